"""A step's whole output, kept in its run's folder: `steps/<n>-<kind>-<target>.log`.

The console shows a step's progress in a line or two; this file has every line it printed
(pip's hundreds, a shell script's), for reading after the run or when it failed. Container
output is untrusted, so the file is bounded: its first HEAD_BYTES are kept whole, after that
only its last TAIL_BYTES (the cause of a failure is usually at the end) with a line saying
how much was left out between them; a line longer than MAX_LINE is cut.
"""

from __future__ import annotations

import os
import re
import threading
from collections import deque
from typing import Optional

from orchestrator.ground import paths

HEAD_BYTES = 16 << 20
TAIL_BYTES = 4 << 20
MAX_LINE = 16 << 10


def step_log_path(run_id: str, number: int, kind: str, target: str) -> str:
    """The log of step `number` (1-based, as the console counts) of `kind` on `target`."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", target) or "_"
    return os.path.join(paths.run_dir(run_id), "steps", f"{number}-{kind}-{safe}.log")


def cut_line(line: str, limit: int = MAX_LINE) -> str:
    if len(line) <= limit:
        return line
    return f"{line[:limit]} [orch: {len(line) - limit} more characters cut]"


class StepLog:
    """Lines appended to one file, opened on the first line (a step that prints nothing
    leaves no file). Private (0600 in a 0700 folder): output may hold environment values.
    A file that cannot be written never fails the step: `error` says why it is missing."""

    def __init__(self, path: str):
        self.path = path
        self.lines = 0
        self.error: Optional[str] = None
        self._lock = threading.Lock()   # a command's stdout and stderr arrive from two threads
        self._fd: Optional[int] = None
        self._written = 0
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._left_out = 0

    def write(self, line: str) -> None:
        data = (cut_line(line) + "\n").encode("utf-8", "replace")
        with self._lock:
            self.lines += 1
            if self.error is not None:
                return
            if self._written + len(data) <= HEAD_BYTES and not self._tail:
                self._append(data)
                self._written += len(data)
                return
            self._tail.append(data)
            self._tail_bytes += len(data)
            while self._tail_bytes > TAIL_BYTES and len(self._tail) > 1:
                self._tail_bytes -= len(self._tail.popleft())
                self._left_out += 1

    def close(self) -> None:
        """Write the kept tail (after a line saying what was left out) and close the file."""
        with self._lock:
            if self._left_out:
                self._append(f"[orch: {self._left_out} lines left out here: a step log keeps "
                             f"its first {_size(HEAD_BYTES)} and its last "
                             f"{_size(TAIL_BYTES)}]\n".encode())
            while self._tail:
                self._append(self._tail.popleft())
            self._tail_bytes = self._left_out = 0
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _append(self, data: bytes) -> None:
        if self.error is not None:
            return
        try:
            if self._fd is None:
                os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as error:
            self.error = f"{self.path}: {error.strerror or error}"


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count} bytes"
