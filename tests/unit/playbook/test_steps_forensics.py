"""The grep, patch and verify steps on a fake host: plans, how payload results become
outcomes, findings and target facts, and payload failures."""

from __future__ import annotations

import json

from tests.support.step_fakes import payload_failure, planned, harness


def _book(step: str, register: str = "") -> str:
    return f"name: t\ntargets: [dev]\nsteps:\n  - {step}\n" + (f"    register: {register}\n" if register else "")


def test_grep_plan(tmp_path):
    plan = planned(tmp_path, _book("grep: {pattern: is_fx_tracing, mode: def, show: true}"))
    assert plan == [
        "orch grep-torch --def --show 'is_fx_tracing' (source_search payload with "
        "/opt/venv/bin/python; expect any)"]


def test_grep_hits_become_output_facts_and_a_finding(tmp_path):
    h = harness(tmp_path, _book("grep: {pattern: _is_fx_tracing_flag, fixed: true, expect: absent}"))
    hits = [{"event": "hit", "path": "torch/fx/_symbolic_trace.py", "line": 40 + i,
             "text": "_is_fx_tracing_flag = False"} for i in range(2)]
    h.host.on_payload("source_search", {"version": "2.13.0", "engine": "rg", "engine_reason": "found rg"},
                      events=hits)
    record = h.record()
    (call,) = h.host.payload_calls("source_search")
    assert call.argv[0] == "/opt/venv/bin/python"
    assert json.loads(call.argv[2])["pattern"] == "_is_fx_tracing_flag"
    assert ("step_output", "dev", "grep", "torch/fx/_symbolic_trace.py:40: _is_fx_tracing_flag = False",
            "stdout") in h.reporter.events
    step = record.steps[0]
    assert step.status == "failed"                       # expect: absent, and it is there
    assert step.data["count"] == 2 and step.data["engine"] == "rg"
    assert record.targets[0].torch_version == "2.13.0"
    assert "save_targets" in h.recorder.names()
    assert [f.signature for f in record.findings] == ["grep:_is_fx_tracing_flag"]


def test_grep_payload_error(tmp_path):
    _, step = payload_failure(tmp_path, _book("grep: {pattern: x}"), "source_search",
                              "torch is not installed in /opt/venv")
    assert step.message == "dev: torch is not installed in /opt/venv"


def test_patch_plan_and_status(tmp_path):
    plan = planned(tmp_path, _book("patch: {action: status}"))
    assert plan == [
        "orch patch fx-tls status -t dev (fx_patch payload with /opt/venv/bin/python)"]
    h = harness(tmp_path, _book("patch: {action: status}", register="fx") +
                "  - shell: [echo, '{{ fx.state }}']\n    when: fx.state == 'vulnerable'\n")
    h.host.on_payload("fx_patch", {"status": "vulnerable", "torch_version": "2.13.0", "changed": False})
    h.host.on_argv(["echo"], stdout=b"vulnerable\n")
    record = h.record()
    assert record.steps[0].status == "ok"
    assert record.steps[0].message == ("torch 2.13.0: VULNERABLE: FX state that threads share is "
                                       "a process-global (threads race)")
    assert record.targets[0].fx_tls_state == "vulnerable"
    assert record.findings[0].remediation == "orch patch fx-tls apply -t dev"
    assert [c.argv for c in h.host.calls if c.argv[0] == "echo"] == [["echo", "vulnerable"]]


def test_patch_apply_that_leaves_torch_unpatched_fails(tmp_path):
    h = harness(tmp_path, _book("patch: {action: apply}"))
    h.host.on_payload("fx_patch", {"status": "unknown", "torch_version": "2.13.0",
                                   "message": "unexpected source shape"})
    record = h.record()
    assert record.steps[0].status == "failed"
    assert record.steps[0].message == "fx-tls apply left torch 2.13.0 unknown"
    assert [f.signature for f in record.findings] == ["fx-tls:unknown"]


def test_verify_plan_progress_and_expectation(tmp_path):
    plan = planned(tmp_path, _book("verify: {trials: 3, expect: fixed}"))
    assert plan == [
        "orch verify fx-race -t dev --trials 3 (fx_race payload with /opt/venv/bin/python; "
        "expect fixed)"]
    h = harness(tmp_path, _book("verify: {trials: 3, expect: fixed}"))
    trial = {"event": "trial", "index": 1, "trials": 3, "cross_thread_raised": True}
    h.host.on_payload("fx_race", {"verdict": "vulnerable", "torch_version": "2.13.0",
                                  "cross_thread_raised": 3, "trials": 3, "same_thread_raised": 3,
                                  "same_thread_trials": 3}, events=[trial])
    record = h.record()
    assert ("step_progress", "dev", "verify", "trial 1/3: cross-thread raised") in h.reporter.events
    assert record.steps[0].status == "failed"
    assert record.steps[0].message == ("torch 2.13.0: cross-thread raised 3/3, same-thread control "
                                       "3/3 -> vulnerable (expected fixed)")
    assert record.findings[0].signature == "fx-race-check:vulnerable"


def test_the_fx_threads_patch_and_verify_steps_name_every_state(tmp_path):
    book = ("name: t\ntargets: [dev]\nsteps:\n  - patch: {name: fx-threads, action: status}\n"
            "  - verify: {check: fx-threads, trials: 2, expect: fixed}\n")
    assert planned(tmp_path, book)[0] == (
        "orch patch fx-threads status -t dev (fx_patch payload with /opt/venv/bin/python)")
    h = harness(tmp_path, book)
    h.host.on_payload("fx_patch", {"status": "vulnerable", "torch_version": "2.14.1",
                                   "states": [{"state": "fx-tracing-flag", "status": "upstream"},
                                              {"state": "node-meta", "status": "vulnerable"}]})
    rows = [{"state": "node-meta", "raised": 2, "trials": 2, "control_held": 2,
             "verdict": "vulnerable"}]
    h.host.on_payload("fx_race", {"overall_verdict": "vulnerable", "torch_version": "2.14.1",
                                  "states": rows})
    record = h.record()
    patch, verify = record.steps
    assert patch.data["states"] == {"fx-tracing-flag": "upstream", "node-meta": "vulnerable"}
    assert record.findings[0].remediation == "orch patch fx-threads apply -t dev"
    assert verify.status == "failed"
    assert verify.message == ("torch 2.14.1: node-meta raised 2/2, control held 2/2 -> vulnerable"
                              " -> vulnerable (expected fixed)")
    sent = [json.loads(c.argv[-1]) for c in h.host.calls
            if c.argv and c.argv[-1].startswith('{"trials"')]   # the fx_race payload's args
    assert sent and sent[-1]["states"] == ["fx-tracing-flag", "node-meta", "trace-patching"]
