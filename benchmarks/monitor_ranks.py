#!/usr/bin/env python3
"""Monitor latency and CPU with 8 torchrun ranks' logs flowing, two ways side by side.

A writer started with orch's launcher (detached, like a training run) plays 8 ranks: each
logs SpecForge's `Train - Step N [N/T?], Loss: .., Acc: ..` through Python logging (its time
stamp, to the millisecond, is when the line was written) at random gaps of 20-120 ms, and
rank 0 redraws a tqdm bar before each of its lines. Two layouts:

  per-rank   torchrun --log-dir D --redirects 3: D/<id>/attempt_0/<rank>/stderr.log, the
             files orch's torchrun launch asks for; the monitor follows all 8 by offset
  tee        torchrun --tee 3: one log, every line prefixed [default<rank>]:

Latency: from a line's stamp to the moment orch's monitor hands it to its console sink.
CPU: the tail payload's own CPU time in the container, and the controller's (this
process: following, splitting, parsing, classifying), each over the wall time.

    sudo .venv/bin/orch sandbox up
    .venv/bin/python benchmarks/monitor_ranks.py                  # sb1-200 of the sandbox
    .venv/bin/python benchmarks/monitor_ranks.py --lines 150 --ranks 8
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import (bench_dir, latency_cells, latency_row, opened_target,  # noqa: E402
                              print_table, target_parser)
from orchestrator.watch.logformats import log_time  # noqa: E402
from orchestrator.watch.monitor import Monitor, MonitorSettings, MonitorSink  # noqa: E402
from orchestrator.remote.payload_api import launcher  # noqa: E402
from orchestrator.watch.torchrun import RANK_LOGS  # noqa: E402

WRITER = r"""
import logging, os, random, sys, threading, time
layout, ranks, lines, run_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lock = threading.Lock()

def rank_stream(rank):
    if layout == "tee":
        return None
    folder = os.path.join(run_dir, "ranks", "bench_x", "attempt_0", str(rank))
    os.makedirs(folder)
    return open(os.path.join(folder, "stderr.log"), "w")

def write(rank, out, text):
    if out is None:                 # tee: one stream, torchrun's prefix on every line
        with lock:
            sys.stdout.write("[default%d]:%s" % (rank, text)); sys.stdout.flush()
    else:
        out.write(text); out.flush()

def play(rank):
    rng = random.Random(rank)
    out = rank_stream(rank)
    formatter = logging.Formatter("%(asctime)s - %(levelname)s - %(name)s - %(message)s")
    time.sleep(0.5)
    for step in range(1, lines + 1):
        if rank == 0:
            write(rank, out, "\rTraining Epoch 0: %3d%%|#   | %d/%d [00:01<00:01, 9.00it/s, loss=2.0]"
                  % (100 * step // lines, step, lines))
        record = logging.LogRecord("specforge.utils", logging.INFO, "train_dflash.py", 0,
                                   "Train - Step %d [%d/%d?], Loss: %.4f, Acc: 0.5000"
                                   % (step, step, lines, 3 - step / lines), None, None)
        write(rank, out, formatter.format(record) + "\n")
        time.sleep(rng.uniform(0.02, 0.12))

threads = [threading.Thread(target=play, args=(r,)) for r in range(ranks)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


class Timing(MonitorSink):
    def __init__(self):
        self.latencies: list[float] = []

    def log_line(self, target: str, line: str) -> None:
        now = time.time()
        if "Train - Step" in line:
            stamp = log_time(line)
            if stamp is not None:
                self.latencies.append(now - stamp)


def measure(target, layout: str, ranks: int, lines: int) -> dict:
    run_dir = bench_dir()
    launcher(target, "start", run_dir, argv=["python3", "-c", WRITER, layout, str(ranks), str(lines), run_dir])
    settings = MonitorSettings(hang_after=3600, gpu_every=0, format="specforge",
                               follow=list(RANK_LOGS) if layout == "per-rank" else [],
                               worker_word="rank")
    sink = Timing()
    monitor = Monitor(target, run_dir, settings, sink)
    began, cpu_began = time.monotonic(), time.process_time()
    end, final = monitor.run()
    wall, controller_cpu = time.monotonic() - began, time.process_time() - cpu_began
    target.run(["rm", "-rf", run_dir], timeout=30)
    steps = {rank: progress.step for rank, progress in monitor.classifier.drafters.items()}
    assert len(sink.latencies) == ranks * lines, f"{len(sink.latencies)} of {ranks * lines} lines"
    assert steps == {rank: lines for rank in range(ranks)}, steps
    return {"layout": layout, "lines": len(sink.latencies), "rate": len(sink.latencies) / wall,
            **latency_row(sink.latencies),
            "tail_cpu_pct": 100 * (final.get("cpu_s") or 0.0) / wall,
            "controller_cpu_pct": 100 * controller_cpu / wall}


def main() -> int:
    parser = target_parser(__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--lines", type=int, default=150, help="lines per rank")
    args = parser.parse_args()
    with opened_target(args) as (_, target):
        rows = [measure(target, layout, args.ranks, args.lines) for layout in ("per-rank", "tee")]
    print(f"monitor with {args.ranks} ranks' logs flowing into {target.describe()}: "
          f"{args.lines} SpecForge lines per rank, from the write to orch's console sink")
    print()
    print_table(["layout", "lines", "lines/s", "median", "p95", "max", "tail payload CPU", "controller CPU"],
                [[row["layout"], row["lines"], f"{row['rate']:.0f}", *latency_cells(row),
                  f"{row['tail_cpu_pct']:.2f} % of a core", f"{row['controller_cpu_pct']:.1f} % of a core"]
                 for row in rows], left=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
