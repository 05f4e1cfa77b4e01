"""One vocabulary for the fx-tls states: every state the fx_patch payload can report has a
meaning and a side (thread-local or not), and every room that shows or judges them uses it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import app as cli

from orchestrator.ground import fx_states

from orchestrator import payloads
from orchestrator.runs import compare
from orchestrator.playbook.steps.patch import PatchStep

PAYLOAD = Path(payloads.__file__).parent / "fx_patch.py"


def payload_states() -> set[str]:
    """The states the payload can report, read from its source: its `status` is always an
    Inspection's, and each Inspection(...) names its state as a literal first argument."""
    states = set()
    for node in ast.walk(ast.parse(PAYLOAD.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Inspection":
            first = node.args[0] if node.args else None
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), \
                f"fx_patch.py:{node.lineno}: an Inspection whose state is not a literal"
            states.add(first.value)
    return states


def test_the_payload_reports_its_states_through_inspections_only():
    source = PAYLOAD.read_text()
    assert source.count('"status": inspection.status') == 1
    assert len(payload_states()) >= 4


def test_every_state_the_payload_can_report_has_a_meaning():
    assert payload_states() - set(fx_states.STATES) == set()
    for state in payload_states():
        assert fx_states.meaning(state) and fx_states.meaning(state) != state


def test_the_vocabulary_names_no_state_the_payload_cannot_report():
    assert set(fx_states.STATES) == payload_states()


def test_every_state_is_on_one_side():
    assert set(fx_states.THREAD_LOCAL) | set(fx_states.UNSAFE) == set(fx_states.STATES)
    assert not set(fx_states.THREAD_LOCAL) & set(fx_states.UNSAFE)
    assert set(fx_states.NEEDS_PATCH) < set(fx_states.UNSAFE)
    assert "unknown" in fx_states.UNSAFE and "unknown" not in fx_states.NEEDS_PATCH


@pytest.mark.parametrize("result, state", [
    ({"status": "patched"}, "patched"),
    ({"state": "drifted", "status": "patched"}, "drifted"),   # older payloads said `state`
    ({}, "unknown"),
])
def test_the_state_after_an_action(result, state):
    assert fx_states.patch_state(result) == state


def test_an_unexpected_state_is_shown_as_it_came():
    assert fx_states.meaning("half-patched") == "half-patched"
    assert fx_states.meaning(None) == ""


def test_the_comparison_judges_with_the_same_words():
    for state in fx_states.NEEDS_PATCH:
        assert compare.is_problem(f"fx-tls:{state}")
    for state in fx_states.THREAD_LOCAL + ("unknown",):
        assert not compare.is_problem(f"fx-tls:{state}")


class FakeContext:
    """What PatchStep.run reads of its context (no target info: no record to update)."""

    def __init__(self, result):
        self.target = type("T", (), {"name": "ct1"})()
        self.info = None
        self.result = result

    def output(self, line):
        pass


@pytest.mark.parametrize("state", sorted(fx_states.STATES))
def test_the_patch_step_says_each_state_in_the_cli_words(monkeypatch, state):
    monkeypatch.setattr("orchestrator.remote.payload_api.fx_patch",
                        lambda target, action, **kw: {"status": state, "torch_version": "2.13.0"})
    outcome = PatchStep().run(FakeContext(None), {"name": "fx-tls", "action": "status", "require": []})
    assert outcome.message == f"torch 2.13.0: {fx_states.MEANINGS[state]}"
    [finding] = outcome.findings
    assert finding.signature == f"fx-tls:{state}"
    assert finding.remediation == ("orch patch fx-tls apply -t ct1" if state in fx_states.NEEDS_PATCH
                                   else "")


def test_the_mcp_tool_and_the_cli_help_name_every_state():
    mcp_doc = (Path(payloads.__file__).parents[1] / "mcp" / "server.py").read_text()
    described = mcp_doc[mcp_doc.index("def fx_tls_status("):mcp_doc.index("def fx_tls_diff(")]
    cli_help = CliRunner().invoke(cli.main, ["patch", "fx-tls", "--help"]).output
    for state in fx_states.STATES:
        assert state in described, f"mcp/server.py's fx_tls_status does not name {state}"
        assert state in cli_help, f"`orch patch fx-tls --help` does not name {state}"


def test_verify_prints_each_trial_once_per_target_and_nothing_with_json(monkeypatch):
    from orchestrator.cli.commands import torch as torch_commands
    shown = []
    monkeypatch.setattr(torch_commands.console, "info", shown.append)
    progress = torch_commands._trial_progress(False, lambda event: f"trial {event['index']}")
    progress("dev")({"event": "trial", "index": 1})
    progress("dev")({"event": "result"})
    torch_commands._trial_progress(True, lambda event: "never")("dev")({"event": "trial", "index": 2})
    assert shown == ["dev: trial 1"]
