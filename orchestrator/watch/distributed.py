"""How distributed (torchrun) runs fail, read from their logs. Pure functions, no I/O.

- torchrun's closing `ChildFailedError` summary: each failed rank with its local rank, exit
  code or signal, pid and error file; the "Root Cause" entry is the first failure (the
  others are usually ranks torchrun itself stopped with SIGTERM afterwards).
- collective timeouts (gloo's `Timed out waiting 5000ms for recv operation`, NCCL's
  watchdog) and a rendezvous that never completes (`RendezvousTimeoutError`, the TCPStore's
  `1/2 clients joined`).
- a hang where one rank stopped while the others went on to a collective and wait there:
  the rank behind is the one to look at.

The formats are torch's own (torch 2.13, checked on real runs; docs/design/trainer-logs.md).
The log signatures of collective and rendezvous timeouts, and what to do about them, are rules
of the verdict table (ground/verdicts.py).
"""

from __future__ import annotations

import re
import signal as signals
from dataclasses import dataclass
from typing import Optional

# What a rank says when another rank (or node) went away first: gloo's `Connection closed by
# peer [...] This is typically caused by a remote worker crashing`, a reset or broken socket,
# NCCL's `remote process exited or there was a network error`, an aborted communicator, the
# c10d store or rendezvous gone with the node that hosted it (plain literals: no backtracking).
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|"
                       r"remote process exited|NCCL communicator was aborted|"
                       r"RendezvousClosedError|TCPStore is not available")
_FAILED_HEADER = re.compile(r"ChildFailedError")
_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*)$")
_RANK = re.compile(r"(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_EXIT = re.compile(r"(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
_RULE = re.compile(r"^\s*(?:={8,}|-{8,})\s*$")
MAX_TRACEBACK = 16 * 1024


@dataclass
class RankFailure:
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    exit_code: Optional[int] = None
    pid: Optional[int] = None
    host: str = ""
    error_file: str = ""
    traceback: str = ""
    root_cause: bool = False
    time: str = ""              # when torchrun saw it fail: 2026-12-02_03:40:07 (its host's clock)

    @property
    def signal(self) -> Optional[int]:
        """torchrun reports death by a signal as a negative exit code (-9: SIGKILL)."""
        return -self.exit_code if self.exit_code is not None and self.exit_code < 0 else None

    @property
    def signal_name(self) -> Optional[str]:
        if self.signal is None:
            return None
        try:
            return signals.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    @property
    def handled_signal(self) -> Optional[int]:
        """A worker that caught a signal and exited 128+N (SpecForge's on SIGTERM: 143)."""
        return handled_signal(self.exit_code)

    def describe(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else "a rank"
        if self.local_rank is not None and self.local_rank != self.rank:
            where += f" (local rank {self.local_rank})"
        if self.host:
            where += f" on {self.host}"
        if self.signal is not None:
            how = f"was killed by {self.signal_name} (signal {self.signal})"
        elif self.handled_signal is not None:
            how = (f"was stopped by {signal_name(self.handled_signal)}: it handled the signal and "
                   f"exited with code {self.exit_code} (128+{self.handled_signal})")
        else:
            how = f"exited with code {self.exit_code}"
        return f"{where} {how}" + (f", pid {self.pid}" if self.pid else "")


class ChildFailedReader:
    """Reads torchrun's summary block line by line (it may arrive in pieces)."""

    def __init__(self):
        self.failures: list[RankFailure] = []
        self._inside = False
        self._root_next = False
        self._current: Optional[RankFailure] = None
        self._in_traceback = False

    def feed(self, line: str) -> None:
        if _FAILED_HEADER.search(line):
            self._inside, self.failures = True, []
            return
        if not self._inside:
            return
        text = line.strip()
        if text.startswith("Root Cause"):
            self._root_next = True
            self._in_traceback = False
            return
        entry = _ENTRY.match(line)
        if entry:
            self._in_traceback = False
            self._current = RankFailure(root_cause=self._root_next)
            self._root_next = False
            self.failures.append(self._current)
            return
        field = _FIELD.match(line)
        if field and self._current is not None:
            self._set(self._current, field.group(1), field.group(2).strip())
            self._in_traceback = field.group(1) == "traceback"
        elif self._in_traceback and self._current is not None and not _RULE.match(line):
            # An @record error file's traceback goes on for many lines: keep it whole.
            if len(self._current.traceback) < MAX_TRACEBACK:
                self._current.traceback += "\n" + line.rstrip()
        else:
            self._in_traceback = False

    @staticmethod
    def _set(failure: RankFailure, name: str, value: str) -> None:
        if name == "rank":
            match = _RANK.match(value)
            if match:
                failure.rank = int(match.group(1))
                failure.local_rank = int(match.group(2)) if match.group(2) else None
        elif name == "exitcode":
            match = _EXIT.match(value)
            if match:
                failure.exit_code = int(match.group(1))
                failure.pid = int(match.group(2)) if match.group(2) else None
        elif name == "host":
            failure.host = value
        elif name == "time":
            failure.time = value[:40]
        elif name == "error_file":
            failure.error_file = "" if value == "<N/A>" else value
        elif name == "traceback":
            failure.traceback = value

    def root_cause(self) -> Optional[RankFailure]:
        for failure in self.failures:
            if failure.root_cause:
                return failure
        return self.failures[0] if self.failures else None


def handled_signal(exit_code: Optional[int]) -> Optional[int]:
    """The signal behind an exit code of 128+N from a process that caught it (SIGTERM: 143,
    SIGINT: 130, SIGHUP: 129), as SpecForge's workers do; None for any other code."""
    if exit_code is None or not 128 < exit_code < 128 + 32:
        return None
    number = exit_code - 128
    return number if number in (signals.SIGHUP, signals.SIGINT, signals.SIGTERM) else None


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def rank_failure_remediation(failure: RankFailure) -> str:
    if failure.signal == signals.SIGKILL:
        return ("SIGKILL with no one asking for it is most often the host's OOM killer: look for "
                "`Out of memory: Killed process` in the host's `dmesg` or `journalctl -k`; lower "
                "the batch size or max length, or give the container more memory")
    if failure.signal == signals.SIGABRT:
        return ("SIGABRT is the process aborting itself: torch's NCCL watchdog after a collective "
                "timeout, a C++ assertion or CHECK, a crash handler. Read the last lines of rank "
                f"{failure.rank}'s log (and its error file) for what it said before it aborted")
    if failure.signal is not None or failure.handled_signal is not None:
        return "a signal from outside the run: look for who sent it (a scheduler, a supervisor)"
    if failure.error_file:
        return f"rank {failure.rank}'s traceback is in its error file {failure.error_file}"
    return (f"read rank {failure.rank}'s traceback in its log (torchrun prefixes it "
            f"`[rank{failure.rank}]:`)")


def behind(progress: dict[int, int]) -> tuple[list[int], int, int]:
    """Of workers' last steps: those behind the front, the lowest step, the highest.
    A worker behind the others while they wait is the one a hang is about."""
    if not progress:
        return [], 0, 0
    low, high = min(progress.values()), max(progress.values())
    if low == high:
        return [], low, high
    return sorted(w for w, step in progress.items() if step == low), low, high


def stuck_message(progress: dict[int, int], word: str = "rank") -> Optional[str]:
    """`rank 1 stopped at step 7 while rank 0 reached step 10` (None when all are level)."""
    stuck, low, high = behind(progress)
    if not stuck:
        return None
    ahead = sorted(w for w, step in progress.items() if step == high)
    names = ", ".join(str(w) for w in stuck)
    others = ", ".join(str(w) for w in ahead)
    plural = "s" if len(stuck) > 1 else ""
    return (f"{word}{plural} {names} stopped at step {low} while {word}"
            f"{'s' if len(ahead) > 1 else ''} {others} reached step {high} and wait for "
            f"{'them' if plural else 'it'} (in a collective, most likely)")
