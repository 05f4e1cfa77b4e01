"""orch shell's local half (orchestrator/remote/terminal.py) on a real pseudo-terminal pair
(os.openpty) and a fake channel (a socket pair): raw mode and its restoring on every way
out, keys as bytes (Ctrl-C is a byte, not a SIGINT here), resizes through SIGWINCH, the
exit status, and the constant script that starts the shell."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from contextlib import contextmanager

import pytest

from orchestrator.agent.client import is_fast_command
from orchestrator.ground.errors import ConnectionLost, OrchError
from orchestrator.remote import terminal
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport


class FakeChannel:
    """What the relay needs of a paramiko channel, over one end of a socket pair; the test
    plays the remote side on the other end (`remote`)."""

    def __init__(self):
        self._sock, self.remote = socket.socketpair()
        self.closed = False
        self.sizes: list[tuple[int, int]] = []
        self.status = -1
        self.input_ended = threading.Event()

    def fileno(self):
        return self._sock.fileno()

    def recv(self, size):
        data = self._sock.recv(size)
        if not data:
            self.closed = True
        return data

    def sendall(self, data):
        self._sock.sendall(data)

    def shutdown_write(self):
        self.input_ended.set()

    def resize_pty(self, width, height):
        self.sizes.append((width, height))

    def exit_status_ready(self):
        return self.closed

    @property
    def exit_status(self):
        return self.status

    def finish(self, status):
        """The remote command exited with status: its channel ends."""
        self.status = status
        self.remote.close()


@pytest.fixture
def pty_pair():
    master, slave = os.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


def set_size(fd, columns, lines):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))


def in_background(action, delay=0.1):
    thread = threading.Thread(target=lambda: (time.sleep(delay), action()), daemon=True)
    thread.start()
    return thread


def test_raw_mode_turns_off_echo_lines_and_signals_and_restores_them(pty_pair):
    _, slave = pty_pair
    before = termios.tcgetattr(slave)
    with terminal.RawMode(slave):
        inside = termios.tcgetattr(slave)
        local = inside[3]
        assert not local & (termios.ICANON | termios.ECHO | termios.ISIG)
        assert not inside[1] & termios.OPOST   # the remote pty turns \n into \r\n
    assert termios.tcgetattr(slave) == before


def test_raw_mode_is_restored_when_the_inside_fails(pty_pair):
    _, slave = pty_pair
    before = termios.tcgetattr(slave)
    with pytest.raises(RuntimeError):
        with terminal.RawMode(slave):
            raise RuntimeError("the link broke")
    assert termios.tcgetattr(slave) == before


def test_keys_reach_the_channel_as_bytes_ctrl_c_included_and_output_comes_back(pty_pair):
    master, slave = pty_pair
    channel = FakeChannel()
    got = []

    def remote():
        os.write(master, b"ls\r\x03\x1a")   # typed: ls, Enter, Ctrl-C, Ctrl-Z
        deadline = time.monotonic() + 5
        while sum(map(len, got)) < 5 and time.monotonic() < deadline:
            got.append(channel.remote.recv(100))
        channel.remote.sendall(b"remote says hi\r\n")
        time.sleep(0.1)
        channel.finish(0)
    in_background(remote)
    # a SIGINT here would end the test with KeyboardInterrupt: raw mode sends it as a byte
    assert terminal.interactive(channel, slave, slave) == 0
    assert b"".join(got) == b"ls\r\x03\x1a"
    assert os.read(master, 100) == b"remote says hi\r\n"


def test_the_remote_exit_status_is_returned(pty_pair):
    _, slave = pty_pair
    channel = FakeChannel()
    in_background(lambda: channel.finish(3))
    assert terminal.interactive(channel, slave, slave) == 3


def test_a_dropped_link_gives_no_status_and_restores_the_terminal(pty_pair):
    _, slave = pty_pair
    before = termios.tcgetattr(slave)
    channel = FakeChannel()
    in_background(channel.remote.close)   # closed without an exit status
    assert terminal.interactive(channel, slave, slave) is None
    assert termios.tcgetattr(slave) == before


def test_a_resize_becomes_a_window_change_with_the_new_size(pty_pair):
    _, slave = pty_pair
    set_size(slave, 80, 24)
    channel = FakeChannel()

    def remote():
        set_size(slave, 132, 43)
        os.kill(os.getpid(), signal.SIGWINCH)
        deadline = time.monotonic() + 5
        while not channel.sizes and time.monotonic() < deadline:
            time.sleep(0.02)
        channel.finish(0)
    previous = signal.getsignal(signal.SIGWINCH)
    in_background(remote)
    assert terminal.interactive(channel, slave, slave) == 0
    assert channel.sizes == [(132, 43)]
    assert signal.getsignal(signal.SIGWINCH) == previous   # the handler is gone again


def test_end_of_input_closes_the_channels_input_and_output_goes_on():
    read_fd, write_fd = os.pipe()
    out_read, out_write = os.pipe()
    os.close(write_fd)   # input that ends at once (a pipe, not a terminal)
    channel = FakeChannel()

    def remote():
        channel.input_ended.wait(5)
        channel.remote.sendall(b"after EOF")
        time.sleep(0.1)
        channel.finish(0)
    in_background(remote, 0)
    terminal.relay(channel, read_fd, out_write)
    assert channel.input_ended.is_set()
    assert os.read(out_read, 100) == b"after EOF"
    for fd in (read_fd, out_read, out_write):
        os.close(fd)


def test_a_new_pty_that_says_0_x_0_counts_as_80_x_24(pty_pair):
    _, slave = pty_pair
    set_size(slave, 0, 0)
    assert terminal.terminal_size(slave) == (80, 24)
    set_size(slave, 100, 30)
    assert terminal.terminal_size(slave) == (100, 30)


def run_script(argv, env=None):
    return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_the_venv_path_and_the_command_are_data_never_code(tmp_path):
    venv = tmp_path / "a venv; touch PWNED $(touch PWNED2)"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\necho venv-python\n")
    python.chmod(0o755)
    argv = terminal.shell_argv(["sh", "-c", 'echo "$VIRTUAL_ENV|$TERM"; python', "x"],
                               term="xterm-kitty", venv=str(venv))
    assert terminal.SHELL_SCRIPT in argv and str(venv) not in terminal.SHELL_SCRIPT
    result = run_script(argv)
    assert result.stdout.splitlines() == [f"{venv}|xterm-kitty", "venv-python"], result.stderr
    assert not list(tmp_path.glob("PWNED*")) and not list(venv.parent.glob("PWNED*"))


def test_a_venv_that_is_not_there_is_said_and_exits_127(tmp_path):
    result = run_script(terminal.shell_argv(["true"], venv=str(tmp_path / "nope")))
    assert result.returncode == 127
    assert f"no virtual environment at {tmp_path / 'nope'}" in result.stderr


def test_without_a_command_the_script_starts_the_accounts_shell_in_its_home(tmp_path):
    # the login shell reads its commands from stdin here: `pwd` shows where it started
    result = subprocess.run(terminal.shell_argv(), input="pwd; echo $HOME\n", text=True,
                            capture_output=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.stdout.split()[-2:] == [str(tmp_path), str(tmp_path)], result.stderr


class NoTerminals:
    name = "odd"


def test_a_transport_without_terminals_is_refused_with_a_sentence():
    with pytest.raises(OrchError, match="cannot open a terminal through host odd's transport"):
        terminal.open_shell(Target("odd", NoTerminals()), [], None, 0, 1, "xterm")


class Screen:
    """The local terminal's other side (the pty master): what orch shows, keys typed."""

    def __init__(self, master):
        self.master = master
        self.seen = b""

    def expect(self, text: bytes, timeout=10.0):
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            ready, _, _ = select.select([self.master], [], [], max(deadline - time.monotonic(), 0))
            assert ready, f"no {text!r} on the screen: {self.seen!r}"
            self.seen += os.read(self.master, 4096)


def shell_here(slave, command, term="xterm-kitty"):
    """orch shell's whole path on a host orch runs on: a pty of its own for the command,
    driven from the terminal `slave`."""
    return terminal.open_shell(Target("here", LocalTransport()), command, None, slave, slave,
                               term)


def test_a_local_command_runs_on_a_terminal_of_the_local_size_and_term(pty_pair):
    master, slave = pty_pair
    set_size(slave, 91, 33)
    code = shell_here(slave, ["sh", "-c", 'tty; stty size; echo "$TERM"; exit 4'])
    screen = Screen(master)
    screen.expect(b"33 91\r\nxterm-kitty\r\n")
    assert code == 4 and b"/dev/pts/" in screen.seen


def trapping_shell_beside(slave, trap: str, action) -> int:
    """Runs a shell on the pty slave that sets the trap, says "ready" and waits forever, while
    action (which waits for "ready") does what should reach it; returns the shell's exit code."""
    thread = in_background(action, 0)
    code = shell_here(slave, ["sh", "-c", f"{trap}; echo ready; while :; do sleep 0.05; done"])
    thread.join(5)
    return code


def test_ctrl_c_interrupts_the_command_on_its_pty_not_orch(pty_pair):
    master, slave = pty_pair
    screen = Screen(master)

    def typist():
        screen.expect(b"ready")
        os.write(master, b"\x03")
    code = trapping_shell_beside(slave, 'trap "echo got-int; exit 9" INT', typist)
    screen.expect(b"got-int")
    assert code == 9


def test_a_local_resize_reaches_the_command(pty_pair):
    master, slave = pty_pair
    set_size(slave, 80, 24)
    screen = Screen(master)

    def resizer():
        screen.expect(b"ready")
        set_size(slave, 120, 40)
        os.kill(os.getpid(), signal.SIGWINCH)
    code = trapping_shell_beside(slave, 'trap "stty size; exit 0" WINCH', resizer)
    screen.expect(b"40 120")
    assert code == 0


class FakeHost:
    """An SSH host whose terminal is a FakeChannel that drops before any exit status."""

    name = "pve"

    def __init__(self):
        self.argv = None

    def terminal(self, argv, term, size):
        @contextmanager
        def opened():
            self.argv, self.term, self.size = argv, term, size
            channel = FakeChannel()
            in_background(channel.remote.close)
            yield channel, lambda: "the host answered none of 3 keepalive(s) in 20 s"
        return opened()


def test_a_link_lost_under_the_shell_is_connection_lost_with_the_reason(pty_pair):
    _, slave = pty_pair
    set_size(slave, 120, 50)
    host = FakeHost()
    target = Target("ct", host)   # a host target: no pct status asked first
    with pytest.raises(ConnectionLost, match="keepalive"):
        terminal.open_shell(target, ["top"], None, slave, slave, "screen")
    assert host.size == (120, 50) and host.term == "screen"
    assert host.argv[-1] == "top" and "TERM=screen" in host.argv


def test_orch_shell_never_goes_to_the_agent():
    # it needs this process's terminal and signals: the warm agent has neither
    assert not is_fast_command(["shell", "sb1-200"])
    assert not is_fast_command(["-i", "inv.yaml", "shell", "--venv", "ct", "--", "top"])
