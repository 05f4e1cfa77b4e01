"""A fan-out's progress line (stderr, a terminal or --progress, never a quick one) and its
failures listed at the end, one line per target."""

from __future__ import annotations

import io

from orchestrator.cli.screens.fanout import (FanoutProgress, failure_lines, progress_wanted)
from orchestrator.ground.errors import HostUnreachable


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_on_a_terminal_unless_json_or_told():
    assert progress_wanted(None, Terminal(), as_json=False)
    assert not progress_wanted(None, Terminal(), as_json=True)
    assert not progress_wanted(None, io.StringIO(), as_json=False)
    assert progress_wanted(True, io.StringIO(), as_json=True)
    assert not progress_wanted(False, Terminal(), as_json=False)


def test_a_terminal_gets_one_line_rewritten_and_cleared_at_the_end():
    stream, clock = Terminal(), Clock()
    progress = FanoutProgress(stream, 4, shown=True, clock=clock)
    progress.draw()
    assert stream.getvalue() == ""          # a quick fan-out shows nothing
    clock.now += 1.5
    progress.done("a", {"ok": 1})
    progress.done("b", HostUnreachable("b: no route"))
    progress.draw()
    assert stream.getvalue() == "\r\x1b[Korch: 2/4 targets done, 1 failed, 2 running (2 s)"
    with progress.printing():                # a target's line: the progress line goes first
        stream.write("[c] hello\n")
    assert stream.getvalue().endswith("\r\x1b[K[c] hello\n")
    progress.draw()
    progress.__exit__(None, None, None)
    assert stream.getvalue().endswith("(2 s)\r\x1b[K")   # nothing of it stays behind


def test_a_log_gets_a_plain_line_now_and_then():
    stream, clock = io.StringIO(), Clock()
    progress = FanoutProgress(stream, 3, shown=True, terminal=False, clock=clock)
    clock.now += 1.2
    progress.draw()
    clock.now += 1.0
    progress.draw()                          # within NOTE_EVERY_S: nothing more
    clock.now += 5.0
    progress.done("a", 1)
    progress.draw()
    assert stream.getvalue().splitlines() == ["orch: 0/3 targets done, 3 running (1 s)",
                                              "orch: 1/3 targets done, 2 running (7 s)"]
    assert "\r" not in stream.getvalue()


def test_failures_are_one_line_each_with_the_fix():
    lines = failure_lines([("sb3-200", "sb3-200: cannot reach host sb3", "check the address"),
                           ("sb1-201", "payload ended with exit code 1 and no result:\n  | boom\n",
                            None)], total=32)
    assert lines == ["2 of 32 targets failed:",
                     "  sb3-200: cannot reach host sb3  (fix: check the address)",
                     "  sb1-201: payload ended with exit code 1 and no result: | boom"]
    assert len(failure_lines([("t", "x" * 5000, None)], 1)[1]) < 420
