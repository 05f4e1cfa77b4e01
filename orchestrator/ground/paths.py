"""Where orch keeps its own files on the controller, and with which modes."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

_umask_lock = threading.Lock()
_private_depth = 0
_user_umask = -1   # the umask orch was started with, while private_files() holds ours


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


@contextmanager
def private_files():
    """While this holds, files orch creates are 0600 and folders 0700: umask 077 on top of
    the user's, set before creation (never a chmod after, which leaves a window). The run
    store, run folders, reports, logs and locks may hold environment values, paths and
    tokens' names. Files that already exist keep their modes. Nestable and thread-safe (the
    agent runs commands in threads): the umask only ever narrows while one holds it."""
    global _private_depth, _user_umask
    with _umask_lock:
        if _private_depth == 0:
            _user_umask = os.umask(0o077)
            os.umask(_user_umask | 0o077)
        _private_depth += 1
    try:
        yield
    finally:
        with _umask_lock:
            _private_depth -= 1
            if _private_depth == 0:
                os.umask(_user_umask)
                _user_umask = -1


def user_umask() -> int:
    """The user's own umask while private_files() holds, else -1: commands orch runs on
    this machine (the local transport) get it, as they would in the user's shell."""
    return _user_umask
