"""runs/edivisive.py, runs/changes.py, runs/history.py: change points over a playbook's
nights, their size, whether they hold, and what changed in the environment at each.
Statistical checks use fixed seeds: the same series give the same answer every run."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from click.testing import CliRunner

from orchestrator.cli.app import main
from orchestrator.runs import changes, edivisive, history, noise
from orchestrator.runs.store import RunStore
from tests.fixtures.synthetic import FREEZE, nights_drifting, nights_with_an_upgrade, synthetic_run

# Series and answers from Apache Otava 0.8.0 (otava.change_point_divisive.calculator
# PairDistanceCalculator.get_candidate_change_point over the whole series, and
# otava.analysis.compute_change_points with its defaults), made with random.Random(41).
OTAVA_0_8_0 = [
    ([99.469, 100.492, 101.115, 101.913, 98.649, 99.28, 99.071, 99.678, 99.849, 98.698, 100.287,
      98.556], 4, 2.9965714285714196, []),
    ([100.572, 99.089, 100.32, 100.471, 99.898, 99.403, 99.215, 98.85, 101.631, 100.64, 101.965,
      100.414, 100.378, 99.414, 99.758, 98.394, 96.053, 96.053, 96.576, 96.551, 93.952, 92.407,
      95.826, 95.289, 94.001], 16, 39.901280000000035, [16]),
    ([99.064, 100.866, 101.904, 100.483, 99.304, 100.903, 101.178, 98.768, 100.813, 98.999,
      100.042, 100.533, 100.073, 98.441, 100.417, 98.525, 100.744, 98.003, 99.49, 99.505, 99.271,
      100.237, 100.282, 101.931, 100.49, 101.177, 95.817, 98.137, 97.932, 98.458, 98.507, 96.068,
      95.621, 96.194, 96.341, 98.48, 94.919, 97.056, 98.071, 96.843], 26, 31.100232, [26]),
]


@pytest.mark.parametrize("values, tau, qhat, otava_points", OTAVA_0_8_0)
def test_the_best_split_is_otavas_and_the_permutation_test_agrees_with_its_change_points(
        values, tau, qhat, otava_points):
    assert edivisive.best_split(values, 0, len(values)) == (pytest.approx(qhat, rel=1e-9), tau)
    assert [s.index for s in edivisive.change_points(values)] == otava_points


def brute_q(x, y):
    n, m = len(x), len(y)
    between = sum(abs(a - b) for a in x for b in y)
    wx = sum(abs(a - b) for a, b in itertools.combinations(x, 2))
    wy = sum(abs(a - b) for a, b in itertools.combinations(y, 2))
    return (2 * between / (n + m) - (2 * m * wx / ((n + m) * (n - 1)) if n > 1 else 0)
            - (2 * n * wy / ((n + m) * (m - 1)) if m > 1 else 0))


def test_the_scan_is_the_energy_statistic_of_matteson_and_james_over_every_split():
    rng = random.Random(7)
    values = [rng.gauss(0, 1) for _ in range(14)]
    best = max((brute_q(values[2:t], values[t:k]), t) for t in range(3, 14)
               for k in range(t + 1, 15))
    q, tau = edivisive.best_split(values, 2, 14)
    assert (q, tau) == (pytest.approx(best[0]), best[1])


def night_levels(seed, nights, shift_at=None, shift=0.0, sd=0.01, spread_at=None):
    rng = random.Random(seed)
    out = []
    for n in range(nights):
        scale = 3 if spread_at is not None and n >= spread_at else 1
        level = 1.0 - (shift if shift_at is not None and n >= shift_at else 0.0)
        out.append(16000 * level * (1 + rng.gauss(0, sd * scale)))
    return out


def test_no_change_point_in_forty_healthy_histories_but_at_most_the_level_alpha_allows():
    found = sum(bool(changes.analyse(night_levels(seed, 40))) for seed in range(40))
    assert found <= 2            # ALPHA 0.005: 0.2 expected; 2 of 40 has p < 0.02


def test_a_step_is_found_on_its_night_with_its_size_interval_and_in_effect():
    found = changes.analyse(night_levels(3, 40, shift_at=30, shift=0.05))
    assert len(found) == 1
    step = found[0]
    assert step.index == 30 and step.kind == changes.LEVEL and step.drop and step.in_effect
    assert step.low < -0.05 < step.high and step.high < 0
    assert step.p <= edivisive.ALPHA and (step.nights_before, step.nights_after) == (30, 10)
    assert changes.describe(step).startswith("tok/s -5.")


def test_a_recovery_takes_the_drop_out_of_effect():
    levels = night_levels(4, 50, shift_at=25, shift=0.05)
    levels = levels[:35] + [v / 0.95 for v in levels[35:]]          # back after 10 nights
    found = changes.analyse(levels)
    assert [(c.index, c.drop, c.in_effect) for c in found] == [(25, True, False), (35, False, True)]


def test_a_noisier_machine_is_no_drop():
    for seed in range(10):
        found = changes.analyse(night_levels(seed, 60, spread_at=30, sd=0.01))
        assert not any(c.drop for c in found)


def test_new_drops_alert_once_where_last_night_had_the_change_within_three_nights():
    levels = night_levels(3, 40, shift_at=30, shift=0.05)
    tonight = changes.analyse(levels)
    assert changes.new_drops(tonight, []) == tonight
    moved = [changes.Change(**{**tonight[0].to_dict(), "index": 28})]
    assert changes.new_drops(tonight, moved) == []
    far = [changes.Change(**{**tonight[0].to_dict(), "index": 20})]
    assert changes.new_drops(tonight, far) == tonight


def test_a_drop_that_may_be_under_one_percent_is_no_alert():
    levels = night_levels(3, 40, shift_at=30, shift=0.05)
    drop = changes.analyse(levels)[0]
    small = changes.Change(**{**drop.to_dict(), "effect": -0.012, "low": -0.02, "high": -0.004})
    assert changes.new_drops([small], []) == []
    assert changes.new_drops([small], [], min_drop=None) == [small]     # no size rule
    assert changes.new_drops([drop], []) == [drop] and drop.high < -changes.MIN_DROP


def test_a_drop_found_on_any_of_the_remembered_nights_is_not_new_again():
    """Found two nights ago, lost last night (its p near ALPHA), found again tonight: one
    alert, on the night it was first found."""
    levels = night_levels(3, 40, shift_at=30, shift=0.05)
    tonight = changes.analyse(levels)
    found_before = [changes.Change(**{**tonight[0].to_dict(), "index": 31})]
    assert changes.new_drops(tonight, found_before) == []
    remembered = changes.remembered_drops(levels[:-1])
    assert any(abs(c.index - 30) <= changes.MATCH_NIGHTS for c in remembered)
    assert changes.new_drops(tonight, remembered) == []
    assert changes.remembered_drops(levels[:30]) == []          # before the step: nothing


def drifting(seed, healthy, drifting_nights, per_night, sd):
    """HEALTHY nights at one level, then DRIFTING_NIGHTS falling PER_NIGHT a night."""
    rng = random.Random(seed)
    return [16000 * (1 - per_night * max(0, n - healthy + 1)) * (1 + rng.gauss(0, sd))
            for n in range(healthy + drifting_nights)]


def first_trend(levels, start=changes.TREND_NIGHTS):
    """The first night through which trend_drop finds a trend (with no change point), and it."""
    for night in range(start, len(levels) + 1):
        trend = changes.trend_drop(levels[:night], [])
        if trend:
            return night, trend
    return None, None


def test_a_drift_too_slow_for_e_divisive_on_a_noisy_machine_is_a_trend():
    """-0.3 % a night under 5 % noise: a fraction of the noise a night."""
    caught = [first_trend(drifting(seed, 30, 30, 0.003, 0.05))[0] for seed in range(20)]
    assert sum(night is not None for night in caught) >= 16          # 18 of 20 at T_TREND 2.75
    night, trend = first_trend(drifting(1, 30, 30, 0.003, 0.05))
    assert trend.kind == changes.TREND and trend.index == 0 and trend.nights_after == night
    assert trend.drop and trend.in_effect
    assert trend.effect < 0 and trend.high < -changes.MIN_DROP and trend.low < trend.effect
    assert "falling" in changes.describe(trend) and "a night over" in changes.describe(trend)


def test_a_trend_alerts_once_per_segment_and_healthy_histories_have_none():
    levels = drifting(1, 30, 30, 0.003, 0.05)
    night, _ = first_trend(levels)
    assert all(changes.trend_drop(levels[:later], []) is None
               for later in range(night + 1, len(levels) + 1))
    # tested every night from night 20 to 60, the whole series the segment: 2 of these 30
    # histories have a chance trend (the nightly from its 30th night on: none in 1,440
    # healthy nights, docs/benchmarks/regressions.md)
    healthy = [first_trend(night_levels(seed, 60, sd=0.05))[0] for seed in range(30)]
    assert sum(night is not None for night in healthy) <= 2
    # a segment starts at the last change point: a fall before it is no trend of it
    before = [changes.Change(40, 1, 1, 0, 0, 0, 0.001, changes.LEVEL, True, 40, 15)]
    assert changes.trend_drop(levels[:55], before) is None      # 15 nights: too few


def test_a_step_on_its_own_night_is_a_tail_drop_and_a_healthy_night_is_not():
    levels = night_levels(6, 31)
    assert changes.tail_drop(levels, []) is None
    stepped = levels[:-1] + [levels[-1] * 0.95]
    tail = changes.tail_drop(stepped, [])
    assert tail.index == 30 and tail.effect == pytest.approx(-0.05, abs=0.02)
    assert changes.tail_drop(stepped[-changes.TAIL_NIGHTS:], []) is None   # too few nights


def test_the_nightly_names_a_slow_drift_a_regression_through_its_change_point():
    """Drift of -0.3 % a night on a quiet machine: never two slow nights by the noise model's
    window (the median follows it), yet the history's change point finds it."""
    rng = random.Random(11)
    profiles = []
    statuses = []
    for n in range(50):
        level = 16000 * (1 - 0.003 * max(0, n - 29)) * (1 + rng.gauss(0, 0.01))
        tonight = noise.RunProfile(f"n{n}", {"total": level}, {})
        judgement = noise.judge(tonight, profiles[::-1][:noise.HISTORY])
        statuses.append((judgement.status, judgement.metrics[0].change))
        profiles.append(tonight)
    first = next(i for i, (status, _) in enumerate(statuses) if status == noise.REGRESSION)
    assert 30 < first < 50
    status, change = statuses[first]
    assert change["rule"] in ("e-divisive", "tail") and change["effect"] < 0
    assert any(c and c["rule"] == "e-divisive" for _, c in statuses[30:])
    assert all(status != noise.REGRESSION for status, _ in statuses[:30])


def test_each_change_point_names_the_environment_diff_between_its_nights():
    found = history.analyse_nights("playbooks/dflash.yaml", [[r] for r in nights_with_an_upgrade()])
    total = [c for c in found.change_points if c.metric == "total"]
    assert len(total) == 1 and total[0].night.number == 21
    line = total[0].line()
    assert line.startswith("tok/s -6.")
    assert "since 2026-11-21 (night 21): torch 2.13.0+cpu -> 2.14.1; fx-tls re-applied " \
           "(found vulnerable: vulnerable -> patched)" in line


def test_a_change_without_a_recorded_cause_says_so():
    records = nights_with_an_upgrade()
    for record in records:          # the same environment every night
        record.targets[0].torch_version = "2.13.0+cpu"
        record.targets[0].pip_freeze = list(FREEZE)
        record.steps = [s for s in record.steps if s.kind != "patch" and s.kind != "grep"]
    found = history.analyse_nights("p.yaml", [[r] for r in records])
    line = next(c for c in found.change_points if c.metric == "total").line()
    assert "nothing recorded changed between nights 18 and 23" in line


def test_patch_phrases():
    assert history.patch_phrase("fx-threads", ["patched"], ["patched"]) is None
    assert history.patch_phrase("fx-threads", ["patched"], ["vulnerable"]) == \
        "fx-threads lost (patched -> vulnerable)"
    assert history.patch_phrase("fx-tls", ["vulnerable"], ["vulnerable", "patched"]) == \
        "fx-tls vulnerable -> patched"
    # every night re-applies it (a fresh container each night): nothing changed
    assert history.patch_phrase("fx-tls", ["vulnerable", "patched"], ["vulnerable", "patched"]) is None


def test_orch_runs_changes_lists_them_with_json_and_exits_20_for_a_drop_in_effect():
    with RunStore() as store:
        nights_with_an_upgrade(store)
    result = CliRunner().invoke(main, ["runs", "changes", "playbooks/dflash.yaml"])
    assert result.exit_code == 20, result.output
    assert "30 nights of playbooks/dflash.yaml: 2026-11-01 (night 1) to 2026-11-30 (night 30)" \
        in result.output
    assert "tok/s -6." in result.output and "torch 2.13.0+cpu -> 2.14.1" in result.output
    data = json.loads(CliRunner().invoke(main, ["runs", "changes", "playbooks/dflash.yaml",
                                                "--json"]).output)
    assert data["slow_down_in_effect"] is True and len(data["nights"]) == 30
    total = next(c for c in data["change_points"] if c["metric"] == "total")
    assert total["night"] == 21 and total["in_effect"] and total["low"] < total["effect"] < total["high"]


def test_orch_runs_changes_without_runs_is_a_sentence():
    result = CliRunner().invoke(main, ["runs", "changes", "nope.yaml"])
    assert result.exit_code == 1 and "no run of nope.yaml in the run store" in result.output


def test_orch_report_shows_the_playbooks_change_points():
    with RunStore() as store:
        nights_with_an_upgrade(store)
    result = CliRunner().invoke(main, ["report", "last", "--md", "-"])
    assert result.exit_code == 0, result.output
    assert "### Change points over 30 nights (2026-11-01 to 2026-11-30)" in result.output
    assert "since 2026-11-21 (night 21): torch 2.13.0+cpu -> 2.14.1" in result.output
    html = CliRunner().invoke(main, ["report", "last", "--html", "-"]).output
    assert html.count('class="chart chart-history') == 2


def test_a_fall_night_by_night_is_listed_as_a_trend_and_marked_in_the_report():
    """A drift with nothing recorded changing: `orch runs changes` lists the total's trend
    (the exit code of a slow-down in effect), the report draws its fitted line."""
    with RunStore() as store:
        nights_drifting(store)
    found = history.playbook_history(RunStore(), "playbooks/dflash.yaml")
    trend = [c for c in found.change_points if c.change.kind == changes.TREND]
    assert len(trend) == 1 and trend[0].metric == "total" and trend[0].change.drop
    assert trend[0].line().startswith("tok/s falling -0.")
    assert "nothing recorded changed" in trend[0].line()
    result = CliRunner().invoke(main, ["runs", "changes", "playbooks/dflash.yaml"])
    assert result.exit_code == 20, result.output
    assert "tok/s falling" in result.output
    data = json.loads(CliRunner().invoke(main, ["runs", "changes", "playbooks/dflash.yaml",
                                                "--json"]).output)
    listed = next(c for c in data["change_points"] if c["kind"] == "trend")
    assert listed["p"] is None and listed["effect"] < -0.05
    html = CliRunner().invoke(main, ["report", "last", "--html", "-"]).output
    assert 'class="trend"' in html and "falling" in html
