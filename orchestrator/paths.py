"""Where orch keeps its own files on the controller."""

from __future__ import annotations

import os


def data_dir() -> str:
    """$ORCH_DATA_DIR, else $XDG_DATA_HOME/orch, else ~/.local/share/orch."""
    explicit = os.environ.get("ORCH_DATA_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(base, "orch")


def store_path() -> str:
    """The run store (SQLite); $ORCH_STORE overrides."""
    return os.path.expanduser(os.environ.get("ORCH_STORE") or os.path.join(data_dir(), "runs.sqlite"))


def run_dir(run_id: str) -> str:
    """The folder that holds one run's collected files (logs, pip freeze, summary)."""
    return os.path.join(data_dir(), "runs", run_id)
