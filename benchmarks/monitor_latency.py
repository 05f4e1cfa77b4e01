#!/usr/bin/env python3
"""How quickly `orch run`'s monitor reports a log line, and what watching costs the container.

A writer started with orch's launcher (detached, like a training run) appends N lines to
its log, each stamped with the time it was written, at random gaps of 20-120 ms (random, so
the writes cannot fall into step with the follower's polling). orch's Monitor follows that
log the way `orch run` does (the tail payload over one `pct exec` channel, byte offsets,
heartbeats) and each line's latency is the time from its stamp to the moment the monitor
hands it to its console sink. The tail payload reports its own CPU time, so its cost inside
the container is measured there, while lines flow and while the log is idle.

    sudo .venv/bin/orch sandbox up
    .venv/bin/python benchmarks/monitor_latency.py                 # sb1-200 of the sandbox
    .venv/bin/python benchmarks/monitor_latency.py -i inventory.yaml -t dev --lines 500

Goal (issue 4): median under 250 ms, p95 under 1 s, under 1 % of one core. The container
and the controller must share a clock (true for the sandbox and for a local target).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import (bench_dir, latency_cells, latency_row, opened_target,  # noqa: E402
                              print_table, target_parser)
from orchestrator.watch.monitor import Monitor, MonitorSettings, MonitorSink  # noqa: E402
from orchestrator.remote.payload_api import launcher, stop_run  # noqa: E402

WRITER = r"""
import random, sys, time
n = int(sys.argv[1])
random.seed(1)
time.sleep(0.5)
for i in range(n):
    sys.stdout.write("bench seq=%d t=%.6f\n" % (i, time.time()))
    sys.stdout.flush()
    time.sleep(random.uniform(0.02, 0.12))
"""


class Timing(MonitorSink):
    def __init__(self):
        self.latencies: list[float] = []
        self.seen: list[int] = []

    def log_line(self, target: str, line: str) -> None:
        now = time.time()
        if line.startswith("bench seq="):
            seq, stamp = line.split()[1:3]
            self.seen.append(int(seq.split("=")[1]))
            self.latencies.append(now - float(stamp.split("=")[1]))


def measure(target, lines: int, idle_s: float) -> dict:
    run_dir = bench_dir()
    launcher(target, "start", run_dir, argv=["python3", "-c", WRITER, str(lines)])
    sink = Timing()
    monitor = Monitor(target, run_dir, MonitorSettings(hang_after=3600, gpu_every=0), sink)
    began = time.monotonic()
    end, final = monitor.run()
    wall = time.monotonic() - began
    active_cpu = final.get("cpu_s") or 0.0
    # The same follower on a log that does not grow: the cost of waiting for lines.
    idle_dir = bench_dir()
    launcher(target, "start", idle_dir, argv=["sleep", str(idle_s + 30)])
    idle = Monitor(target, idle_dir, MonitorSettings(hang_after=3600, gpu_every=0, watch_for=idle_s),
                   MonitorSink())
    idle.started = time.monotonic()
    idle_end, idle_status = idle.run()
    idle_cpu = idle.cpu_s or 0.0
    stop_run(target, idle_dir, grace=2)
    target.run(["rm", "-rf", run_dir, idle_dir], timeout=30)
    assert sink.seen == list(range(lines)), "lines lost or repeated"
    return {"lines": len(sink.latencies), **latency_row(sink.latencies),
            "active_cpu_pct": 100 * active_cpu / wall, "idle_cpu_pct": 100 * idle_cpu / idle_s,
            "wall_s": wall}


def main() -> int:
    parser = target_parser(__doc__)
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of an idle log to measure")
    args = parser.parse_args()
    with opened_target(args) as (_, target):
        row = measure(target, args.lines, args.idle)
    print(f"monitor latency: {args.lines} lines into {target.describe()}, "
          "from the write in the container to orch's console sink")
    print()
    print_table(["lines", "median", "p95", "max", "monitor CPU, lines flowing", "monitor CPU, idle log"],
                [[row["lines"], *latency_cells(row), f"{row['active_cpu_pct']:.2f} % of a core",
                  f"{row['idle_cpu_pct']:.2f} % of a core"]], left=0)
    print()
    ok = row["median_ms"] < 250 and row["p95_ms"] < 1000 and row["active_cpu_pct"] < 1.0
    print("goal (median < 250 ms, p95 < 1 s, < 1 % of a core): " + ("met" if ok else "NOT met"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
