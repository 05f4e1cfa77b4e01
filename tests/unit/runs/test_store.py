"""The run store: round trips, references, baselines, concurrency and a kill -9 mid-write."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from orchestrator.ground.errors import OrchError
from orchestrator.runs.model import Finding, MetricPoint, RunRecord, StepResult, TargetInfo
from orchestrator.runs.store import SCHEMA_VERSION, RunStore


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("ORCH_STORE", raising=False)
    with RunStore() as s:
        yield s


def make_record(run_id: str, *, playbook="playbooks/dflash.yaml", verdict="running",
                started_at="2026-11-29T01:00:00+00:00", **kw) -> RunRecord:
    return RunRecord(run_id=run_id, playbook=playbook, playbook_sha256="ab" * 32, name="dflash",
                     vars={"slow_ms": 0, "when": {"nested": [1, 2]}}, started_at=started_at,
                     verdict=verdict, **kw)


def test_default_path_wal_and_schema_version(store, tmp_path):
    assert store.path == str(tmp_path / "data" / "runs.sqlite")
    db = sqlite3.connect(store.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "targets", "steps", "metrics", "findings", "pins"} <= tables


def test_orch_store_env_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_STORE", str(tmp_path / "elsewhere" / "x.sqlite"))
    with RunStore() as s:
        assert s.path == str(tmp_path / "elsewhere" / "x.sqlite")
    assert (tmp_path / "elsewhere" / "x.sqlite").exists()


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    RunStore(str(path)).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(OrchError, match="newer than this orch"):
        RunStore(str(path))


def test_full_round_trip(store):
    record = make_record("20261129-010000-aaaaaa")
    store.begin(record)
    assert store.get("20261129-010000-aaaaaa").verdict == "running"
    step = StepResult(name="bootstrap", kind="bootstrap", target="sb1-200", status="running",
                      started_at="2026-11-29T01:00:01+00:00")
    store.save_step(record.run_id, step)
    step.status, step.duration_s, step.data = "changed", 12.5, {"freeze": ["torch==2.13.0"]}
    store.save_step(record.run_id, step)       # same step again: updated, not doubled
    store.save_step(record.run_id, StepResult(name="launch", kind="launch", target="sb1-200",
                                              status="ok", started_at="2026-11-29T01:00:14+00:00"))
    store.add_metrics(record.run_id, [MetricPoint("sb1-200", d, s, loss=3.0 - s / 100,
                                                  tok_s=5000.0 + s, elapsed_s=s / 10)
                                      for d in range(3) for s in range(0, 50, 10)])
    store.add_metrics(record.run_id, [MetricPoint("sb1-200", 0, 0, loss=9.0, tok_s=1.0)])  # re-read
    store.add_findings(record.run_id, [Finding("sb1-200", "fx-race", "race in drafter 1",
                                               "orch patch fx-tls apply", ["line a", "line b"])])
    record.targets = [TargetInfo("sb1-200", "sb1", 200, "2.13.0+cpu", "patched",
                                 ["torch==2.13.0+cpu", "numpy==2.1.0"])]
    record.summary = {"total_tok_s": 15000.0, "per_drafter_tok_s": {"0": 5000.0}}
    record.artifacts_dir = "/tmp/x"
    record.launch = {"pid_file": "/run/x.pid"}
    store.update(record)
    record.verdict, record.exit_code, record.ended_at = "ok", 0, "2026-11-29T01:05:00+00:00"
    store.finish(record)

    got = store.get(record.run_id[:12])
    assert got.verdict == "ok" and got.exit_code == 0 and got.ended_at == record.ended_at
    assert got.vars == record.vars and got.summary == record.summary and got.launch == record.launch
    assert got.targets == record.targets
    assert [(s.name, s.status, s.duration_s) for s in got.steps] == [
        ("bootstrap", "changed", 12.5), ("launch", "ok", 0.0)]
    assert got.steps[0].data == {"freeze": ["torch==2.13.0"]}
    assert len(got.metrics) == 15
    assert got.metrics[0].loss == 9.0 and got.metrics[0].tok_s == 1.0
    assert got.findings[0].evidence == ["line a", "line b"]
    listed = store.list()
    assert len(listed) == 1 and listed[0].metrics == [] and listed[0].findings


def test_writes_to_an_unknown_run_are_refused(store):
    with pytest.raises(OrchError, match="begin"):
        store.add_metrics("nope", [MetricPoint("t", 0, 0)])


def test_references(store):
    for i, rid in enumerate(["20261129-010000-abc111", "20261129-020000-abc222",
                             "20261130-010000-def333"]):
        store.begin(make_record(rid, started_at=f"2026-11-{29 + (i == 2)}T0{i + 1}:00:00+00:00"))
    assert store.get("last").run_id == "20261130-010000-def333"
    assert store.get("last~1").run_id == "20261129-020000-abc222"
    assert store.get("20261130").run_id == "20261130-010000-def333"
    with pytest.raises(OrchError, match="more than one run"):
        store.get("20261129")
    with pytest.raises(OrchError, match="no run"):
        store.get("1999")
    with pytest.raises(OrchError, match="no run"):
        store.get("2026%")           # LIKE wildcards in a ref are literal
    with pytest.raises(OrchError, match="fewer than"):
        store.get("last~7")


def test_of_two_runs_started_in_one_second_the_later_one_is_last(store):
    # started_at has one-second steps; the tie was broken by the run id's random part, so
    # `orch runs show last` named the earlier of two quick runs half the time
    second = "2026-11-29T01:00:00+00:00"
    store.begin(make_record("20261129-010000-ffffff", started_at=second))
    store.begin(make_record("20261129-010000-000000", started_at=second))
    assert store.get("last").run_id == "20261129-010000-000000"
    assert store.get("last~1").run_id == "20261129-010000-ffffff"
    assert [r.run_id for r in store.list()] == ["20261129-010000-000000", "20261129-010000-ffffff"]


def test_empty_store_last(store):
    with pytest.raises(OrchError, match="no runs yet"):
        store.get("last")


def test_list_filters_and_limits(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i in range(5):
        store.begin(make_record(f"r{i}", started_at=f"2026-11-29T0{i}:00:00+00:00",
                                playbook="a.yaml" if i % 2 else os.path.abspath("b.yaml")))
    assert [r.run_id for r in store.list()] == ["r4", "r3", "r2", "r1", "r0"]
    assert [r.run_id for r in store.list(last=2)] == ["r4", "r3"]
    assert [r.run_id for r in store.list(playbook="a.yaml")] == ["r3", "r1"]
    assert [r.run_id for r in store.list(playbook="b.yaml")] == ["r4", "r2", "r0"]  # relative == absolute


def test_baseline_is_pinned_else_last_ok(store):
    store.begin(make_record("r1", verdict="ok", started_at="2026-11-27T00:00:00+00:00"))
    store.begin(make_record("r2", verdict="ok", started_at="2026-11-28T00:00:00+00:00"))
    store.begin(make_record("r3", verdict="degraded", started_at="2026-11-29T00:00:00+00:00"))
    store.begin(make_record("x1", verdict="ok", playbook="other.yaml"))
    assert store.baseline("playbooks/dflash.yaml").run_id == "r2"
    assert store.baseline("playbooks/dflash.yaml", exclude="r2").run_id == "r1"
    store.pin("r1")
    assert store.baseline("playbooks/dflash.yaml").run_id == "r1"
    assert store.pinned("playbooks/dflash.yaml") == "r1"
    store.pin("r3")                                   # a new pin replaces the old one
    assert store.baseline("playbooks/dflash.yaml").run_id == "r3"
    assert store.unpin("playbooks/dflash.yaml") is True
    assert store.baseline("playbooks/dflash.yaml").run_id == "r2"
    assert store.baseline("never.yaml") is None


def test_threads_share_one_store(store):
    store.begin(make_record("r"))

    def hammer(drafter: int) -> None:
        for s in range(100):
            store.add_metrics("r", [MetricPoint("t", drafter, s, tok_s=1.0)])
    threads = [threading.Thread(target=hammer, args=(d,)) for d in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.metric_count("r") == 400


def test_two_processes_write_at_once(tmp_path):
    path = str(tmp_path / "s.sqlite")
    with RunStore(path) as s:
        s.begin(make_record("r"))
    code = textwrap.dedent(f"""
        import sys
        from orchestrator.runs.store import RunStore
        from orchestrator.runs.model import MetricPoint
        s = RunStore({path!r})
        d = int(sys.argv[1])
        for step in range(200):
            s.add_metrics("r", [MetricPoint("t", d, step, tok_s=1.0)])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(d)]) for d in range(3)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    with RunStore(path) as s:
        assert s.metric_count("r") == 600


HAMMER = """
import sys
from orchestrator.runs.store import RunStore
from orchestrator.runs.model import MetricPoint, RunRecord
store = RunStore(sys.argv[1])
store.begin(RunRecord(run_id="victim", playbook="p.yaml", playbook_sha256="", name="p"))
print("ready", flush=True)
step = 0
while True:
    store.add_metrics("victim", [MetricPoint("t", d, step + i, loss=1.0, tok_s=2.0)
                                 for i in range(50) for d in range(3)])
    step += 50
"""


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.8])
def test_kill_9_during_writes_leaves_a_readable_store(tmp_path, delay):
    path = str(tmp_path / "victim.sqlite")
    proc = subprocess.Popen([sys.executable, "-c", HAMMER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # The WAL and shm files are left behind as a killed process leaves them; opening recovers.
    with RunStore(path) as s:
        assert s.integrity_check() == "ok"
        record = s.get("victim")
        count = s.metric_count("victim")
        assert count > 0 and count % 150 == 0, "a batch is all in or all out"
        assert len(record.metrics) == count
        # And the store takes writes again.
        s.add_metrics("victim", [MetricPoint("t", 9, 0)])
        assert s.metric_count("victim") == count + 1


def test_begin_twice_is_a_clear_error(store):
    store.begin(make_record("r"))
    with pytest.raises(OrchError, match="already in the run store"):
        store.begin(make_record("r"))
