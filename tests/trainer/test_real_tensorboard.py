"""TensorBoard event files written by a real torch.utils.tensorboard SummaryWriter (torch
2.13 CPU, tensorboard 2.21 in a cached venv: tests/trainer/realenv.py), logged the way
SpecForge's tracker does (tests/trainer/real/specforge_tensorboard.py), read back through
the real monitor: collected from the target, parsed on the controller, checked against what
the loop logged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.payload_api import launcher
from orchestrator.watch.monitor import Monitor, MonitorSettings, stream_copy_path
from tests.trainer.realenv import tensorboard_venv
from tests.support.monitor_sinks import Sink

pytestmark = pytest.mark.torch
pytest.importorskip("tensorboard", reason="the test extra installs tensorboard")
WRITER = Path(__file__).resolve().parent / "real" / "specforge_tensorboard.py"
TOKENS_PER_SAMPLE = 128


@pytest.fixture(scope="module")
def python(torch_python) -> str:
    return str(tensorboard_venv(torch_python) / "bin" / "python")


def train(python: str, tmp_path: Path, *extra: str):
    """The loop under orch's launcher and the monitor, the event files read at its end."""
    target = Target("here", LocalTransport("here"))
    run_dir, output_dir, truth = tmp_path / "run", tmp_path / "out", tmp_path / "truth.json"
    launcher(target, "start", str(run_dir), env={"OMP_NUM_THREADS": "1"},
             argv=[python, str(WRITER), "--output-dir", str(output_dir), "--truth", str(truth), *extra])
    sink = Sink()
    settings = MonitorSettings(gpu_every=0, hang_after=120, tensorboard=str(output_dir / "runs"),
                               tokens_per_sample=TOKENS_PER_SAMPLE)
    monitor = Monitor(target, str(run_dir), settings, sink,
                      stream_copy=stream_copy_path(str(tmp_path / "local")))
    end, _ = monitor.run()
    found = monitor.read_tensorboard()
    verdict = monitor.verdict(end, {}, cli="orch", playbook=None)
    return json.loads(truth.read_text()), found, sink, verdict


def test_event_files_give_the_points_of_a_run_that_prints_none(python, tmp_path):
    truth, found, sink, verdict = train(python, tmp_path)
    assert verdict.verdict == "ok", verdict.message
    assert found["points_from"] == "TensorBoard event files (the log gave none)"
    [event_file] = found["files"]
    assert "problem" not in event_file and event_file["read"] == event_file["size"]
    assert "train/perf/global_samples_per_second" in found["tags"] and "eval/avg_loss" in found["tags"]
    train_logs = {step: values for step, values in truth if "train/loss" in values}
    eval_logs = {step: values for step, values in truth if "eval/avg_loss" in values}
    assert [p.step for p in sink.points] == sorted(train_logs) == [3, 6, 9, 12]
    for point in sink.points:
        logged = train_logs[point.step]
        assert point.loss == pytest.approx(logged["train/loss"], rel=1e-6)   # float32 in the file
        assert point.extra["grad_norm"] == pytest.approx(logged["train/grad_norm"], rel=1e-6)
        samples = logged["train/perf/global_samples_per_second"]
        assert point.tok_s == pytest.approx(samples * TOKENS_PER_SAMPLE, rel=1e-3)
        assert point.derived is True
        if point.step in eval_logs:
            assert point.extra["eval/avg_loss"] == pytest.approx(eval_logs[point.step]["eval/avg_loss"], rel=1e-6)
    # the run's copy of the event file, byte for byte, for `tensorboard --logdir`
    [name] = os.listdir(tmp_path / "out" / "runs")
    kept = tmp_path / "local" / "tensorboard" / name
    assert kept.read_bytes() == (tmp_path / "out" / "runs" / name).read_bytes()


def test_event_files_agree_with_the_steps_the_log_printed(python, tmp_path):
    truth, found, sink, verdict = train(python, tmp_path, "--print")
    assert verdict.verdict == "ok", verdict.message
    assert found["agrees_with_log"] is True and "points_from" not in found
    assert (found["first_step"], found["last_step"], found["entries"]) == (3, 12, 4)
    assert sorted({p.step for p in sink.points}) == sorted({step for step, _ in truth})
