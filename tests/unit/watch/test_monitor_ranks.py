"""torchrun launches and every rank's log followed: the argv orch builds, the playbook keys'
checks, and the monitor reading per-rank files (torchrun's --log-dir layout) by byte offset
on this machine. The same with a real torchrun is in tests/trainer and tests/integration."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import time

import pytest

from orchestrator.ground.errors import ConfigError
from orchestrator.watch.monitor import (LogFollower, Monitor, MonitorSettings, MonitorSink,
                                  stream_copy_path, worker_of)
from orchestrator.remote.payload_api import launcher
from orchestrator.playbook.loader import load_playbook
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.watch.classify import ProgressSnapshot
from orchestrator.watch.logformats import FORMATS, make_format
from orchestrator.watch.torchrun import RANK_LOGS, TorchrunError, build_argv, check_spec

from tests.support.follow_handlers import Collect


# ------------------------------------------------------------------------------ argv
def test_torchrun_argv_for_a_python_script():
    argv = build_argv({"nproc_per_node": 2, "master_port": 29511}, ["python", "train.py", "--lr", "1e-4"],
                      "/var/tmp/orch/runs/r1/train/")
    assert argv == ["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                    "29511", "--log-dir", "/var/tmp/orch/runs/r1/train/ranks", "--redirects", "3",
                    "train.py", "--lr", "1e-4"]


def test_torchrun_argv_for_a_module_and_for_a_program():
    assert build_argv({"nproc_per_node": "4"}, ["/root/venv/bin/python3", "-m", "pkg.train", "x"], "/r")[:9] == [
        "/root/venv/bin/python3", "-m", "torch.distributed.run", "--nproc-per-node", "4",
        "--log-dir", "/r/ranks", "--redirects", "3"]
    assert build_argv({"nproc_per_node": 4}, ["/root/venv/bin/python3", "-m", "pkg.train", "x"], "/r")[-3:] == [
        "--module", "pkg.train", "x"]
    assert build_argv({"nproc_per_node": 1}, ["./train.sh", "a b"], "/r")[-3:] == ["--no-python", "./train.sh", "a b"]


@pytest.mark.parametrize("spec,message", [
    ({}, "needs nproc_per_node"),
    ({"nproc_per_node": 0}, "must be a positive number"),
    ({"nproc_per_node": "two"}, "must be int, not 'two'"),
    ({"nproc_per_node": 2, "nproc": 2}, "unknown torchrun option 'nproc'"),
    ({"nproc_per_node": True}, "must be int, not True"),
    ([2], "must be a mapping"),
])
def test_bad_torchrun_blocks(spec, message):
    with pytest.raises(TorchrunError, match=message):
        build_argv(spec, ["python", "t.py"], "/r")


def test_a_templated_value_is_checked_after_rendering():
    check_spec({"nproc_per_node": "{{ ranks }}"})
    with pytest.raises(TorchrunError, match="needs a script"):
        build_argv({"nproc_per_node": 2}, ["python"], "/r")


def test_worker_of_a_rank_log():
    assert worker_of("ranks/abc_x1/attempt_0/3/stderr.log") == 3
    assert worker_of(None) is None and worker_of("output.log") is None


# ------------------------------------------------------------------- playbook checks
PLAYBOOK = """\
name: t
targets: [dev]
steps:
  - launch:
      torchrun: {torchrun}
      command: [python, t.py]
  - monitor: {monitor}
"""


def load(tmp_path, torchrun="{nproc_per_node: 2}", monitor="{format: specforge}"):
    path = tmp_path / "p.yaml"
    path.write_text(PLAYBOOK.format(torchrun=torchrun, monitor=monitor))
    return load_playbook(str(path))


def error(tmp_path, **kwargs) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, **kwargs)
    return str(caught.value).split("p.yaml:", 1)[1]


def test_playbook_keys_are_checked_with_file_line_col(tmp_path):
    assert load(tmp_path).steps[1].params == {"format": "specforge"}
    assert error(tmp_path, torchrun="{nproc_per_node: 2, nodes: 2}").startswith(
        "5:37: unknown torchrun option 'nodes'")
    assert error(tmp_path, torchrun="{master_port: 1}").startswith("5:17: torchrun needs nproc_per_node")
    assert f"format must be one of {', '.join(FORMATS)}, not 'specforg'" in \
        error(tmp_path, monitor="{format: specforg}")
    assert error(tmp_path, monitor="{format: regex}").startswith("7:23: format regex needs a metric_regex")
    assert "metric_regex is for format regex" in error(
        tmp_path, monitor="{format: specforge, metric_regex: 'step=(?P<step>\\d+)'}")


# -------------------------------------------------------- following every rank's log
# Writes what torchrun --log-dir D --redirects 3 leaves: D/<id>/attempt_0/<rank>/stderr.log,
# rank 0 with a tqdm bar redrawn by \r, rank 1 stopping 3 steps early; and the agent's own
# words on stdout (the run's output.log).
FAKE_TORCHRUN = r'''
import os, sys, time
base = os.path.join(sys.argv[1], "ranks", "run-x_abc", "attempt_0")
logs = {}
for rank in (0, 1):
    os.makedirs(os.path.join(base, str(rank)))
    logs[rank] = open(os.path.join(base, str(rank), "stderr.log"), "w")
    open(os.path.join(base, str(rank), "stdout.log"), "w").close()
print("W1130 torch/distributed/run.py: Setting OMP_NUM_THREADS", flush=True)
for step in range(1, 11):
    for rank in (0, 1):
        if rank == 1 and step > 7:
            continue
        out = logs[rank]
        if rank == 0:
            out.write("\rTraining Epoch 0: %3d%%|#   | %d/10 [00:01<00:01, 9.00it/s, loss=1.0]" % (step * 10, step))
        out.write("2026-11-30 12:00:%02d,000 - INFO - specforge.utils - Train - Step %d [%d/10?], "
                  "Loss: %.4f, Acc: 0.5000\n" % (step, step, step, 3 - step / 10))
        out.flush()
    time.sleep(0.03)
'''


class Recording(MonitorSink):
    def __init__(self):
        self.lines, self.points, self.snapshots = [], [], []

    def progress(self, target, snapshot, status):
        self.snapshots.append(snapshot)

    def log_line(self, target, line):
        self.lines.append(line)

    def metrics(self, target, points):
        self.points.extend(points)


def test_the_monitor_follows_every_ranks_log(tmp_path):
    target = Target("here", LocalTransport("here"))
    run_dir = tmp_path / "run"
    launcher(target, "start", str(run_dir), argv=[sys.executable, "-c", FAKE_TORCHRUN, str(run_dir)])
    settings = MonitorSettings(format="specforge", follow=list(RANK_LOGS), worker_word="rank",
                               tokens_per_step=1000, gpu_every=0, hang_after=60)
    sink = Recording()
    monitor = Monitor(target, str(run_dir), settings, sink, stream_copy=stream_copy_path(str(tmp_path / "local")))
    end, _ = monitor.run()
    assert end.state == "exited" and end.exit_code == 0
    steps = {r: [p.step for p in sink.points if p.drafter == r] for r in (0, 1)}
    assert steps == {0: list(range(1, 11)), 1: list(range(1, 8))}
    assert all(p.extra == {"acc": 0.5} for p in sink.points)
    # no tok/s printed: derived from the log's own times (1 step/s) x tokens_per_step
    assert {p.tok_s for p in sink.points if p.step > 1} == {1000.0}
    assert all(p.derived for p in sink.points if p.step > 1)
    assert "[rank 1] 2026-11-30 12:00:07,000 - INFO - specforge.utils - Train - Step 7 [7/10?], " \
           "Loss: 2.3000, Acc: 0.5000" in sink.lines
    assert not any("Training Epoch" in line for line in sink.lines)   # redraws are progress
    assert sink.lines[0].startswith("W1130 torch/distributed/run.py")   # the agent's output.log
    # Progress reached the sink as frozen copies: each kept what it saw when it was taken.
    assert all(isinstance(s, ProgressSnapshot) and s.worker_word == "rank" for s in sink.snapshots)
    seen = [max((w.step for w in s.workers), default=0) for s in sink.snapshots]
    assert seen[0] < 10 and seen[-1] == 10 and seen == sorted(seen)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sink.snapshots[-1].workers[0].step = 0
    verdict = monitor.verdict(end, {}, cli="orch", playbook=None)
    assert verdict.verdict == "ok"
    assert verdict.message == "ok: 2 ranks trained to step 10, 2,000 tok/s total (derived from step times)"
    assert verdict.summary["workers"] == "rank" and set(verdict.summary["drafters"]) == {"0", "1"}
    copy = tmp_path / "local" / "logs" / "ranks" / "run-x_abc" / "attempt_0" / "1" / "stderr.log"
    assert copy.read_bytes() == (run_dir / "ranks" / "run-x_abc" / "attempt_0" / "1" / "stderr.log").read_bytes()


def test_a_follower_resumes_each_rank_log_at_its_own_offset(tmp_path):
    target = Target("here", LocalTransport("here"))
    run_dir = tmp_path / "run"
    launcher(target, "start", str(run_dir), argv=[sys.executable, "-c", FAKE_TORCHRUN, str(run_dir)])
    deadline = time.monotonic() + 30
    while launcher(target, "status", str(run_dir))["state"] != "exited" and time.monotonic() < deadline:
        time.sleep(0.1)
    rank1 = "ranks/run-x_abc/attempt_0/1/stderr.log"
    whole = (run_dir / rank1).read_bytes()
    follower = LogFollower(target, str(run_dir), follow=RANK_LOGS, offsets={rank1: 100})

    class PerFile(Collect):
        files: dict = {}

        def on_file_data(self, name, data):
            self.files[name] = self.files.get(name, b"") + data

    handler = PerFile()
    final = follower.follow(handler)
    assert final["state"] == "exited"
    assert handler.files[rank1] == whole[100:]
    assert follower.offsets[rank1] == len(whole)
    assert b"Train - Step 10 [10/10?]" in handler.files["ranks/run-x_abc/attempt_0/0/stderr.log"]


# ------------------------------------------------------------ the SpecForge playbooks
def dry_run(tmp_path, playbook, *extra):
    from click.testing import CliRunner

    from orchestrator.cli.app import main

    repo = __import__("pathlib").Path(__file__).resolve().parents[3]
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("hosts: {here: {transport: local}}\n"
                         "containers: {drafters: {host: here, venv: /root/venv, gpus: [5, 6, 7]}}\n")
    result = CliRunner().invoke(main, ["-i", str(inventory), "run", "--dry-run",
                                       str(repo / "playbooks" / playbook), *extra])
    assert result.exit_code == 0, result.output
    return load_playbook(str(repo / "playbooks" / playbook)), " ".join(result.output.split())


def test_the_legacy_specforge_playbook_validates_and_dry_runs(tmp_path):
    book, out = dry_run(tmp_path, "specforge-dflash-legacy.yaml",
                        "-e", "specforge_dir=/opt/SpecForge", "-e", "batch_size=2")
    assert [s.kind for s in book.steps] == ["ensure", "shell", "launch", "monitor", "collect"]
    assert ("CUDA_VISIBLE_DEVICES=5,6,7 TORCHINDUCTOR_CACHE_DIR=/var/lib/orch/inductor-cache "
            "/root/venv/bin/python -m torch.distributed.run --nproc-per-node 3 --master-port 29500 "
            "--log-dir ") in out
    assert "--redirects 3 /opt/SpecForge/scripts/train_dflash.py --target-model-path" in out
    assert "--batch-size 2 --max-length 3072" in out
    assert "test -f /opt/SpecForge/scripts/train_dflash.py" in out
    assert "read as specforge lines" in out and "tok/s derived from 18,432 tokens per step" in out
    assert "3 ranks under torchrun" in out


def test_the_specforge_train_playbook_validates_and_dry_runs(tmp_path):
    book, out = dry_run(tmp_path, "specforge-dflash.yaml", "-e", "specforge_dir=/opt/SpecForge",
                        "-e", "batch_size=2", "-e", 'overrides=["training.learning_rate=2e-4"]')
    assert [s.kind for s in book.steps] == ["ensure", "push", "shell", "launch", "monitor", "collect"]
    assert "put rendered files/specforge-dflash-run.yaml.j2 -> " in out
    assert ("env -C /opt/SpecForge /root/venv/bin/python -m specforge.cli train --config "
            in out) and "specforge-run.yaml --plan training.learning_rate=2e-4" in out
    assert ("/root/venv/bin/python -m torch.distributed.run --nproc-per-node 3 --master-port 29500 "
            "--log-dir ") in out
    assert ("--redirects 3 --module specforge.cli train --config " in out
            and "specforge-run.yaml --role all training.learning_rate=2e-4" in out)
    assert "scripts/train_dflash.py" not in out
    assert "lines recognised by shape (format auto)" in out and "3 ranks under torchrun" in out


def test_the_specforge_run_config_renders_to_its_sections(tmp_path):
    import yaml

    from orchestrator.config.jinja import ENV

    repo = __import__("pathlib").Path(__file__).resolve().parents[3]
    template = ENV.from_string((repo / "playbooks" / "files" / "specforge-dflash-run.yaml.j2").read_text())
    values = {"target_model_path": "/m/Qwen3-8B", "draft_model_config": "configs/qwen3-8b-dflash.json",
              "embedding_key": "model.embed_tokens.weight", "torch_dtype": "bfloat16",
              "hidden_states_path": "/d/hidden: odd", "max_length": "2048",
              "chat_template": "qwen", "cache_dir": "./cache", "num_epochs": 1, "batch_size": 2,
              "learning_rate": "1e-4", "attention_backend": "flex_attention", "num_anchors": 512,
              "log_interval": 50, "save_interval": 1000, "dist_timeout": 10, "specforge_run_id": "orch-dev",
              "output_dir": "/r/out", "nproc_per_node": "3", "report_to": "tensorboard"}
    config = yaml.safe_load(template.render(**values))
    assert set(config) == {"model", "data", "training", "tracking", "run_id", "output_dir", "deployment"}
    assert config["tracking"] == {"report_to": "tensorboard"}
    assert config["data"] == {"hidden_states_path": "/d/hidden: odd", "max_length": 2048,
                              "chat_template": "qwen", "cache_dir": "./cache"}
    assert config["training"]["learning_rate"] == 1e-4 and config["training"]["strategy"] == "dflash"
    assert config["deployment"] == {"mode": "local_colocated", "trainer": {"nnodes": 1, "nproc_per_node": 3}}


def test_one_step_said_twice_becomes_one_point_with_both():
    from orchestrator.watch.logformats import LogPoint
    from orchestrator.watch.classify import ClassifierSettings, LogClassifier

    classifier = LogClassifier(ClassifierSettings("dev", metrics_from_lines=False))
    first = classifier.observe(LogPoint(step=20, loss=5.4, metrics={"grad_norm": 1.8}), 1.0)
    again = classifier.observe(LogPoint(step=20, metrics={"train_loss": 5.39}), 2.0)
    assert (first.loss, again.loss) == (5.4, 5.4)
    assert again.extra == {"grad_norm": 1.8, "train_loss": 5.39}


def test_the_live_view_names_ranks_and_hides_the_lines_its_table_shows():
    import io

    from rich.console import Console

    from orchestrator.watch.logformats import LogPoint
    from orchestrator.watch.classify import ClassifierSettings, LogClassifier
    from orchestrator.cli.screens.run import ConsoleReporter

    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, width=120, force_terminal=False), live=False, echo="events")
    classifier = LogClassifier(ClassifierSettings("dev", metrics_from_lines=False, worker_word="rank",
                                                  metric_lines=make_format("specforge").is_metric_line))
    for rank in (0, 1):
        classifier.observe(LogPoint(step=50, worker=rank, loss=2.1), 1.0)
    reporter.monitor_started("dev", "/r", MonitorSettings())
    reporter.monitor_progress("dev", classifier.snapshot(), {"state": "running"})
    reporter.log_line("dev", "2026-11-30 12:00:00,000 - INFO - x - Train - Step 50 [50/99?], Loss: 2.1")
    reporter.log_line("dev", "Saved checkpoint to /out")
    text = out.getvalue()
    assert "Train - Step 50" not in text and "dev | Saved checkpoint to /out" in text
    header = reporter._table({"dev": {"progress": classifier.snapshot(), "status": {}, "settings": None}})
    rendered = io.StringIO()
    Console(file=rendered, width=120).print(header)
    assert "rank" in rendered.getvalue().splitlines()[0] and "drafter" not in rendered.getvalue()


def test_the_live_view_says_when_no_metric_line_was_recognised():
    import io

    from rich.console import Console

    from orchestrator.cli.screens.run import ConsoleReporter
    from orchestrator.watch.classify import ClassifierSettings, LogClassifier

    reporter = ConsoleReporter(Console(file=io.StringIO(), width=160, force_terminal=False), live=False,
                               echo="events")
    classifier = LogClassifier(ClassifierSettings("dev", metrics_from_lines=False, format_name="auto",
                                                  format_tried="orch, specforge"))
    classifier.feed("warming caches", 1.0)
    rendered = io.StringIO()
    Console(file=rendered, width=160).print(
        reporter._table({"dev": {"progress": classifier.snapshot(), "status": {}, "settings": None}}))
    assert "no metric lines recognised (format auto; looked for orch, specforge)" in rendered.getvalue()
