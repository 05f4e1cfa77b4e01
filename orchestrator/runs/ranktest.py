"""The Mann-Whitney U test (Wilcoxon rank-sum): are one run's samples lower than another's?

Written here rather than taken from scipy: scipy.stats.mannwhitneyu is the maintained
implementation, but scipy is a ~40 MB dependency (numpy with it) for some forty lines, and
orch installs on controllers that run nothing numeric. The test is textbook (Mann & Whitney
1947; the tie correction and continuity correction as in scipy) and tests/unit/runs/test_ranktest.py
checks it against scipy's documented values and against a brute-force enumeration.

    exact        no ties and n1 * n2 <= EXACT_LIMIT: U's distribution counted exactly
    asymptotic   otherwise: the normal approximation, tie-corrected variance, continuity
                 correction of 0.5

Samples of tok/s rarely tie, but the stand-in trainer rounds them, so ties are handled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

EXACT_LIMIT = 400          # n1 * n2: beyond it the counting costs more than the approximation errs
ALTERNATIVES = ("less", "greater", "two-sided")


@dataclass(frozen=True)
class RankTest:
    u: float               # U of the first sample: how often one of it beats one of the second
    p: float
    method: str            # exact | asymptotic
    n1: int
    n2: int


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given their mean rank (midranks)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            result[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return result


def mann_whitney_u(x: list[float], y: list[float], alternative: str = "two-sided") -> RankTest:
    """Test X against Y. alternative "less": X tends to be smaller than Y (tonight slower)."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(ALTERNATIVES)}")
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        raise ValueError("both samples need at least one value")
    pooled = list(x) + list(y)
    rank = ranks(pooled)
    u1 = sum(rank[:n1]) - n1 * (n1 + 1) / 2
    ties = len(set(pooled)) < len(pooled)
    if not ties and n1 * n2 <= EXACT_LIMIT:
        return RankTest(u1, _exact_p(u1, n1, n2, alternative), "exact", n1, n2)
    return RankTest(u1, _asymptotic_p(u1, n1, n2, pooled, alternative), "asymptotic", n1, n2)


def _exact_p(u1: float, n1: int, n2: int, alternative: str) -> float:
    counts = _u_counts(n1, n2)
    total = sum(counts)
    u = int(round(u1))
    below = sum(counts[: u + 1]) / total          # P(U <= u)
    above = sum(counts[u:]) / total               # P(U >= u)
    if alternative == "less":
        return below
    if alternative == "greater":
        return above
    return min(1.0, 2 * min(below, above))


@lru_cache(maxsize=64)
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """How many of the C(n1+n2, n1) orderings give U = 0, 1, ..., n1*n2 (no ties).

    The recurrence on the largest value: it belongs to the first sample (it beats all n2 of
    the second: U - n2 over n1-1, n2) or to the second (U over n1, n2-1)."""
    if n1 == 0 or n2 == 0:
        return (1,)
    with_first, with_second = _u_counts(n1 - 1, n2), _u_counts(n1, n2 - 1)
    counts = [0] * (n1 * n2 + 1)
    for u, count in enumerate(with_first):
        counts[u + n2] += count
    for u, count in enumerate(with_second):
        counts[u] += count
    return tuple(counts)


def _asymptotic_p(u1: float, n1: int, n2: int, pooled: list[float], alternative: str) -> float:
    n = n1 + n2
    tie_sizes: dict[float, int] = {}
    for value in pooled:
        tie_sizes[value] = tie_sizes.get(value, 0) + 1
    ties = sum(t ** 3 - t for t in tie_sizes.values())
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    mean = n1 * n2 / 2
    if variance <= 0:
        return 1.0                     # every value equal: nothing tells the samples apart
    sd = math.sqrt(variance)
    if alternative == "less":
        return _normal_cdf((u1 - mean + 0.5) / sd)
    if alternative == "greater":
        return _normal_cdf(-(u1 - mean - 0.5) / sd)
    u = max(u1, n1 * n2 - u1)
    return min(1.0, 2 * _normal_cdf(-(u - mean - 0.5) / sd))


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))
