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

  new_drops   the level drops in effect tonight that last night's analysis did not have
              (within MATCH_NIGHTS of where it put its own), whose 95 % interval lies
              wholly below -MIN_DROP: a change alerts once, on the night the history
              first proves it larger than 1 % (a slow drift, a step a few nights old);
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
T_TAIL = 3.0           # tonight this many prediction-interval widths below the segment
TAIL_NIGHTS = 10       # ... of at least this many nights
TAIL_METRICS = ("total",)
Z_INTERVAL = 1.96      # a 95 % interval
MIN_DROP = 0.01        # a new drop alerts when its interval lies wholly below -1 %: the
                       # smallest drop worth a page, and on a quiet machine it drops the
                       # chance splits of its four nearly independent metrics (measured:
                       # docs/benchmarks/regressions.md)
LEVEL, SPREAD = "level", "spread"


@dataclass(frozen=True)
class Change:
    index: int                 # the first night of the new level (0: the oldest analysed)
    before: float
    after: float
    effect: float              # fraction; negative: slower
    low: float                 # the effect's 95 % interval
    high: float
    p: float                   # the permutation test's p-value
    kind: str                  # LEVEL or SPREAD
    in_effect: bool
    nights_before: int         # the nights of the segments either side
    nights_after: int

    @property
    def drop(self) -> bool:
        return self.kind == LEVEL and self.effect < 0

    def to_dict(self) -> dict:
        return asdict(self)


def analyse(levels: Sequence[float], *, alpha: Optional[float] = None,
            permutations: Optional[int] = None) -> list[Change]:
    """The change points of LEVELS (per-night levels, oldest first), oldest first; ALPHA and
    PERMUTATIONS default to edivisive's (read at the call)."""
    return list(_analyse(tuple(float(v) for v in levels), alpha or edivisive.ALPHA,
                         permutations or edivisive.PERMUTATIONS))


@functools.lru_cache(maxsize=64)
def _analyse(levels: tuple, alpha: float, permutations: int) -> tuple:
    # Cached: tonight's analysis is tomorrow's "last night" where one process judges many
    # nights (the benchmark); the answer depends on the levels alone (the seed is theirs).
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


def new_drops(tonight: list[Change], last_night: list[Change], *,
              min_drop: Optional[float] = MIN_DROP) -> list[Change]:
    """The level drops in effect in TONIGHT's analysis that LAST_NIGHT's did not have, whose
    interval lies wholly below -MIN_DROP (a drop that may be smaller is no alert; None: no
    size rule, for change points without an interval)."""
    known = [c.index for c in last_night if c.drop]
    return [c for c in tonight if c.drop and c.in_effect
            and (min_drop is None or c.high < -min_drop)
            and not any(abs(c.index - k) <= MATCH_NIGHTS for k in known)]


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
    if change.kind == SPREAD:
        return (f"{unit}: the spread changed, not the level ({change.effect * 100:+.1f} %, "
                f"{change.low * 100:+.1f} to {change.high * 100:+.1f} %)")
    return (f"{unit} {change.effect * 100:+.1f} % ({change.low * 100:+.1f} to "
            f"{change.high * 100:+.1f} %)")

