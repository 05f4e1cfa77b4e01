"""What a command over many targets shows (exec, inventory check, grep-torch, patch on a
group): how far it got while it runs, and at its end the targets that failed, one line each.

The progress line goes to stderr, so stdout stays the command's output (a table, JSON, the
containers' lines). It is shown on a terminal, or wherever `--progress` asks for it, and
only once the fan-out has run for PROGRESS_AFTER_S (a quick one shows nothing); `--json`
keeps it off unless asked. On a terminal it is one line rewritten in place; elsewhere (a CI
log) a plain line every NOTE_EVERY_S, so a log does not fill with carriage returns.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional, Sequence, TextIO

PROGRESS_AFTER_S = 1.0   # a fan-out shorter than this shows no progress
REDRAW_EVERY_S = 0.25    # on a terminal: the line's seconds move on, 4 times a second
NOTE_EVERY_S = 5.0       # not on a terminal: a line this often at most
WHAT_WIDTH = 400         # a failure's line is cut here (--json has every error whole)
CLEAR = "\r\x1b[K"


def progress_wanted(asked: Optional[bool], stream: TextIO, as_json: bool) -> bool:
    """--progress / --no-progress when given, else: on a terminal, unless --json."""
    if asked is not None:
        return asked
    try:
        return stream.isatty() and not as_json
    except (AttributeError, ValueError, OSError):
        return False


class FanoutProgress:
    """`orch: 12/32 targets done, 1 failed, 20 running (3 s)` on `stream` while a fan-out
    runs; done() is called from the workers' threads. Used as a context manager: the line
    is cleared at the end. Output printed meanwhile goes through `printing()`, which takes
    the line away first (it is drawn again on the next tick)."""

    def __init__(self, stream: TextIO, total: int, shown: bool, terminal: Optional[bool] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.stream, self.total, self.shown = stream, total, shown
        self.terminal = _is_terminal(stream) if terminal is None else terminal
        self.clock = clock
        self.done_count = self.failed_count = 0
        self.started = clock()
        self._noted = self.started
        self._drawn = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: Optional[threading.Thread] = None

    def __enter__(self) -> "FanoutProgress":
        if self.shown and self.total > 1:
            self._ticker = threading.Thread(target=self._tick, name="fanout-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            self._take_away()

    def done(self, item, outcome) -> None:
        """One target ended; `outcome` is its value or the OrchError it raised."""
        with self._lock:
            self.done_count += 1
            self.failed_count += isinstance(outcome, Exception)

    def printing(self):
        """A lock to hold while printing something else: the progress line is gone meanwhile."""
        return _Printing(self)

    def line(self) -> str:
        running = self.total - self.done_count
        failed = f", {self.failed_count} failed" if self.failed_count else ""
        return (f"orch: {self.done_count}/{self.total} targets done{failed}, {running} running "
                f"({self.clock() - self.started:.0f} s)")

    def _tick(self) -> None:
        while not self._stop.wait(REDRAW_EVERY_S):
            self.draw()

    def draw(self) -> None:
        now = self.clock()
        with self._lock:
            if now - self.started < PROGRESS_AFTER_S or self.done_count >= self.total:
                return
            if self.terminal:
                self._write(CLEAR + self.line())
                self._drawn = True
            elif now - self._noted >= NOTE_EVERY_S or self._noted == self.started:
                self._noted = now
                self._write(self.line() + "\n")

    def _take_away(self) -> None:
        if self._drawn:
            self._write(CLEAR)
            self._drawn = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.shown = False   # stderr went away: say nothing more


class _Printing:
    def __init__(self, progress: FanoutProgress):
        self.progress = progress

    def __enter__(self):
        self.progress._lock.acquire()
        self.progress._take_away()

    def __exit__(self, *exc):
        self.progress._lock.release()


def failure_lines(failures: Sequence[tuple[str, str, Optional[str]]], total: int) -> list[str]:
    """The end of a fan-out with failures: a heading, then one line per failed target,
    `  TARGET: what went wrong  (fix: the hint)`; a message of several lines (a payload's
    stderr) joined into one, cut at WHAT_WIDTH."""
    lines = [f"{len(failures)} of {total} target{'s' if total != 1 else ''} failed:"]
    for target, what, fix in failures:
        what = " ".join(part.strip() for part in what.splitlines() if part.strip())
        if what.startswith(f"{target}: "):
            what = what[len(target) + 2:]
        if len(what) > WHAT_WIDTH:
            what = what[:WHAT_WIDTH - 1] + "…"
        lines.append(f"  {target}: {what}" + (f"  (fix: {fix})" if fix else ""))
    return lines


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False
