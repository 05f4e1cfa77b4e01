"""Acknowledged regressions (runs/acks.py, `orch runs ack|unack|acks`): a known slow-down
stops alerting, stays in the reports with who/why/until, and clears when it expires, the
metric recovers, or the window's median has come down to it. The nightlies are synthetic
(tests/unit/nightly/test_rerun.py's fake runner): 3 drafters, per-step tok/s within +-4 %."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner

from orchestrator.cli.app import main
from orchestrator.ground.errors import ConfigError, ExitCode
from orchestrator.nightly.rerun import nightly
from orchestrator.runs import acks, noise
from orchestrator.runs.store import RunStore
from tests.support.nightly import fake_runner, run_numbers_from_one, seed_history  # noqa: F401

QUIET = [1.01, 0.99, 1.008, 0.992, 1.0, 1.012, 0.988, 1.004]      # about 1.3 % noise


@pytest.fixture
def playbook(tmp_path):
    path = tmp_path / "dflash.yaml"
    path.write_text("name: dflash\n")
    return str(path)


def night(playbook, level):
    return nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=6000 * level))


def ack(playbook, *args):
    return CliRunner().invoke(main, ["runs", "ack", playbook, *args])


def acks_json(playbook, *args):
    result = CliRunner().invoke(main, ["runs", "acks", playbook, "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_an_acknowledged_regression_stops_alerting_but_stays_in_the_reports(playbook, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    seed_history(playbook, QUIET)
    assert night(playbook, 0.94).status == "suspected"
    result = ack(playbook, "--reason", "torch 2.14 compiles slower; accepted", "--expires", "14d")
    assert result.exit_code == 0, result.output
    assert re.search(r"^total: [\d,]+ tok/s \(usually [\d,]+\) acknowledged by alice on "
                     r"\d{4}-\d\d-\d\d until ", result.stderr, re.M), result.stderr
    recorded = acks_json(playbook)
    assert sorted(a["metric"] for a in recorded) == ["d0", "d1", "d2", "total"]
    assert all(a["by"] == "alice" and a["reason"].startswith("torch 2.14") for a in recorded)

    outcome = night(playbook, 0.94)          # the second slow night: a regression without the ack
    assert outcome.exit_code == ExitCode.OK and outcome.status == "ok"
    summary = json.load(open(outcome.reports["md"].replace("report.md", "nightly.json")))
    total = next(m for m in summary["noise"]["metrics"] if m["metric"] == "total")
    assert total["status"] == noise.ACKNOWLEDGED and total["ack"]["by"] == "alice"
    assert total["ack"]["reason"].startswith("torch 2.14") and total["ack"]["expires"]
    assert summary["regressions"] == [] and len(summary["acknowledged"]) == 4
    assert "4 acknowledged slow-down(s): " in summary["text"]
    assert "acknowledged by alice on" in open(outcome.reports["md"]).read()
    assert "acknowledged by alice on" in open(outcome.reports["html"]).read()


def test_a_night_slower_than_the_acknowledged_level_alerts_again(playbook):
    seed_history(playbook, QUIET)
    night(playbook, 0.95)
    assert ack(playbook, "total", "--reason", "known").exit_code == 0
    outcome = night(playbook, 0.85)
    assert outcome.exit_code == ExitCode.REGRESSION
    total = next(m for m in outcome.judgement.metrics if m.metric == "total")
    assert total.status == noise.REGRESSION and "slower than the acknowledged" in total.reason


def test_the_acknowledgement_clears_when_the_metric_recovers_and_is_kept(playbook):
    seed_history(playbook, QUIET)
    night(playbook, 0.94)
    assert ack(playbook, "total", "--reason", "a noisy neighbour this week").exit_code == 0
    outcome = night(playbook, 1.0)
    assert outcome.status == "ok"
    assert acks_json(playbook) == []
    cleared = acks_json(playbook, "--all")
    assert len(cleared) == 1 and cleared[0]["cleared"].startswith("recovered: ")
    total = next(m for m in outcome.judgement.metrics if m.metric == "total")
    assert "is cleared: recovered" in total.reason
    assert night(playbook, 0.94).status == "suspected"       # a new drop alerts again


def test_the_acknowledgement_clears_once_the_new_level_is_the_baseline(playbook):
    seed_history(playbook, QUIET[:4])
    night(playbook, 0.94)
    assert ack(playbook, "--reason", "accepted").exit_code == 0     # every flagged metric
    outcomes = [night(playbook, 0.94) for _ in range(8)]
    statuses = [o.status for o in outcomes]
    # The total never alerts again. A worker whose first night was only -3 % may get its
    # change point named once, when the history proves its -6 % (runs/changes.py).
    assert not [m for o in outcomes for m in o.judgement.metrics if m.status == "regression"
                and (m.metric == "total" or not m.change)]
    assert statuses[-1] == "ok"
    cleared = acks_json(playbook, "--all")
    assert acks_json(playbook) == [] and len(cleared) == 4
    assert all(a["cleared"].startswith("the new level is the baseline") for a in cleared), cleared


def test_an_expired_acknowledgement_is_cleared_and_the_metric_alerts(playbook, monkeypatch):
    seed_history(playbook, QUIET)
    night(playbook, 0.94)
    assert ack(playbook, "total", "--reason", "known", "--expires", "1h").exit_code == 0
    later = (datetime.now(timezone.utc) + timedelta(hours=2)).isoformat(timespec="seconds")
    monkeypatch.setattr(acks, "now_iso", lambda: later)
    outcome = night(playbook, 0.94)
    assert outcome.exit_code == ExitCode.REGRESSION
    assert acks_json(playbook, "--all")[0]["cleared"].startswith("expired on ")


def test_ack_refuses_what_it_cannot_acknowledge(playbook):
    result = ack(playbook, "--reason", "x")
    assert result.exit_code != 0 and "no run of" in result.output
    seed_history(playbook, QUIET)
    night(playbook, 1.0)
    result = ack(playbook, "--reason", "x")
    assert result.exit_code == ExitCode.USAGE and "flagged no throughput metric" in result.output
    night(playbook, 0.94)
    result = ack(playbook, "d9", "--reason", "x")
    assert result.exit_code == ExitCode.USAGE and "no metric 'd9'" in result.output
    assert "d0, d1, d2, total" in result.output
    for bad in ("yesterday", "0d", "2000-01-01", "400d"):
        result = ack(playbook, "--reason", "x", "--expires", bad)
        assert result.exit_code == ExitCode.USAGE and "--expires" in result.output, bad
    assert ack(playbook, "--reason", "  ").exit_code == ExitCode.USAGE
    assert acks_json(playbook) == []


def test_unack_clears_and_a_second_ack_replaces_the_first(playbook):
    seed_history(playbook, QUIET)
    night(playbook, 0.94)
    assert ack(playbook, "total", "--reason", "first", "--by", "bob").exit_code == 0
    assert ack(playbook, "total", "--reason", "second", "--by", "carol").exit_code == 0
    active = acks_json(playbook)
    assert [(a["metric"], a["by"], a["reason"]) for a in active] == [("total", "carol", "second")]
    result = CliRunner().invoke(main, ["runs", "unack", playbook, "total"])
    assert result.exit_code == 0 and "cleared the acknowledgement of total" in result.stderr
    history = acks_json(playbook, "--all")
    assert [a["cleared"] for a in history][1] == "replaced by carol's acknowledgement"
    assert history[0]["cleared"].startswith("removed by ")
    table = CliRunner().invoke(main, ["runs", "acks", "--all"])
    assert table.exit_code == 0 and "carol" in table.stdout and "replaced by carol" in table.stdout
    assert night(playbook, 0.94).exit_code == ExitCode.REGRESSION


def test_parse_expiry():
    now = datetime(2026, 12, 2, 3, 0, tzinfo=timezone.utc)
    assert acks.parse_expiry("14d", now) == "2026-12-16T03:00:00+00:00"
    assert acks.parse_expiry("2w", now) == "2026-12-16T03:00:00+00:00"
    assert acks.parse_expiry("2026-12-24", now) == "2026-12-24T23:59:59+00:00"
    with pytest.raises(ConfigError, match="expected a span"):
        acks.parse_expiry("soon", now)



def test_an_acknowledgement_made_on_the_confirming_night_holds_on_a_busy_machine():
    """The sandbox's numbers: a -94 % drop on a machine whose nights spread 13 %, confirmed
    on its second night and acknowledged then, when the window's noise already counted the
    first slow night (5,000 tok/s). A later night judged ok, at the slow level, with the
    window's median still near the usual level: neither recovered nor the new baseline."""
    held = acks.Ack(playbook="p", metric="total", run_id="r", level=590.0, centre=10268.0,
                    noise=5000.0, reason="slowed", by="me", at="2026-12-02T04:00:00+00:00",
                    expires="2027-01-01T00:00:00+00:00")
    tonight = noise.MetricJudgement("total", noise.OK, "within the noise", tonight=594.0,
                                    centre=9504.0, noise=5200.0)
    assert acks.clears(held, tonight, "2026-12-03T04:00:00+00:00") == ""
    tonight.tonight = 9800.0
    assert acks.clears(held, tonight, "2026-12-03T04:00:00+00:00").startswith("recovered: ")
    tonight.tonight, tonight.centre = 600.0, 4000.0
    assert acks.clears(held, tonight, "2026-12-03T04:00:00+00:00").startswith("the new level is")
    assert acks.clears(held, tonight, "2027-01-02T00:00:00+00:00").startswith("expired on 2027-01-01")

