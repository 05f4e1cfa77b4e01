"""The run recorder and the reporter interface the steps and the engine talk to."""

from __future__ import annotations

import inspect

from orchestrator.mcp.tools import LiveReporter
from orchestrator.cli.screens.run import ConsoleReporter
from orchestrator.runs.model import Finding, RunRecord, StepResult, TargetInfo
from orchestrator.runs.recorder import RunRecorder, masked
from orchestrator.playbook.steps.base import Reporter
from tests.support.step_fakes import FakeReporter, harness


class FakeStore:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def _record() -> RunRecord:
    return RunRecord(run_id="r1", playbook="/p.yaml", playbook_sha256="", name="t",
                     targets=[TargetInfo(name="dev", host="h", vmid=200)], launch={"targets": {}})


def _positional(function) -> list[str]:
    return [p.kind for p in inspect.signature(function).parameters.values()]


def test_the_console_implements_the_reporter_interface():
    members = [name for name, value in vars(Reporter).items()
               if callable(value) and not name.startswith("_")]
    members += [name for base in Reporter.__mro__[1:] for name, value in vars(base).items()
                if callable(value) and not name.startswith("_") and name not in members]
    assert {"run_started", "step_finished", "monitor_started", "log_line", "note"} <= set(members)
    for implementation in (ConsoleReporter, FakeReporter):
        for name in members:
            method = getattr(implementation, name, None)
            assert method is not None, f"{implementation.__name__} lacks {name}"
            assert _positional(method) == _positional(getattr(Reporter, name)), name
    # the MCP server's reporter keeps what it needs and ignores the rest
    assert all(callable(getattr(LiveReporter(), name)) for name in members)


def test_recorder_saves_as_it_goes_and_summarizes():
    store = FakeStore()
    recorder = RunRecorder("r1", store)
    record = _record()
    recorder.begin(record)
    recorder.save_step(StepResult(name="s", kind="shell", target="dev", status="ok"))
    recorder.add_findings([Finding(target="dev", signature="hang", message="m")])
    recorder.note_launch("dev", {"run_dir": "/runs/r1", "pid": 3})
    recorder.note_monitor("dev", 2, {"hang_after": 60})
    recorder.note_monitor_result("dev", {"total_tok_s": 900.0, "drafters": {"0": {}}, "drafters_ok": 1})
    finished = recorder.finish("ok", 0, {"dev": {"verdict": "ok", "failed_step": None}})
    assert [c[0] for c in store.calls] == ["begin", "save_step", "add_findings", "update", "update",
                                           "update", "finish"]
    assert finished is record and record.ended_at
    assert record.launch["targets"]["dev"] == {"run_dir": "/runs/r1", "pid": 3,
                                               "monitor": {"hang_after": 60}, "monitor_step": 2}
    assert record.summary == {"targets": {"dev": {"verdict": "ok", "failed_step": None}},
                              "monitor": {"dev": {"total_tok_s": 900.0, "drafters": {"0": {}},
                                                  "drafters_ok": 1}},
                              "total_tok_s": 900.0, "drafters": {"0": {}}, "drafters_ok": 1}
    assert len(record.steps) == 1 and len(record.findings) == 1


def test_recorder_without_a_store_keeps_it_in_memory_and_resume_names_the_controller():
    recorder = RunRecorder("r1")
    record = _record()
    recorder.resume(record, {"dev": {"run_dir": "/runs/r1"}}, controller={"pid": 1, "attached": True})
    assert recorder.launch_info("dev") == {"run_dir": "/runs/r1"}
    assert recorder.target_info("dev") is record.targets[0]
    assert record.launch["controller"] == {"pid": 1, "attached": True}
    store = FakeStore()
    live = RunRecorder("r1", store)
    live.resume(_record(), {}, controller={"pid": 2})
    assert [c[0] for c in store.calls] == ["update"]
    replay = RunRecorder("r1", FakeStore())
    replay.resume(_record(), {})
    assert replay.store.calls == []


def test_recorded_vars_hide_secrets():
    assert masked({"HF_TOKEN": "x", "steps": 5, "nested": {"api_key": "y", "list": [1]}}) == \
        {"HF_TOKEN": "***", "steps": 5, "nested": {"api_key": "***", "list": [1]}}


def test_the_engine_records_vars_masked_and_the_run_for_attach(tmp_path):
    h = harness(tmp_path, "name: t\ntargets: [dev]\nvars: {HF_TOKEN: s3cret, n: 2}\n"
                          "steps:\n  - shell: [echo, '{{ n }}']\n")
    h.host.on_argv(["echo"], stdout=b"2\n")
    record = h.record()
    assert record.vars == {"HF_TOKEN": "***", "n": 2}
    assert record.launch["cli"] == "orch -i inv.yaml"
    assert record.launch["inventory"] == str(tmp_path / "inv.yaml")
    assert h.reporter.events[0] == ("run_started", record.run_id, ["dev"])
    assert h.reporter.events[-1] == ("run_finished", "ok", 0)


def test_each_monitor_of_a_target_keeps_its_own_summary():
    recorder = RunRecorder("r1")
    recorder.begin(_record())
    recorder.note_monitor("dev", 2, {"format": "auto"})
    recorder.note_monitor_result("dev", {"verdict": "ok", "total_tok_s": 10.0})
    recorder.note_monitor("dev", 4, {"format": "auto"})
    recorder.note_monitor_result("dev", {"verdict": "hang", "total_tok_s": None})
    record = recorder.finish("hang", 11, {"dev": {"verdict": "hang"}})
    assert record.summary["monitor"]["dev"]["verdict"] == "hang"
    assert [(m["step"], m["verdict"]) for m in record.summary["monitors"]["dev"]] == [(2, "ok"), (4, "hang")]
