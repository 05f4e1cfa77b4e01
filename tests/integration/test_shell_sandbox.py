"""orch shell against the sandbox (real sshd, real pct and lxc-attach), driven in a real
pseudo-terminal as a person's terminal would drive it (pty.fork): the prompt is the
container's, `stty size` follows a resize, Ctrl-C stops a `sleep` and the shell lives on,
`exit 3` gives 3, --venv puts the venv first, a killed link ends orch with 255, and the
terminal's attributes are as they were afterwards."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import secrets
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
import yaml

pytestmark = pytest.mark.sandbox

ORCH = [sys.executable, "-m", "orchestrator"]


class Terminal:
    """`sh -c 'stty -g; orch ...; echo EXIT=$?; stty -g'` on a new pty of 80 x 24: the two
    `stty -g` lines are the terminal's attributes before and after orch."""

    def __init__(self, inventory, *args):
        orch = shlex.join([*ORCH, "-i", inventory, *args])
        script = f'stty -g; echo START; {orch}; echo "EXIT=$?"; stty -g; sleep 0.2'
        env = {**os.environ, "ORCH_AGENT": "off", "TERM": "xterm-256color"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:   # the child: exec at once
            os.execvpe("sh", ["sh", "-c", script], env)
        self.resize(80, 24)
        self.seen = b""

    def resize(self, columns, lines):
        # on the master: the kernel sends SIGWINCH to the pty's foreground process group
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))

    def send(self, data: bytes):
        os.write(self.fd, data)

    def expect(self, pattern: str, timeout=30.0) -> re.Match:
        regex = re.compile(pattern.encode())
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.seen)
            if found:
                self.seen_before_match = self.seen[:found.start()]
                self.seen = self.seen[found.end():]
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} within {timeout} s; the terminal "
                                     f"showed: {self.seen[-2000:]!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the terminal closed before {pattern!r}: "
                                         f"{self.seen[-2000:]!r}")
                self.seen += chunk

    def orch_pid(self) -> int:
        """The orch process: the one child of the terminal's sh."""
        with open(f"/proc/{self.pid}/task/{self.pid}/children") as children:
            return int(children.read().split()[0])

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.fd)

    def finish(self, timeout=30.0) -> tuple[int, bytes]:
        """orch's exit code and the terminal's attributes after it; what orch wrote before
        its exit code is in `shown`."""
        found = self.expect(r"EXIT=(\d+)", timeout)
        self.shown = self.seen_before_match
        code = int(found.group(1))
        after = self.expect(r"\s*(\S+)\r?\n").group(1)
        return code, after


@pytest.fixture
def term(sandbox):
    opened = []

    def start(*args, inventory=None):
        terminal = Terminal(inventory or str(sandbox.inventory_path), *args)
        opened.append(terminal)
        terminal.before = terminal.expect(r"(\S+)\r?\nSTART").group(1)
        return terminal
    yield start
    for terminal in opened:
        terminal.close()


def test_a_shell_in_the_container_follows_resizes_lives_through_ctrl_c_z_and_exits_3(term):
    t = term("shell", "sb1-200")
    t.expect(r"root@CT200")                          # the container's prompt
    t.send(b"hostname; stty size; echo $TERM\r")
    # \r\r\n: lxc-attach leaves output processing on for sshd's pty (as under ssh -t pct enter)
    t.expect(r"CT200\r+\n24 80\r+\nxterm-256color")
    t.resize(132, 43)
    time.sleep(0.3)
    t.send(b"stty size\r")
    t.expect(r"43 132")
    # the job says it runs (the sums show only in its output, not in the echoed line)
    t.send(b"sh -c 'echo running-$((1+2)); exec sleep 30'; echo slept\r")
    t.expect(r"running-3")
    started = time.monotonic()
    t.send(b"\x03")                                  # Ctrl-C, as a byte in raw mode
    t.send(b"echo alive-$((40+2))\r")
    t.expect(r"alive-42")
    assert time.monotonic() - started < 10
    t.send(b"sh -c 'echo running-$((2+2)); exec sleep 31'\r")
    t.expect(r"running-4")
    t.send(b"\x1a")                                  # Ctrl-Z: the container's shell stops it
    t.expect(r"Stopped\s+sh -c")
    # a stopped job killed, so that exit is not blocked: `fg` waits for its end (a bare `wait`
    # returned while bash still had it stopped, then exit said "There are stopped jobs")
    t.send(b"kill -9 %1; fg >/dev/null 2>&1; echo killed-$((6*7))\r")
    t.expect(r"killed-42")
    t.send(b"exit 3\r")
    code, after = t.finish()
    assert code == 3
    assert after == t.before                          # the terminal as it was


@pytest.fixture
def venv_inventory(sandbox, ct, tmp_path):
    """The sandbox's inventory with sb1-200's venv in a folder of this test's own (the
    shared /root/venv is the bootstrap tests'), a venv whose python is the system's."""
    venv = f"/tmp/orch-shell-venv-{secrets.token_hex(4)}"
    ct.run(["mkdir", "-p", f"{venv}/bin"], timeout=30).check()
    ct.run(["ln", "-s", "/usr/bin/python3", f"{venv}/bin/python"], timeout=30).check()
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(sandbox.inventory_path.read_text().replace("venv: /root/venv",
                                                                    f"venv: {venv}"))
    yield str(inventory), venv
    ct.run(["rm", "-rf", venv], timeout=30)


def test_a_command_on_a_terminal_with_the_venv_first(term, venv_inventory):
    inventory, venv = venv_inventory
    t = term("shell", "--venv", "sb1-200", "--", "sh", "-c",
             'tty; echo "venv=$VIRTUAL_ENV"; command -v python', inventory=inventory)
    t.expect(r"/dev/pts/\d+")                        # the command has a terminal
    t.expect(f"venv={venv}")
    t.expect(f"{venv}/bin/python")
    code, after = t.finish()
    assert code == 0 and after == t.before


def test_a_missing_venv_is_said(term):
    t = term("shell", "--venv", "sb1-201", "--", "true")
    code, _ = t.finish()
    assert code == 127 and b"no virtual environment at /root/venv" in t.shown


def test_a_killed_link_ends_orch_with_255_and_the_terminal_restored(term, fleet):
    marker = f"301.{secrets.randbelow(10**6)}"        # sleep's argument finds its sshd
    t = term("shell", "sb1-200", "--", "sleep", marker)
    host = fleet.host("sb1")
    deadline = time.monotonic() + 30
    while True:
        found = host.run(["pgrep", "-f", f"^lxc-attach .* sleep {marker}$"], timeout=30)
        if found.exit_code == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    attach = found.text.split()[0]
    parent = host.run(["ps", "-o", "ppid=", "-p", attach], timeout=30).check().text.strip()
    # the sshd process of orch's session: killing it drops orch's connection
    host.run(["kill", "-9", parent], timeout=30).check()
    code, after = t.finish(timeout=60)
    assert code == 255
    assert b"the connection to host sb1 broke while a shell in sb1-200 ran" in t.shown
    assert after == t.before


def test_a_dead_link_is_noticed_by_the_keepalives_and_the_terminal_restored(sandbox, term,
                                                                             tmp_path):
    # sb2 declared dead after 1 s x (2 + 1) of silence; its packets dropped for a few seconds
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    data["hosts"]["sb2"].update(alive_interval=1, alive_count_max=2, connect_timeout=3)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(data))
    t = term("shell", "sb2-201", "--", "sh", "-c", "echo started; exec sleep 60",
             inventory=str(inventory))
    t.expect("started")
    sandbox.block_ssh("sb2")
    try:
        blocked = time.monotonic()
        code, after = t.finish(timeout=30)
        elapsed = time.monotonic() - blocked
    finally:
        sandbox.unblock_ssh("sb2")
    assert code == 255 and b"answered none of 2 keepalive(s)" in t.shown, t.shown
    assert elapsed < 3 + 5, f"{elapsed:.1f} s to notice a dead link"
    assert after == t.before


def test_sigterm_ends_orch_with_143_and_the_terminal_restored(term):
    t = term("shell", "sb1-200", "--", "sh", "-c", "echo started; exec sleep 60")
    t.expect("started")
    os.kill(t.orch_pid(), signal.SIGTERM)
    code, after = t.finish()
    assert code == 128 + signal.SIGTERM and after == t.before


def test_without_a_terminal_a_shell_is_refused_and_a_command_runs_as_exec(sandbox,
                                                                         venv_inventory):
    env = {**os.environ, "ORCH_AGENT": "off"}
    inventory, venv = venv_inventory
    base = [*ORCH, "-i", inventory, "shell"]
    refused = subprocess.run([*base, "sb1-200"], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 2 and "not on a terminal" in refused.stderr
    ran = subprocess.run([*base, "--venv", "sb1-200", "--", "sh", "-c",
                          'command -v python; exit 5'], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, env=env, timeout=60)
    assert (ran.returncode, ran.stdout) == (5, f"{venv}/bin/python\n"), ran.stderr


def test_a_host_needs_host_and_a_stopped_container_is_exit_4(sandbox, term):
    env = {**os.environ, "ORCH_AGENT": "off"}
    base = [*ORCH, "-i", str(sandbox.inventory_path), "shell"]
    host = subprocess.run([*base, "sb1:", "--", "true"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert host.returncode == 2 and "add --host" in host.stderr, host.stderr
    t = term("shell", "--host", "sb1", "--", "sh", "-c", "ls /etc/pve/nodes; exit 7")
    t.expect(r"sb1")                                   # the Proxmox node's own files
    assert t.finish()[0] == 7
    t = term("shell", "sb1-202")                       # stopped
    code, after = t.finish()
    assert code == 4 and b"is not running" in t.shown and after == t.before
