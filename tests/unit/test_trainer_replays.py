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


class Sink(MonitorSink):
    def __init__(self):
        self.lines, self.points, self.notes = [], [], []

    def log_line(self, target, line):
        self.lines.append(line)

    def note(self, target, text, level="info"):
        self.notes.append(text)

    def metrics(self, target, points):
        self.points.extend(points)


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
