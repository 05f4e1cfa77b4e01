"""Test helpers for the warm agent: find and stop the agents a test (or the session) started."""

from __future__ import annotations

import glob
import json
import os
import signal
import time


def agent_pids(directory: str) -> list[int]:
    """Pids of the agents alive in directory (each writes its pid into its lock file)."""
    pids = []
    for lock in glob.glob(os.path.join(directory, "agent-*.lock")):
        try:
            pid = json.loads(open(lock).read() or "{}").get("pid")
        except (OSError, ValueError):
            continue
        if pid and alive(pid):
            pids.append(pid)
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our own child, not reaped yet) is not alive
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_agents(directory: str, grace: float = 5.0) -> None:
    """SIGTERM each agent (it lets running commands end, then exits), SIGKILL after grace."""
    pids = agent_pids(directory)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
