"""A hang comes with its stacks: the monitor takes them before it stops the run, the hang
finding says who waits on whom (the cycle and its remedy), the record, stacks.json, the
report and `orch explain` keep and show them."""

from __future__ import annotations

import json
import threading

from orchestrator.remote import payload_api
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.runs.model import RunRecord, StepResult
from orchestrator.watch import stacks
from orchestrator.forensics import explain
from orchestrator.watch import monitor as monitor_module
from orchestrator.watch.classify import ClassifierSettings, EndState, LogClassifier
from orchestrator.watch.monitor import Monitor, MonitorSettings, MonitorSink, stream_copy_path
from tests.support.fake_torch import fake_torch, issue_stacks

START = "start drafters=3 devices=cuda:0,cuda:0,cuda:0 torch=2.11.0+cu130 pid=1 steps=20"


def taken_stacks(tmp_path) -> dict:
    """What the monitor's taker returns for issue 39's stacks: explain.Stacks as a dict."""
    root = fake_torch(tmp_path / "site")
    threads = stacks.thread_names(stacks.parse_pystack(issue_stacks(root)), pid=4100)
    facts = payload_api.explain_frames(Target("dev", LocalTransport("here")), stacks.stack_frames(threads),
                                       roots=[root], context=0)
    locks, waits, found = stacks.analyse(threads, facts)
    result = explain.Stacks("dev", 4100, [{"tid": t.tid, "label": t.label, "frames": []} for t in threads],
                            [dict(vars(lock), sentence=lock.sentence()) for lock in locks],
                            waits=[vars(w) for w in waits], cycles=[explain.cycle_entry(c) for c in found])
    return {"taken_at": 1.0, "pid": 4100, "results": [vars(result)]}


def test_the_hang_finding_names_the_cycle_and_its_remedy(tmp_path):
    classifier = LogClassifier(ClassifierSettings("dev", hang_after=20), now=0.0)
    for n, line in enumerate([START, "drafter=0 step=1 loss=6 tok_s=100"]):
        classifier.feed(line, float(n))
    end = EndState(state="exited", signal=15, exit_code=143, stopped_for="hang", hang_seconds=20,
                   hang_stacks=taken_stacks(tmp_path))
    verdict = classifier.classify(end, {}, cli="orch", playbook="pb.yaml")
    assert verdict.verdict == "hang"
    hang = next(f for f in verdict.findings if f.signature == "hang")
    assert "DEADLOCK: thread " in hang.message and "(pt_autograd_0)" in hang.message
    assert "holds compile_lock (convert_frame.py:2314), waits in the autograd engine" in hang.message
    assert "`torch.autograd.set_multithreading_enabled(False)`" in hang.remediation
    assert "--backward-in-thread" in hang.remediation


def test_stacks_that_could_not_be_taken_are_said_so():
    words, fix = stacks.hang_words({"results": [], "error": "process 7 is not running"})
    assert words == "; its stacks could not be taken: process 7 is not running" and fix == ""
    assert stacks.hang_words(None) == ("", "")


def test_the_monitor_takes_the_stacks_before_it_stops_the_run(tmp_path, monkeypatch):
    order = []
    monkeypatch.setattr(monitor_module, "stop_run", lambda *a, **k: order.append("stopped"))
    taken = {"taken_at": 1.0, "pid": 42, "results": [{"pid": 42, "cycles": [
        {"line": "DEADLOCK: a -> b -> a", "words": "a waits for b", "remedy": None}]}]}

    def taker():
        order.append("stacks")
        return taken
    notes = []

    class Sink(MonitorSink):
        def note(self, target, text, level="info"):
            notes.append(text)
    local = tmp_path / "local"
    monitor = Monitor(Target("dev", LocalTransport("here")), str(tmp_path), MonitorSettings(gpu_every=0),
                      Sink(), stream_copy=stream_copy_path(str(local)), stacks_taker=taker)
    monitor._stop("hang", "no output for 20 s")
    monitor._stopper.join(10)
    assert order == ["stacks", "stopped"]
    assert monitor.hang_stacks["results"] == taken["results"] and monitor.hang_stacks["seconds"] >= 0
    assert json.loads((local / "stacks.json").read_text())["results"] == taken["results"]
    assert "DEADLOCK: a -> b -> a: a waits for b" in notes


def test_a_taker_that_fails_still_stops_the_run(tmp_path, monkeypatch):
    stopped = threading.Event()
    monkeypatch.setattr(monitor_module, "stop_run", lambda *a, **k: stopped.set())

    def taker():
        raise RuntimeError("pystack crashed")
    monitor = Monitor(Target("dev", LocalTransport("here")), str(tmp_path), MonitorSettings(gpu_every=0),
                      MonitorSink(), stacks_taker=taker)
    monitor._stop("hang", "quiet")
    monitor._stopper.join(10)
    assert stopped.is_set() and monitor.hang_stacks["error"] == "RuntimeError: pystack crashed"
    monitor._stopper = None
    monitor.hang_stacks = None
    monitor._stop("timeout", "limit")          # only a hang takes stacks
    monitor._stopper.join(10)
    assert monitor.hang_stacks is None


def test_explain_reads_the_recorded_stacks_and_the_report_shows_them(tmp_path):
    from orchestrator.runs.report import hang_stacks_context
    record = RunRecord(run_id="20261203-0100-abcdef", playbook="p.yaml", playbook_sha256="", name="p")
    taken = taken_stacks(tmp_path)
    record.steps.append(StepResult("monitor", "monitor", "dev", "failed", data={"hang_stacks": taken}))
    [recorded] = explain.recorded_stacks(record, "dev")
    assert recorded["pid"] == 4100 and recorded["cycles"][0]["line"].startswith("DEADLOCK: ")
    assert explain.recorded_stacks(record, "other") == []
    [shown] = hang_stacks_context(record)
    assert shown["cycles"] == recorded["cycles"] and len(shown["threads"]) == 4
    assert any("compile_lock" in sentence for sentence in shown["locks"])


def test_the_html_report_has_the_stacks_section(tmp_path):
    from orchestrator.runs.report import render_html
    from tests.fixtures.synthetic import synthetic_run
    record = synthetic_run("hung", tok_s=100)
    record.steps.append(StepResult("monitor", "monitor", "dev", "failed",
                                   data={"hang_stacks": taken_stacks(tmp_path)}))
    html = render_html(record, None)
    assert 'id="hang-stacks"' in html and "DEADLOCK: thread " in html
    assert "torch.autograd.set_multithreading_enabled(False)" in html


def test_a_job_over_nodes_keeps_each_nodes_stacks(tmp_path):
    from orchestrator.runs.report import hang_stacks_context
    record = RunRecord(run_id="20261203-0200-abcdef", playbook="p.yaml", playbook_sha256="", name="p")
    taken = taken_stacks(tmp_path)
    record.steps.append(StepResult("launch", "launch", "n0", "changed", data={"hang_stacks": taken}))
    record.steps.append(StepResult("monitor", "monitor", "n0", "failed",
                                   data={"nodes": {"n0": {"verdict": "ok"}, "n1": {"hang_stacks": taken}}}))
    assert explain.recorded_stacks(record, "n0") == []      # a launch step's data is no monitor's
    [recorded] = explain.recorded_stacks(record, "n1")
    assert recorded["cycles"][0]["line"].startswith("DEADLOCK: ")
    assert [p["target"] for p in hang_stacks_context(record)] == ["n1"]
