"""Log parsing and the verdicts: every failure mode of docs/design/dflash-workload.md, from its log lines."""

from __future__ import annotations

import pytest

from orchestrator.watch.classify import ClassifierSettings, EndState, LogClassifier

FX = ("RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized "
      "function. This is not supported at the moment.")
START = "start drafters=3 devices=cpu,cpu,cpu torch=2.13.0+cpu pid=1 steps=20"


def healthy(drafters=3, steps=20, rate=5000, every=10):
    lines = [START]
    for d in range(drafters):
        lines.append(f"drafter={d} compiled seconds=2.5")
        lines.append(f"drafter={d} step=1 loss=6.2 tok_s=200")
    for step in range(every, steps + 1, every):
        for d in range(drafters):
            lines.append(f"drafter={d} step={step} loss={6 - step / 10:.4f} tok_s={rate}")
    for d in range(drafters):
        lines.append(f"drafter={d} done steps={steps} loss=4.0 tok_s={rate}")
    lines.append(f"summary status=ok drafters={drafters} ok={drafters} failed=0 "
                 f"total_tok_s={rate * drafters} stalled=0 seconds=9.0")
    return lines


def classify(lines, end=EndState(state="exited", exit_code=0), facts=None, **settings):
    classifier = LogClassifier(ClassifierSettings("dev", **settings))
    points = [p for i, line in enumerate(lines) if (p := classifier.feed(line, float(i))) is not None]
    return classifier, points, classifier.classify(end, facts or {}, cli="orch", playbook="pb.yaml")


def test_metric_lines_become_points():
    classifier, points, verdict = classify(healthy())
    assert len(points) == 9  # step 1, 10, 20 for three drafters
    assert points[0].drafter == 0 and points[0].step == 1 and points[0].loss == 6.2
    assert points[-1].tok_s == 5000
    assert verdict.verdict == "ok"
    assert verdict.summary["total_tok_s"] == 15000
    assert verdict.summary["drafters_ok"] == 3
    assert verdict.message == "ok: 3/3 drafters trained, 15,000 tok/s total"


def test_throughput_without_summary_excludes_the_compile_step():
    lines = [line for line in healthy() if not line.startswith(("summary", "drafter=0 done",
                                                                "drafter=1 done", "drafter=2 done"))]
    classifier, _, _ = classify(lines)
    assert classifier.total_tok_s() == 15000


def test_fx_race_with_remediation():
    lines = [START, "race trace=open", f"drafter=0 ERROR {FX}", "Traceback (most recent call last):",
             '  File "x.py", line 1, in f', FX, f"drafter=1 ERROR {FX}",
             "summary status=failed drafters=3 ok=0 failed=3 total_tok_s=0 stalled=0"]
    _, _, verdict = classify(lines, EndState(state="exited", exit_code=1),
                             facts={"fx_tls_state": "vulnerable"})
    assert verdict.verdict == "fx-race"
    finding = next(f for f in verdict.findings if f.signature == "fx-race")
    assert "torch 2.13.0+cpu" in finding.message and "vulnerable" in finding.message
    assert "`orch patch fx-threads apply -t dev`" in finding.remediation
    assert "torch 2.13.0+cpu on dev is vulnerable" in finding.remediation
    assert "orch run pb.yaml" in finding.remediation


def test_fx_race_then_deadlock_is_still_the_race_and_the_hang_is_reported():
    lines = [START, f"drafter=1 ERROR {FX}", "drafter=0 step=1 loss=6 tok_s=100"]
    _, _, verdict = classify(lines, EndState(state="exited", signal=15, exit_code=143,
                                             stopped_for="hang", hang_seconds=121))
    assert verdict.verdict == "fx-race"
    assert {f.signature for f in verdict.findings} >= {"fx-race", "hang"}


def test_hang():
    lines = [START, "drafter=0 step=1 loss=6 tok_s=100",
             "drafter=1 ERROR RuntimeError: drafter 1 failed at step 1 (--fail-drafter)"]
    classifier, _, verdict = classify(lines, EndState(state="exited", signal=15, exit_code=143,
                                                      stopped_for="hang", hang_seconds=20))
    assert verdict.verdict == "hang"
    hang = next(f for f in verdict.findings if f.signature == "hang")
    assert "no new step line for 20 s" in hang.message and "drafter 1 had raised" in hang.message
    assert classifier.hung(now=200.0, alive=True) is True
    assert classifier.hung(now=200.0, alive=False) is False


def test_hang_clock_and_shift():
    classifier = LogClassifier(ClassifierSettings("dev", hang_after=10), now=0.0)
    classifier.feed("drafter=0 step=1 loss=1 tok_s=1", 5.0)
    assert not classifier.hung(14.0, True) and classifier.hung(15.0, True)
    classifier.shift(10.0)  # ten seconds the monitor could not see
    assert not classifier.hung(24.0, True) and classifier.hung(25.0, True)


def test_watchdog_timeout_with_stalled_drafters_is_a_hang():
    lines = [START, "drafter=0 step=1 loss=6 tok_s=100",
             "summary status=timeout drafters=3 ok=0 failed=1 total_tok_s=0 stalled=2 seconds=60"]
    _, _, verdict = classify(lines, EndState(state="exited", exit_code=3))
    assert verdict.verdict == "hang"


def test_degraded_and_recompile_limit():
    _, _, verdict = classify(healthy(rate=1500), degraded_below=8000, expected_tok_s=20000)
    assert verdict.verdict == "degraded"
    finding = next(f for f in verdict.findings if f.signature == "degraded")
    assert "4,500 tok/s" in finding.message and "8,000" in finding.message and "20,000" in finding.message
    lines = healthy(rate=1500)
    lines.insert(3, "W1129 torch._dynamo hit config.recompile_limit (8) function: 'flex_attention'")
    _, _, verdict = classify(lines, degraded_below=8000)
    assert verdict.verdict == "recompile-limit"
    assert "per thread" in next(f for f in verdict.findings if f.signature == "recompile-limit").remediation
    _, _, verdict = classify(lines, degraded_below=1000)  # a warning only, when fast enough
    assert verdict.verdict == "ok"
    assert "recompile-limit" in {f.signature for f in verdict.findings}


@pytest.mark.parametrize("line,expected", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda-oom"),
    ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", "nccl-error"),
    ("[rank0]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout", "collective-timeout"),
])
def test_gpu_failures(line, expected):
    _, _, verdict = classify([START, "Traceback (most recent call last):", line],
                             EndState(state="exited", exit_code=1))
    assert verdict.verdict == expected
    assert next(f for f in verdict.findings if f.signature == expected).remediation


def test_traceback_nonzero_killed_vanished_stopped():
    tb = [START, "Traceback (most recent call last):", '  File "t.py", line 3, in <module>',
          "ValueError: bad config value"]
    _, _, verdict = classify(tb, EndState(state="exited", exit_code=1))
    assert verdict.verdict == "traceback"
    assert "ValueError: bad config value" in verdict.findings[-1].message
    _, _, verdict = classify([START, "bye"], EndState(state="exited", exit_code=7))
    assert verdict.verdict == "nonzero-exit" and "code 7" in verdict.findings[-1].message
    _, _, verdict = classify([START], EndState(state="exited", exit_code=137, signal=9))
    assert verdict.verdict == "killed" and "signal 9" in verdict.findings[-1].message
    _, _, verdict = classify([START], EndState(state="vanished"))
    assert verdict.verdict == "killed"
    _, _, verdict = classify([START], EndState(state="exited", exit_code=143, signal=15, stopped_for="user"))
    assert verdict.verdict == "killed" and "orch stop" in verdict.findings[-1].message
    _, _, verdict = classify([START], EndState(state="exited", exit_code=143, signal=15, stopped_for="timeout"))
    assert verdict.verdict == "timeout"


def test_expected_drafters():
    lines = [line for line in healthy() if not line.startswith("drafter=2 done")]
    _, _, verdict = classify(lines, expect_drafters=3)
    assert verdict.verdict == "failed" and "2 of the expected 3" in verdict.findings[-1].message


def test_still_running_after_watch_for_is_healthy():
    lines = healthy()[:-4]
    _, _, verdict = classify(lines, EndState(state="running", watch_ended=True), degraded_below=1000)
    assert verdict.verdict == "ok" and "the run goes on" in verdict.message


def test_custom_metric_regex():
    classifier = LogClassifier(ClassifierSettings(
        "dev", metric_regex=r"it (?P<step>\d+) loss (?P<loss>[\d.]+) (?P<tok_s>\d+) tok/s"))
    point = classifier.feed("it 7 loss 1.5 900 tok/s", 1.0)
    assert point.drafter == 0 and point.step == 7 and point.loss == 1.5 and point.tok_s == 900
    with pytest.raises(ValueError):
        LogClassifier(ClassifierSettings("dev", metric_regex=r"(\d+)"))


HUNG_IN_COMPILE = [START.replace("devices=cpu,cpu,cpu", "devices=cuda:0,cuda:0,cuda:0"),
                   "drafter=0 compiled seconds=41.0", "drafter=0 step=1 loss=6.2 tok_s=900"]
HANG_END = EndState(state="exited", signal=15, exit_code=143, stopped_for="hang", hang_seconds=240)


def test_a_first_compile_hang_on_a_patched_torch_is_its_own_kind():
    """Seen on one H200: drafters 1 and 2 never finished their first compile, torch patched.
    Not "0/0 drafters", not "apply the patch" (it is applied): serialise the first compile."""
    _, _, verdict = classify(HUNG_IN_COMPILE, HANG_END, expect_drafters=3,
                             facts={"fx_tls_state": "patched", "torch_version": "2.11.0+cu130"})
    assert verdict.verdict == "hang"
    assert verdict.message == "hang: 0/3 drafters finished (exit 143)"
    assert [f.signature for f in verdict.findings] == ["hang:first-compile"]
    finding = verdict.findings[0]
    assert "2 of the 3 drafters (drafter 1, 2) hung in their first compile" in finding.message
    assert "torch 2.11.0+cu130" in finding.message and "not the FX race" in finding.message
    assert "patch fx-tls apply" not in finding.remediation
    assert "--serialize-compile" in finding.remediation and "one drafter per GPU" in finding.remediation
    assert "extra_args" in finding.remediation
    assert verdict.summary["drafters_expected"] == 3


def test_no_drafter_line_at_all_still_counts_the_expected_drafters():
    _, _, verdict = classify([START], HANG_END, facts={"fx_tls_state": "patched"})
    assert verdict.message == "hang: 0/3 drafters finished (exit 143)"   # drafters=3 on the start line
    assert "3 of the 3 drafters (drafter 0, 1, 2)" in verdict.findings[0].message


def test_a_first_compile_hang_on_a_vulnerable_torch_still_points_at_the_patch():
    _, _, verdict = classify(HUNG_IN_COMPILE, HANG_END, expect_drafters=3,
                             facts={"fx_tls_state": "vulnerable"})
    hang = next(f for f in verdict.findings if f.signature == "hang")
    assert "patch fx-threads apply -t dev" in hang.remediation


def test_a_hang_after_a_drafter_error_on_a_patched_torch_does_not_suggest_the_patch():
    lines = [START, "drafter=0 step=1 loss=6 tok_s=100",
             "drafter=1 ERROR RuntimeError: drafter 1 failed at step 1 (--fail-drafter)"]
    _, _, verdict = classify(lines, HANG_END, facts={"fx_tls_state": "patched"})
    hang = next(f for f in verdict.findings if f.signature == "hang")
    assert "drafter 1 had raised" in hang.message and "patch fx-tls apply" not in hang.remediation


NODE_META_TRACE = ['Traceback (most recent call last):',
                   '  File "/v/lib/python3.11/site-packages/torch/fx/traceback.py", line 363, '
                   'in annotate', "    del current_meta[\"custom\"]", "KeyError: 'custom'"]


def test_the_node_meta_race_is_an_fx_race_pointing_at_fx_threads():
    lines = [START, "drafter=0 step=1 loss=6 tok_s=100", *NODE_META_TRACE,
             "drafter=1 ERROR KeyError: 'custom'",
             "summary status=failed drafters=3 ok=2 failed=1 total_tok_s=0 stalled=0"]
    _, _, verdict = classify(lines, EndState(state="exited", exit_code=1))
    assert verdict.verdict == "fx-race"
    finding = next(f for f in verdict.findings if f.signature == "fx-race:node-meta")
    assert "torch/fx/traceback.py" in finding.message and "line 363, in annotate" in finding.message
    assert "`orch patch fx-threads apply -t dev`" in finding.remediation
    assert "`orch verify fx-threads -t dev`" in finding.remediation


@pytest.mark.parametrize("line", [
    "AssertionError: CURRENT_PATCHER is None in finally block",
    "NameError: module is not installed as a submodule"])
def test_the_trace_time_patcher_leak_is_an_fx_race_that_says_what_helps(line):
    lines = [START, "Traceback (most recent call last):", line, f"drafter=2 ERROR {line}",
             "summary status=failed drafters=3 ok=2 failed=1 total_tok_s=0 stalled=0"]
    _, _, verdict = classify(lines, EndState(state="exited", exit_code=1))
    assert verdict.verdict == "fx-race"
    finding = next(f for f in verdict.findings if f.signature == "fx-race:trace-patcher")
    assert "CURRENT_PATCHER" in finding.message
    assert "`orch patch fx-threads apply -t dev`" in finding.remediation
    assert "--serialize-compile" in finding.remediation


def test_a_keyerror_of_another_key_is_not_the_node_meta_race():
    lines = [START, "Traceback (most recent call last):", "KeyError: 'customer'",
             "summary status=failed drafters=3 ok=2 failed=1 total_tok_s=0 stalled=0"]
    _, _, verdict = classify(lines, EndState(state="exited", exit_code=1))
    assert verdict.verdict == "traceback"


def test_reporters_read_a_frozen_snapshot_not_the_live_classifier():
    """The MCP server's progress (and the console's table) show what the monitor last
    reported; the classifier changing later in the monitor's thread does not reach them."""
    from orchestrator.mcp.tools import LiveReporter

    classifier = LogClassifier(ClassifierSettings("dev"))
    classifier.feed("drafter=0 step=3 loss=2.5 tok_s=100", 1.0)
    reporter = LiveReporter()
    reporter.monitor_progress("dev", classifier.snapshot(), {"state": "running"})
    classifier.feed("drafter=0 step=4 loss=2.4 tok_s=110", 2.0)
    classifier.feed("drafter=1 step=1 loss=3.0 tok_s=90", 2.0)
    shown = reporter.progress()["targets"]["dev"]["drafters"]
    assert [(d["drafter"], d["step"], d["loss"]) for d in shown] == [(0, 3, 2.5)]
    snapshot = classifier.snapshot()
    assert [w.step for w in snapshot.workers] == [4, 1] and snapshot.silent_for(5.0) == 3.0
    assert snapshot.is_metric_line("drafter=1 step=2 loss=3 tok_s=1") and not snapshot.is_metric_line("hi")


def test_a_run_that_is_not_dflashs_is_told_in_its_own_words():
    """The DFlash trainer's word (drafter) is the DFlash workload's (watch/dflash.py), not the
    generic classifier's: another trainer's run is told in its own word for a worker."""
    classifier = LogClassifier(ClassifierSettings("dev", expect_drafters=2, worker_word="worker"))
    classifier.feed("drafter=0 step=5 loss=1.0 tok_s=100", 1.0)
    classifier.feed("RuntimeError: boom", 2.0)
    failed = classifier.classify(EndState(exit_code=1))
    assert failed.verdict == "nonzero-exit"
    assert failed.message == "nonzero-exit: 0/2 workers finished, 100 tok/s total (exit 1)"
    assert not any("drafter" in f.message + f.remediation for f in failed.findings)
