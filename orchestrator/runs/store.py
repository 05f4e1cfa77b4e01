"""The run store: every playbook run, its steps, metric series and findings, in SQLite.

Why SQLite in WAL mode: a run is written while it happens (steps as they end, metrics many
times a second) by a controller that may be killed at any moment, and read at the same time
by `orch runs list`, `orch report` or a second controller (`orch attach`). WAL gives readers
that never block the writer, and a commit is atomic: a `kill -9` mid-write loses at most the
transaction in flight, never the file. synchronous=NORMAL is durable against a crash of the
process (only an OS crash or power loss can drop the last commits), which is the failure we
expect; FULL would fsync on every metric batch for no gain here.

Tables are normalised enough to query (runs, targets, steps, metrics, findings, pins); the
free-form parts (vars, summary, launch, step data, evidence, pip freeze) are JSON columns.
The store is safe to share between threads of one process (one connection, one lock) and
between processes (SQLite's own locking, with a busy timeout).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from contextlib import contextmanager
from typing import Iterable, Iterator, Optional

from orchestrator.ground import paths
from orchestrator.ground.errors import OrchError
from orchestrator.runs.model import Finding, MetricPoint, RunRecord, StepResult, TargetInfo, now_iso

SCHEMA_VERSION = 3
BUSY_TIMEOUT_MS = 15_000

# Each entry takes the store from version i to i+1; append, never edit, once released.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE runs (
        run_id          TEXT PRIMARY KEY,
        playbook        TEXT NOT NULL,
        playbook_sha256 TEXT NOT NULL DEFAULT '',
        name            TEXT NOT NULL DEFAULT '',
        vars            TEXT NOT NULL DEFAULT '{}',
        started_at      TEXT NOT NULL,
        ended_at        TEXT,
        verdict         TEXT NOT NULL DEFAULT 'running',
        exit_code       INTEGER,
        summary         TEXT NOT NULL DEFAULT '{}',
        artifacts_dir   TEXT,
        launch          TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX runs_by_playbook ON runs(playbook, started_at);
    CREATE INDEX runs_by_start ON runs(started_at);
    CREATE TABLE targets (
        run_id        TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
        seq           INTEGER NOT NULL,
        name          TEXT NOT NULL,
        host          TEXT NOT NULL DEFAULT '',
        vmid          INTEGER,
        torch_version TEXT,
        fx_tls_state  TEXT,
        pip_freeze    TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (run_id, name)
    );
    CREATE TABLE steps (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
        name        TEXT NOT NULL,
        kind        TEXT NOT NULL,
        target      TEXT NOT NULL,
        status      TEXT NOT NULL,
        started_at  TEXT NOT NULL DEFAULT '',
        duration_s  REAL NOT NULL DEFAULT 0,
        message     TEXT NOT NULL DEFAULT '',
        data        TEXT NOT NULL DEFAULT '{}',
        UNIQUE (run_id, name, target, started_at)
    );
    CREATE TABLE metrics (
        run_id    TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
        target    TEXT NOT NULL,
        drafter   INTEGER NOT NULL,
        step      INTEGER NOT NULL,
        loss      REAL,
        tok_s     REAL,
        elapsed_s REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, target, drafter, step)
    ) WITHOUT ROWID;
    CREATE TABLE findings (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
        target      TEXT NOT NULL,
        signature   TEXT NOT NULL,
        message     TEXT NOT NULL,
        remediation TEXT NOT NULL DEFAULT '',
        evidence    TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX findings_by_run ON findings(run_id);
    CREATE TABLE pins (
        playbook TEXT PRIMARY KEY,
        run_id   TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
        pinned_at TEXT NOT NULL
    );
    """,
    # 2: real trainers' other numbers (acc, lr, ...) and whether tok/s was derived by orch
    """
    ALTER TABLE metrics ADD COLUMN extra TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE metrics ADD COLUMN derived INTEGER NOT NULL DEFAULT 0;
    """,
    # 3: acknowledged regressions (runs/acks.py), kept after they clear: who, why, when;
    #    and what each target ran on (GPUs, driver, CUDA, cgroup limits: payloads/machine.py)
    """
    ALTER TABLE targets ADD COLUMN machine TEXT NOT NULL DEFAULT '{}';
    CREATE TABLE acks (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        playbook    TEXT NOT NULL,
        metric      TEXT NOT NULL,
        run_id      TEXT NOT NULL,
        level       REAL NOT NULL,
        centre      REAL NOT NULL,
        noise       REAL NOT NULL,
        reason      TEXT NOT NULL,
        by          TEXT NOT NULL,
        at          TEXT NOT NULL,
        expires     TEXT NOT NULL,
        cleared_at  TEXT,
        cleared     TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX acks_by_playbook ON acks(playbook, metric);
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION


class StoreError(OrchError):
    """The run store could not be read or written (exit code 1, ExitCode.FAILED)."""


def _store_hint(error: sqlite3.Error) -> str:
    text = str(error).lower()
    if "locked" in text or "busy" in text:
        return (f"another process held the store's write lock for over {BUSY_TIMEOUT_MS // 1000} s: "
                "try again once it is done")
    if "readonly" in text or "read-only" in text:
        return "the store or its folder is not writable by you: fix the permissions, or set ORCH_STORE"
    if "full" in text:
        return "the disk holding the store is full"
    return ("check the file (`sqlite3 FILE 'PRAGMA integrity_check'`), or set ORCH_STORE to "
            "use another store")


def _dumps(value) -> str:
    # default=str: rendered vars may hold YAML dates or paths; a record must never fail to save.
    return json.dumps(value, sort_keys=True, default=str)


class RunStore:
    """The run history. `RunStore()` opens (and creates) the store at paths.store_path()."""

    def __init__(self, path: Optional[str] = None):
        self.path = os.path.abspath(os.path.expanduser(path or paths.store_path()))
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._lock = threading.RLock()
        try:
            # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE), so a
            # writer takes the write lock up front instead of failing half-way on upgrade.
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000,
                                       isolation_level=None, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise OrchError(f"the run store {self.path} cannot use WAL mode (got {mode!r})",
                                hint="put it on a local filesystem (set ORCH_STORE or ORCH_DATA_DIR)")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as error:
            raise OrchError(f"cannot open the run store {self.path}: {error}",
                            hint="set ORCH_STORE to another file to start a fresh store") from error

    # ------------------------------------------------------------------ plumbing
    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write transaction: all of it lands, or none of it."""
        with self._lock, self._sqlite_errors():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    def _read(self, sql: str, params: Iterable = ()) -> list[sqlite3.Row]:
        with self._lock, self._sqlite_errors():
            return self._db.execute(sql, tuple(params)).fetchall()

    @contextmanager
    def _sqlite_errors(self) -> Iterator[None]:
        """SQLite's own failures (locked past the busy timeout, a read-only or full disk, a
        damaged file) as orch's error with the store's name, never a traceback."""
        try:
            yield
        except sqlite3.Error as error:
            raise StoreError(f"the run store {self.path}: {error}", hint=_store_hint(error)) from None

    def _migrate(self) -> None:
        # Fast path without the write lock: a reader (orch runs list) never waits on a writer.
        if self._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        with self.transaction() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise OrchError(f"the run store {self.path} has schema version {version}, "
                                f"newer than this orch understands ({SCHEMA_VERSION})",
                                hint="upgrade orch, or set ORCH_STORE to use another store")
            for script in MIGRATIONS[version:]:
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
            if version != SCHEMA_VERSION:
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # ------------------------------------------------------------------ writing
    def begin(self, record: RunRecord) -> None:
        """Record a new run (normally verdict "running"), with whatever the record holds already."""
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM runs WHERE run_id=?", (record.run_id,)).fetchone():
                raise OrchError(f"run {record.run_id} is already in the run store",
                                hint="use update() or finish() for a run that was begun")
            db.execute(
                "INSERT INTO runs (run_id, playbook, playbook_sha256, name, vars, started_at,"
                " ended_at, verdict, exit_code, summary, artifacts_dir, launch)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (record.run_id, record.playbook, record.playbook_sha256 or "", record.name or "",
                 _dumps(record.vars), record.started_at, record.ended_at, record.verdict,
                 record.exit_code, _dumps(record.summary), record.artifacts_dir,
                 _dumps(record.launch)))
            self._put_targets(db, record.run_id, record.targets)
            for step in record.steps:
                self._put_step(db, record.run_id, step)
            self._put_metrics(db, record.run_id, record.metrics)
            self._put_findings(db, record.run_id, record.findings)

    def save_step(self, run_id: str, step: StepResult) -> None:
        """Save a step's result; saving the same step again (same name, target, start) updates it."""
        with self.transaction() as db:
            self._require(db, run_id)
            self._put_step(db, run_id, step)

    def add_metrics(self, run_id: str, points: list[MetricPoint]) -> None:
        """Append metric points in one transaction; a point seen again (same drafter and step,
        e.g. after `orch attach` re-read a log) replaces the old one instead of doubling it."""
        if not points:
            return
        with self.transaction() as db:
            self._require(db, run_id)
            self._put_metrics(db, run_id, points)

    def add_findings(self, run_id: str, findings: list[Finding]) -> None:
        if not findings:
            return
        with self.transaction() as db:
            self._require(db, run_id)
            self._put_findings(db, run_id, findings)

    def update(self, record: RunRecord) -> None:
        """Save what the runner learned since begin(): targets, summary, launch, vars, artifacts."""
        with self.transaction() as db:
            self._require(db, record.run_id)
            self._put_header(db, record)

    def finish(self, record: RunRecord) -> None:
        """Save the outcome (verdict, exit code, end time, summary) and everything update() saves."""
        with self.transaction() as db:
            self._require(db, record.run_id)
            self._put_header(db, record)
            db.execute("UPDATE runs SET verdict=?, exit_code=?, ended_at=? WHERE run_id=?",
                       (record.verdict, record.exit_code, record.ended_at, record.run_id))

    def pin(self, run_id: str) -> RunRecord:
        """Make this run the baseline of its playbook (replaces an earlier pin)."""
        record = self.get(run_id)
        with self.transaction() as db:
            db.execute("INSERT INTO pins (playbook, run_id, pinned_at) VALUES (?,?,?)"
                       " ON CONFLICT(playbook) DO UPDATE SET run_id=excluded.run_id,"
                       " pinned_at=excluded.pinned_at",
                       (record.playbook, record.run_id, now_iso()))
        return record

    def unpin(self, playbook: str) -> bool:
        """Forget the pinned baseline of a playbook; True when there was one."""
        keys = self._playbook_keys(playbook)
        with self.transaction() as db:
            cursor = db.execute(f"DELETE FROM pins WHERE playbook IN ({_marks(keys)})", keys)
            return cursor.rowcount > 0

    def delete(self, run_id: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM runs WHERE run_id=?", (run_id,))

    # helpers that run inside a write transaction
    @staticmethod
    def _require(db: sqlite3.Connection, run_id: str) -> None:
        if db.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is None:
            raise OrchError(f"run {run_id} is not in the run store; begin() it first")

    def _put_header(self, db: sqlite3.Connection, record: RunRecord) -> None:
        db.execute("UPDATE runs SET playbook=?, playbook_sha256=?, name=?, vars=?, summary=?,"
                   " artifacts_dir=?, launch=? WHERE run_id=?",
                   (record.playbook, record.playbook_sha256 or "", record.name or "",
                    _dumps(record.vars), _dumps(record.summary), record.artifacts_dir,
                    _dumps(record.launch), record.run_id))
        if record.targets:
            self._put_targets(db, record.run_id, record.targets)

    @staticmethod
    def _put_targets(db: sqlite3.Connection, run_id: str, targets: list[TargetInfo]) -> None:
        db.execute("DELETE FROM targets WHERE run_id=?", (run_id,))
        db.executemany(
            "INSERT INTO targets (run_id, seq, name, host, vmid, torch_version, fx_tls_state,"
            " pip_freeze, machine) VALUES (?,?,?,?,?,?,?,?,?)",
            [(run_id, seq, t.name, t.host or "", t.vmid, t.torch_version, t.fx_tls_state,
              _dumps(list(t.pip_freeze or [])), _dumps(t.machine or {}))
             for seq, t in enumerate(targets)])

    @staticmethod
    def _put_step(db: sqlite3.Connection, run_id: str, step: StepResult) -> None:
        db.execute(
            "INSERT INTO steps (run_id, name, kind, target, status, started_at, duration_s,"
            " message, data) VALUES (?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT(run_id, name, target, started_at) DO UPDATE SET kind=excluded.kind,"
            " status=excluded.status, duration_s=excluded.duration_s,"
            " message=excluded.message, data=excluded.data",
            (run_id, step.name, step.kind, step.target, step.status, step.started_at or "",
             float(step.duration_s or 0.0), step.message or "", _dumps(step.data)))

    @staticmethod
    def _put_metrics(db: sqlite3.Connection, run_id: str, points: list[MetricPoint]) -> None:
        db.executemany(
            "INSERT OR REPLACE INTO metrics (run_id, target, drafter, step, loss, tok_s, elapsed_s,"
            " extra, derived) VALUES (?,?,?,?,?,?,?,?,?)",
            [(run_id, p.target, int(p.drafter), int(p.step), p.loss, p.tok_s,
              float(p.elapsed_s or 0.0), _dumps(p.extra or {}), int(bool(p.derived)))
             for p in points])

    @staticmethod
    def _put_findings(db: sqlite3.Connection, run_id: str, findings: list[Finding]) -> None:
        db.executemany(
            "INSERT INTO findings (run_id, target, signature, message, remediation, evidence)"
            " VALUES (?,?,?,?,?,?)",
            [(run_id, f.target, f.signature, f.message, f.remediation or "",
              _dumps(list(f.evidence or []))) for f in findings])

    # ------------------------------------------------------------------ reading
    def get(self, ref: str, *, metrics: bool = True) -> RunRecord:
        """A run by full id, unique id prefix, "last" (newest) or "last~N" (N runs before it)."""
        return self._load(self.resolve(ref), metrics=metrics)

    def resolve(self, ref: str) -> str:
        """The full run id that REF names; OrchError with a sentence when it names none or many."""
        ref = (ref or "").strip()
        if not ref:
            raise OrchError("no run given", hint="name a run by its id, an id prefix, or 'last'")
        if ref == "last" or ref.startswith("last~"):
            # newest first: by start (whole seconds), then by the order the runs were begun
            # (rowid), not by the run id, whose tail is random within a second
            back = 0
            if ref != "last":
                try:
                    back = int(ref[5:])
                except ValueError:
                    raise OrchError(f"{ref!r} is not a run reference",
                                    hint="use 'last', or 'last~N' for the Nth run before the last")
            rows = self._read("SELECT run_id FROM runs ORDER BY started_at DESC, rowid DESC"
                              " LIMIT 1 OFFSET ?", (back,))
            if not rows:
                raise OrchError("the run store has no runs yet" if back == 0 else
                                f"there is no run {ref} (fewer than {back + 1} runs recorded)",
                                hint="run a playbook with `orch run PLAYBOOK` first")
            return rows[0]["run_id"]
        exact = self._read("SELECT run_id FROM runs WHERE run_id=?", (ref,))
        if exact:
            return exact[0]["run_id"]
        # Prefix match with LIKE needs its wildcards escaped: a ref is user input.
        pattern = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._read("SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\'"
                          " ORDER BY run_id LIMIT 6", (pattern,))
        if not rows:
            raise OrchError(f"no run {ref!r} in the run store ({self.path})",
                            hint="`orch runs list` shows the recorded runs")
        if len(rows) > 1:
            shown = ", ".join(r["run_id"] for r in rows[:5]) + (", ..." if len(rows) > 5 else "")
            raise OrchError(f"{ref!r} matches more than one run: {shown}",
                            hint="give more characters of the run id")
        return rows[0]["run_id"]

    def list(self, playbook: Optional[str] = None, last: Optional[int] = None) -> list[RunRecord]:
        """Runs, newest first, without their metric series (steps, targets, findings included)."""
        sql, params = "SELECT run_id FROM runs", []
        if playbook:
            keys = self._playbook_keys(playbook)
            sql += f" WHERE playbook IN ({_marks(keys)}) OR name=?"
            params = [*keys, playbook]
        sql += " ORDER BY started_at DESC, rowid DESC"
        if last is not None:
            sql += " LIMIT ?"
            params.append(max(0, int(last)))
        return [self._load(row["run_id"], metrics=False) for row in self._read(sql, params)]

    def baseline(self, playbook: str, *, exclude: Optional[str] = None) -> Optional[RunRecord]:
        """What a new run of PLAYBOOK is compared with: its pinned run, else its last ok run."""
        keys = self._playbook_keys(playbook)
        pinned = self._read(f"SELECT run_id FROM pins WHERE playbook IN ({_marks(keys)})"
                            " ORDER BY pinned_at DESC LIMIT 1", keys)
        if pinned and pinned[0]["run_id"] != exclude:
            return self._load(pinned[0]["run_id"], metrics=True)
        rows = self._read(f"SELECT run_id FROM runs WHERE playbook IN ({_marks(keys)})"
                          " AND verdict='ok' AND run_id IS NOT ?"
                          " ORDER BY started_at DESC, rowid DESC LIMIT 1", [*keys, exclude])
        return self._load(rows[0]["run_id"], metrics=True) if rows else None

    def ok_runs(self, playbook: str, *, exclude: Optional[str] = None,
                last: int = 200) -> Iterator[RunRecord]:
        """The newest ok runs of PLAYBOOK (without their metric series): the baseline
        candidates, newest first, each read only when the caller gets to it."""
        keys = self._playbook_keys(playbook)
        rows = self._read(f"SELECT run_id FROM runs WHERE playbook IN ({_marks(keys)})"
                          " AND verdict='ok' AND run_id IS NOT ?"
                          " ORDER BY started_at DESC, rowid DESC LIMIT ?", [*keys, exclude, last])
        return (self._load(row["run_id"], metrics=False) for row in rows)

    def pinned(self, playbook: str) -> Optional[str]:
        keys = self._playbook_keys(playbook)
        rows = self._read(f"SELECT run_id FROM pins WHERE playbook IN ({_marks(keys)})", keys)
        return rows[0]["run_id"] if rows else None

    def pins(self) -> dict[str, str]:
        """playbook -> pinned run id."""
        return {row["playbook"]: row["run_id"] for row in self._read("SELECT * FROM pins")}

    # ------------------------------------------------------------------ acknowledgements
    def add_ack(self, ack: dict) -> int:
        """Record an acknowledgement (runs/acks.py Ack fields); an active one of the same
        playbook and metric is cleared as replaced, in the same transaction."""
        with self.transaction() as db:
            db.execute("UPDATE acks SET cleared_at=?, cleared=? WHERE playbook=? AND metric=?"
                       " AND cleared_at IS NULL",
                       (ack["at"], f"replaced by {ack['by']}'s acknowledgement", ack["playbook"],
                        ack["metric"]))
            fields = [k for k in ack if k != "id"]
            cursor = db.execute(f"INSERT INTO acks ({', '.join(fields)}) VALUES ({_marks(fields)})",
                                [ack[k] for k in fields])
            return cursor.lastrowid

    def acks(self, playbook: Optional[str] = None, *, cleared: bool = False) -> list[dict]:
        """Acknowledgements, newest first: the active ones, or with CLEARED all of them."""
        sql, params = "SELECT * FROM acks WHERE 1=1", []
        if playbook:
            keys = self._playbook_keys(playbook)
            sql += f" AND playbook IN ({_marks(keys)})"
            params += keys
        if not cleared:
            sql += " AND cleared_at IS NULL"
        return [dict(row) for row in self._read(sql + " ORDER BY at DESC, id DESC", params)]

    def clear_ack(self, ack_id: int, why: str, at: str) -> bool:
        """Mark an active acknowledgement cleared (kept, with WHY); False if it was not active."""
        with self.transaction() as db:
            cursor = db.execute("UPDATE acks SET cleared_at=?, cleared=? WHERE id=?"
                                " AND cleared_at IS NULL", (at, why, ack_id))
            return cursor.rowcount > 0

    def metric_count(self, run_id: str) -> int:
        return self._read("SELECT count(*) AS n FROM metrics WHERE run_id=?", (run_id,))[0]["n"]

    def integrity_check(self) -> str:
        return self._read("PRAGMA integrity_check")[0][0]

    @staticmethod
    def _playbook_keys(playbook: str) -> list[str]:
        # Runs record the playbook path as given; accept it as typed or as an absolute path,
        # so `--playbook playbooks/dflash.yaml` finds runs started from another directory.
        keys = [playbook]
        absolute = os.path.abspath(os.path.expanduser(playbook))
        if absolute not in keys:
            keys.append(absolute)
        return keys

    def _load(self, run_id: str, *, metrics: bool) -> RunRecord:
        with self._lock, self._sqlite_errors():
            # One read transaction so the run, its steps and metrics are one consistent snapshot.
            self._db.execute("BEGIN")
            try:
                row = self._db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
                if row is None:
                    raise OrchError(f"no run {run_id!r} in the run store ({self.path})")
                targets = self._db.execute("SELECT * FROM targets WHERE run_id=? ORDER BY seq",
                                           (run_id,)).fetchall()
                steps = self._db.execute("SELECT * FROM steps WHERE run_id=? ORDER BY id",
                                         (run_id,)).fetchall()
                findings = self._db.execute("SELECT * FROM findings WHERE run_id=? ORDER BY id",
                                            (run_id,)).fetchall()
                points = self._db.execute(
                    "SELECT * FROM metrics WHERE run_id=? ORDER BY target, drafter, step",
                    (run_id,)).fetchall() if metrics else []
            finally:
                self._db.execute("COMMIT")
        return RunRecord(
            run_id=row["run_id"], playbook=row["playbook"], playbook_sha256=row["playbook_sha256"],
            name=row["name"], vars=json.loads(row["vars"]), started_at=row["started_at"],
            ended_at=row["ended_at"], verdict=row["verdict"], exit_code=row["exit_code"],
            summary=json.loads(row["summary"]), artifacts_dir=row["artifacts_dir"],
            launch=json.loads(row["launch"]),
            targets=[TargetInfo(name=t["name"], host=t["host"], vmid=t["vmid"],
                                torch_version=t["torch_version"], fx_tls_state=t["fx_tls_state"],
                                pip_freeze=json.loads(t["pip_freeze"]),
                                machine=json.loads(t["machine"])) for t in targets],
            steps=[StepResult(name=s["name"], kind=s["kind"], target=s["target"],
                              status=s["status"], started_at=s["started_at"],
                              duration_s=s["duration_s"], message=s["message"],
                              data=json.loads(s["data"])) for s in steps],
            findings=[Finding(target=f["target"], signature=f["signature"], message=f["message"],
                              remediation=f["remediation"], evidence=json.loads(f["evidence"]))
                      for f in findings],
            metrics=[MetricPoint(target=m["target"], drafter=m["drafter"], step=m["step"],
                                 loss=m["loss"], tok_s=m["tok_s"], elapsed_s=m["elapsed_s"],
                                 extra=json.loads(m["extra"]), derived=bool(m["derived"]))
                     for m in points],
        )


def _marks(values: list) -> str:
    return ",".join("?" * len(values))
