"""The monitor step without a trainer: its plan, what it needs before it can follow, what it
records, and how the monitor's verdict becomes the step's outcome. (Following real logs is
tested in tests/unit/watch/test_monitor_follow.py and tests/unit/runs/test_controller.py.)"""

from __future__ import annotations

import pytest

from orchestrator.ground.errors import ConfigError
from orchestrator.watch.classify import Verdict
from orchestrator.runs.model import Finding
from orchestrator.playbook.steps import monitor as monitor_step
from orchestrator.watch.torchrun import RANK_LOGS
from tests.support.step_fakes import planned, harness

TORCHRUN = """\
    name: t
    targets: [dev]
    steps:
      - launch: {command: [train.py], torchrun: {nproc_per_node: 2}}
      - monitor: {hang_after: 60, degraded_below: 3000, watch_for: 30}
"""


def test_plan_knows_an_earlier_torchrun_launch(tmp_path):
    plan = planned(tmp_path, TORCHRUN, index=1)
    assert plan == [
        "follow <the last launch's run directory>/output.log and every rank's log by byte "
        "offset (tail payload), lines recognised by shape (format auto); hang after 60 s, degraded under 3,000 tok/s, "
        "watch 30 s, then leave it running"]


def test_nothing_launched_nothing_to_follow(tmp_path):
    h = harness(tmp_path, "name: t\ntargets: [dev]\nsteps:\n  - monitor: {}\n")
    record = h.record()
    assert record.steps[0].status == "failed"
    assert record.steps[0].message == ("monitor: nothing to follow: no launch step ran on dev "
                                       "before this one (or give run_dir:)")
    assert "note_monitor" not in h.recorder.names()


def test_format_regex_needs_a_metric_regex_at_load_time(tmp_path):
    with pytest.raises(ConfigError) as error:
        harness(tmp_path, "name: t\nsteps:\n  - monitor: {format: regex}\n")
    assert str(error.value) == (f"{tmp_path}/playbook.yaml:3:23: format regex needs a metric_regex")


def test_the_monitor_verdict_becomes_the_outcome(tmp_path, monkeypatch):
    seen = {}

    def fake_monitor_run(target, run_dir, settings, **kw):
        seen.update(kw, run_dir=run_dir, follow=settings.follow, gpus=settings.gpus)
        finding = Finding(target=target.name, signature="hang", message="no step for 60 s")
        return (Verdict("hang", "hung at step 3", [finding], {"total_tok_s": 10.0}),
                {"verdict": "hang", "run_dir": run_dir})
    monkeypatch.setattr(monitor_step, "monitor_run", fake_monitor_run)
    h = harness(tmp_path, TORCHRUN, targets=["dev"])
    h.host.on_payload("launcher", {"run_dir": "/runs/r1", "pid": 9})
    record = h.record()
    assert seen["run_dir"] == "/runs/r1" and seen["gpus"] == [0, 1]
    assert seen["follow"] == list(RANK_LOGS)            # torchrun: every rank's log
    assert seen["cli"] == "orch -i inv.yaml" and seen["rerun"] == "playbook.yaml"
    assert seen["recorder"] is h.recorder and seen["reporter"] is h.reporter
    monitor = record.steps[1]
    assert (monitor.status, monitor.message, monitor.data["verdict"]) == ("failed", "hung at step 3", "hang")
    assert record.verdict == "hang" and record.exit_code == 11
    assert [f.signature for f in record.findings] == ["hang"]
    entry = record.launch["targets"]["dev"]
    assert entry["monitor_step"] == 1 and entry["monitor"]["hang_after"] == 60
