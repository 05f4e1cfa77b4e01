"""E-divisive means: change points in a series, each tested by permutations.

The method of Matteson and James ("A Nonparametric Approach for Multiple Change Point
Analysis of Multivariate Data", 2014), as Apache Otava's change_point_divisive does it
(docs/design/regressions.md says which release was read and why orch has its own):

  - a candidate splits a segment Z into X = Z[start:tau] and Y = Z[tau:kappa] where
        Q(X, Y) = 2/(n+m) sum|X_i - Y_j| - 2m/((n+m)(n-1)) sum_{i<k}|X_i - X_k|
                                         - 2n/((n+m)(m-1)) sum_{j<k}|Y_j - Y_k|
    (the energy distance of the two pieces, weighted by their sizes) is largest; a term
    whose piece has one value is 0, as in Otava;
  - the best candidate over all current segments is tested: the values are shuffled within
    each segment PERMUTATIONS times and the best Q of each shuffle found again; its p-value
    is (1 + shuffles at least as good) / (1 + shuffles). Significant at ALPHA: it splits its
    segment and the next candidate is tested; else the search ends.

Unlike Otava's default (a t-test at the best split, which ignores that the split was the best
of many and assumes normal noise) the permutation test is exact for exchangeable noise: a
history without a change is split with probability ALPHA. The shuffles stop early once the
test can no longer pass (Besag and Clifford's sequential p-value), so a quiet history costs a
few shuffles, not all of them.

Pure Python: O(n^2) a scan, for histories of a few hundred nights; no numpy on a controller.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

ALPHA = 0.005          # a history without a change is split this often
PERMUTATIONS = 399     # p-values down to 1/400: ALPHA allows one shuffle as good of 399


@dataclass(frozen=True)
class Split:
    index: int           # the first value of the new segment (a change point)
    qhat: float
    p: float


def best_split(values: Sequence[float], start: int, end: int) -> Optional[tuple[float, int]]:
    """(Q, tau) of the best split of values[start:end] (tau absolute), None for < 2 values."""
    z = values[start:end]
    n = len(z)
    if n < 2:
        return None
    # col[k][t] = sum over i < t of |z_i - z_k| (t <= k): the distances from z_k to the
    # values before it, cumulated, so each (tau, kappa) below is O(1).
    col = []
    for k, zk in enumerate(z):
        row, total = [0.0], 0.0
        for i in range(k):
            total += abs(z[i] - zk)
            row.append(total)
        col.append(row)
    best_q, best_tau = float("-inf"), start + 1
    within_x = 0.0                       # sum_{i<k<tau} |z_i - z_k|
    for tau in range(1, n):
        within_x += col[tau - 1][tau - 1]
        x_term = 2.0 * within_x / (tau - 1) if tau > 1 else 0.0
        between = within_y = 0.0
        for kappa in range(tau + 1, n + 1):
            ck = col[kappa - 1]
            between += ck[tau]
            within_y += ck[kappa - 1] - ck[tau]
            m = kappa - tau
            q = (2.0 * between - m * x_term
                 - (2.0 * tau * within_y / (m - 1) if m > 1 else 0.0)) / (tau + m)
            if q > best_q:
                best_q, best_tau = q, start + tau
    return best_q, best_tau


def _best_candidate(values: Sequence[float], cuts: list[int]) -> Optional[tuple[float, int]]:
    found = [best_split(values, a, b) for a, b in zip(cuts, cuts[1:])]
    found = [f for f in found if f is not None]
    return max(found) if found else None


def change_points(values: Sequence[float], *, alpha: float = ALPHA,
                  permutations: int = PERMUTATIONS, seed: int = 0) -> list[Split]:
    """The significant change points of VALUES (oldest first), in order of the index."""
    values = [float(v) for v in values]
    rng = random.Random(seed)
    cuts = [0, len(values)]
    found: list[Split] = []
    # Besag-Clifford: this many shuffles at least as good and the test cannot pass.
    allowed = int(alpha * (permutations + 1)) - 1
    while True:
        candidate = _best_candidate(values, cuts)
        if candidate is None:
            break
        qhat, tau = candidate
        as_good = shuffles = 0
        while shuffles < permutations and as_good <= allowed:
            shuffled = []
            for a, b in zip(cuts, cuts[1:]):
                piece = values[a:b]
                rng.shuffle(piece)
                shuffled += piece
            shuffles += 1
            as_good += _best_candidate(shuffled, cuts)[0] >= qhat
        p = (1 + as_good) / (1 + shuffles)
        if as_good > allowed:
            break
        found.append(Split(tau, qhat, p))
        cuts = sorted(cuts + [tau])
    return sorted(found, key=lambda s: s.index)
