"""Is tonight slower than usual? Throughput judged against its own measured noise.

A fixed threshold against one baseline run cries wolf where runs vary more than it (a loaded
CPU, drafters sharing a GPU) and misses smaller real drops where they vary less. Here each
metric (the total tok/s and each worker's) is judged against a window of earlier nights of
the same shape (runs/baseline.py, `same_shape_nights`). A night is one run, or the N runs of
`orch nightly --repeat N`: its level the mean of theirs, its samples all of theirs.

    level     a run's tok/s for the metric, as runs/compare.py's `throughput` gives it
    centre    the median of the window's levels
    noise     the median absolute deviation of the window's levels x 1.4826 (a standard
              deviation for normal noise), or the mean absolute deviation x 1.2533 where
              that is larger, never below NOISE_FLOOR of the centre: the MAD of ten runs
              alone is often 40 % low (its efficiency is 37 %), and z then cries wolf;
              the mean deviation is as robust to one slow run as it needs to be here
    effect    (tonight - centre) / centre
    z         (tonight - centre) / (noise x sqrt(1 + pi / 2n)): against a prediction
              interval, as the centre is itself the median of n noisy runs
    p         one-sided Mann-Whitney U (runs/ranktest.py) of tonight's per-step samples
              against the window's: are tonight's steps slower? (None without samples) It
              describes the night and judges nothing: a night's steps share its machine
              state, so they are not independent evidence and their p overstates it.

A night is slow for a metric at z <= -Z_CONFIRM, bad at z <= -Z_BAD: the evidence is the
nights' levels (with --repeat N the mean of N replicate runs), never the steps. Persistence: one bad night is "suspected" (exit 0,
one line); two slow nights in a row are a "regression" (each worker's bar corrected for the
number of workers, confirm_bar: they vary nearly independently on a quiet machine), and so is one night far outside the
noise (z <= -Z_FAR) once the window holds FAR_MIN_RUNS nights. Two nights at the lower bar
rather than two at the higher one: HUD's "consecutive points over the line"; in the
benchmark it catches more 5 % drops on a quiet machine for a small rise in false regressions
(docs/benchmarks/regressions.md).
The history's change points (runs/changes.py, over up to HISTORY nights) add three rules: a
level drop that e-divisive finds tonight and found on none of the nights just before (a slow
drift, a step a few nights old), tonight far below the level since the last change point (a
step on its night), and the level since the last change point falling night by night (a
drift too slow for e-divisive on a noisy machine): each a "regression".
Fewer than MIN_RUNS window runs: "insufficient data" (orch nightly keeps the fixed threshold).
The previous night is judged again against the window behind it, so nothing extra is stored
and a pinned or deleted run cannot leave a stale state. After a real drop the window's median
follows the new level within WINDOW / 2 nights: the new level becomes the baseline.
The figures behind these constants: docs/benchmarks/regressions.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

from orchestrator.runs import changes
from orchestrator.runs.compare import Change, Comparison, series, throughput
from orchestrator.runs.model import RunRecord
from orchestrator.runs.ranktest import mann_whitney_u

WINDOW = 20            # the earlier ok runs of the same shape a night is judged against
HISTORY = changes.HISTORY_NIGHTS   # the nights whose change points the nightly looks at
MIN_RUNS = 4           # fewer and the noise cannot be measured
MIN_SAMPLES = 3        # per-step samples a run needs for the rank test
Z_BAD = 3.0            # a bad night: this many noise widths below the centre
Z_CONFIRM = 2.0        # a slow night: two in a row at this lower bar are a regression (the
                       # total's bar; each worker's is confirm_bar's, corrected for the workers)
TOTAL = "total"        # the primary metric: tested at the full level, the workers as a family
Z_FAR = 6.0            # so far outside the noise that one night confirms it
FAR_MIN_RUNS = 8       # ... once the window holds this many: the noise of 4-7 runs is itself
                       # too uncertain (seen: a drafter's -25 % quiet night at z below -6
                       # against 4 quiet sandbox nights); before, the next night confirms
NOISE_FLOOR = 0.005    # 0.5 %: a window of identical runs would make any wobble a regression
MAD_SCALE = 1.4826     # MAD -> standard deviation for normal noise
MEAN_AD_SCALE = 1.2533 # mean absolute deviation -> standard deviation (sqrt(pi / 2))

REGRESSION, SUSPECTED, OK, INSUFFICIENT = "regression", "suspected", "ok", "insufficient data"
ACKNOWLEDGED = "acknowledged"    # flagged, but a known slow-down (runs/acks.py): no alert
ORDER = (REGRESSION, SUSPECTED, ACKNOWLEDGED, OK, INSUFFICIENT)      # the worst first


@dataclass(frozen=True)
class RunProfile:
    """One night's throughput as the noise model needs it: a level and samples per metric.
    A night is one run, or the repeats of one `orch nightly --repeat N` (profile_night)."""
    run_id: str             # "A+B+C" for a night of three repeats
    levels: dict            # metric ("total", "d0", "sb1-200/d1") -> tok/s
    samples: dict           # metric -> the night's steady per-step tok/s
    runs: int = 1           # the repeats the levels are the mean of


@dataclass
class MetricJudgement:
    metric: str
    status: str
    reason: str
    tonight: Optional[float] = None
    centre: Optional[float] = None
    noise: Optional[float] = None        # tok/s
    noise_pct: Optional[float] = None    # noise / centre
    effect: Optional[float] = None       # fraction, negative: slower
    z: Optional[float] = None
    p: Optional[float] = None
    window_runs: int = 0
    samples: int = 0
    repeats: int = 1                     # tonight's runs, whose mean "tonight" is
    ack: Optional[dict] = None           # the acknowledgement that covers it (runs/acks.py)
    previous_z: Optional[float] = None   # the night before, against its own window (None: unknown)
    change: Optional[dict] = None        # the change point that made it a regression (runs/changes.py)


@dataclass
class NoiseJudgement:
    status: str
    metrics: list[MetricJudgement] = field(default_factory=list)
    window: list[str] = field(default_factory=list)       # run ids, newest first

    @property
    def decides(self) -> bool:
        """Whether the noise model, not the fixed threshold, judges throughput tonight."""
        return self.status != INSUFFICIENT

    def worst(self) -> list[MetricJudgement]:
        return [m for m in self.metrics if m.status == self.status]

    def lines(self) -> list[str]:
        """One line per metric, the worst first, for reports and notifications."""
        ranked = sorted(self.metrics, key=lambda m: (ORDER.index(m.status), m.metric != "total"))
        return [f"{m.metric}: {m.status} - {m.reason}" for m in ranked]

    def to_dict(self) -> dict:
        return {"status": self.status, "window": self.window,
                "metrics": [asdict(m) for m in self.metrics]}


# ------------------------------------------------------------------ a run's numbers
def profile(record: RunRecord) -> RunProfile:
    tp = throughput(record)
    levels = dict(tp["per_drafter"])
    if tp["total"]:
        levels["total"] = tp["total"]
    return RunProfile(record.run_id, levels, samples(record))


def profile_night(records: list[RunRecord]) -> RunProfile:
    """The repeats of one night as one profile: per metric the mean of the runs' levels (the
    noise of a mean of N independent runs is 1/sqrt(N) of one run's) and all their samples."""
    if len(records) == 1:
        return profile(records[0])
    runs = [profile(record) for record in records]
    levels, pooled = {}, {}
    for metric in sorted({m for run in runs for m in run.levels}):
        values = [run.levels[metric] for run in runs if run.levels.get(metric)]
        if values:
            levels[metric] = statistics.fmean(values)
        pooled[metric] = [v for run in runs for v in run.samples.get(metric, [])]
    return RunProfile("+".join(run.run_id for run in runs), levels,
                      {metric: values for metric, values in pooled.items() if values}, len(runs))


def samples(record: RunRecord) -> dict[str, list[float]]:
    """Per metric, the run's per-step tok/s after its first point (which holds the compile).
    The total's samples are the steps every worker reported, summed."""
    per_worker: dict[str, dict[int, float]] = {}
    for label, points in series(record).items():
        steady = [p for p in points if p.tok_s is not None][1:]
        per_worker[label] = {p.step: float(p.tok_s) for p in steady}
    result = {label: list(steps.values()) for label, steps in per_worker.items()}
    if per_worker:
        common = set.intersection(*(set(steps) for steps in per_worker.values()))
        result["total"] = [sum(steps[s] for steps in per_worker.values()) for s in sorted(common)]
    return {metric: values for metric, values in result.items() if values}


# ------------------------------------------------------------------ judging
def judge(tonight: RunProfile, history: list[RunProfile]) -> NoiseJudgement:
    """TONIGHT against HISTORY (earlier runs of the same shape, newest first)."""
    window = history[:WINDOW]
    workers = sum(1 for metric in tonight.levels if metric != TOTAL)
    metrics = [judge_metric(metric, tonight, history, confirm_bar(metric, workers))
               for metric in sorted(tonight.levels)]
    judged = [m.status for m in metrics]
    status = next((s for s in ORDER if s in judged), INSUFFICIENT)
    return NoiseJudgement(status, metrics, [run.run_id for run in window])


def confirm_bar(metric: str, workers: int) -> float:
    """The z bar of the two-slow-nights rule for METRIC: Z_CONFIRM for the total; for each of
    WORKERS worker metrics a Bonferroni bar, so that the chance of two chance-slow nights in a
    row on any worker is that of one metric at Z_CONFIRM. On a quiet machine the workers vary
    nearly independently, and at the total's bar each added its own chance alarms (measured:
    docs/benchmarks/regressions.md); a real slow-down of every worker shows in the total."""
    if metric == TOTAL or workers <= 1:
        return Z_CONFIRM
    one_night = statistics.NormalDist().cdf(-Z_CONFIRM) / math.sqrt(workers)   # the pair: / workers
    return -statistics.NormalDist().inv_cdf(one_night)


def judge_metric(metric: str, tonight: RunProfile, history: list[RunProfile],
                 z_confirm: float = Z_CONFIRM) -> MetricJudgement:
    result = measure(metric, tonight, history[:WINDOW])
    if result.status == INSUFFICIENT:
        return result
    bad, slow = _slow(result, Z_BAD), _slow(result, z_confirm)
    before_slow = False
    if history:
        before = measure(metric, history[0], history[1:WINDOW + 1])
        before_slow = _slow(before, z_confirm)
        result.previous_z = before.z
    numbers = _numbers(result)
    change = change_point(metric, tonight, history)
    if bad and result.z <= -Z_FAR and result.window_runs >= FAR_MIN_RUNS:
        result.status, result.reason = REGRESSION, f"far outside the noise tonight: {numbers}"
    elif slow and before_slow:
        result.status, result.reason = REGRESSION, (f"the second slow night in a row: {numbers}; "
                                                    f"the night before z {result.previous_z:+.1f}")
    elif change:
        result.status, result.change = REGRESSION, change
        result.reason = f"{change['text']}: {numbers}"
    elif bad:
        result.status, result.reason = SUSPECTED, (f"slower than the noise explains: {numbers}; "
                                                   "confirmed if the next night is slow too")
    else:
        result.status, result.reason = OK, f"within the noise: {numbers}"
    return result


def change_point(metric: str, tonight: RunProfile, history: list[RunProfile]) -> Optional[dict]:
    """The change-point rules (runs/changes.py) over METRIC's nights through tonight: a new
    level drop in effect, or tonight far below the level since the last change point."""
    remembered = history[:HISTORY - 1 + changes.REMEMBER_NIGHTS][::-1]
    known = [run.levels[metric] for run in remembered if run.levels.get(metric)]
    earlier = known[-(HISTORY - 1):]
    levels = earlier + [tonight.levels[metric]]
    last_night = changes.analyse(earlier)
    steady = metric in changes.TAIL_METRICS
    tail = changes.tail_drop(levels, last_night) if steady else None
    if tail:
        text = (f"far below the level of the {tail.nights_before} nights since the last change "
                f"point: {changes.describe(tail)}")
        return {**tail.to_dict(), "rule": "tail", "nights": len(levels), "text": text}
    drops = changes.new_drops(changes.analyse(levels), changes.remembered_drops(known))
    if drops:
        drop = drops[-1]
        ago = len(levels) - drop.index
        text = (f"a change point {ago} night{'s' if ago > 1 else ''} ago in the last "
                f"{len(levels)} nights (e-divisive, p {drop.p:.2g}): {changes.describe(drop)}")
        return {**drop.to_dict(), "rule": "e-divisive", "nights": len(levels), "text": text}
    trend = changes.trend_drop(levels, last_night) if steady else None
    if trend:
        since = "since the last change point" if last_night else "of the history"
        text = f"a downward trend over the {trend.nights_after} nights {since}: {changes.describe(trend)}"
        return {**trend.to_dict(), "rule": "trend", "nights": len(levels), "text": text}
    return None


def measure(metric: str, tonight: RunProfile, window: list[RunProfile]) -> MetricJudgement:
    """The numbers for METRIC, status OK or INSUFFICIENT (judge_metric decides the rest)."""
    level = tonight.levels.get(metric)
    levels = [run.levels[metric] for run in window if run.levels.get(metric)]
    if level is None:
        return MetricJudgement(metric, INSUFFICIENT, "no throughput tonight")
    if len(levels) < MIN_RUNS:
        return MetricJudgement(metric, INSUFFICIENT,
                               f"{len(levels)} earlier run(s) of this shape, {MIN_RUNS} needed "
                               "to measure the noise", tonight=level, window_runs=len(levels))
    centre = statistics.median(levels)
    deviations = [abs(v - centre) for v in levels]
    noise = max(MAD_SCALE * statistics.median(deviations),
                MEAN_AD_SCALE * statistics.fmean(deviations), NOISE_FLOOR * centre)
    # z is taken against a prediction interval: the centre is a median of n noisy runs
    # itself, with a variance of about pi/2 * noise^2 / n.
    spread = noise * math.sqrt(1 + math.pi / (2 * len(levels)))
    mine = tonight.samples.get(metric, [])
    theirs = [v for run in window for v in run.samples.get(metric, [])]
    p = None
    if len(mine) >= MIN_SAMPLES and len(theirs) >= MIN_SAMPLES:
        p = mann_whitney_u(mine, theirs, "less").p
    return MetricJudgement(metric, OK, "", tonight=level, centre=centre, noise=noise,
                           noise_pct=noise / centre, effect=(level - centre) / centre,
                           z=(level - centre) / spread, p=p, window_runs=len(levels),
                           samples=len(mine), repeats=tonight.runs)


def _slow(result: MetricJudgement, z: float) -> bool:
    """Tonight's level at least Z noise widths below the centre (the rank test's p only
    describes the night: its steps are not independent of each other)."""
    return result.status != INSUFFICIENT and result.z <= -z


def _numbers(m: MetricJudgement) -> str:
    runs = f" (mean of {m.repeats} runs)" if m.repeats > 1 else ""
    text = (f"{m.tonight:,.0f} tok/s{runs} vs median {m.centre:,.0f} of {m.window_runs} nights "
            f"({m.effect * 100:+.1f} %, noise {m.noise_pct * 100:.1f} %, z {m.z:+.1f}")
    return text + (f", rank test p {m.p:.2g})" if m.p is not None else ")")


# ------------------------------------------------------------------ into the comparison
def apply_to(comparison: Comparison, judgement: NoiseJudgement) -> None:
    """Let JUDGEMENT, where it decides, replace the fixed threshold's throughput verdicts in
    COMPARISON: a drop against the one baseline run becomes information, and each metric the
    noise model finds slow becomes a "regression" or "suspected" change with its numbers
    ("acknowledged": a known one, shown but no regression).
    A worker that reported nothing stays a regression: that is no matter of noise."""
    if not judgement.decides:
        return
    for change in comparison.changes:
        if change.kind == "throughput" and change.detail.get("change") is not None:
            if change.severity == "regression":
                change.severity = "info"
                change.message += " (against one run; the noise model judges throughput)"
    for metric in judgement.metrics:
        if metric.status in (REGRESSION, SUSPECTED, ACKNOWLEDGED):
            comparison.changes.append(Change("throughput", metric.status,
                                             f"{metric.metric} throughput: {metric.reason}",
                                             detail=asdict(metric)))
