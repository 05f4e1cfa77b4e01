"""Change points in a metric's per-night levels: where the level moved, by how much, and
whether it still holds.

A night's level is one number per metric (the mean of its runs with `--repeat N`: the runs
of one night are replicates of that night, its steps are not independent evidence). The
levels of a playbook's history, oldest first, go through e-divisive means
(runs/edivisive.py); each change point it finds becomes a `Change`:

    before, after   the mean levels of the segments either side of it
    effect          after / before - 1
    interval        effect +- 1.96 standard errors of the difference of the two means,
                    with the noise pooled over every segment (each segment's own spread is
                    too uncertain for the few nights a step leaves after it)
    kind            "level" when the interval excludes 0; "spread" otherwise (e-divisive
                    sees changes of the distribution, a noisier machine as well)
    in effect       the newest segment's level is nearer the change's after-level than its
                    before-level (a recovery takes it out of effect)

The nightly's two rules over a metric's history through tonight:

  new_drops   the level drops in effect tonight that none of the analyses of the
              REMEMBER_NIGHTS nights before had (within MATCH_NIGHTS of where it put its
              own), whose 95 % interval lies wholly below -MIN_DROP: a change alerts once,
              on the night the history first proves it larger than 1 % (a slow drift, a
              step a few nights old), and a change whose p-value hovers near ALPHA, found,
              lost and found again, does not alert again each time it is found;
  trend_drop  the level since the last change point falling night by night: the least-
              squares slope of that segment's nights through tonight at t <= -T_TREND,
              its fall over the segment's 95 % interval wholly below -MIN_DROP, at least
              TREND_NIGHTS nights; once per segment (no earlier night of it had the test
              pass). E-divisive compares the means of two segments: a drift of a fraction
              of the noise a night is many nights old before the means differ enough on a
              noisy machine, while the slope uses every night's position too. The total only
              (TAIL_METRICS), as the tail rule;
  tail_drop   tonight alone far below the level since the last change point: t <= -T_TAIL
              against that segment's mean and spread (at least TAIL_NIGHTS nights), a
              prediction interval. E-divisive cannot split off one night (a shuffle puts
              the odd night anywhere, as good), so a step on its own night needs this
              parametric test; the next nights' e-divisive split confirms where it began.
              The nightly applies it to the total only (TAIL_METRICS): the steadiest
              metric, and each further metric tested adds its own false alarms (measured:
              docs/benchmarks/regressions.md).
"""

from __future__ import annotations

import functools
import hashlib
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from orchestrator.runs import edivisive

HISTORY_NIGHTS = 90    # the newest nights analysed: a quarter of nightly runs (O(n^2) scans)
MIN_NIGHTS = 6         # fewer and no change point is looked for
MATCH_NIGHTS = 3       # a change point moved by up to this many nights is the same one
REMEMBER_NIGHTS = 7    # a drop found on any of this many nights before tonight is not new
T_TREND = 2.75         # the slope this many standard errors below 0 (p about 0.003 one-sided
                       # for the 20-90 nights of a segment: it is tested every night)
TREND_NIGHTS = 20      # the fewest nights a trend is fitted to (fewer: its t has heavy tails)
T_TAIL = 3.0           # tonight this many prediction-interval widths below the segment
TAIL_NIGHTS = 10       # ... of at least this many nights
TAIL_METRICS = ("total",)
Z_INTERVAL = 1.96      # a 95 % interval
MIN_DROP = 0.01        # a new drop alerts when its interval lies wholly below -1 %: the
                       # smallest drop worth a page, and on a quiet machine it drops the
                       # chance splits of its four nearly independent metrics (measured:
                       # docs/benchmarks/regressions.md)
LEVEL, SPREAD, TREND = "level", "spread", "trend"


@dataclass(frozen=True)
class Change:
    index: int                 # the first night of the new level (0: the oldest analysed);
                               # of a TREND, the first night of the falling segment
    before: float              # of a TREND, its fitted level at its first night
    after: float               # ... and at its last
    effect: float              # fraction; negative: slower
    low: float                 # the effect's 95 % interval
    high: float
    p: float                   # the permutation test's p-value
    kind: str                  # LEVEL or SPREAD
    in_effect: bool
    nights_before: int         # the nights of the segments either side (of a TREND: 0 and
    nights_after: int          # the nights of its segment)

    @property
    def drop(self) -> bool:
        """A slower level: a step down, or a level falling night by night."""
        return self.kind in (LEVEL, TREND) and self.effect < 0

    def to_dict(self) -> dict:
        """As JSON holds it: a p-value there is none of (a trend, tonight's tail) is None."""
        data = asdict(self)
        if math.isnan(data["p"]):
            data["p"] = None
        return data


def analyse(levels: Sequence[float], *, alpha: Optional[float] = None,
            permutations: Optional[int] = None) -> list[Change]:
    """The change points of LEVELS (per-night levels, oldest first), oldest first; ALPHA and
    PERMUTATIONS default to edivisive's (read at the call)."""
    return list(_analyse(tuple(float(v) for v in levels), alpha or edivisive.ALPHA,
                         permutations or edivisive.PERMUTATIONS))


@functools.lru_cache(maxsize=256)
def _analyse(levels: tuple, alpha: float, permutations: int) -> tuple:
    # Cached: tonight's analysis is one of tomorrow's remembered nights where one process
    # judges many nights (the benchmark); the answer depends on the levels alone (the seed
    # is theirs).
    levels = list(levels)
    if len(levels) < MIN_NIGHTS:
        return ()
    splits = edivisive.change_points(levels, alpha=alpha, permutations=permutations,
                                     seed=_seed(levels))
    cuts = [0] + [s.index for s in splits] + [len(levels)]
    segments = [levels[a:b] for a, b in zip(cuts, cuts[1:])]
    means = [statistics.fmean(segment) for segment in segments]
    noise = _pooled_sd(segments, means)
    newest = means[-1]
    changes = []
    for i, split in enumerate(splits):
        before, after = means[i], means[i + 1]
        n1, n2 = len(segments[i]), len(segments[i + 1])
        half = Z_INTERVAL * noise * math.sqrt(1 / n1 + 1 / n2)
        effect = after / before - 1 if before else 0.0
        low, high = ((after - half) / before - 1, (after + half) / before - 1) if before else (0.0, 0.0)
        kind = LEVEL if (low > 0 or high < 0) else SPREAD
        changes.append(Change(split.index, before, after, effect, low, high, split.p, kind,
                              abs(newest - after) < abs(newest - before), n1, n2))
    return tuple(changes)


def new_drops(tonight: list[Change], earlier: list[Change], *,
              min_drop: Optional[float] = MIN_DROP) -> list[Change]:
    """The level drops in effect in TONIGHT's analysis that EARLIER (the change points of the
    analyses of the nights before: remembered_drops) did not have, whose interval lies
    wholly below -MIN_DROP (a drop that may be smaller is no alert; None: no size rule, for
    change points without an interval)."""
    known = [c.index for c in earlier if c.drop]
    return [c for c in tonight if c.drop and c.in_effect
            and (min_drop is None or c.high < -min_drop)
            and not any(abs(c.index - k) <= MATCH_NIGHTS for k in known)]


def remembered_drops(earlier: Sequence[float]) -> list[Change]:
    """The level drops of the analyses of the REMEMBER_NIGHTS nights before tonight (EARLIER:
    the levels through last night, oldest first): what new_drops holds tonight's against.
    Each analysis is of the history as it stood that night (the same HISTORY_NIGHTS window)."""
    known = []
    for back in range(REMEMBER_NIGHTS):
        through = len(earlier) - back
        if through < MIN_NIGHTS:
            break
        known += [c for c in analyse(earlier[max(0, through - HISTORY_NIGHTS):through]) if c.drop]
    return known


def trend_drop(levels: Sequence[float], before: list[Change]) -> Optional[Change]:
    """The nightly's trend rule: current_trend, unless a shorter stretch of the same segment,
    through an earlier night, passed the test already (a trend alerts once)."""
    trend = current_trend(levels, before)
    if trend is None:
        return None
    segment = [float(v) for v in levels[trend.index:]]
    if any(_falling(segment[:end]) for end in range(TREND_NIGHTS, len(segment))):
        return None
    return trend


def current_trend(levels: Sequence[float], before: list[Change]) -> Optional[Change]:
    """The segment since the last change point of BEFORE through the last of LEVELS, falling:
    a Change of kind TREND from the segment's first night (before/after: its fitted levels
    at its first and last night) when its least-squares slope is at t <= -T_TREND and its
    fall's 95 % interval lies wholly below -MIN_DROP; else None."""
    start = before[-1].index if before else 0
    segment = [float(v) for v in levels[start:]]
    trend = _falling(segment)
    if trend is None:
        return None
    first, last, low, high = trend
    n = len(segment)
    return Change(start, first, last, last / first - 1, low, high, math.nan, TREND, True, 0, n)


def _falling(segment: list[float]) -> Optional[tuple[float, float, float, float]]:
    """(fitted first, fitted last, the fall's 95 % interval as fractions) of SEGMENT's
    least-squares line when it falls by the trend rule, else None."""
    n = len(segment)
    if n < TREND_NIGHTS:
        return None
    mean_x, mean_y = (n - 1) / 2, statistics.fmean(segment)
    sxx = sum((x - mean_x) ** 2 for x in range(n))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(segment)) / sxx
    first = mean_y - slope * mean_x
    residuals = sum((y - first - slope * x) ** 2 for x, y in enumerate(segment))
    standard_error = math.sqrt(residuals / (n - 2) / sxx)
    if first <= 0 or not standard_error or slope / standard_error > -T_TREND:
        return None
    span = n - 1
    half = Z_INTERVAL * standard_error * span
    low, high = (slope * span - half) / first, (slope * span + half) / first
    if high >= -MIN_DROP:
        return None
    return first, first + slope * span, low, high


def tail_drop(levels: Sequence[float], before: list[Change]) -> Optional[Change]:
    """Tonight (the last of LEVELS) against the segment since the last change point of
    BEFORE (the analysis of the nights before tonight): a Change at tonight when t <= -T_TAIL."""
    start = before[-1].index if before else 0
    segment = [float(v) for v in levels[start:-1]]
    if len(segment) < TAIL_NIGHTS:
        return None
    mean, sd = statistics.fmean(segment), statistics.stdev(segment)
    spread = sd * math.sqrt(1 + 1 / len(segment))
    tonight = float(levels[-1])
    if not mean or not spread or (tonight - mean) / spread > -T_TAIL:
        return None
    half = Z_INTERVAL * spread
    return Change(len(levels) - 1, mean, tonight, tonight / mean - 1, (tonight - half) / mean - 1,
                  (tonight + half) / mean - 1, math.nan, LEVEL, True, len(segment), 1)


def _pooled_sd(segments: list[list[float]], means: list[float]) -> float:
    squares = sum((v - mean) ** 2 for segment, mean in zip(segments, means) for v in segment)
    freedom = sum(len(segment) for segment in segments) - len(segments)
    return math.sqrt(squares / freedom) if freedom > 0 else 0.0


def _seed(levels: list[float]) -> int:
    """The same history gets the same shuffles, so the same answer, every time it is read."""
    text = ",".join(f"{v:.6g}" for v in levels)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def describe(change: Change, unit: str = "tok/s") -> str:
    """"tok/s -6.1 % (-8.0 to -4.2 %)": the size of a change with its interval."""
    if change.kind == TREND:
        nights = change.nights_after
        return (f"{unit} falling {change.effect / (nights - 1) * 100:+.2f} % a night over "
                f"{nights} nights, {change.effect * 100:+.1f} % in all ({change.low * 100:+.1f} "
                f"to {change.high * 100:+.1f} %)")
    if change.kind == SPREAD:
        return (f"{unit}: the spread changed, not the level ({change.effect * 100:+.1f} %, "
                f"{change.low * 100:+.1f} to {change.high * 100:+.1f} %)")
    return (f"{unit} {change.effect * 100:+.1f} % ({change.low * 100:+.1f} to "
            f"{change.high * 100:+.1f} %)")

