"""Container output is untrusted: parsing it is linear in its size and bounded in memory.

A tensor repr of a megabyte in one line, a writer that never prints a newline: the monitor
must keep up (its verdict within seconds of the run's end) with flat memory. Each test has
its own timeout so the quadratic patterns these replace fail instead of hanging the suite.
The bounds are on the test process's CPU time: on a loaded machine wall-clock time also
counts the time it waited for a core (a full suite beside other work failed them).
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
    began = time.process_time()
    find_bars(text)
    assert time.process_time() - began < 3


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", ["auto", "specforge", "hf-trainer", "tqdm", "jsonl", "keyvalue"])
def test_every_format_reads_a_megabyte_line_in_bounded_time(name):
    lines = ["Train - Step 5 [5/9?], " + "Loss" * (MB // 4), "step 5: {'" + "9" * MB,
             "{'" * (MB // 2), "x" * MB + ": 1", "a=" * (MB // 2)]
    parser = LogParser(make_format(name))
    began = time.process_time()
    for line in lines:
        shown, _ = parser.feed(line + "\n")
        assert all(len(text) < MAX_LINE + 200 for text in shown)
    assert time.process_time() - began < 5


@pytest.mark.timeout(30)
def test_a_stream_without_newlines_is_held_to_a_bounded_line():
    stream = LogStream()
    chunk = "y" * MB
    tracemalloc.start()
    began = time.process_time()
    for _ in range(64):
        assert stream.feed(chunk) == []
    [segment] = stream.feed("\nnext\n")[:1]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.process_time() - began < 5
    assert peak < 8 * MB                        # one chunk in flight, not 64 MB pending
    assert len(segment.text) == MAX_LINE and segment.dropped == 64 * MB - MAX_LINE


@pytest.mark.timeout(30)
def test_the_line_splitter_is_linear_and_capped():
    pieces = []
    splitter = LineSplitter(pieces.append, max_line=4 * MB)
    began = time.process_time()
    for _ in range(32 * 16):
        splitter.feed(b"z" * (64 * 1024))
    splitter.feed(b"\nend\n")
    assert time.process_time() - began < 3
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
    from orchestrator.watch.classify import ClassifierSettings, LogClassifier

    classifier = LogClassifier(ClassifierSettings("t", metrics_from_lines=False))
    line = word * (MAX_LINE // len(word))
    began = time.process_time()
    for _ in range(20):
        classifier.feed(line, 0.0)
    assert time.process_time() - began < 1.0


# ------------------------------------------------------------ worker ids from the log
def hostile_monitor(tmp_path):
    from orchestrator.remote.container import Target
    from orchestrator.remote.local import LocalTransport
    from orchestrator.watch.monitor import Monitor, MonitorSettings
    from tests.support.monitor_sinks import Sink

    sink = Sink()
    return Monitor(Target("here", LocalTransport("here")), str(tmp_path), MonitorSettings(), sink), sink


@pytest.mark.timeout(60)
@pytest.mark.parametrize("line", ["[rank{r}]:step 1: {{'loss': 1.0}}\n",         # torchrun's prefix
                                  '{{"step": 2, "rank": {r}, "loss": 0.5}}\n',    # a JSON line's own
                                  "drafter={r} step=3 loss=0.25 tok_s=10\n",      # orch's stand-in
                                  "drafter={r} ERROR boom\n", "drafter={r} done steps=3\n"])
def test_a_log_naming_a_hundred_thousand_workers_tracks_only_the_first_ones(tmp_path, line):
    from orchestrator.watch.classify import EndState
    from orchestrator.watch.logformats import MAX_WORKERS

    monitor, sink = hostile_monitor(tmp_path)
    for start in range(0, 100_000, 10_000):
        monitor.on_data("".join(line.format(r=r) for r in range(start, start + 10_000)).encode())
    monitor._flush_lines(final=True)
    classifier = monitor.classifier
    assert len(classifier.workers) == MAX_WORKERS
    assert len(classifier._last_points) <= MAX_WORKERS
    assert len({p.drafter for p in monitor._points + sink.points}) <= MAX_WORKERS
    for fmt in [monitor.log_format, *monitor.log_format.candidates]:
        for state in ("_bars", "_waiting", "_counted", "_last_step", "_bar_log", "_cleared", "_apart"):
            assert len(getattr(fmt, state, {})) <= MAX_WORKERS, (fmt, state)
    summary = classifier.summary(EndState(state="exited", exit_code=0), None)
    assert len(summary["drafters"]) == MAX_WORKERS
    assert summary["workers_not_tracked"].startswith(f"the log named more than {MAX_WORKERS} "
                                                     f"{classifier.worker_word}s: only the first")


@pytest.mark.timeout(20)
def test_a_start_line_announcing_a_billion_drafters_is_not_counted_to(tmp_path):
    from orchestrator.watch.logformats import MAX_WORKERS

    monitor, _ = hostile_monitor(tmp_path)
    monitor.classifier.feed("start drafters=1000000000 torch=2.13.0", 0.0)
    began = time.process_time()
    assert len(monitor.classifier.never_stepped()) == MAX_WORKERS
    assert time.process_time() - began < 2


@pytest.mark.timeout(60)
def test_a_run_that_makes_thousands_of_rank_logs_gets_a_bounded_number_followed(tmp_path):
    from orchestrator.watch.logformats import MAX_WORKERS
    from orchestrator.watch.monitor import stream_copy_path

    monitor, _ = hostile_monitor(tmp_path)
    monitor._copy_dir = __import__("os").path.dirname(stream_copy_path(str(tmp_path / "local")))
    for rank in range(3 * MAX_WORKERS):
        monitor.on_file_data(f"x/attempt_0/{rank}/stdout.log", b"step 1: {'loss': 1.0}\n")
    assert len(monitor.parsers) <= MAX_WORKERS + 1 and len(monitor._decoders) <= MAX_WORKERS + 1
    assert len(monitor._copies) <= MAX_WORKERS
    assert monitor.classifier.worker_cap.refused > 0
    for copy in monitor._copies.values():
        copy.close()


@pytest.mark.timeout(60)
def test_the_tail_follows_a_bounded_number_of_the_logs_a_run_makes(tmp_path):
    from orchestrator.payloads import payload_source

    namespace = {"__name__": "launcher"}
    exec(compile(payload_source("launcher"), "launcher.py", "exec"), namespace)
    limit = namespace["MAX_FOLLOWED"]
    for rank in range(limit + 50):
        folder = tmp_path / "logs" / "x" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stdout.log").write_text("")
    followed = {}
    namespace["discover"](str(tmp_path), ["logs/*/attempt_*/*/stdout.log"], followed, {})
    assert len(followed) == limit == 1024


def _line_in_chunks_seconds(size: int, chunk: int = 64) -> float:
    """CPU seconds for BufferedLines to read one line of `size` bytes arriving `chunk` at a
    time (the best of three)."""
    from orchestrator.remote.base import BufferedLines

    best = None
    for _ in range(3):
        pieces = iter([b"x" * chunk] * (size // chunk) + [b"\n"])
        lines = BufferedLines(lambda timeout: next(pieces, b""))
        began = time.process_time()   # CPU time: a loaded machine's waits do not count
        assert len(lines.readline(None)) == size + 1
        took = time.process_time() - began
        best = took if best is None else min(best, took)
    return best


@pytest.mark.timeout(60)
def test_a_long_line_in_many_small_chunks_is_read_in_linear_time():
    # the buffer was searched again from its start (and copied) for every chunk: four
    # times the input took sixteen times as long
    small, large = _line_in_chunks_seconds(1 << 19), _line_in_chunks_seconds(1 << 21)
    assert large < 8 * small, (small, large)


def _best_of_three(text: str) -> float:
    """CPU seconds for auto-detection to read `text` (the best of three): CPU time, since on a
    loaded machine the wall clock counts the other processes' turns (CI saw 3.3 for 2)."""
    best = float("inf")
    for _ in range(3):
        parser = LogParser(make_format("auto"))
        started = time.process_time()
        for start in range(0, len(text), 65536):
            parser.feed(text[start:start + 65536])
        parser.finish()
        best = min(best, time.process_time() - started)
    return best


@pytest.mark.parametrize("make", [
    lambda n: "".join(f"iter 12: loss 1.2, time {i}\n[Rank 0] step={i}, skipped=\n Epoch 3:  45%|#| 4/9 "
                      f"[00:01<00:01, 4.30it/s, v_num=\n" for i in range(n)),
    lambda n: "".join("step " + " ".join(str(i) for i in range(60)) + "\n" for _ in range(n)),
    lambda n: "9" * (40 * n),
])
def test_auto_detection_is_linear_on_near_misses(make):
    """Twice the hostile input costs about twice the time (a quadratic reader: four times);
    the figures for 100,000 lines and 1 MB are in docs/benchmarks/speed.md."""
    small, large = _best_of_three(make(2000)), _best_of_three(make(4000))
    assert large / small < 3.0, (small, large)
