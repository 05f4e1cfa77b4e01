"""Metric points of real trainers keep their other numbers (acc, lr, ...) and whether orch
derived their tok/s; a store made before these existed is upgraded in place, its points kept."""

from __future__ import annotations

import sqlite3

from orchestrator.runs.model import MetricPoint, RunRecord
from orchestrator.runs.store import MIGRATIONS, SCHEMA_VERSION, RunStore


def test_extra_numbers_and_derived_round_trip(tmp_path):
    with RunStore(str(tmp_path / "s.sqlite")) as store:
        record = RunRecord(run_id="r1", playbook="p.yaml", playbook_sha256="", name="p")
        store.begin(record)
        store.add_metrics("r1", [MetricPoint("dev", 1, 50, 2.1, 4096.0, 3.0, {"acc": 0.45}, True)])
        [point] = store.get("r1").metrics
    assert point.extra == {"acc": 0.45} and point.derived is True and point.drafter == 1


def test_a_version_1_store_is_upgraded_and_keeps_its_points(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    for statement in MIGRATIONS[0].split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute("INSERT INTO runs (run_id, playbook, started_at) VALUES ('old', 'p.yaml', '2026-11-01')")
    db.execute("INSERT INTO metrics (run_id, target, drafter, step, loss, tok_s, elapsed_s) "
               "VALUES ('old', 'dev', 0, 10, 3.5, 5000, 1.0)")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    with RunStore(str(path)) as store:
        [point] = store.get("old").metrics
    assert (point.step, point.loss, point.tok_s, point.extra, point.derived) == (10, 3.5, 5000, {}, False)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
