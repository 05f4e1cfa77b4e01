"""The training loops people run, through `orch run` in a sandbox container with the default
monitor (`format: auto`, nothing said about the trainer): verdict ok, the true last step and
loss, tok/s where the shape has a rate.

Real libraries where they run on CPU: a Hugging Face Trainer (transformers 5.24, no bar,
`disable_tqdm=True`), Lightning 2.6.6 (its TQDMProgressBar), a hand-written DDP loop under
orch's torchrun block (2 ranks, gloo). nanoGPT, torchtitan, Megatron-LM and DeepSpeed need
GPUs (or their own data): their lines come from tests/trainer/real/shape_writers.py, built
with upstream's format strings. The libraries are the cached test venvs
(tests/trainer/realenv.py), linked into the container's venv as torch_seed.py links torch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.runs.store import RunStore
from tests.integration.torch_seed import container_root, remove_venv, seed_torch_venv
from tests.support.torchenv import torch_venv
from tests.trainer.real.shape_writers import losses
from tests.trainer.realenv import lightning_venv, trainers_venv

HOST, VMID, TARGET = "sb1", 200, "sb1-200"
VENV_DIR = "orch-shapes-venv"
FILES = "/root/orch-shapes"
REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "trainer" / "real"
ORCH = [sys.executable, "-c", "from orchestrator.cli.app import main; main()"]
SCRIPTS = ("hf_tiny_trainer.py", "lightning_tiny.py", "ddp_nodes_loop.py", "shape_writers.py")


@pytest.fixture(scope="module")
def container(sandbox):
    """torch, transformers and Lightning in the container's venv; the scripts; its loopback up."""
    venv = seed_torch_venv(sandbox, HOST, VMID, dest=VENV_DIR)
    root = Path(container_root(sandbox, HOST, VMID))
    site = next((root / VENV_DIR).glob("lib/python3*/site-packages"))
    torch_python = Path(torch_venv()) / "bin" / "python"
    for layered in (trainers_venv(torch_python), lightning_venv(torch_python)):
        for entry in next(layered.glob("lib/python3*/site-packages")).iterdir():
            if not (site / entry.name).exists() and entry.suffix != ".pth":
                subprocess.run(["cp", "-al", str(entry), str(site / entry.name)], check=True)
    files = root / FILES.split("/root/", 1)[1]
    files.mkdir(exist_ok=True)
    for script in SCRIPTS:
        shutil.copy(REAL / script, files / script)
    subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), "exec", TARGET, "--", "ip", "link", "set",
                    "lo", "up"], cwd=REPO, check=True, capture_output=True)
    yield f"/root/{VENV_DIR}/bin/python"
    remove_venv(sandbox, HOST, VMID, dest=VENV_DIR)
    shutil.rmtree(files, ignore_errors=True)


def orch_run(sandbox, tmp_path, launch: str, monitor: str = "{hang_after: 240, gpu_every: 0}"):
    """`orch run` of a two-step playbook: the launch given, then the default monitor."""
    book = tmp_path / "shape.yaml"
    book.write_text(f"name: shape\ntargets: [{TARGET}]\nsteps:\n  - launch:\n{launch}"
                    f"      env: {{OMP_NUM_THREADS: '1', PYTHONUNBUFFERED: '1'}}\n  - monitor: {monitor}\n")
    done = subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), "run", str(book), "-t", TARGET],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=500,
                          env={**os.environ, "COLUMNS": "200"})
    with RunStore() as store:
        record = store.get("last")
    return done.returncode, done.stdout, record, record.summary["monitor"][TARGET]


def truth(sandbox, name: str):
    return json.loads((Path(container_root(sandbox, HOST, VMID)) / FILES.split("/root/", 1)[1] / name).read_text())


@pytest.mark.parametrize("flag,numbered", [
    ("--logging-steps", None),                       # on the command line: a step from the start
    ("--log-every", "steps numbered in log order x 5 (train_steps_per_second x train_runtime)"),
])
def test_hugging_face_trainer_without_a_bar(sandbox, container, tmp_path, flag, numbered):
    """The issue's run: disable_tqdm=True, logging_steps=5, max_steps 30 (it read "trained
    to step 6"). Named --log-every, orch cannot see it: the closing summary's steps/s x
    runtime over the 6 dicts says 5, and nothing else fits."""
    code, output, record, summary = orch_run(sandbox, tmp_path, f"""\
      command: [{container}, {FILES}/hf_tiny_trainer.py, --output-dir, {FILES}/hf-out, --history,
                {FILES}/history.json, --steps, "30", {flag}, "5", --no-bar]
""")
    assert code == 0, output[-5000:]
    history = truth(sandbox, "history.json")
    assert "ok: 1 worker trained to step 30" in output and summary["verdict"] == "ok"
    logged = [e for e in history if "loss" in e]
    points = {p.step: p for p in record.metrics}
    assert sorted(points) == [e["step"] for e in logged] == [5, 10, 15, 20, 25, 30]
    for entry in logged:
        assert points[entry["step"]].loss == pytest.approx(entry["loss"], rel=1e-3)
        assert points[entry["step"]].tok_s == pytest.approx(entry["train_tokens_per_second"], rel=1e-3)
    assert summary.get("steps_numbered") == numbered


def test_lightning_progress_bar(sandbox, container, tmp_path):
    code, output, record, summary = orch_run(sandbox, tmp_path, f"""\
      command: [{container}, {FILES}/lightning_tiny.py, --epochs, "3", --batches, "8", --out,
                {FILES}/lightning-out, --truth, {FILES}/lightning.json]
""")
    assert code == 0, output[-5000:]
    logged = truth(sandbox, "lightning.json")
    assert summary["format"] == "auto: lightning"
    assert "ok: 1 worker trained to step 24" in output
    points = {p.step: p for p in record.metrics}
    assert sorted(points) == [step for step, _ in logged] == list(range(1, 25))
    for step, loss in logged:                # the bar shows 3 significant digits (tqdm's format_num)
        assert points[step].loss == pytest.approx(loss, rel=6e-3)
    assert points[24].extra["epoch"] == 2 and "val_loss" in points[24].extra
    assert "Epoch 2:" not in output          # redraws are progress, never lines


def test_hand_written_ddp_loop_under_torchrun(sandbox, container, tmp_path):
    code, output, record, summary = orch_run(sandbox, tmp_path, f"""\
      torchrun: {{nproc_per_node: 2, master_port: 29651}}
      command: [{container}, {FILES}/ddp_nodes_loop.py, --steps, "20", --line, loop, --truth, {FILES}/loop-truth]
""")
    assert code == 0, output[-5000:]
    assert summary["format"] == "auto: loop" and summary["tok_s_printed_as"] == ["tok/s"]
    assert "ok: 2 ranks trained to step 20, " in output and "tok/s total (printed: tok/s)" in output
    for rank in (0, 1):
        logged = truth(sandbox, f"loop-truth/rank{rank}.json")
        points = [(p.step, p.loss, p.tok_s) for p in record.metrics if p.drafter == rank]
        assert points == [tuple(row) for row in logged]


@pytest.mark.parametrize("shape,steps,tok_s", [
    ("nanogpt", 40, 491520 / 0.290),            # its tokens per iteration / the iteration's time
    ("torchtitan", 30, 12375),                  # tps, tokens/s per device
    ("megatron", 100, 64 / 0.85 * 4096),        # samples/s (batch over the time) x --seq-length
    ("deepspeed", 20, 32 / 0.125 * 4096),       # CurrSamplesPerSec x --seq-length
])
def test_upstream_shapes_replayed_through_orch_run(sandbox, container, tmp_path, shape, steps, tok_s):
    last_step, loss = steps, losses(steps)[steps]
    code, output, record, summary = orch_run(sandbox, tmp_path, f"""\
      command: [python3, {FILES}/shape_writers.py, {shape}, "{steps}", --seq-length, "4096"]
      venv: false
""")
    assert code == 0, output[-5000:]
    assert summary["format"] == f"auto: {shape}" and summary["verdict"] == "ok"
    assert f"ok: 1 worker trained to step {last_step}" in output
    last = max(record.metrics, key=lambda p: p.step)
    assert last.step == last_step
    assert last.loss == pytest.approx(loss, rel=1e-4)     # as printed: 4 to 7 digits
    assert last.tok_s == pytest.approx(tok_s, rel=1e-3)
