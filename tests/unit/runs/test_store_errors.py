"""SQLite's failures in the run store reach the user as one sentence and exit code 1, never a
traceback (a store locked past the busy timeout; a file damaged under a running orch)."""

from __future__ import annotations

import sqlite3

from click.testing import CliRunner

from orchestrator.cli.app import main
from orchestrator.runs import store as store_module
from orchestrator.runs.model import RunRecord
from orchestrator.runs.store import RunStore


def test_a_locked_store_is_a_sentence_and_exit_1(tmp_path, monkeypatch):
    path = tmp_path / "runs.sqlite"
    monkeypatch.setenv("ORCH_STORE", str(path))
    with RunStore() as store:
        store.begin(RunRecord(run_id="20261201-000000-aaaaaa", playbook="p.yaml", playbook_sha256="",
                              name="p", started_at="2026-12-01T00:00:00+00:00", verdict="ok"))
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 200)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")   # a writer that never lets go
    try:
        result = CliRunner().invoke(main, ["runs", "pin", "last"])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.exit_code == 1 and not isinstance(result.exception, sqlite3.Error), result.exception
    assert f"the run store {path}: database is locked" in result.output
    assert "write lock" in result.output
