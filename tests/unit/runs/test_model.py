"""The monitor's part of a run record, typed: MonitorSummary, WorkerSummary and the record's
accessors read old records (the explain corpus's real ones, dicts missing keys) and give the
JSON back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.runs.model import MonitorSummary, RunRecord, RunState, WorkerSummary, recorded_monitor_settings

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "explain_corpus"
RECORDS = sorted(CORPUS.glob("*/record.json"))


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.parent.name)
def test_real_records_load_and_round_trip(path):
    data = json.loads(path.read_text())
    record = RunRecord.from_dict(data)
    monitors = record.monitors()
    assert list(monitors) == list(data["summary"]["monitor"])
    for target, summary in monitors.items():
        stored = data["summary"]["monitor"][target]
        assert summary.to_dict() == stored and list(summary.to_dict()) == list(stored)
        assert summary.verdict == stored["verdict"] and summary.workers == stored["workers"]
        assert record.monitor(target) == summary
    assert list(record.launches()) == list(data["launch"]["targets"])


def test_a_summary_older_than_its_keys_reads_as_defaults():
    summary = MonitorSummary.from_dict({"total_tok_s": 900.0, "drafters": {"0": {}, 1: {"tok_s": 5}}})
    assert summary.verdict is None and summary.workers is None and summary.gpu_series == ()
    assert summary.drafters == {"0": WorkerSummary(), "1": WorkerSummary(tok_s=5)}
    assert summary.worker_count() == 2
    assert MonitorSummary.from_dict({"drafters_expected": 4}).worker_count() == 4
    assert MonitorSummary.from_dict("not a dict") == MonitorSummary()


def test_unknown_keys_are_kept_and_wrong_types_read_as_defaults():
    summary = MonitorSummary.from_dict({"verdict": 3, "drafters_ok": True, "future_key": [1], "exit_code": 0})
    assert summary.verdict is None and summary.drafters_ok is None
    assert summary.extra == {"future_key": [1], "exit_code": 0}
    assert summary.to_dict()["future_key"] == [1]


def test_a_made_summary_round_trips():
    made = MonitorSummary(verdict="ok", workers="rank", drafters={"0": WorkerSummary(step=3, tok_s=10.0)},
                          drafters_ok=1, total_tok_s=10.0, extra={"lines": 7})
    again = MonitorSummary.from_dict(json.loads(json.dumps(made.to_dict())))
    assert again == made


def test_a_worker_writes_log_points_only_when_steps_were_counted():
    assert "log_points" not in WorkerSummary(step=3).to_dict()
    assert WorkerSummary(log_points=5).to_dict()["log_points"] == 5
    assert list(WorkerSummary().to_dict()) == ["step", "loss", "tok_s", "status", "error"]


def test_a_record_without_monitor_or_launches():
    record = RunRecord(run_id="r", playbook="p", playbook_sha256="", name="n",
                       summary={"monitor": {"a": "junk"}}, launch={"targets": {"a": None, "b": {"pid": 1}}})
    assert record.monitors() == {} and record.monitor("a") is None
    assert record.launches() == {"b": {"pid": 1}}
    assert RunRecord(run_id="r", playbook="p", playbook_sha256="", name="n").launches() == {}
    assert recorded_monitor_settings({"monitor": {"hang_after": 5}}) == {"hang_after": 5}
    assert recorded_monitor_settings({}) == {}


def test_run_states_are_their_strings():
    assert RunState.of("vanished") == "vanished" and f"{RunState.of('vanished')}" == "vanished"
    assert json.dumps({"state": RunState.EXITED}) == '{"state": "exited"}'
    assert "exited" in {RunState.EXITED} and RunState.of("odd") == "odd"
