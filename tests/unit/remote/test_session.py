"""The persistent command session, on the local transport."""

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.ground.errors import CommandTimeout, HostUnreachable, OrchError
from orchestrator.payloads import payload_source
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.session import ExecSession, SessionPool, SessionUnavailable

from tests.support.argv import ECHO_ARGV, HOSTILE


@pytest.fixture()
def session():
    session = ExecSession(Target("dev", LocalTransport()), python=sys.executable)
    yield session
    session.close()


def test_argv_stdin_and_exit_codes(session):
    assert json.loads(session.run(ECHO_ARGV + HOSTILE, check=True).text) == HOSTILE
    assert session.run(["cat"], stdin=b"\x00\xffbytes").stdout == b"\x00\xffbytes"
    assert [session.run(["sh", "-c", f"exit {c}"]).exit_code for c in (0, 1, 255)] == [0, 1, 255]


def test_timeout_then_the_session_still_works(session):
    with pytest.raises(CommandTimeout):
        session.run(["sleep", "5"], timeout=0.3)
    assert session.run(["echo", "ok"]).text == "ok\n"


def test_a_program_it_cannot_start_is_left_to_the_plain_path(session):
    # nothing ran, and the message a user sees is the plain path's: the session says so
    with pytest.raises(SessionUnavailable, match="orch-no-such-program: No such file"):
        session.run(["orch-no-such-program"])
    assert session.run(["echo", "still warm"]).text == "still warm\n"


def test_restarts_after_the_server_dies(session):
    session.run(["true"])
    session._process.close()
    assert session.run(["echo", "again"]).text == "again\n"


def test_bad_interpreter_is_a_clear_error():
    session = ExecSession(Target("dev", LocalTransport()), python="/nonexistent/python")
    with pytest.raises(OrchError, match="cannot start a command session"):
        session.run(["true"])


# ------------------------------------------------------------------ streaming (issue 11)
def test_output_streams_while_the_command_runs(session):
    seen = []
    started = time.monotonic()

    def on_stdout(chunk):
        seen.append((chunk, time.monotonic() - started))

    result = session.run(["sh", "-c", "echo first; sleep 1; echo second"], on_stdout=on_stdout)
    assert result.stdout == b"first\nsecond\n"
    assert seen[0][0] == b"first\n" and seen[0][1] < 0.8  # before the command ended


def test_stdin_streams_line_by_line(session):
    read_end, write_end = os.pipe()
    writer = os.fdopen(write_end, "wb", buffering=0)
    lines = []

    def on_stdout(chunk):
        lines.append(chunk)
        if len(lines) == 1:
            writer.write(b"two\n")  # sent only once the first line came back
            writer.close()

    writer.write(b"one\n")
    with os.fdopen(read_end, "rb", buffering=0) as reader:
        result = session.run(["cat"], stdin=reader, on_stdout=on_stdout, timeout=10)
    assert result.stdout == b"one\ntwo\n" and result.exit_code == 0


def test_a_timeout_kills_the_whole_group_and_the_session_stays(session, tmp_path):
    mark = tmp_path / "child.pid"
    with pytest.raises(CommandTimeout, match="did not finish within 0.5 s"):
        session.run(["sh", "-c", f"sleep 60 & echo $! > {mark}; wait"], timeout=0.5)
    child = int(mark.read_text())
    assert _gone(child), "the command's child outlived the timeout"
    server = session._process
    assert session.run(["echo", "ok"]).text == "ok\n" and session._process is server


def test_signal_exit_codes_and_binary_output(session):
    assert session.run(["sh", "-c", "kill -TERM $$"]).exit_code == 128 + 15
    data = bytes(range(256)) * 1000
    assert session.run(["cat"], stdin=data).stdout == data


def test_closing_the_session_kills_the_running_command(tmp_path):
    session = ExecSession(Target("dev", LocalTransport()), python=sys.executable)
    mark = tmp_path / "pid"
    done = threading.Event()

    def run():
        try:
            session.run(["sh", "-c", f"echo $$ > {mark}; exec sleep 60"], timeout=30)
        except OrchError:
            pass
        done.set()

    threading.Thread(target=run, daemon=True).start()
    _wait(lambda: mark.exists() and mark.read_text().strip(), "the command did not start")
    pid = int(mark.read_text())
    session.close()   # as when orch's channel closes (Ctrl-C, a lost agent)
    assert done.wait(10)
    assert _gone(pid), "the command outlived its session"


def test_a_read_that_loses_the_race_with_close_is_the_end_of_the_output():
    # close() from another thread (as above) waits for the server to exit and then closes
    # its pipe; a reader that had not yet seen the end (slow to be scheduled: the suite
    # under load) read a closed file, the ValueError ended its thread and the command's
    # end was never reported. This is that losing interleaving, in order.
    process = LocalTransport().spawn([sys.executable, "-c", "import time; time.sleep(30)"])
    process.close()
    assert process.read(9, 1.0) == b""
    assert process.readline(None) == b""


# The server as it runs, with one change: it signals itself to stop right after it has
# said "started", i.e. while it is still inside start(), before the command is recorded as
# the one running (the other losing interleaving of the test above under load: the session
# closed as soon as the command had written its mark). It writes the command's pid first:
# the command itself may be stopped before it could.
_STOP_WHILE_STARTING = """
_init = Command.__init__
def _init_and_tell(self, *args):
    _init(self, *args)
    with open(os.environ["PID_FILE"], "w") as file:
        file.write(str(self.process.pid))
Command.__init__ = _init_and_tell
_send = Output.send
def _send_then_stop(self, kind, ident, body=b""):
    _send(self, kind, ident, body)
    if kind == b"s":
        os.kill(os.getpid(), signal.SIGTERM)
Output.send = _send_then_stop
"""


def test_a_stop_that_comes_while_a_command_starts_still_takes_the_command_along(tmp_path):
    source = payload_source("exec_server").decode()
    main_call = 'if __name__ == "__main__":'
    assert source.count(main_call) == 1
    source = source.replace(main_call, _STOP_WHILE_STARTING + main_call)
    pid_file = tmp_path / "pid"
    request = json.dumps({"argv": ["sleep", "60"], "env": {}}).encode()
    server = subprocess.Popen([sys.executable, "-I", "-S", "-c", source],
                              env={**os.environ, "PID_FILE": str(pid_file)},
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              start_new_session=True)
    server.stdin.write(struct.pack(">cII", b"r", 1, len(request)) + request)
    server.stdin.flush()
    assert server.wait(20) == 128 + signal.SIGTERM
    pid = int(pid_file.read_text())
    try:
        assert _gone(pid), "the command outlived the server"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def test_a_session_that_died_while_idle_is_restarted_once(session):
    session.run(["true"])
    session._process.close()   # as if the container restarted between two commands
    session._process = _Dead()
    assert session.run(["echo", "again"]).text == "again\n"


def test_the_pool_lends_each_session_to_one_command_at_a_time():
    pool = SessionPool(per_target=2)
    target = Target("dev", LocalTransport())
    with _python_sessions():
        first, second = pool.borrow(target), pool.borrow(target)
        assert first is not None and second is not None and first is not second
        assert pool.borrow(target) is None        # both busy: the plain path runs the third
        assert pool.describe() == [{"host": "local", "vmid": None, "idle": 0, "busy": 2}]
        pool.give_back(target, first)
        assert pool.borrow(target) is first       # warm: no new start
        pool.give_back(target, first)
        pool.give_back(target, second)
        assert pool.describe() == [{"host": "local", "vmid": None, "idle": 2, "busy": 0}]
        pool.close()
        assert pool.borrow(target) is None and not first.alive()


def test_a_session_that_cannot_start_leaves_the_command_to_the_plain_path():
    pool = SessionPool()
    target = Target("dev", LocalTransport())
    with _python_sessions("/nonexistent/python"):
        assert pool.borrow(target) is None
    assert pool.describe() == []


class _Dead:
    def write(self, data):
        raise BrokenPipeError("gone")

    def close(self):
        pass


@contextlib.contextmanager
def _python_sessions(python=sys.executable):
    """ExecSession's default interpreter is the container's python3: here, this one."""
    original = ExecSession.__init__.__defaults__
    ExecSession.__init__.__defaults__ = (python,)
    try:
        yield
    finally:
        ExecSession.__init__.__defaults__ = original


def _gone(pid, seconds=5.0):
    """pid ended (a zombie not yet reaped by whoever inherited it counts as ended)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _wait(predicate, what, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_host_that_cannot_be_reached_is_its_own_error_not_a_second_try():
    class Unreachable(LocalTransport):
        def spawn(self, argv):
            raise HostUnreachable("cannot reach host pve")

    class NoPython(LocalTransport):
        def spawn(self, argv):
            raise OrchError("python3: No such file or directory on pve")

    pool = SessionPool()
    with pytest.raises(HostUnreachable):
        pool.borrow(Target("dev", Unreachable("pve")))
    assert pool.borrow(Target("dev", NoPython("pve"))) is None  # the plain path says why
    assert pool.describe() == []
