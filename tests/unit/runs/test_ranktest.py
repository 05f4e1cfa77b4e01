"""The Mann-Whitney U test of runs/ranktest.py against known values: scipy.stats.mannwhitneyu's
documented example (Conover's males/females), tie-corrected values scipy gives, and an exact
distribution counted by brute force over every ordering."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.runs.ranktest import mann_whitney_u, ranks

MALES, FEMALES = [19, 22, 16, 29, 24], [20, 11, 17, 12]


def test_ranks_give_ties_their_mean_rank():
    assert ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]


@pytest.mark.parametrize("alternative, p", [("two-sided", 0.1111111111111111),
                                            ("less", 0.9682539682539683),
                                            ("greater", 0.05555555555555555)])
def test_exact_p_values_match_scipys_documented_example(alternative, p):
    result = mann_whitney_u(MALES, FEMALES, alternative)
    assert result.u == 17 and result.method == "exact"
    assert result.p == pytest.approx(p, rel=1e-12)


@pytest.mark.parametrize("alternative, p", [("two-sided", 0.006373133838085873),
                                            ("less", 0.0031865669190429364)])
def test_ties_use_the_tie_corrected_normal_approximation(alternative, p):
    x, y = [1, 2, 2, 3, 3, 3, 4, 5], [3, 4, 4, 5, 5, 6, 7, 7, 8]
    result = mann_whitney_u(x, y, alternative)
    assert result.u == 7.5 and result.method == "asymptotic"
    assert result.p == pytest.approx(p, rel=1e-9)


def test_exact_distribution_matches_brute_force_enumeration():
    x, y = [1.5, 4.0, 6.5], [2.0, 3.0, 5.0, 7.0, 8.0]
    u_observed = mann_whitney_u(x, y).u
    pooled = sorted(x + y)
    us = []
    for chosen in itertools.combinations(range(len(pooled)), len(x)):
        us.append(sum(r + 1 for r in chosen) - len(x) * (len(x) + 1) / 2)
    below = sum(u <= u_observed for u in us) / len(us)
    assert mann_whitney_u(x, y, "less").p == pytest.approx(below, rel=1e-12)


def test_large_samples_use_the_approximation_and_see_a_shift():
    slow = [100 + i % 7 for i in range(40)]
    fast = [104 + i % 7 + 0.5 for i in range(40)]
    result = mann_whitney_u(slow, fast, "less")
    assert result.method == "asymptotic" and result.p < 0.001
    assert mann_whitney_u(fast, slow, "less").p > 0.99


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="alternative"):
        mann_whitney_u([1], [2], "lower")
    with pytest.raises(ValueError, match="at least one"):
        mann_whitney_u([], [2])
