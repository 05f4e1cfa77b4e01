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

--changes measures the change-point rules instead (runs/changes.py, in the nightly's
runs/noise.py), side by side with Apache Otava's defaults on the same histories when
`apache-otava` is installed (pip install 'orch[bench]'): after CP_WARMUP healthy nights,
30 more nights of each case, every night judged on the history so far:

  healthy     nothing changes: false alarms per 30 nights
  drift       -0.1, -0.3 or -1 % a night, from night 1 on: caught by night 30, nights to catch
  step        -5 % from night 1 on: caught, on its night, nights to catch
  spread      the noise x 3 from night 1 on, the level unchanged: alarms per 30 nights
  recovery    -5 % for 5 nights, then back: the dip caught, and 10 nights after its end
              no drop still in effect (orch's segments; Otava's split at its change points)

An alarm is a night that exits 20 for throughput (any metric). Rules: "orch change points"
(a metric's regression that came from runs/changes.py's rules), "orch nightly" (every
throughput rule of `orch nightly`: noise model and change points), "Otava" (each metric's
series so far through otava.analysis.compute_change_points with its defaults, a new drop
in effect being an alarm, as for orch, without orch's 1 % rule: Otava's change points come
with no interval). A step's change point "on its night": five nights in, the total's
analysis puts one exactly on the step's first night. --repeat N plays N runs a night.
The e-divisive scan runs in numpy where numpy is installed (numpy_scan: checked equal to
runs/edivisive.py's first); --jobs N runs the cases N processes at a time:

    nice .venv/bin/python benchmarks/regression_detection.py --changes --trials 30 --jobs 2
    nice .venv/bin/python benchmarks/regression_detection.py --changes --scenario cpu --repeat 3 --no-otava
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrator.runs import changes, noise  # noqa: E402
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
        history = self.profiles[::-1][:max(noise.WINDOW + 1, noise.HISTORY)]
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


# ------------------------------------------------------------------ change points (--changes)
CP_WARMUP = 30         # healthy nights before each case: a month of nightly history
CP_NIGHTS = 30         # nights of each case judged
STEP_PLACED = 5        # a step's change point is looked for where these nights of it show it
CASES = ("healthy", "drift -0.1 %/night", "drift -0.3 %/night", "drift -1 %/night", "step -5 %",
         "spread x3", "recovery")
RULES = ("orch change points", "orch nightly", "Otava 0.8.0 defaults")


def case_night(case: str, k: int) -> tuple[float, float]:
    """(shift, noise scale) of the case's night K (1: its first)."""
    if case.startswith("drift"):
        return float(case.split()[1]) / -100 * k, 1.0
    if case == "step -5 %":
        return 0.05, 1.0
    if case == "spread x3":
        return 0.0, 3.0
    if case == "recovery":
        return (0.05 if k <= 5 else 0.0), 1.0
    return 0.0, 1.0


def otava_changes(values: list[float]) -> list:
    """Otava's change points of VALUES (its defaults), as runs/changes.py Changes so the same
    "new drop in effect" rule reads them; None without Otava."""
    from otava.analysis import compute_change_points   # optional: orch[bench]
    points, _ = compute_change_points(values)
    cuts = [0] + [p.index for p in points] + [len(values)]
    means = [sum(values[a:b]) / (b - a) for a, b in zip(cuts, cuts[1:])]
    return [changes.Change(p.index, means[i], means[i + 1], means[i + 1] / means[i] - 1, 0.0, 0.0,
                           p.stats.pvalue, changes.LEVEL,
                           abs(means[-1] - means[i + 1]) < abs(means[-1] - means[i]), 0, 0)
            for i, p in enumerate(points)]


def cp_history(rng: random.Random, spreads: tuple, case: str, with_otava: bool,
               repeat: int = 1) -> dict:
    """One history of CASE: per rule, the case's nights (1-based) that alarmed, whether each
    rule sees a recovery as over at the end, and whether a step's change point is placed on
    its night once STEP_PLACED nights show it."""
    judges = Judges()
    for n in range(CP_WARMUP):
        judges.add(nights(rng, n, spreads, repeat))
    alarms = {rule: [] for rule in RULES if with_otava or not rule.startswith("Otava")}
    otava_last: dict = {}
    series: dict = {}
    for profile in judges.profiles:
        for metric, level in profile.levels.items():
            series.setdefault(metric, []).append(level)
    # Each rule's first alarm is all a detection case needs: the rest of its nights are
    # judged for the healthy and spread cases only (alarms per 30 nights); a recovery is
    # judged through its dip, then its total analysed once at the end.
    judged = CP_NIGHTS if case in ("healthy", "spread x3") else 5 if case == "recovery" else None
    for k in range(1, CP_NIGHTS + 1):
        shift, scale = case_night(case, k)
        tonight = noise.profile_night(nights(rng, CP_WARMUP + k, tuple(s * scale for s in spreads),
                                             repeat, shift))
        if (k <= judged) if judged is not None else not all(alarms.values()):
            judge_cp_night(judges, tonight, series, alarms, otava_last, with_otava, k)
        else:
            for metric, level in tonight.levels.items():
                series[metric].append(level)
        if judged is None and all(alarms.values()) and (case != "step -5 %" or k >= STEP_PLACED):
            break
    recovered, placed = {}, {}
    if case == "recovery":
        total = series["total"][-noise.HISTORY:]
        recovered["orch"] = not any(c.drop and c.in_effect for c in changes.analyse(total))
        if with_otava:
            recovered["Otava 0.8.0 defaults"] = not any(c.drop and c.in_effect
                                                        for c in otava_changes(total))
    if case == "step -5 %":
        total = series["total"][:CP_WARMUP + STEP_PLACED]
        placed["orch"] = any(c.index == CP_WARMUP for c in changes.analyse(total))
        if with_otava:
            placed["Otava 0.8.0 defaults"] = any(c.index == CP_WARMUP for c in otava_changes(total))
    return {"alarms": alarms, "recovered": recovered, "placed": placed}


def judge_cp_night(judges: Judges, tonight, series: dict, alarms: dict, otava_last: dict,
                   with_otava: bool, k: int) -> None:
    """Night K judged by orch's rules and Otava's, its alarms noted, then kept."""
    judgement = noise.judge(tonight, judges.profiles[::-1][:max(noise.WINDOW + 1, noise.HISTORY)])
    judges.profiles.append(tonight)
    flagged = [m for m in judgement.metrics if m.status == noise.REGRESSION]
    if flagged:
        alarms["orch nightly"].append(k)
    if any(m.change for m in flagged):
        alarms["orch change points"].append(k)
    for metric, level in tonight.levels.items():
        series[metric].append(level)
    if not with_otava:
        return
    new = False
    for metric, values in series.items():
        found = otava_changes(values[-noise.HISTORY:])
        last = otava_last.get(metric)
        if last is None:
            last = otava_changes(values[-noise.HISTORY - 1:-1])
        new = new or bool(changes.new_drops(found, last, min_drop=None))   # no interval
        otava_last[metric] = found
    if new:
        alarms["Otava 0.8.0 defaults"].append(k)


def measure_case(name: str, case: str, trials: int, seed: int, with_otava: bool,
                 repeat: int) -> dict:
    spreads = SCENARIOS[name]
    tag = f"-x{repeat}" if repeat > 1 else ""
    rng = random.Random(f"{seed}-{name}-changes-{case}{tag}")
    runs = [cp_history(rng, spreads, case, with_otava, repeat) for _ in range(trials)]
    rows = {}
    for rule in RULES:
        if rule.startswith("Otava") and not with_otava:
            continue
        key = "orch" if rule.startswith("orch") else rule
        firsts = [r["alarms"][rule][0] if r["alarms"][rule] else None for r in runs]
        caught = sorted(f for f in firsts if f is not None)
        row = {"caught": len(caught) / trials,
               "median_nights": caught[len(caught) // 2] if caught else None,
               "first_night": sum(f == 1 for f in caught) / trials,
               "alarms_per_30": sum(len(r["alarms"][rule]) for r in runs) / trials
               * 30 / CP_NIGHTS}
        if case == "recovery":
            row["caught"] = sum(1 for f in firsts if f is not None and f <= 5) / trials
            row["recovered"] = sum(r["recovered"].get(key, False) for r in runs) / trials
        if case == "step -5 %":
            row["placed"] = sum(r["placed"].get(key, False) for r in runs) / trials
        rows[(case, rule)] = row
    return rows


def progress(task: tuple, rows: dict) -> dict:
    """A finished case on stderr (one JSON line: the run takes minutes), then its rows."""
    print(json.dumps({"scenario": task[0], "case": task[1],
                      "rows": [{"rule": rule, **row} for (_, rule), row in rows.items()]}),
          file=sys.stderr, flush=True)
    return rows


def measure_changes(names: list[str], trials: int, seed: int, with_otava: bool,
                    repeat: int = 1, jobs: int = 1) -> list[dict]:
    """Every case of every scenario in NAMES, JOBS processes at a time (each case has its own
    seeded generator: the figures do not depend on JOBS)."""
    tasks = [(name, case) for name in names for case in CASES]
    args = [(name, case, trials, seed, with_otava, repeat) for name, case in tasks]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs) as pool:
            futures = [pool.submit(measure_case, *a) for a in args]
            done = [progress(task, future.result()) for task, future in zip(tasks, futures)]
    else:
        done = [progress(task, measure_case(*a)) for task, a in zip(tasks, args)]
    results = []
    for name in names:
        rows = {}
        for (task_name, _), found in zip(tasks, done):
            if task_name == name:
                rows.update(found)
        results.append({"scenario": name, "spreads": SCENARIOS[name], "trials": trials,
                        "repeat": repeat, "rows": rows})
    return results


def changes_table(results: list[dict]) -> str:
    lines = ["| scenario | case | rule | caught (by night 30) | median nights to catch | "
             "alarm on its night | change point on its night | alarms per 30 nights |",
             "| --- | --- | --- |" + " ---: |" * 5]
    for result in results:
        spread = "/".join(f"{s:.0%}" for s in result["spreads"])
        if result.get("repeat", 1) > 1:
            spread += f", {result['repeat']} runs a night"
        for (case, rule), row in result["rows"].items():
            caught = "-" if case in ("healthy", "spread x3") else f"{row['caught']:.0%}"
            if case == "recovery":
                caught = f"dip {row['caught']:.0%}, recovery seen {row['recovered']:.0%}"
            nights = "-" if row["median_nights"] is None or case in ("healthy", "spread x3") \
                else str(row["median_nights"])
            first = f"{row['first_night']:.0%}" if case == "step -5 %" else "-"
            placed = f"{row['placed']:.0%}" if case == "step -5 %" else "-"
            lines.append(f"| {result['scenario']} ({spread}) | {case} | {rule} | {caught} | "
                         f"{nights} | {first} | {placed} | {row['alarms_per_30']:.2f} |")
    return "\n".join(lines)


def numpy_scan():
    """runs/edivisive.py's best_split in numpy (2-D prefix sums of the distances: every
    (tau, kappa) at once), or None without numpy. The benchmark judges thousands of
    histories, each night again with hundreds of shuffles; the pure-Python scan (what a
    controller runs) takes days for that. Checked equal to it before use (use_numpy_scan)."""
    try:
        import numpy as np
    except ImportError:
        return None

    def best_split(values, start, end):
        z = np.asarray(values[start:end], dtype=float)
        n = len(z)
        if n < 2:
            return None
        distances = np.abs(z[:, None] - z[None, :])
        prefix = np.zeros((n + 1, n + 1))
        prefix[1:, 1:] = distances.cumsum(0).cumsum(1)
        diagonal = prefix.diagonal()                      # within z[:b], twice
        tau = np.arange(1, n)[:, None]
        kappa = np.arange(2, n + 1)[None, :]
        valid = kappa > tau
        t, k = np.broadcast_to(tau, valid.shape), np.where(valid, kappa, n)
        between = prefix[t, k] - prefix[t, t]
        within_y = (prefix[k, k] - 2 * prefix[t, k] + prefix[t, t]) / 2
        within_x = diagonal[t] / 2
        m = k - t
        x_term = np.where(t > 1, 2 * within_x / np.maximum(t - 1, 1), 0.0)
        y_term = np.where(m > 1, 2 * t * within_y / np.maximum(m - 1, 1), 0.0)
        q = np.where(valid, (2 * between - m * x_term - y_term) / (t + m), -np.inf)
        at = int(np.argmax(q))          # row-major: the first best (tau, kappa), as the loop
        return float(q.flat[at]), start + 1 + at // q.shape[1]
    return best_split


def use_numpy_scan() -> bool:
    """Put the numpy scan in runs/edivisive.py's place if it gives the same splits as the
    pure-Python one on random series (else keep the pure-Python one)."""
    from orchestrator.runs import edivisive
    fast = numpy_scan()
    if fast is None:
        return False
    rng = random.Random(5)
    for n in (2, 3, 7, 30, 61):
        values = [rng.gauss(100, 3) for _ in range(n)]
        mine, theirs = fast(values, 0, n), edivisive.best_split(values, 0, n)
        if mine[1] != theirs[1] or abs(mine[0] - theirs[0]) > 1e-9 * max(1.0, abs(theirs[0])):
            print(f"the numpy scan differs ({mine} vs {theirs}): the pure-Python one is used",
                  file=sys.stderr)
            return False
    edivisive.best_split = fast
    return True


def otava_available() -> bool:
    try:
        import otava.analysis  # noqa: F401  (optional: orch[bench])
    except ImportError:
        return False
    return True


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
    parser.add_argument("--changes", action="store_true",
                        help="the change-point rules against Otava (default scenarios: quiet, cpu)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="with --changes: processes (one case of a scenario each; default 1)")
    parser.add_argument("--no-otava", action="store_true", help="with --changes: leave Otava out")
    args = parser.parse_args(argv)
    if args.changes:
        use_numpy_scan()
        with_otava = not args.no_otava and otava_available()
        if not with_otava and not args.no_otava:
            print("apache-otava is not installed (pip install 'orch[bench]'): its rows are left out",
                  file=sys.stderr)
        results = [result for repeat in (args.repeat or [1])
                   for result in measure_changes(args.scenario or ["quiet", "cpu"], args.trials,
                                                 args.seed, with_otava, repeat, args.jobs)]
        if args.json:
            print(json.dumps([{**r, "rows": [{"case": c, "rule": rule, **row}
                                             for (c, rule), row in r["rows"].items()]}
                              for r in results], indent=2))
        else:
            print(changes_table(results))
        return 0
    rows = [measure(name, args.trials, args.seed, repeat)
            for name in (args.scenario or SCENARIOS) for repeat in (args.repeat or [1])]
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
