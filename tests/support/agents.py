"""Test helpers for the warm agent: find and stop the agents a test (or the session) started."""

from __future__ import annotations

import os
import signal
import time


def agent_pids(directory: str) -> list[int]:
    """Pids of the agent processes alive for directory (their ORCH_AGENT_DIR), found in /proc:
    also one still starting, or one that won the lock after the first agent was stopped
    (several clients that found no agent each start one; all but one leave)."""
    pids = []
    wanted = f"ORCH_AGENT_DIR={os.path.abspath(directory)}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if b"orchestrator.agentd.server" not in cmdline.read():
                    continue
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if wanted not in environ.read().split(b"\0"):
                    continue
        except OSError:
            continue
        if alive(int(entry)):
            pids.append(int(entry))
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
