"""The launcher payload and the byte-offset follower, on this machine (local transport).

Detached start, status, stop (SIGTERM then SIGKILL); following a log from any offset with
exact bytes (invalid UTF-8 and a last line without newline included); and the follower's
reconnects: a dropped channel and a silent (stopped) one, with no line lost or repeated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.watch.monitor import FollowHandler, LogFollower
from orchestrator.remote.payload_api import launcher, stop_run
from orchestrator.payloads import payload_source
from orchestrator.remote.base import command_timeout
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from tests.support.follow_handlers import Collect

WRITER = ("import sys, time\n"
          "n, pause = int(sys.argv[1]), float(sys.argv[2])\n"
          "for i in range(n):\n"
          "    sys.stdout.write('line %d ' % i + 'x' * (i % 7) + '\\n'); sys.stdout.flush()\n"
          "    time.sleep(pause)\n")


@pytest.fixture
def target():
    return Target("here", LocalTransport("here"))


def start(target, run_dir, argv, **extra):
    return launcher(target, "start", str(run_dir), argv=argv, **extra)


def wait_state(target, run_dir, state, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = launcher(target, "status", str(run_dir))
        if status["state"] == state:
            return status
        time.sleep(0.1)
    raise AssertionError(f"{run_dir} never reached {state}: {status}")


def test_start_detaches_and_records_exit(target, tmp_path):
    run_dir = tmp_path / "run"
    began = time.monotonic()
    result = start(target, run_dir, [sys.executable, "-c", "import time; print('hi', flush=True); "
                                                         "time.sleep(1.5); raise SystemExit(3)"],
                   env={"ORCH_TEST": "yes"})
    assert time.monotonic() - began < 1.5  # the payload returned while the command runs
    assert result["pid"] > 0 and result["log"] == str(run_dir / "output.log")
    assert launcher(target, "status", str(run_dir))["state"] == "running"
    ended = wait_state(target, run_dir, "exited")
    assert ended["exit_code"] == 3 and ended["signal"] is None
    assert (run_dir / "output.log").read_text() == "hi\n"
    cmd = json.loads((run_dir / "cmd.json").read_text())
    assert cmd["env_keys"] == ["ORCH_TEST"]


def test_start_refuses_a_second_run_and_reports_a_missing_command(target, tmp_path):
    run_dir = tmp_path / "run"
    start(target, run_dir, ["sleep", "30"])
    from orchestrator.ground.errors import PayloadError
    with pytest.raises(PayloadError, match="already going"):
        start(target, run_dir, ["sleep", "30"])
    stop_run(target, str(run_dir), grace=2)
    with pytest.raises(PayloadError, match="cannot run no-such-command"):
        start(target, tmp_path / "other", ["no-such-command"])


def test_stop_sigterm_then_sigkill(target, tmp_path):
    run_dir = tmp_path / "run"
    start(target, run_dir, ["sleep", "60"])
    stopped = stop_run(target, str(run_dir), grace=5)
    assert stopped["sent"] == "SIGTERM" and stopped["state"] == "exited" and stopped["signal"] == 15
    assert stopped["stop_requested"] is True
    stubborn = tmp_path / "stubborn"
    start(target, stubborn, [sys.executable, "-c", "import signal, time\n"
                                                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                                    "print('ready', flush=True)\ntime.sleep(60)"])
    deadline = time.monotonic() + 10
    while "ready" not in (stubborn / "output.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    began = time.monotonic()
    stopped = stop_run(target, str(stubborn), grace=1)
    assert stopped["sent"] == "SIGKILL" and stopped["signal"] == 9
    assert time.monotonic() - began < 8
    again = stop_run(target, str(stubborn), grace=1)
    assert again["already"] is True


def test_the_process_group_is_stopped_with_its_children(target, tmp_path):
    run_dir = tmp_path / "run"
    start(target, run_dir, ["sh", "-c", "sleep 60 & echo child $! ; wait"])
    deadline = time.monotonic() + 10
    while "child" not in (run_dir / "output.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int((run_dir / "output.log").read_text().split()[1])
    stop_run(target, str(run_dir), grace=3)
    deadline = time.monotonic() + 5
    while gone_or_zombie(child) is False and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone_or_zombie(child)


# torchrun's way: each worker in a session of its own (start_new_session), which a signal to
# the run's process group does not reach; the launcher that holds it SIGKILLed before it
# could stop its workers leaves them running, holding their GPUs.
WORKER_OF_ITS_OWN = """\
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, "-c", "import signal, time\\n"
                           "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\ntime.sleep(60)"],
                          start_new_session=True)
print("worker", worker.pid, flush=True)
time.sleep(60)
"""


def test_a_worker_in_a_session_of_its_own_is_stopped_with_the_run(target, tmp_path):
    run_dir = tmp_path / "run"
    start(target, run_dir, [sys.executable, "-c", WORKER_OF_ITS_OWN])
    deadline = time.monotonic() + 10
    while "worker" not in (run_dir / "output.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = int((run_dir / "output.log").read_text().split()[1])
    try:
        stopped = stop_run(target, str(run_dir), grace=1)
        assert stopped["sent"] == "SIGKILL"
        deadline = time.monotonic() + 5
        while gone_or_zombie(worker) is False and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone_or_zombie(worker), "the worker outlived the stop"
        assert stopped["strays_killed"] == 1
    finally:
        if not gone_or_zombie(worker):
            os.kill(worker, signal.SIGKILL)


def gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def tail_events(run_dir, offset):
    done = subprocess.run([sys.executable, "-", json.dumps({"action": "tail", "run_dir": str(run_dir),
                                                           "offset": offset})],
                          input=payload_source("launcher"), capture_output=True, timeout=30)
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_tail_returns_exact_bytes_from_any_offset(target, tmp_path):
    run_dir = tmp_path / "run"
    payload = b"first line\n\xff\xfe not utf-8 \xc3\n" + "ünïcödé\n".encode() + b"no newline at the end"
    script = f"import sys; sys.stdout.buffer.write({payload!r}); sys.stdout.flush()"
    start(target, run_dir, [sys.executable, "-c", script])
    wait_state(target, run_dir, "exited")
    for offset in (0, 11, len(payload) - 5, len(payload)):
        events = tail_events(run_dir, offset)
        data = b"".join(e["text"].encode("utf-8", "surrogateescape") for e in events if e["event"] == "data")
        assert data == payload[offset:]
        ats = [e["at"] for e in events if e["event"] == "data"]
        assert not ats or ats[0] == offset
        assert events[-1]["event"] == "result" and events[-1]["offset"] == len(payload)
        assert events[-1]["state"] == "exited"


class Flaky(Target):
    """A target whose follower channels die: after `cut` output lines, or go silent
    (SIGSTOP) once, as a dead link looks from the controller."""

    def __init__(self, cut=None, freeze_after=None):
        super().__init__("flaky", LocalTransport("flaky"))
        self.cut = cut
        self.freeze_after = freeze_after
        self.spawned = []

    def spawn(self, argv):
        process = super().spawn(argv)
        self.spawned.append(process)
        flaky = self

        class Wrapped:
            lines = 0

            def readline(self, timeout):
                line = process.readline(timeout)
                Wrapped.lines += 1
                if flaky.cut and Wrapped.lines > flaky.cut:
                    return b""  # the channel closed under us
                if flaky.freeze_after and Wrapped.lines == flaky.freeze_after and len(flaky.spawned) == 1:
                    os.kill(process._process.pid, signal.SIGSTOP)
                return line

            def close(self):
                try:
                    os.kill(process._process.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                process.close()

        return Wrapped()


def run_writer(target, run_dir, lines=150, pause=0.01):
    start(target, run_dir, [sys.executable, "-c", WRITER, str(lines), str(pause)])


def expected_log(lines):
    return "".join("line %d " % i + "x" * (i % 7) + "\n" for i in range(lines)).encode()


def test_follower_resumes_after_drops_without_loss_or_repeat(tmp_path):
    flaky = Flaky(cut=6)
    run_dir = tmp_path / "run"
    run_writer(flaky, run_dir)
    follower = LogFollower(flaky, str(run_dir), min_interval=0.01, max_interval=0.05)
    handler = Collect()
    final = follower.follow(handler)
    assert final["state"] == "exited" and final["exit_code"] == 0
    assert handler.data == expected_log(150) == (run_dir / "output.log").read_bytes()
    assert follower.reconnects >= 2
    assert (False, "the monitor's channel closed") in handler.connections


def test_follower_reconnects_after_a_silent_channel(tmp_path):
    flaky = Flaky(freeze_after=4)
    run_dir = tmp_path / "run"
    run_writer(flaky, run_dir, lines=100, pause=0.02)
    follower = LogFollower(flaky, str(run_dir), stall_after=1.5, min_interval=0.01, max_interval=0.05)
    handler = Collect()
    began = time.monotonic()
    final = follower.follow(handler)
    assert final["state"] == "exited"
    assert handler.data == expected_log(100)
    assert follower.reconnects >= 1 and len(flaky.spawned) >= 2  # more, if a loaded machine stalls
    assert handler.connections[0][0] is False and handler.connections[1][0] is True
    assert time.monotonic() - began < 15


def test_follower_starts_from_an_offset(tmp_path, target):
    run_dir = tmp_path / "run"
    run_writer(target, run_dir, lines=20, pause=0)
    wait_state(target, run_dir, "exited")
    full = (run_dir / "output.log").read_bytes()
    follower = LogFollower(target, str(run_dir), offset=len(full) // 2)
    handler = Collect()
    follower.follow(handler)
    assert handler.data == full[len(full) // 2:]


def test_follower_should_stop(tmp_path, target):
    run_dir = tmp_path / "run"
    start(target, run_dir, ["sleep", "30"])
    stop_at = time.monotonic() + 1.0

    class Stopper(Collect):
        def should_stop(self):
            return time.monotonic() > stop_at

    assert LogFollower(target, str(run_dir)).follow(Stopper()) is None
    stop_run(target, str(run_dir), grace=2)


class TimesOutOnce(Target):
    """A target whose first follower start outlives its timeout (the error orch raises for
    that, whatever its wording), as a half-open SSH connection does."""

    def __init__(self, transport):
        super().__init__("slow", transport)
        self.tries = 0

    def spawn(self, argv):
        self.tries += 1
        if self.tries == 1:
            raise command_timeout("tail", "on host slow", 30, None)
        return super().spawn(argv)


def test_follower_drops_the_connection_when_its_start_timed_out(tmp_path):
    """By the error's type (CommandTimeout), not by its wording: orch's own message says
    "did not finish within", which the old text match ("timed out") missed."""
    closed = threading.Event()

    class Transport(LocalTransport):
        def close(self):
            closed.set()

    target = TimesOutOnce(Transport("slow"))
    run_dir = tmp_path / "run"
    run_writer(target, run_dir, lines=5)
    final = LogFollower(target, str(run_dir), min_interval=0.01, max_interval=0.05).follow(Collect())
    assert final["state"] == "exited" and target.tries >= 2
    assert closed.wait(5), "the timed-out connection was not dropped"
