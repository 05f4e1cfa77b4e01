#!/usr/bin/env python3
"""How long `format: auto` takes to read hostile logs: linear or not.

Container output is untrusted. Every log below goes through the monitor's own parsing
(LogParser with `format: auto`, the shapes tried in order, each line offered to all of
them until one is picked), at size N and at 2N: a linear reader takes about twice as long
at 2N, a quadratic one four times. Side by side, a well-formed log of each shape (so the
figures have a scale) and the hostile ones:

- a 1 MB line of digits (no newline) and 1 MB of digits cut into 16 KiB lines;
- 100,000 near-miss lines for every shape: the start of its metric line, then not quite
  (`iter 12: loss 1.2, time`, `step:  5  loss: 9 tps`, `iteration 5/ 9 | consumed samples`,
  `[Rank 0] step=1, skipped=`, `Epoch 3:  45%|`, `step 10/`, `{'loss': '1`, ...);
- 100,000 lines of a step word followed by 60 numbers (`step 1 2 3 ...`);
- ANSI colour codes, 1 MB of `\\x1b[3` without an end.

    .venv/bin/python benchmarks/logformat_hostile.py            # N = 100,000 lines, 1 MB
    .venv/bin/python benchmarks/logformat_hostile.py --scale 0.1

Prints a Markdown table: seconds at N and 2N (median of 3) and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import print_table  # noqa: E402
from orchestrator.watch.logformats import LogParser, make_format  # noqa: E402

NEAR_MISSES = [
    "iter 12: loss 1.2, time",                                   # nanoGPT, cut short
    "step 40: train loss 2.5, val",                              # nanoGPT's eval
    "[titan] 2026-08-22 12:00:00,000 - root - INFO - step:  5  loss: 9 tps",
    " iteration       5/      9 | consumed samples",             # Megatron
    "[Rank 0] step=1, skipped=",                                 # DeepSpeed
    "epoch=0/micro_step=1/global_step=1, RunningAvgSamplesPerSec=",
    "Epoch 3:  45%|####5     | 45/100 [00:10<00:12, 4.30it/s, v_num=",
    "step 10/ loss",                                             # a loop's
    "{'loss': '1",                                               # a Trainer's dict
    '{"step": 1, "loss": ',                                      # a JSON line
    "Train - Step 5 [5/",                                        # SpecForge's old script
    "drafter=1 step=",                                           # orch's stand-in
]


def logs(lines: int, size: int) -> dict[str, str]:
    """name -> a log of `lines` lines (or `size` bytes)."""
    digits = "1234567890" * (size // 10)
    steps = "step " + " ".join(str(i) for i in range(60))
    return {
        "well-formed loop lines (scale)": "".join(f"step {i}/{lines} loss={1 / (i + 1):.4f} tok/s 12,345\n"
                                                  for i in range(lines)),
        "1 MB line of digits, no newline": digits,
        "1 MB of digits in 16 KiB lines": "\n".join(digits[i:i + 16384] for i in range(0, len(digits), 16384)),
        "near misses of every shape": "".join(NEAR_MISSES[i % len(NEAR_MISSES)] + f" {i}\n" for i in range(lines)),
        "step word and 60 numbers": "".join(f"{steps} {i}\n" for i in range(lines)),
        "1 MB of unfinished colour codes": "\x1b[3" * (size // 3) + "\n",
    }


def read_seconds(text: str) -> float:
    parser = LogParser(make_format("auto"))
    started = time.perf_counter()
    for start in range(0, len(text), 65536):       # in chunks, as the follower hands them
        parser.feed(text[start:start + 65536])
    parser.finish()
    return time.perf_counter() - started


def median_seconds(text: str, repeat: int) -> float:
    return statistics.median(read_seconds(text) for _ in range(repeat))


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--scale", type=float, default=1.0, help="N = scale x 100,000 lines, 1 MB")
    options.add_argument("--repeat", type=int, default=3)
    args = options.parse_args()
    lines, size = int(100_000 * args.scale), int(1_000_000 * args.scale)
    single, double = logs(lines, size), logs(2 * lines, 2 * size)
    rows = []
    for name in single:
        once, twice = median_seconds(single[name], args.repeat), median_seconds(double[name], args.repeat)
        rows.append([name, f"{len(single[name]):,}", f"{once:.3f}", f"{twice:.3f}", f"{twice / once:.2f}"])
    print_table(["log", "bytes at N", "s at N", "s at 2N", "ratio"], rows, left=1)


if __name__ == "__main__":
    main()
