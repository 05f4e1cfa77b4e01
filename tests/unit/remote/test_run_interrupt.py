"""Ctrl-C on `orch run` tells the truth about what runs on the target (local transport, real
processes, the real launcher payload): before the launch, nothing was launched and the record
is finished as interrupted; after it, the run goes on and the record stays running for
`orch attach`; in between (Ctrl-C while the launch step is in flight), whatever orch says
matches what the target has."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from orchestrator.playbook import engine
from orchestrator.remote.payload_api import launcher, stop_run
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.runs.store import RunStore
from tests.support.interrupts import GOES_ON, NOTHING, interrupt_when, playbook  # noqa: F401 (fixtures among them)


def last_record():
    with RunStore() as store:
        return store.get("last")


def state_of(playbook):
    return launcher(Target("dev", LocalTransport("here")), "status", str(playbook / "run"))["state"]


def test_ctrl_c_before_the_launch_says_nothing_runs_and_finishes_the_record(playbook):
    code, output = interrupt_when(playbook, "> dev 1/3", "-e", "before=3")
    assert code == 130, output
    assert NOTHING in output and GOES_ON not in output
    record = last_record()
    assert (record.verdict, record.exit_code) == ("interrupted", 130) and record.ended_at
    assert state_of(playbook) == "missing"


def test_ctrl_c_while_monitoring_leaves_the_run_going(playbook):
    try:
        code, output = interrupt_when(playbook, "> dev 3/3")
        assert code == 130, output
        assert GOES_ON in output and str(playbook / "run") in output
        assert last_record().verdict == "running"
        assert state_of(playbook) == "running"
    finally:
        stop_run(Target("dev", LocalTransport("here")), str(playbook / "run"), grace=2)


@pytest.mark.parametrize("attempt", range(3))
def test_ctrl_c_as_the_launch_starts_says_what_the_target_has(playbook, attempt):
    try:
        code, output = interrupt_when(playbook, "> dev 2/3")
        assert code == 130, output
        record = last_record()
        if GOES_ON in output:
            assert state_of(playbook) in ("running", "starting")
            assert record.verdict == "running"
            assert record.launch["targets"]["dev"]["run_dir"] == str(playbook / "run")
        else:
            assert NOTHING in output, output
            assert state_of(playbook) == "missing"
            assert record.verdict == "interrupted"
    finally:
        if state_of(playbook) != "missing":
            stop_run(Target("dev", LocalTransport("here")), str(playbook / "run"), grace=2)


class _Recorder:
    """A recorder with one launch in flight and nothing known about it yet."""

    def __init__(self, target):
        self.target, self.noted = target, {}

    def launches_starting(self):
        return {"dev": (self.target, "/run/dir")}

    def launch_info(self, name):
        return None

    def note_launch(self, name, info):
        self.noted[name] = info


def test_a_wedged_connection_after_ctrl_c_costs_a_bounded_wait_not_a_hang(monkeypatch):
    """Ctrl-C can land inside paramiko while it holds its send lock: every later request on
    that connection then waits for ever. Asking the in-flight launch whether it started must
    give up ("it may have started") instead of hanging `orch run` (seen: 72 minutes)."""
    released = threading.Event()
    monkeypatch.setattr(engine, "launcher", lambda *a, **k: released.wait() and {})
    monkeypatch.setattr(engine, "ASK_AFTER_INTERRUPT_S", 0.5)
    recorder = _Recorder(Target("dev", LocalTransport("here")))
    started = time.monotonic()
    try:
        launched = engine.Engine._launched_when_interrupted(SimpleNamespace(recorder=recorder))
    finally:
        released.set()
    assert time.monotonic() - started < 5
    assert launched == {"dev": "/run/dir (it may have started: asking failed)"}


def test_an_answer_after_ctrl_c_is_still_taken(monkeypatch):
    monkeypatch.setattr(engine, "launcher",
                        lambda *a, **k: {"state": "running", "pid": 42, "started_at": "t"})
    recorder = _Recorder(Target("dev", LocalTransport("here")))
    launched = engine.Engine._launched_when_interrupted(SimpleNamespace(recorder=recorder))
    assert launched == {"dev": "/run/dir"} and recorder.noted["dev"]["pid"] == 42
