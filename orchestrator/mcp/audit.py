"""The audit trail of MCP tool calls: one row per call in the run store's SQLite file.

A table of its own (created on first use, `IF NOT EXISTS`), written through the store's
connection and lock, so it shares the store's WAL safety and needs no schema migration:
tool, arguments (secrets masked, stdin as a byte count), target, outcome, duration.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from typing import Any, Optional

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
MAX_VALUE_CHARS = 2000


def mask(value: Any, key: str = "") -> Any:
    """Arguments as recorded: secret-looking names hidden, argv NAME=VALUE and --password V
    hidden, stdin recorded as its size, long strings cut."""
    if key == "stdin" and isinstance(value, str):
        return f"<{len(value.encode())} bytes>"
    if isinstance(value, dict):
        return {k: "***" if SECRET_NAME.search(str(k)) and not isinstance(v, (dict, list))
                else mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return _mask_words(value) if all(isinstance(v, str) for v in value) else [mask(v) for v in value]
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        return value[:MAX_VALUE_CHARS] + f"... [{len(value) - MAX_VALUE_CHARS} more]"
    return value


def _mask_words(words: list[str]) -> list[str]:
    masked, hide_next = [], False
    for word in words:
        name, sep, _ = word.partition("=")
        if hide_next:
            masked.append("***")
        elif sep and SECRET_NAME.search(name):
            masked.append(f"{name}=***")
        else:
            masked.append(mask(word))
        hide_next = word.startswith("-") and not sep and bool(SECRET_NAME.search(word))
    return masked


class AuditLog:
    def __init__(self, store: RunStore, session: str):
        self.store = store
        self.session = session
        with store.transaction() as db:
            db.execute(TABLE)

    def record(self, tool: str, arguments: dict, target: str, outcome: str,
               error: str = "", duration_s: float = 0.0) -> None:
        stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        with self.store.transaction() as db:
            db.execute("INSERT INTO mcp_audit (at, session, tool, target, arguments, outcome, "
                       "error, duration_ms) VALUES (?,?,?,?,?,?,?,?)",
                       (stamp, self.session, tool, target,
                        json.dumps(mask(arguments), sort_keys=True, default=str), outcome,
                        error[:4000], round(duration_s * 1000, 3)))


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
