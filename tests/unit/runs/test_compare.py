"""Comparisons and regression detection between two runs."""

from __future__ import annotations

import pytest

from orchestrator.runs.compare import (ENVIRONMENT_LINES, compare, environment_diff, package_diff,
                                       parse_freeze, throughput)
from orchestrator.runs.model import Finding, MetricPoint, RunRecord
from tests.fixtures.synthetic import FREEZE, synthetic_run


def kinds(comparison, severity="regression"):
    return sorted({c.kind for c in comparison.changes if c.severity == severity})


def test_same_run_twice_is_no_regression():
    a, b = synthetic_run("a", seed=1), synthetic_run("b", seed=2)
    result = compare(a, b)
    assert not result.regressed, result.regressions
    assert set(result.throughput["per_drafter"]) == {"d0", "d1", "d2"}
    assert abs(result.throughput["total"]["change"]) < 0.05


def test_throughput_excludes_the_compile_step():
    record = synthetic_run("a", tok_s=6000)
    tp = throughput(record)
    assert tp["source"] == "metrics"
    assert 5500 < tp["per_drafter"]["d1"] < 6500       # step 1 is tok_s/12 and ignored
    assert tp["total"] == pytest.approx(sum(tp["per_drafter"].values()))


def test_summary_numbers_win_over_the_series():
    record = synthetic_run("a", tok_s=6000)
    record.summary = {"total_tok_s": 12345, "per_drafter_tok_s": {"0": 4000, "1": 4100, "2": 4245}}
    tp = throughput(record)
    assert tp == {"total": 12345.0, "per_drafter": {"d0": 4000.0, "d1": 4100.0, "d2": 4245.0},
                  "source": "summary"}


def test_throughput_drop_beyond_threshold_is_a_regression():
    base, slow = synthetic_run("a", tok_s=6000), synthetic_run("b", tok_s=4000, seed=3)
    result = compare(base, slow)
    assert kinds(result) == ["throughput"]
    assert any("total throughput fell" in c.message for c in result.regressions)
    assert result.throughput["total"]["change"] == pytest.approx(-1 / 3, abs=0.05)
    # The same drop under a looser threshold is not one.
    assert not compare(base, slow, threshold=0.5).regressed


def test_small_drop_within_threshold_is_fine():
    assert not compare(synthetic_run("a", tok_s=6000), synthetic_run("b", tok_s=5700)).regressed


def test_improvement_is_reported_not_flagged():
    result = compare(synthetic_run("a", tok_s=4000), synthetic_run("b", tok_s=6000))
    assert not result.regressed and kinds(result, "improvement") == ["throughput"]


def test_missing_drafter_is_a_regression():
    result = compare(synthetic_run("a", drafters=3), synthetic_run("b", drafters=2))
    assert any("d2 reported no throughput" in c.message for c in result.regressions)


def test_new_failure_signature_and_verdict():
    bad = synthetic_run("b", verdict="hang",
                        findings=[Finding("sb1-200", "hang", "no step for 120 s", "orch stop")])
    result = compare(synthetic_run("a"), bad)
    assert {"verdict", "failure-signature"} <= set(kinds(result))
    # A signature the baseline had too is not new.
    base = synthetic_run("a", findings=[Finding("sb1-200", "recompile-limit", "hit limit")])
    again = synthetic_run("b", findings=[Finding("sb1-200", "recompile-limit", "hit limit")])
    assert not compare(base, again).regressed


def test_patch_drift_seen_by_a_step_even_when_repatched():
    base = synthetic_run("a")
    drifted = synthetic_run("b", states_seen=["drifted", "patched"])
    result = compare(base, drifted)
    assert kinds(result) == ["patch-drift"]
    assert "re-applied" in result.regressions[0].message


def test_patch_gone_after_patched_baseline():
    result = compare(synthetic_run("a"), synthetic_run("b", fx_tls_state="vulnerable"))
    assert kinds(result) == ["patch-drift"]
    # Vulnerable in both runs is not drift (it never was patched).
    never = compare(synthetic_run("a", fx_tls_state="vulnerable"),
                    synthetic_run("b", fx_tls_state="vulnerable"))
    assert "patch-drift" not in kinds(never)


def test_torch_version_change_and_package_diff():
    new_freeze = [l for l in FREEZE if not l.startswith(("torch", "sympy"))] + [
        "torch==2.13.1+cpu", "mpmath==1.3.0"]
    result = compare(synthetic_run("a"), synthetic_run("b", torch_version="2.13.1+cpu",
                                                       freeze=new_freeze))
    assert kinds(result) == ["torch-version"]
    diff = result.targets["sb1-200"]["packages"]
    assert diff == {"added": {"mpmath": "1.3.0"}, "removed": {"sympy": "1.13.3"},
                    "changed": {"torch": ["2.13.0+cpu", "2.13.1+cpu"]}}
    assert kinds(result, "info") == ["packages"]


def test_no_baseline_only_flags_the_run_itself():
    assert not compare(None, synthetic_run("b")).regressed
    assert kinds(compare(None, synthetic_run("b", verdict="fx-race"))) == ["failure-signature", "verdict"]


def test_parse_freeze_normalises_names_and_keeps_odd_lines():
    got = parse_freeze(["Typing_Extensions==4.12", "# comment", "", "foo @ file:///x/foo.whl",
                        "-e git+https://example.invalid/x#egg=x", "bar[extra]==1.0", "weird line!"])
    assert got["typing-extensions"] == "4.12"
    assert got["foo"] == "file:///x/foo.whl"
    assert got["bar"] == "1.0"
    assert "weird line!" in got and any(k.startswith("-e ") for k in got)
    assert package_diff(["a==1"], ["A==1"]) == {"added": {}, "removed": {}, "changed": {}}


def test_empty_records_compare_without_errors():
    a = RunRecord(run_id="a", playbook="p", playbook_sha256="", name="p", verdict="ok")
    b = RunRecord(run_id="b", playbook="p", playbook_sha256="", name="p", verdict="ok")
    result = compare(a, b)
    assert result.throughput["total"] == {"base": None, "new": None, "change": None, "regressed": False}
    assert not result.regressed
    b.metrics = [MetricPoint("t", 0, 1, tok_s=10.0)]   # one point: used as it is
    assert throughput(b)["per_drafter"] == {"d0": 10.0}
    assert compare(a, b).to_dict()["regressed"] is False


def test_patch_state_findings_are_not_failure_signatures():
    # steps/patch.py records "fx-tls:<state>" findings: drift is judged from them, and a
    # "patched" one is no failure.
    base = synthetic_run("a", findings=[Finding("sb1-200", "fx-tls:patched", "patched")])
    same = synthetic_run("b", findings=[Finding("sb1-200", "fx-tls:patched", "patched")])
    assert not compare(base, same).regressed
    assert not compare(synthetic_run("a"), same).regressed
    drifted = synthetic_run("c", findings=[Finding("sb1-200", "fx-tls:drifted", "drifted"),
                                           Finding("sb1-200", "fx-tls:patched", "re-applied")])
    drifted.steps = []                     # only the findings tell
    assert kinds(compare(base, drifted)) == ["patch-drift"]


def test_monitor_summary_drafters_are_used():
    record = synthetic_run("a", tok_s=6000)
    record.summary = {"total_tok_s": 15000.0, "drafters": {
        "0": {"step": 50, "loss": 2.1, "tok_s": 5000.0}, "1": {"step": 50, "tok_s": 5000.0},
        "2": {"step": 50, "tok_s": None}}}
    tp = throughput(record)
    assert tp["per_drafter"] == {"d0": 5000.0, "d1": 5000.0} and tp["total"] == 15000.0


def test_runner_summary_for_several_targets():
    record = synthetic_run("a")
    record.summary = {"total_tok_s": 4.0, "monitor": {
        "sb2-200": {"drafters": {"0": {"tok_s": 1.0}, "1": {"tok_s": 1.0}}},
        "sb1-200": {"drafters": {"0": {"tok_s": 2.0}}}}}
    assert throughput(record)["per_drafter"] == {"sb1-200/d0": 2.0, "sb2-200/d0": 1.0,
                                                 "sb2-200/d1": 1.0}


def test_verdict_exit_codes_are_the_documented_ones():
    from orchestrator.ground.verdicts import exit_code_for
    codes = {v: exit_code_for(v) for v in ("ok", "fx-race", "traceback", "killed", "hang",
                                           "degraded", "recompile-limit", "unreachable")}
    assert codes == {"ok": 0, "fx-race": 10, "traceback": 10, "killed": 10, "hang": 11,
                     "degraded": 12, "recompile-limit": 12, "unreachable": 13}


def test_informational_findings_are_not_failures():
    notes = [Finding("sb1-200", "grep:_is_fx_tracing_flag", "10 matches"),
             Finding("sb1-200", "fx-race-check:fixed", "0/1 raised"),
             Finding("sb1-200", "fx-tls:vulnerable", "vulnerable"),
             Finding("sb1-200", "fx-tls:patched", "patched")]
    assert not compare(None, synthetic_run("b", findings=notes)).regressed
    assert not compare(synthetic_run("a"), synthetic_run("b", findings=notes)).regressed
    hang = compare(synthetic_run("a"), synthetic_run("b", findings=notes + [
        Finding("sb1-200", "hang", "no step for 120 s")]))
    assert kinds(hang) == ["failure-signature"]


def test_the_environment_diff_is_bounded_for_a_chat_message():
    base = synthetic_run("b")
    new = synthetic_run("n", torch_version="2.14.0+cpu",
                        freeze=[f"pkg{i}==1.{i}" for i in range(20)] + ["torch==2.14.0+cpu"])
    lines = environment_diff(compare(base, new))
    assert len(lines) == ENVIRONMENT_LINES and lines[0] == "sb1-200: torch 2.13.0+cpu -> 2.14.0+cpu"
    assert lines[-1].startswith("... and ") and "the report has them all" in lines[-1]
