"""Whether the orch process that owns a "running" record (its controller) still lives.

A controller killed with SIGKILL (or a machine that went down) writes nothing more: its
record says "running" for ever. The record names its controller (pid, host name, start
time, written by recorder.controller_entry): on the same machine, a pid that no longer
exists, or that now belongs to a process started after the controller's record was made
(a reused pid), means the controller is gone. On another machine nothing can be told.
Stdlib only, and cheap: `orch runs list` asks it for every running record.
"""

from __future__ import annotations

import os
import socket
from typing import Optional

from orchestrator.ground.verdicts import ABANDONED, RUNNING, exit_code_for
from orchestrator.runs.model import Finding, RunRecord, now_iso

ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"
# The recorded start is time.time() when the record was made, after the process started;
# /proc's start time has a granularity of one clock tick and the boot time of one second.
_START_SLACK_S = 2.0


def controller_state(record: RunRecord) -> Optional[str]:
    """ALIVE, GONE or UNKNOWN (another machine's, or no controller recorded) for a running
    record; None for a record that has ended."""
    if record.verdict != RUNNING:
        return None
    controller = (record.launch or {}).get("controller") or {}
    pid = controller.get("pid")
    if not isinstance(pid, int) or controller.get("host") != socket.gethostname():
        return UNKNOWN
    if pid == os.getpid():
        return ALIVE
    started = _process_start(pid)
    if started is None:
        return GONE
    recorded = controller.get("started")
    if isinstance(recorded, (int, float)) and started > recorded + _START_SLACK_S:
        return GONE   # the pid was reused by a process started after the controller
    return ALIVE


def describe(record: RunRecord) -> str:
    """One sentence about the controller of a running record, for `orch runs show`."""
    controller = (record.launch or {}).get("controller") or {}
    who = f"pid {controller.get('pid')} on {controller.get('host') or 'an unknown host'}"
    state = controller_state(record)
    if state == GONE:
        return f"controller {who} is gone: {settle_hint(record)}"
    if state == ALIVE:
        return f"controller {who} is running"
    return f"controller {who}: cannot be checked from this machine"


def settle_hint(record: RunRecord) -> str:
    """The command that settles a record whose controller is gone."""
    launched = any(entry.get("run_dir") for entry in record.launches().values())
    if launched:
        return (f"`orch attach {record.run_id}` follows the run to its end and records its "
                f"verdict (`orch stop {record.run_id}` ends it)")
    return (f"it launched nothing; `orch runs abandon {record.run_id}` (or attach, or stop) "
            "records it as abandoned")


def _process_start(pid: int) -> Optional[float]:
    """The wall-clock time process pid started (None: there is no such process, or it is
    a zombie, which will never write again either)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith(b"btime "))
    except (OSError, StopIteration, IndexError, ValueError):
        return _exists(pid)
    if fields[0] == b"Z":
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _exists(pid: int) -> Optional[float]:
    """Without /proc: whether pid exists at all (0.0: it does, start unknown)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return 0.0
    return 0.0


def mark_abandoned(store, record: RunRecord, why: str) -> RunRecord:
    """Settle a running record whose controller is gone: verdict "abandoned", with a
    finding that says why (its launched processes, if any, are left as they are)."""
    record.verdict = ABANDONED
    record.exit_code = exit_code_for(ABANDONED)
    record.ended_at = now_iso()
    finding = Finding(target=",".join(t.name for t in record.targets) or "-",
                      signature=ABANDONED, message=why)
    record.findings.append(finding)
    store.add_findings(record.run_id, [finding])
    store.finish(record)
    return record


def abandoned_because(record: RunRecord) -> str:
    controller = (record.launch or {}).get("controller") or {}
    return (f"its controller (orch, pid {controller.get('pid')} on "
            f"{controller.get('host') or 'an unknown host'}) ended without recording a verdict")
