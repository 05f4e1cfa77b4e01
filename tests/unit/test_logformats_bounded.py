"""Container output is untrusted: parsing it is linear in its size and bounded in memory.

A tensor repr of a megabyte in one line, a writer that never prints a newline: the monitor
must keep up (its verdict within seconds of the run's end) with flat memory. Each test has
its own timeout so the quadratic patterns these replace fail instead of hanging the suite.
"""

from __future__ import annotations

import sys
import time
import tracemalloc

import pytest

from orchestrator.watch.logformats import MAX_LINE, LogParser, LogStream, find_bars, make_format
from orchestrator.remote.base import LineSplitter

MB = 1 << 20


@pytest.mark.timeout(20)
@pytest.mark.parametrize("text", [
    "7" * MB + " [00:01, 2.00it/s]",            # a long digit run: the old tqdm regex's worst case
    "12/" * (MB // 3) + "[00:01, 2.00it/s]",
    "[00:01, 3it/s, " * (MB // 16) + "]",       # many bar tails, one closed at the end
    "a: 5%|" * (MB // 6) + "3/4 [00:01, 1it/s]",
    " " * MB + "5/9 [00:01, 1it/s]" * (MB // 18),
])
def test_finding_bars_is_linear(text):
    began = time.monotonic()
    find_bars(text)
    assert time.monotonic() - began < 3


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", ["auto", "specforge", "hf-trainer", "tqdm", "jsonl", "keyvalue"])
def test_every_format_reads_a_megabyte_line_in_bounded_time(name):
    lines = ["Train - Step 5 [5/9?], " + "Loss" * (MB // 4), "step 5: {'" + "9" * MB,
             "{'" * (MB // 2), "x" * MB + ": 1", "a=" * (MB // 2)]
    parser = LogParser(make_format(name))
    began = time.monotonic()
    for line in lines:
        shown, _ = parser.feed(line + "\n")
        assert all(len(text) < MAX_LINE + 200 for text in shown)
    assert time.monotonic() - began < 5


@pytest.mark.timeout(30)
def test_a_stream_without_newlines_is_held_to_a_bounded_line():
    stream = LogStream()
    chunk = "y" * MB
    tracemalloc.start()
    began = time.monotonic()
    for _ in range(64):
        assert stream.feed(chunk) == []
    [segment] = stream.feed("\nnext\n")[:1]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.monotonic() - began < 5
    assert peak < 8 * MB                        # one chunk in flight, not 64 MB pending
    assert len(segment.text) == MAX_LINE and segment.dropped == 64 * MB - MAX_LINE


@pytest.mark.timeout(30)
def test_the_line_splitter_is_linear_and_capped():
    pieces = []
    splitter = LineSplitter(pieces.append, max_line=4 * MB)
    began = time.monotonic()
    for _ in range(32 * 16):
        splitter.feed(b"z" * (64 * 1024))
    splitter.feed(b"\nend\n")
    assert time.monotonic() - began < 3
    assert sum(len(p) for p in pieces[:-1]) == 32 * MB     # nothing lost: cut into pieces
    assert max(len(p) for p in pieces) <= 4 * MB and pieces[-1] == "end"


BIG_WRITER = r'''
import sys
out = sys.stdout
out.write("drafter=0 step=1 loss=3.0 tok_s=100\n")
out.write("7" * (1 << 20) + "\n")                  # a megabyte-long digit line
block = "q" * (1 << 20)
for _ in range(64):                                # 64 MB without a newline
    out.write(block)
out.write("\ndrafter=0 step=2 loss=2.0 tok_s=100\n")
for n in range(100000):                            # a chatty run: lines are not all kept
    out.write("shard %d loaded, " % n + "x" * 100 + "\n")
out.flush()
'''


@pytest.mark.timeout(120)
def test_the_monitor_keeps_up_with_a_megabyte_digit_line_64_mb_without_a_newline_and_many_lines(tmp_path):
    from orchestrator.watch.monitor import Monitor, MonitorSettings, MonitorSink, stream_copy_path
    from orchestrator.remote.payload_api import launcher
    from orchestrator.remote.container import Target
    from orchestrator.remote.local import LocalTransport

    class Sink(MonitorSink):
        def __init__(self):
            self.lines, self.points = [], []

        def log_line(self, target, line):
            self.lines.append(line)

        def metrics(self, target, points):
            self.points.extend(points)

    target = Target("here", LocalTransport("here"))
    run_dir = tmp_path / "run"
    launcher(target, "start", str(run_dir), argv=[sys.executable, "-c", BIG_WRITER])
    sink = Sink()
    monitor = Monitor(target, str(run_dir), MonitorSettings(gpu_every=0, hang_after=60), sink,
                      stream_copy=stream_copy_path(str(tmp_path / "local")))
    tracemalloc.start()
    began = time.monotonic()
    end, _ = monitor.run()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    verdict = monitor.verdict(end, {}, cli="orch", playbook=None)
    assert verdict.verdict == "ok", verdict.message
    assert time.monotonic() - began < 60
    assert peak < 40 * MB, f"peak {peak / MB:.0f} MB"
    assert [p.step for p in sink.points] == [1, 2]
    assert all(len(line) < MAX_LINE + 200 for line in sink.lines)
    # the raw text is all in the run's copy of the log
    assert (tmp_path / "local" / "stream.log").stat().st_size == (run_dir / "output.log").stat().st_size


@pytest.mark.timeout(60)
@pytest.mark.parametrize("word", ["ProcessGroupNCCL", "gloo ", "DistBackendError", "client socket has timed out after "])
def test_failure_signatures_are_bounded_on_a_long_repeating_line(word):
    from orchestrator.watch.classify import LogClassifier

    classifier = LogClassifier("t", metrics_from_lines=False)
    line = word * (MAX_LINE // len(word))
    began = time.monotonic()
    for _ in range(20):
        classifier.feed(line, 0.0)
    assert time.monotonic() - began < 1.0
