"""Real trainers in a sandbox container, watched by `orch run`.

playbooks/specforge-dflash-legacy.yaml: a real `torchrun --nproc-per-node 2`
(gloo, torch 2.13 CPU) in a container, running a DDP loop that logs like SpecForge's
train_dflash.py in place of the trainer (tests/trainer/real/ddp_specforge_loop.py, put at
scripts/train_dflash.py of a fake checkout; the playbook's trainer_args set its flags).

- healthy: both ranks' steps recorded (per-rank logs followed), verdict ok;
- rank 1 sends itself SIGKILL mid-run: verdict killed, naming rank 1 and SIGKILL;
- rank 1 sleeps before a collective rank 0 waits in: a hang naming rank 1;
- the container's loopback down (the sandbox's bind-mounted containers start that way; a
  Proxmox CT's init brings it up): the ranks never reach their store at 127.0.0.1, a
  rendezvous failure rather than a plain hang.

A Hugging Face Trainer (transformers 5.24, a 2-layer GPT-2 from its config, synthetic data)
under a playbook with `format: hf-trainer`: the record's points are its log_history. The
libraries are the test venv's (tests/trainer/realenv.py), linked into the container's venv
the way tests/integration/torch_seed.py links torch.
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
from tests.support.hf_history import assert_recorded_as_history
from tests.support.torchenv import torch_venv
from tests.trainer.realenv import trainers_venv

HOST, VMID, TARGET = "sb1", 200, "sb1-200"
VENV_DIR = "orch-torchrun-venv"
CHECKOUT = "/root/orch-fake-specforge"
REPO = Path(__file__).resolve().parents[2]
ORCH = [sys.executable, "-c", "from orchestrator.cli.app import main; main()"]


def loopback(sandbox, state: str) -> None:
    subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), "exec", TARGET, "--",
                    "ip", "link", "set", "lo", state], cwd=REPO, check=True, capture_output=True)


def loopback_up(sandbox) -> bool:
    shown = subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), "exec", TARGET, "--",
                            "ip", "-o", "link", "show", "lo"], cwd=REPO, capture_output=True, text=True)
    return ",UP" in shown.stdout


@pytest.fixture(scope="module")
def container(sandbox):
    """torch (the shared venv, hard-linked) plus tqdm in the container; the fake checkout;
    its loopback up (torchrun's ranks meet at 127.0.0.1)."""
    venv = seed_torch_venv(sandbox, HOST, VMID, dest=VENV_DIR)
    root = Path(container_root(sandbox, HOST, VMID))
    trainers = trainers_venv(Path(torch_venv()) / "bin" / "python")
    site = next((root / VENV_DIR).glob("lib/python3*/site-packages"))
    for entry in next(trainers.glob("lib/python3*/site-packages")).iterdir():
        # transformers, accelerate, tqdm and their dependencies; not the venv's own tools
        if not (site / entry.name).exists() and entry.suffix != ".pth":
            subprocess.run(["cp", "-al", str(entry), str(site / entry.name)], check=True)
    scripts = root / CHECKOUT.split("/root/", 1)[1] / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "trainer" / "real" / "ddp_specforge_loop.py", scripts / "train_dflash.py")
    shutil.copy(REPO / "tests" / "trainer" / "real" / "hf_tiny_trainer.py", scripts / "hf_tiny_trainer.py")
    was_up = loopback_up(sandbox)
    loopback(sandbox, "up")
    yield venv
    if not was_up:
        loopback(sandbox, "down")     # as it was (a sandbox from before orch-ct-init)
    remove_venv(sandbox, HOST, VMID, dest=VENV_DIR)
    shutil.rmtree(scripts.parent, ignore_errors=True)


def run(sandbox, venv: str, trainer_args: str, *extra: str, timeout=400):
    argv = [*ORCH, "-i", str(sandbox.inventory_path), "run", "playbooks/specforge-dflash-legacy.yaml",
            "-t", TARGET, "-e", f"venv={venv}", "-e", f"specforge_dir={CHECKOUT}",
            "-e", "nproc_per_node=2", "-e", f"trainer_args={trainer_args}", *extra]
    done = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    with RunStore() as store:
        return done.returncode, done.stdout, store.get("last")


def test_healthy_run_records_every_ranks_steps(sandbox, container):
    code, output, record = run(sandbox, container, "[--steps, 24, --log-interval, 2, --step-seconds, 0.05]")
    assert code == 0, output[-6000:]
    steps = {rank: sorted(p.step for p in record.metrics if p.drafter == rank) for rank in (0, 1)}
    assert steps == {0: list(range(2, 25, 2)), 1: list(range(2, 25, 2))}
    assert all("acc" in p.extra for p in record.metrics)
    assert any(p.derived and p.tok_s for p in record.metrics)     # tokens_per_step x steps/s
    summary = record.summary["monitor"][TARGET]
    assert summary["verdict"] == "ok" and summary["workers"] == "rank"
    assert set(summary["drafters"]) == {"0", "1"} and summary["drafters"]["1"]["step"] == 24
    assert "ok: 2 ranks trained to step 24" in output
    assert "[rank 1] " in output and "Train - Step 24 [24/24?]" in output
    assert "Training Epoch 0:" not in output          # rank 0's bar is progress, not a line
    # the same report as for the stand-in trainer: both ranks charted, their throughput
    page = Path(record.artifacts_dir or ".") / "check-report.html"
    done = subprocess.run([*ORCH, "report", record.run_id, "--html", str(page)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    html = page.read_text()
    assert "<svg" in html and ">d0<" in html and ">d1<" in html


def test_a_rank_killed_by_sigkill_is_named(sandbox, container):
    code, output, record = run(sandbox, container, "[--steps, 200, --kill-rank, 1, --kill-at-step, 8]")
    assert code == 10, output[-6000:]
    assert record.verdict == "killed"
    finding = next(f for f in record.findings if f.signature == "rank-failed")
    assert finding.message.startswith("torchrun: rank 1 ")
    assert "was killed by SIGKILL (signal 9)" in finding.message and "OOM killer" in finding.message
    assert "verdict: killed" in output and "rank 1" in output


def test_a_rank_stuck_before_a_collective_is_named_in_the_hang(sandbox, container):
    code, output, record = run(
        sandbox, container,
        "[--steps, 200, --sync-every, 10, --sleep-rank, 1, --sleep-at-step, 7, --sleep-seconds, 600]",
        "-e", "hang_after=15")
    assert code == 11, output[-6000:]
    assert record.verdict == "hang"
    finding = next(f for f in record.findings if f.signature == "hang:stuck-rank")
    assert finding.message.startswith("rank 1 stopped at step 6 while rank 0 reached step 9")
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in finding.remediation


def test_ranks_that_cannot_reach_their_store_never_meet(sandbox, container):
    loopback(sandbox, "down")
    try:
        code, output, record = run(sandbox, container, "[--steps, 20]", "-e", "hang_after=20")
    finally:
        loopback(sandbox, "up")
    assert code == 10, output[-6000:]
    assert record.verdict == "rendezvous-timeout"
    assert "rendezvous-timeout: the ranks never met" in output
    finding = next(f for f in record.findings if f.signature == "rendezvous-timeout")
    assert "ip link set lo up" in finding.remediation


HF_PLAYBOOK = """\
name: hf-tiny
targets: [{target}]
steps:
  - launch:
      command: [{venv}/bin/python, {checkout}/scripts/hf_tiny_trainer.py, --output-dir, {checkout}/hf-out,
                --history, {checkout}/history.json, --steps, "20", --logging-steps, "5"]
      env: {{HF_HUB_OFFLINE: "1", OMP_NUM_THREADS: "1"}}
  - monitor: {{format: hf-trainer, tokens_per_step: 128, hang_after: 240}}
"""


def test_a_hugging_face_trainer_run_is_recorded_as_its_log_history(sandbox, container, tmp_path):
    book = tmp_path / "hf.yaml"
    book.write_text(HF_PLAYBOOK.format(target=TARGET, venv=container, checkout=CHECKOUT))
    done = subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), "run", str(book)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-6000:]
    assert "ok: 1 worker trained to step 20" in done.stdout
    with RunStore() as store:
        record = store.get("last")
    root = Path(container_root(sandbox, HOST, VMID))
    history = json.loads((root / CHECKOUT.split("/root/", 1)[1] / "history.json").read_text())
    assert_recorded_as_history(record, history, "learning_rate")
