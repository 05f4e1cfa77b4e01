#!/usr/bin/env python3
"""False alarms and detections of orch nightly's two rules over synthetic nightly histories.

Each night is a run record like the stand-in trainer's: WORKERS workers, STEPS metric points
each (the first slow: the compile), judged the way `orch nightly` judges it:

  threshold   the old rule: any of the total's or a worker's tok/s more than 10 % below the
              last ok run (runs/compare.py)
  noise       runs/noise.py: against the last 10 runs' median and measured noise, rank test,
              suspected after one bad night, a regression after two or when far outside

A night's noise, per scenario (a run's level = base x (1 + shared) x (1 + worker) x (1 - shift),
each step's tok/s that x (1 + step); all normal, standard deviations below):

  quiet       a dedicated machine: shared 1 %, worker 1 %, step 1 %
  cpu         the project's CPU runs on a loaded 2-core machine: shared 5 %, worker 1 %, step 2 %
  gpu-shared  drafters sharing one GPU: shared 2 %, worker 8 % (a worker's nights spread over
              about 25 %, as measured on an H200), step 3 %

With --repeat N each night is N runs, each drawn as above (independent: the repeats share
nothing of a night's conditions, the best case for repeating), and the noise model judges
the night by the mean of its runs (`orch nightly --repeat N`); the threshold rule still
compares one run with the last one before it.

Measured: false "regression" (exit code 20) nights per 30 healthy nights, after 10 healthy
nights of history, across all metrics (the total and each worker); "suspected" nights (exit
0, one line) the same way; and the share of shifts of 3, 5, 10 and 20 % (all workers slower
from one night on) confirmed as a regression on the first or second night.

    .venv/bin/python benchmarks/regression_detection.py                  # the table in docs
    .venv/bin/python benchmarks/regression_detection.py --repeat 3 --scenario cpu
    .venv/bin/python benchmarks/regression_detection.py --trials 50 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrator.runs import noise  # noqa: E402
from orchestrator.runs.compare import compare  # noqa: E402
from orchestrator.runs.model import MetricPoint, RunRecord, TargetInfo  # noqa: E402

WORKERS, STEPS, BASE_TOK_S = 3, 12, 5400.0
WARMUP = 10            # healthy nights before any night is judged
HEALTHY_NIGHTS = 30    # judged nights per false-alarm trial
SHIFTS = (0.03, 0.05, 0.10, 0.20)
SCENARIOS = {          # (shared, worker, step) standard deviations
    "quiet": (0.01, 0.01, 0.01),
    "cpu": (0.05, 0.01, 0.02),
    "gpu-shared": (0.02, 0.08, 0.03),
}


def night(rng: random.Random, n: int, spreads: tuple, shift: float = 0.0) -> RunRecord:
    shared_sd, worker_sd, step_sd = spreads
    shared = rng.gauss(0, shared_sd)
    metrics = []
    for worker in range(WORKERS):
        level = BASE_TOK_S * (1 + 0.03 * (worker - 1)) * (1 + shared) * (1 + rng.gauss(0, worker_sd))
        level *= 1 - shift
        for step in range(1, STEPS + 1):
            rate = level / 12 if step == 1 else level * (1 + rng.gauss(0, step_sd))
            metrics.append(MetricPoint("t", worker, step, tok_s=round(max(rate, 1.0))))
    return RunRecord(run_id=f"night-{n:04d}", playbook="bench.yaml", playbook_sha256="",
                     name="bench", targets=[TargetInfo("t", "h")], verdict="ok", metrics=metrics)


class Judges:
    """Both rules over one history, night by night (the newest last)."""

    def __init__(self):
        self.records: list[RunRecord] = []
        self.profiles: list[noise.RunProfile] = []

    def add(self, night_runs: list[RunRecord]) -> tuple[bool, str]:
        """(the threshold rule flagged the night's first run, the noise model's status for
        the night), then keep it."""
        threshold = bool(self.records) and compare(self.records[-1], night_runs[0]).regressed
        tonight = noise.profile_night(night_runs)
        history = self.profiles[::-1][:noise.WINDOW + 1]
        status = noise.judge(tonight, history).status
        self.records.append(night_runs[-1])
        self.profiles.append(tonight)
        return threshold, status


def nights(rng: random.Random, n: int, spreads: tuple, repeat: int, shift: float = 0.0) -> list:
    return [night(rng, n * 100 + k, spreads, shift) for k in range(repeat)]


def healthy(rng: random.Random, spreads: tuple, repeat: int) -> dict:
    judges = Judges()
    for n in range(WARMUP):
        judges.add(nights(rng, n, spreads, repeat))
    counts = {"threshold": 0, "regression": 0, "suspected": 0}
    for n in range(WARMUP, WARMUP + HEALTHY_NIGHTS):
        flagged, status = judges.add(nights(rng, n, spreads, repeat))
        counts["threshold"] += flagged
        counts["regression"] += status == noise.REGRESSION
        counts["suspected"] += status == noise.SUSPECTED
    return counts


def shifted(rng: random.Random, spreads: tuple, shift: float, repeat: int) -> dict:
    judges = Judges()
    for n in range(WARMUP):
        judges.add(nights(rng, n, spreads, repeat))
    results = [judges.add(nights(rng, WARMUP + k, spreads, repeat, shift)) for k in range(2)]
    return {"threshold": any(flagged for flagged, _ in results),
            "noise": any(status == noise.REGRESSION for _, status in results),
            "noise_first_night": results[0][1] in (noise.REGRESSION, noise.SUSPECTED)}


def measure(name: str, trials: int, seed: int, repeat: int = 1) -> dict:
    spreads = SCENARIOS[name]
    # The seed string of one run a night is the one the first published table used.
    rng = random.Random(f"{seed}-{name}" + (f"-x{repeat}" if repeat > 1 else ""))
    alarms = {"threshold": 0, "regression": 0, "suspected": 0}
    for _ in range(trials):
        for key, count in healthy(rng, spreads, repeat).items():
            alarms[key] += count
    row = {"scenario": name, "spreads": spreads, "trials": trials, "repeat": repeat,
           "false_per_30": {k: v / trials for k, v in alarms.items()}, "detected": {}}
    for shift in SHIFTS:
        hits = {"threshold": 0, "noise": 0, "noise_first_night": 0}
        for _ in range(trials):
            for key, hit in shifted(rng, spreads, shift, repeat).items():
                hits[key] += hit
        row["detected"][f"{shift:.0%}"] = {k: v / trials for k, v in hits.items()}
    return row


def table(rows: list[dict]) -> str:
    head = ("| scenario (shared/worker/step sd) | rule | false regressions per 30 healthy nights | "
            + " | ".join(f"{s:.0%} confirmed in 2 nights" for s in SHIFTS) + " |")
    lines = [head, "|" + " --- |" * 2 + " ---: |" * (1 + len(SHIFTS))]
    shown = set()
    for row in rows:
        spread = "/".join(f"{s:.0%}" for s in row["spreads"])
        label = f"{row['scenario']} ({spread})"
        noise_rule = "noise model" + (f", {row['repeat']} runs a night" if row["repeat"] > 1 else "")
        detected = row["detected"]
        if row["scenario"] not in shown:   # repeats do not change the threshold rule: once a scenario
            shown.add(row["scenario"])
            lines.append(f"| {label} | threshold 10 % vs last run | {row['false_per_30']['threshold']:.2f} | "
                         + " | ".join(f"{detected[f'{s:.0%}']['threshold']:.0%}" for s in SHIFTS) + " |")
        lines.append(f"| {label} | {noise_rule} | {row['false_per_30']['regression']:.2f} "
                     f"(+{row['false_per_30']['suspected']:.2f} suspected) | "
                     + " | ".join(f"{detected[f'{s:.0%}']['noise']:.0%} "
                                  f"({detected[f'{s:.0%}']['noise_first_night']:.0%} flagged night 1)"
                                  for s in SHIFTS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200,
                        help="histories per scenario and per shift (default 200)")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append",
                        help="only these scenarios (repeatable; default all)")
    parser.add_argument("--repeat", type=int, action="append",
                        help="runs a night for the noise model (repeatable: one row each; "
                             "default 1)")
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    args = parser.parse_args(argv)
    rows = [measure(name, args.trials, args.seed, repeat)
            for name in (args.scenario or SCENARIOS) for repeat in (args.repeat or [1])]
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
