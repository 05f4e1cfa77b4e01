"""Transport pieces without a server: refused channels, the command string, the reaper,
streaming through the local transport. (Each is also proven over SSH against the sandbox's
stock sshd in tests/integration/test_transport_hardening.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import paramiko
import pytest

from orchestrator.ground.errors import BadArgument, ChannelRefused, HostUnreachable
from orchestrator.payloads import compact_source, payload_source
from orchestrator.remote.base import Result, validate_env
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.ssh import (ARGV_FROM_STDIN, INLINE_COMMAND_LIMIT, SshHost, SshSettings,
                                     _Connection, remote_command)
from tests.support.ssh_fakes import FakeClient


class RefusingTransport:
    def __init__(self, error):
        self.error = error

    def is_active(self):
        return True

    def open_session(self, timeout=None):
        raise self.error


def host_with(transport) -> SshHost:
    host = SshHost(SshSettings(name="pve", address="192.0.2.1"))
    host._connections = [_Connection(FakeClient(transport), 10)]
    return host


@pytest.mark.parametrize("error", [paramiko.ChannelException(2, "Connect failed"),
                                   paramiko.SSHException("Unable to open channel.")])
def test_a_refused_channel_is_reported_as_refused_at_once(error):
    host = host_with(RefusingTransport(error))
    started = time.monotonic()
    with pytest.raises(ChannelRefused) as raised:
        host.run(["true"], timeout=30)
    assert time.monotonic() - started < 1
    message = str(raised.value)
    assert "refused to open a session channel" in message and "MaxSessions" in message
    assert "within 30" not in message and "after 0.0" in message
    assert host._connections[0].open == 0  # the slot was given back


def test_commands_waiting_for_a_connection_that_fails_share_its_error():
    """A fan-out over a down host's containers: the first command dials, the others wait for
    that attempt and fail with its error, instead of each paying the connect timeout again."""
    host = SshHost(SshSettings(name="pve", address="192.0.2.1"))
    dials = []

    def slow_failure():
        dials.append(1)
        time.sleep(0.3)
        raise HostUnreachable("cannot reach host pve at 192.0.2.1:22: timed out")
    host.open_client = slow_failure
    errors = []

    def one():
        try:
            host.run(["true"], timeout=30)
        except HostUnreachable as error:
            errors.append(str(error))
    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(dials) == 1 and len(errors) == 4
    assert all("cannot reach host pve" in error for error in errors)
    with pytest.raises(HostUnreachable):   # a later command dials again: the host may be back
        host.run(["true"], timeout=30)
    assert len(dials) == 2


def test_env_goes_into_the_command_quoted_once():
    command, preamble = remote_command(["printenv", "A B"], {"A B": "x 'y'", "-n": "$(z)"})
    assert command == b"env -- 'A B=x '\"'\"'y'\"'\"'' '-n=$(z)' printenv 'A B'"
    assert preamble == b""
    command, _ = remote_command(["a=b", "c"], {"K": "v"})
    assert command == b"env -- K=v sh -c 'exec \"$@\"' sh a=b c"


def test_bad_env_names_and_values_are_refused():
    for bad in ({"": "x"}, {"A=B": "x"}, {"A": "x\0y"}, {"A": "\ud800"}):
        with pytest.raises(BadArgument):
            validate_env(bad)


def test_a_long_command_sends_its_argv_on_stdin():
    argv = ["echo", "x" * INLINE_COMMAND_LIMIT, "caf\udce9"]
    command, preamble = remote_command(argv, {})
    assert command.startswith(b"bash -c ") and b" orch-argv 3" in command
    assert ARGV_FROM_STDIN.encode() in command.replace(b"'\"'\"'", b"'")
    assert preamble == b"echo\0" + b"x" * INLINE_COMMAND_LIMIT + b"\0caf\xe9\0"


def test_a_non_utf8_argument_is_sent_as_its_bytes():
    command, _ = remote_command(["echo", "caf\udce9"], {})
    assert command == b"echo 'caf\xe9'"


def test_an_argument_that_is_no_bytes_is_a_clear_error():
    with pytest.raises(BadArgument, match="no character and no byte"):
        LocalTransport().run(["echo", "a\ud800"])


def test_an_argument_over_the_kernel_limit_is_a_clear_error():
    with pytest.raises(BadArgument, match="MAX_ARG_STRLEN"):
        LocalTransport().run(["echo", "y" * 200_000])


def test_reaper_kills_the_group_when_the_reader_goes_away():
    source = payload_source("reaper").decode()
    process = subprocess.Popen([sys.executable, "-c", source, "sh", "-c",
                                "sleep 300 & echo $!; wait"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    grandchild = int(process.stdout.readline())
    process.stdout.close()
    process.stderr.close()
    assert process.wait(timeout=10) == 128 + signal.SIGHUP
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_reaper_kills_the_group_past_its_own_limit_with_the_channel_still_open():
    """--limit: a dead link that never closes the channel does not let a command (and what
    it forked) run on: after the limit the group is killed and the status is 124."""
    source = payload_source("reaper").decode()
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-c", source, "--limit=1", "sh", "-c",
                                "sleep 300 & echo $!; wait"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    grandchild = int(process.stdout.readline())
    assert process.wait(timeout=10) == 124     # our end of its pipes is still open
    assert time.monotonic() - started < 5
    assert b"ran past its limit of 1 s" in process.stderr.read()
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
    assert subprocess.run([sys.executable, "-c", source, "--limit=0", "true"]).returncode == 0


def test_every_container_command_runs_under_the_reaper_with_a_limit():
    """Not only `orch exec`: a payload or step command on a plain channel is reaped too,
    with the reaper's own limit a little past the command's timeout."""
    from orchestrator.remote.container import Target
    seen = []

    class Host(LocalTransport):
        def _run(self, argv, options):
            seen.append(argv)
            return Result(argv, 0, b"", b"", 0.0)

    Target("ct", Host("pve"), vmid=200).run(["python3", "-", "{}"], timeout=30)
    inner = seen[0][seen[0].index("--") + 1:]
    assert inner[3:9] == ["python3", "-I", "-S", "-c", compact_source("reaper"), "--limit=35"]
    assert inner[9:] == ["python3", "-", "{}"]


def test_reaper_passes_exit_codes_and_signals_through():
    source = payload_source("reaper").decode()
    assert subprocess.run([sys.executable, "-c", source, "sh", "-c", "exit 9"]).returncode == 9
    assert subprocess.run([sys.executable, "-c", source, "sh", "-c", "kill -9 $$"]).returncode == 137
    missing = subprocess.run([sys.executable, "-c", source, "no-such-program-x"],
                             capture_output=True, text=True)
    assert missing.returncode == 127 and "no-such-program-x" in missing.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_local_transport_streams_stdin_and_can_skip_capture():
    read_end, write_end = os.pipe()
    seen = []
    writer = os.fdopen(write_end, "wb", buffering=0)
    writer.write(b"first\n")
    result_box = []
    thread = threading.Thread(target=lambda: result_box.append(LocalTransport().run(
        ["head", "-n1"], stdin=os.fdopen(read_end, "rb", buffering=0), capture=False,
        on_stdout=seen.append, timeout=10)))
    thread.start()
    thread.join(timeout=5)   # head answers while our end of the pipe is still open
    assert not thread.is_alive() and seen == [b"first\n"]
    assert result_box[0].exit_code == 0 and result_box[0].stdout == b"first\n"   # only a tail is kept
    writer.close()


def test_reaped_command_runs_without_python_too():
    """A container without python3: env says so and runs nothing; the command then runs
    once more without the reaper. The command's own exit 127 is not taken for that."""
    from orchestrator.remote.container import Target
    seen = []

    class Host(LocalTransport):
        def _run(self, argv, options):
            seen.append(argv)
            if "-I" in argv:
                return Result(argv, 127, b"", b"env: 'python3': No such file or directory\n", 0.0)
            return Result(argv, 127, b"", b"sh: 1: nope: not found\n", 0.0)

    result = Target("ct", Host("pve"), vmid=200).run(["nope"])
    assert result.exit_code == 127 and len(seen) == 2 and seen[1][-1] == "nope" and "-I" not in seen[1]


def test_reaped_commands_keep_every_variable_a_shell_would_drop():
    from orchestrator.remote.container import reaped
    odd = {"-dash": "d", "not-an-identifier": "ok", "A": "1"}
    done = subprocess.run(reaped(["env"]), capture_output=True, env=odd, timeout=30)
    assert sorted(done.stdout.decode().splitlines()) == ["-dash=d", "A=1", "not-an-identifier=ok"]


def test_the_reaper_ignores_the_commands_python_settings_and_passes_them_on(tmp_path):
    """The reaper runs as `python3 -I -S`: a PYTHONPATH (inventory `env:`) or a current
    folder holding a module named like one of the reaper's own (select.py) cannot break it,
    and the command still gets that environment."""
    from orchestrator.remote.container import reaped
    for name in ("select", "signal", "stat", "time", "sitecustomize"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('shadowed stdlib module imported')\n")
    argv = reaped(["/bin/sh", "-c", 'printf "%s" "$PYTHONPATH"; exit 3'])
    done = subprocess.run(argv, capture_output=True, cwd=tmp_path, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert (done.returncode, done.stdout, done.stderr) == (3, str(tmp_path).encode(), b"")


def test_the_reaper_starts_on_the_c_modules_only():
    """No `signal` wrapper (it imports enum, ~3 ms of every reaped command) and no site."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-I", "-S", "-c", compact_source("reaper"),
                           "true"], capture_output=True, text=True, timeout=30)
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert done.returncode == 0 and "_signal" in imported
    assert not imported & {"signal", "enum", "site"}, imported & {"signal", "enum", "site"}


def test_the_reaped_command_gets_default_signal_dispositions():
    """Python ignores SIGPIPE and SIGXFSZ for itself; a command it forks and execs keeps
    them ignored unless reset (a writer into a closed pipe gets EPIPE errors instead of ending)."""
    from orchestrator.remote.container import reaped
    done = subprocess.run(reaped(["sh", "-c", "grep SigIgn /proc/self/status"]),
                          capture_output=True, text=True, timeout=30)
    ignored = int(done.stdout.split()[1], 16)
    for number in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (number - 1)), f"signal {number} is ignored in the command"


def test_an_empty_program_name_is_a_clear_error(tmp_path):
    """`orch exec T -- ""` once printed the reaper's traceback from the container."""
    with pytest.raises(BadArgument, match="program is an empty string"):
        LocalTransport().run([""])
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("hosts:\n  here: {transport: local}\ncontainers:\n  dev: {host: here}\n")
    done = subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(inventory), "exec",
                           "dev", "--", ""], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ORCH_AGENT": "off"})
    assert done.returncode == 2 and "empty string" in done.stderr
    assert "Traceback" not in done.stderr
