"""`orch explain` measured on the labelled corpus of real failures (tests/fixtures/explain_corpus),
the whole answer as `orch explain` gives it: each case's logs (and run record) explained with
the frames read in the real torch 2.13 venv (a copy with orch's fx-threads patch for the cases
explained after the patch). The issue's bar: the lead cause right in at least 90 % of the
cases, and no shared-state remedy for a case whose failure involves no shared state. The
table itself is benchmarks/explain_corpus.py's (docs/benchmarks/explain.md)."""

from __future__ import annotations

import pytest

from benchmarks.explain_corpus import run, table

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return run()


def test_the_lead_cause_is_right_in_at_least_90_percent(rows):
    right = [r for r in rows if r["lead_right"]]
    assert len(right) >= 0.9 * len(rows), "\n".join(
        table(rows) + [f"{r['name']}: {r['answer']['lead']}" for r in rows if not r["lead_right"]])


def test_no_case_without_shared_state_gets_a_shared_state_remedy(rows):
    false = [(r["name"], r["answer"]["remedies"]) for r in rows if r["false_shared_state"]]
    assert false == []


def test_the_issues_two_cases_read_right(rows):
    by_name = {r["name"]: r for r in rows}
    two_nodes = by_name["two-nodes-raise"]["answer"]
    assert two_nodes["lead"]["summary"] == "RuntimeError: injected failure on rank 1 at step 30 (rank 1)"
    assert two_nodes["lead"]["node"] == "sb2-200" and two_nodes["remedies"] == []
    for name in ("race-fx-flag-after-patch", "demo-playbook"):
        answer = by_name[name]["answer"]
        assert answer["top_state"] == "torch.fx._symbolic_trace._is_fx_tracing_flag", name
        assert answer["remedies"] == ["torch.fx._symbolic_trace._is_fx_tracing_flag"], name
