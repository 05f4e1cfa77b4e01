"""Trainers as they print today, replayed through the real monitor (launcher payload, tail,
follower, log formats, classifier) on this machine.

Each writer below prints lines built from the upstream trainer's own format strings:
SpecForge's `specforge train` (`print(f"step {step}: {printable}", flush=True)`, its
`printable` a dict of floats, `train/` keys with tracking on), its older
scripts/train_dflash.py (logging with `datefmt="%m/%d/%Y %H:%M:%S"` and
`f"{mode.capitalize()} - Step {global_step} [{global_step}/{total}?], Loss: {loss:.4f}, Acc:
{accuracy:.4f}"`), Hugging Face Trainer's log dicts with no bar (disable_tqdm=True), and
torchrun's ChildFailedError summary (torch 2.13's layout, docs/design/trainer-logs.md).
"""

from __future__ import annotations

import sys

import pytest

from orchestrator.watch.monitor import Monitor, MonitorSettings, MonitorSink, stream_copy_path
from orchestrator.remote.payload_api import launcher
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from tests.support.monitor_sinks import Sink


def watch(tmp_path, script, **settings):
    target = Target("here", LocalTransport("here"))
    run_dir = tmp_path / "run"
    launcher(target, "start", str(run_dir), argv=[sys.executable, "-c", script])
    sink = Sink()
    monitor = Monitor(target, str(run_dir), MonitorSettings(**{"gpu_every": 0, "grace": 2, **settings}),
                      sink, stream_copy=stream_copy_path(str(tmp_path / "local")))
    end, _ = monitor.run()
    return monitor.verdict(end, {}, cli="orch", playbook=None), sink


SPECFORGE_NEW = r'''
import sys, time
tracking = len(sys.argv) > 1
print("Resolved run qwen3-8b-dflash-offline", flush=True)
for step in range(1, 6):
    metrics = {"loss": 3.0 - step / 10, "acc": 0.1 * step, "grad_norm": 0.88, "lr": 0.0001,
               "perf/global_samples_per_second": 48.0}
    if tracking:
        metrics = {f"train/{key}": value for key, value in metrics.items()}
    printable = {key: float(value) for key, value in metrics.items()}
    print(f"step {step * 50}: {printable}", flush=True)
    time.sleep(0.05)
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tracking", [False, True])
def test_specforge_train_step_dicts_are_points(tmp_path, tracking):
    script = SPECFORGE_NEW.replace("len(sys.argv) > 1", str(tracking))
    verdict, sink = watch(tmp_path, script)
    assert [(p.step, p.loss) for p in sink.points] == [(50 * s, pytest.approx(3.0 - s / 10)) for s in range(1, 6)]
    assert sink.points[-1].extra == {"acc": pytest.approx(0.5), "grad_norm": 0.88, "lr": 0.0001,
                                     "perf/global_samples_per_second": 48.0}
    assert verdict.verdict == "ok"
    assert verdict.summary["format"] == "auto: specforge" and verdict.summary["metric_note"] is None
    assert verdict.message == "ok: 1 worker trained to step 250"


@pytest.mark.timeout(60)
def test_specforge_samples_per_second_times_tokens_per_sample_is_the_throughput(tmp_path):
    verdict, sink = watch(tmp_path, SPECFORGE_NEW.replace("len(sys.argv) > 1", "False"),
                          tokens_per_sample=2048, tokens_per_step=999)
    assert {p.tok_s for p in sink.points} == {48.0 * 2048}
    assert verdict.message == ("ok: 1 worker trained to step 250, 98,304 tok/s total "
                               "(derived from samples/s x tokens_per_sample)")


SPECFORGE_OLD = r'''
import logging, time
logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                    datefmt="%m/%d/%Y %H:%M:%S", level=logging.INFO)
logger = logging.getLogger("specforge.utils")
for global_step in range(1, 4):
    loss, accuracy = 6.0 - global_step, 0.1 * global_step
    logger.info(f"Train - Step {global_step} [{global_step}/72000?], Loss: {loss:.4f}, Acc: {accuracy:.4f}")
    time.sleep(1.05)
'''


@pytest.mark.timeout(60)
def test_specforge_legacy_lines_with_its_datefmt_give_times_and_derived_throughput(tmp_path):
    verdict, sink = watch(tmp_path, SPECFORGE_OLD, tokens_per_step=1000)
    assert [p.step for p in sink.points] == [1, 2, 3]
    assert sink.points[0].extra == {"acc": 0.1}
    # tok/s from the log's own %m/%d/%Y times (whole seconds): 1 step per 1-2 s x 1000
    assert all(p.derived and 400 <= p.tok_s <= 1000 for p in sink.points[1:])
    assert verdict.verdict == "ok" and verdict.summary["format"] == "auto: specforge"


HF_NO_BAR = r'''
import time
for n in range(1, 4):
    print(str({"loss": str(round(5.0 - n / 10, 4)), "grad_norm": "1.2", "learning_rate": "5e-05",
               "epoch": str(n / 3)}), flush=True)
    time.sleep(0.3)
print(str({"train_runtime": "1.2", "train_samples_per_second": "40.0", "train_steps_per_second": "25.0",
           "train_tokens_per_second": "5120.0", "train_loss": "4.8", "epoch": "1.0"}), flush=True)
'''


@pytest.mark.timeout(60)
def test_hf_trainer_without_a_bar_counts_its_dicts_and_keeps_its_tokens_per_second(tmp_path):
    verdict, sink = watch(tmp_path, HF_NO_BAR, logging_steps=10, hang_after=60)
    assert [(p.step, p.loss) for p in sink.points] == [(10, 4.9), (20, 4.8), (30, 4.7), (30, 4.7)]
    assert sink.points[-1].tok_s == 5120.0 and sink.points[-1].extra["train_loss"] == 4.8
    assert verdict.verdict == "ok"
    assert verdict.summary["format"].startswith("auto: hf-trainer, no progress bar")


UNKNOWN = r'''
import time
for n in range(12):
    print(f"[{n}] warming caches, shard {n} of 12", flush=True)
    time.sleep(0.4)
'''


@pytest.mark.timeout(60)
def test_a_trainer_printing_only_unknown_lines_runs_to_its_end(tmp_path):
    verdict, sink = watch(tmp_path, UNKNOWN, hang_after=2)
    assert verdict.verdict == "ok", verdict.message
    assert not sink.points and not any("hang" in note for note in sink.notes)
    assert verdict.summary["metric_note"].startswith("no metric lines recognised (format auto; looked for orch")


STEPS_THEN_WARNINGS = r'''
import time
for step in range(1, 4):
    print(f"step {step}: {{'loss': 1.0}}", flush=True)
    time.sleep(0.1)
while True:                              # stuck in a collective, a library still warning
    print("[W] still waiting for the store", flush=True)
    time.sleep(0.3)
'''


@pytest.mark.timeout(60)
def test_steps_that_stop_while_output_goes_on_are_a_hang_naming_the_worker(tmp_path):
    verdict, sink = watch(tmp_path, STEPS_THEN_WARNINGS, hang_after=2)
    assert verdict.verdict == "hang"
    [finding] = [f for f in verdict.findings if f.signature == "hang"]
    assert "worker 0 (at step 3" in finding.message and "kept printing" in finding.message
    assert "fx-tls" not in finding.remediation and "drafter" not in finding.message


TORCHRUN_ABORT = r'''
import sys, time
print("[rank1]:[E1201 10:00:00.000000 77 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
      "operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
      "ran for 600005 milliseconds before timing out.", flush=True)
summary = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_10:00:01
  host      : ct200
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 4242)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 4242
============================================================"""
print(summary, file=sys.stderr, flush=True)
sys.exit(1)
'''


@pytest.mark.timeout(60)
def test_sigabrt_after_the_watchdog_line_is_a_collective_timeout(tmp_path):
    verdict, _ = watch(tmp_path, TORCHRUN_ABORT)
    assert verdict.verdict == "collective-timeout", verdict.message
    [rank] = [f for f in verdict.findings if f.signature == "rank-failed"]
    assert "SIGABRT" in rank.message and "outside the run" not in rank.remediation


BENIGN_NCCL = r'''
print("ct200:77:88 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)", flush=True)
print("ct200:77:88 [0] NCCL WARN NET/Plugin: Could not find: libnccl-net.so", flush=True)
for step in range(1, 3):
    print(f"step {step}: {{'loss': 1.5}}", flush=True)
'''


@pytest.mark.timeout(60)
def test_a_benign_nccl_warn_in_a_run_that_exits_0_is_a_warning_not_the_verdict(tmp_path):
    verdict, _ = watch(tmp_path, BENIGN_NCCL)
    assert verdict.verdict == "ok", verdict.message
    assert [w["signature"] for w in verdict.summary["warnings"]] == ["nccl-warn"]
    assert not verdict.findings


SIGTERM_HANDLED = r'''
import signal, sys, time
def unwind(signum, frame):
    raise SystemExit(128 + signum)
signal.signal(signal.SIGTERM, unwind)
print("step 1: {'loss': 2.0}", flush=True)
import os
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
'''


@pytest.mark.timeout(60)
def test_exit_143_from_a_worker_that_handled_sigterm_is_stopped_and_says_so(tmp_path):
    verdict, _ = watch(tmp_path, SIGTERM_HANDLED)
    assert verdict.verdict == "killed"
    [finding] = [f for f in verdict.findings if f.signature == "killed"]
    assert "stopped by SIGTERM" in finding.message and "143 (128+15)" in finding.message


def test_busy_gpus_keep_a_run_without_steps_alive(tmp_path):
    target = Target("here", LocalTransport("here"))
    monitor = Monitor(target, str(tmp_path / "run"), MonitorSettings(hang_after=5), Sink())
    monitor.classifier.last_progress = monitor.classifier.last_output = 0.0   # long silent
    import time
    monitor.on_gpu({"gpus": [{"index": 5, "utilization_pct": 0}]})
    assert monitor.classifier.hung(time.monotonic(), alive=True)
    monitor.on_gpu({"gpus": [{"index": 5, "utilization_pct": 97}]})
    assert not monitor.classifier.hung(time.monotonic(), alive=True)


STATE_WRITER = r'''
import json, sys
print("a trainer orch cannot read", flush=True)
history = [{"loss": 2.5, "grad_norm": 1.1, "learning_rate": 5e-05, "epoch": 0.5, "step": 10},
           {"loss": 2.25, "grad_norm": 0.9, "learning_rate": 2.5e-05, "epoch": 1.0, "step": 20},
           {"train_runtime": 3.2, "train_loss": 2.4, "total_flos": 1.0, "step": 20}]
with open(sys.argv[1], "w") as out:
    json.dump({"global_step": 20, "log_history": history}, out)
'''


@pytest.mark.timeout(60)
def test_a_trainer_state_json_gives_the_points_a_log_did_not(tmp_path):
    state = tmp_path / "trainer_state.json"
    target = Target("here", LocalTransport("here"))
    run_dir = tmp_path / "run"
    launcher(target, "start", str(run_dir), argv=[sys.executable, "-c", STATE_WRITER, str(state)])
    sink = Sink()
    monitor = Monitor(target, str(run_dir), MonitorSettings(gpu_every=0, trainer_state=str(state)), sink)
    monitor.run()
    found = monitor.read_trainer_state()
    assert found["entries"] == 3 and found["steps"] == [10, 20]
    assert found["points_from"].startswith("trainer_state.json")
    assert [(p.step, p.loss) for p in sink.points] == [(10, 2.5), (20, 2.25), (20, 2.25)]
    assert sink.points[-1].extra["train_loss"] == 2.4 and "total_flos" not in sink.points[-1].extra


def test_a_missing_or_broken_trainer_state_json_is_said_not_raised(tmp_path):
    from orchestrator.watch.logformats import TrainerStateError, log_history_points

    target = Target("here", LocalTransport("here"))
    monitor = Monitor(target, str(tmp_path), MonitorSettings(trainer_state=str(tmp_path / "none.json")), Sink())
    assert "No such file" in monitor.read_trainer_state()["error"]
    for text, message in [("{", "not JSON"), ('{"global_step": 3}', "no log_history")]:
        with pytest.raises(TrainerStateError, match=message):
            log_history_points(text)


# torchrun --redirects 3 with a Trainer: rank 0's stdout.log has the dicts, its stderr.log the
# bar; tqdm.write clears the bar (a blank redraw), the dict goes to stdout, the bar comes back
# at the step just logged. The shapes as a real run wrote them (tests/trainer/ runs one).
REDIRECTED_STDOUT = "".join(f"{{'loss': '{5.4 - i / 100:.3f}', 'grad_norm': '1.1', 'epoch': '{i * 0.625}'}}\n"
                            for i in (1, 2, 3, 4)) + \
    "{'train_runtime': '0.4', 'train_samples_per_second': '397.2', 'train_loss': '5.38', 'epoch': '2.5'}\n"
BLANK = "\r" + " " * 38 + "\r"
REDIRECTED_STDERR = ("[transformers] a warning\n\r  0%|          | 0/20 [00:00<?, ?it/s]"
                     + "".join(f"{BLANK}\r {n * 5}%|##  | {n}/20 [00:00<00:00, 55.17it/s]"
                               f"\r {n * 5 + 5}%|##  | {n + 1}/20 [00:00<00:00, 58.99it/s]"
                               for n in (5, 10, 15))
                     + f"{BLANK}\r100%|####| 20/20 [00:00<00:00, 60.1it/s]\r100%|####| 20/20 [00:00<00:00, 60.1it/s]\n")


@pytest.mark.parametrize("logging_steps", [None, 5])
@pytest.mark.parametrize("order", ["dicts first", "bar first", "in pieces"])
def test_a_trainers_dicts_and_bar_in_two_rank_logs_pair_in_any_order(order, logging_steps):
    from orchestrator.watch.logformats import LogParser, make_format

    fmt = make_format("auto", logging_steps=logging_steps)
    logs = {"stdout": REDIRECTED_STDOUT, "stderr": REDIRECTED_STDERR}
    parsers = {name: LogParser(fmt, worker=0, source=f"d/attempt_0/0/{name}.log") for name in logs}
    if order == "in pieces":
        chunks = [(name, text[i:i + 23]) for i in range(0, 2000, 23) for name, text in logs.items()]
    else:
        chunks = list(logs.items()) if order == "dicts first" else list(logs.items())[::-1]
    points = []
    for name, text in chunks:
        points += parsers[name].feed(text)[1]
    for parser in parsers.values():
        points += parser.finish()[1]
    steps = [(p.step, p.loss) for p in points if not p.progress]
    assert steps == [(5, 5.39), (10, 5.38), (15, 5.37), (20, 5.36), (20, None)]


# ----------------------------------------------------- steps never invented (issue 40)
HF_POINTS = r'''
import sys, time
logs = int(sys.argv[1]) if len(sys.argv) > 1 else 6
# transformers 5.24 PrinterCallback: print(logs), floats as f"{v:.4g}"
for n in range(1, logs + 1):
    print(str({"loss": f"{4.0 - n / 10:.4g}", "grad_norm": f"{0.96051:.4g}", "learning_rate": "4.5e-05",
               "epoch": f"{n / 4:.4g}"}), flush=True)
    time.sleep(0.05)
print(str({"train_runtime": "%s", "train_samples_per_second": "38.7", "train_steps_per_second": "%s",
           "train_loss": "3.6", "epoch": "1.5"}), flush=True)
'''


@pytest.mark.timeout(60)
def test_hf_dicts_without_logging_steps_get_their_steps_from_the_closing_summary(tmp_path):
    """The issue's run: disable_tqdm=True, logging_steps=5, max_steps 30, nothing said to
    orch. 9.677 steps/s x 3.1 s = 30 steps over 6 logs: 5 between them, nothing else fits."""
    verdict, sink = watch(tmp_path, HF_POINTS % ("3.1", "9.677"))
    assert [p.step for p in sink.points if p.loss is not None][:6] == [5, 10, 15, 20, 25, 30]
    assert verdict.message == "ok: 1 worker trained to step 30"
    assert verdict.summary["steps_numbered"] == ("steps numbered in log order x 5 "
                                                 "(train_steps_per_second x train_runtime)")


@pytest.mark.timeout(60)
def test_hf_dicts_whose_spacing_nothing_says_are_log_points_not_steps(tmp_path):
    # a closing summary that fits more than one spacing (1,000 +- 1 steps over 6 logs: 143..166)
    verdict, sink = watch(tmp_path, HF_POINTS % ("1.2e+04", "0.08333"))
    assert verdict.message == "ok: 1 worker, 6 log points, no step numbers printed"
    assert verdict.summary["drafters"]["0"]["step"] is None
    assert verdict.summary["drafters"]["0"]["log_points"] == 6
    assert [p.step for p in sink.points] == [1, 2, 3, 4, 5, 6, 6]      # their order, kept as such
    assert verdict.summary["steps_numbered"].startswith("6 log points, no step numbers printed")


@pytest.mark.timeout(60)
def test_a_healthy_run_with_no_metric_line_says_what_was_looked_for(tmp_path):
    verdict, _ = watch(tmp_path, UNKNOWN.replace("range(12)", "range(3)"), hang_after=5)
    assert verdict.verdict == "ok"
    assert verdict.message.startswith("ok: no metric lines recognised (format auto; looked for orch, "
                                      "specforge, hf-trainer, jsonl, nanogpt, torchtitan, megatron, "
                                      "deepspeed, lightning, keyvalue, loop")
    assert "step 0" not in verdict.message


LOOP_ON_NODE_1 = r'''
import time
for step in range(10, 61, 10):
    print(f"[default0]:step {step}/60 loss={2.0 - step / 60:.4f}", flush=True)
    time.sleep(0.05)
'''


@pytest.mark.timeout(60)
def test_a_nodes_ranks_are_named_by_their_global_rank(tmp_path):
    """Node rank 1 of nproc 2: its local rank 0 is the job's rank 2."""
    verdict, sink = watch(tmp_path, LOOP_ON_NODE_1, rank_offset=2, worker_word="rank")
    assert {p.drafter for p in sink.points} == {2}
    assert verdict.message == "ok: 1 rank trained to step 60" and set(verdict.summary["drafters"]) == {"2"}
    assert any(line.startswith("step 60/60") for line in sink.lines)
