"""One torchrun job over two sandbox hosts, watched as one run (playbooks/ddp-two-nodes.yaml).

CT 200 of sb1 and CT 200 of sb2 are the two nodes: real torch 2.13 (the shared test venv,
hard-linked as tests/integration/torch_seed.py does), a real DDP loop over gloo
(tests/trainer/real/ddp_nodes_loop.py), the c10d rendezvous at sb1-200's bridge address,
the gradients' all-reduce between the two containers over the sandbox's shared bridge.

- healthy (nnodes 2, and an elastic 1:2): the job trains to its end, verdict ok, both
  nodes' ranks in one record, each node given SkyPilot's variables, `orch report` showing
  both nodes;
- sb2-200 without torch in its venv: pre-flight fails naming it, and nothing is launched;
- sb2-200's worker killed from outside (SIGKILL, by its pid): the verdict names sb2-200 and
  its rank, and no rank is left on either node afterwards (pgrep in each container);
- sb2-200's worker frozen (SIGSTOP): a hang that stops both nodes, the frozen worker too;
- after a killed controller, `orch attach` follows both nodes as one, `orch stop` stops
  both; `orch nightly` reruns the job into one record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.runs.store import RunStore
from tests.integration.torch_seed import container_root, remove_venv, seed_torch_venv
from tests.support.processes import sigkilled_after

NODES = [("sb1", 200, "sb1-200"), ("sb2", 200, "sb2-200")]
VENV_DIR = "orch-mn-venv"
SCRIPT = "/root/ddp_nodes_loop.py"
PIDS = "/root/mn-pids"
REPO = Path(__file__).resolve().parents[2]
ORCH = [sys.executable, "-c", "from orchestrator.cli.app import main; main()"]


def orch(sandbox, *args, **options):
    return subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), *args], cwd=REPO,
                          capture_output=True, text=True, **options)


@pytest.fixture(scope="module")
def nodes(sandbox):
    """torch and the trainer in both nodes' containers."""
    for host, vmid, _name in NODES:
        seed_torch_venv(sandbox, host, vmid, dest=VENV_DIR)
        shutil.copy(REPO / "tests" / "trainer" / "real" / "ddp_nodes_loop.py",
                    Path(container_root(sandbox, host, vmid)) / "ddp_nodes_loop.py")
    yield f"/root/{VENV_DIR}"
    for host, vmid, _name in NODES:
        remove_venv(sandbox, host, vmid, dest=VENV_DIR)
        root = Path(container_root(sandbox, host, vmid))
        for leftover in ("ddp_nodes_loop.py", "mn-nodes.json"):
            (root / leftover).unlink(missing_ok=True)
        shutil.rmtree(root / "mn-pids", ignore_errors=True)


def run_argv(sandbox, venv: str, trainer_args: str, *extra: str) -> list[str]:
    return [*ORCH, "-i", str(sandbox.inventory_path), "run", "playbooks/ddp-two-nodes.yaml",
            "-t", NODES[0][2], "-t", NODES[1][2], "-e", f"venv={venv}", "-e", f"script={SCRIPT}",
            "-e", f"trainer_args={trainer_args}", *extra]


def last_record():
    with RunStore() as store:
        return store.get("last")


def test_two_nodes_train_to_the_end_as_one_run(sandbox, nodes):
    (Path(container_root(sandbox, "sb1", 200)) / "mn-nodes.json").unlink(missing_ok=True)
    done = subprocess.run(run_argv(sandbox, nodes, "[--steps, 20, --nodes-file, /root/mn-nodes.json]"),
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200"})
    record = last_record()
    assert done.returncode == 0, done.stdout[-6000:]
    assert record.verdict == "ok"
    assert "pre-flight: 2 node(s) ready" in done.stdout
    names = [name for _h, _v, name in NODES]
    launches = record.launch["targets"]
    assert [launches[name]["node_rank"] for name in names] == [0, 1]
    assert launches["sb2-200"]["rdzv_endpoint"].startswith("10.88.1.200:")
    # one record: both nodes' ranks, every step
    steps = {name: sorted({p.step for p in record.metrics if p.target == name}) for name in names}
    assert steps == {name: list(range(1, 21)) for name in names}
    assert set(record.summary["monitor"]) == set(names)
    assert all(record.summary["monitor"][name]["verdict"] == "ok" for name in names)
    # what the job saw of itself: two ranks, SkyPilot's names set on the nodes
    seen = json.loads((Path(container_root(sandbox, "sb1", 200)) / "mn-nodes.json").read_text())
    assert seen["world_size"] == 2
    assert seen["SKYPILOT_NODE_IPS"] == "10.88.1.200\n10.88.2.200"
    assert seen["SKYPILOT_NUM_NODES"] == "2"
    report = orch(sandbox, "report", record.run_id, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    markdown = Path(next(line for line in report.stdout.splitlines() if line.endswith(".md"))).read_text()
    assert "### Nodes (one torchrun job, rendezvous 10.88.1.200:" in markdown
    assert "| 0 | `sb1-200` | 10.88.1.200 | 1 | ok |" in markdown
    assert "| 1 | `sb2-200` | 10.88.2.200 | 1 | ok |" in markdown
    # both nodes' ranks, each by its global rank (node rank x nproc + local rank)
    assert "| sb1-200/d0 | 20 |" in markdown and "| sb2-200/d1 | 20 |" in markdown


def test_two_nodes_of_a_hand_written_loop_read_by_global_rank(sandbox, nodes):
    """Issue 40: a DDP job printing `step 10/20 loss=1.2024 tok/s T` on every rank was "2
    nodes; sb1-200: 0 ranks trained to step 0; ...". Each node's rank is named by its
    global rank (node rank x nproc + local rank), and torchrun is given no --node-rank."""
    done = subprocess.run(run_argv(sandbox, nodes, "[--steps, 20, --line, loop]"), cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    record = last_record()
    assert done.returncode == 0, done.stdout[-6000:]
    assert record.verdict == "ok"
    assert "sb1-200: 1 rank trained to step 20" in record.steps[-2].message or \
        "sb1-200: 1 rank trained to step 20" in done.stdout
    assert "sb2-200: 1 rank trained to step 20" in done.stdout
    ranks = {name: {p.drafter for p in record.metrics if p.target == name} for _h, _v, name in NODES}
    assert ranks == {"sb1-200": {0}, "sb2-200": {1}}
    assert all("--node-rank" not in record.launch["targets"][name]["argv"] for _h, _v, name in NODES)
    assert record.summary["monitor"]["sb2-200"]["format"] == "auto: loop"
    assert set(record.summary["monitor"]["sb2-200"]["drafters"]) == {"1"}


def _worker_pid(sandbox, host: str, vmid: int, deadline: float) -> tuple[int, int]:
    """(global rank, pid) of the worker on a node, once it wrote its pid file."""
    folder = Path(container_root(sandbox, host, vmid)) / "mn-pids"
    while time.monotonic() < deadline:
        found = sorted(folder.glob("rank*.pid")) if folder.exists() else []
        if found and found[0].read_text().strip():
            return int(found[0].stem[4:]), int(found[0].read_text())
        time.sleep(0.5)
    raise AssertionError(f"no worker wrote its pid in {folder}")


def _signal_sb2s_worker_mid_run(sandbox, nodes, signal_option: str, *run_options):
    """`orch run` of the two nodes, with `kill SIGNAL_OPTION` sent to sb2-200's worker a few
    steps in; (that worker's global rank, orch's exit code, its output)."""
    for host, vmid, _name in NODES:
        shutil.rmtree(Path(container_root(sandbox, host, vmid)) / "mn-pids", ignore_errors=True)
    running = subprocess.Popen(
        run_argv(sandbox, nodes, f"[--steps, 4000, --step-seconds, 0.05, --pid-dir, {PIDS}]",
                 *run_options),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "200"})
    try:
        rank, pid = _worker_pid(sandbox, "sb2", 200, time.monotonic() + 180)
        time.sleep(3)                          # a few steps in
        sent = orch(sandbox, "exec", "sb2-200", "--", "kill", signal_option, str(pid), timeout=60)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        output, _ = running.communicate(timeout=240)
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate()
    return rank, running.returncode, output


def test_a_worker_killed_on_one_node_stops_the_other_and_is_named(sandbox, nodes):
    rank, code, output = _signal_sb2s_worker_mid_run(sandbox, nodes, "-9")
    record = last_record()
    assert code == 10, output[-6000:]
    assert record.verdict == "killed", output[-6000:]
    monitor = next(s for s in record.steps if s.kind == "monitor" and s.target == "sb1-200")
    assert monitor.data["first_failure"]["node"] == "sb2-200"
    assert monitor.data["first_failure"]["rank"] == rank
    assert f"node sb2-200 (node rank 1) failed first: torchrun: rank {rank} " in output
    assert "killed by SIGKILL" in output
    # no rank is left on either node ([d]: the pattern does not match the exec's own argv)
    for _host, _vmid, name in NODES:
        left = orch(sandbox, "exec", name, "--", "pgrep", "-f", "[d]dp_nodes_loop", timeout=60)
        shown = orch(sandbox, "exec", name, "--", "ps", "-eo", "pid,ppid,pgid,stat,args", timeout=60).stdout
        assert left.returncode == 1 and left.stdout.strip() == "", f"{name}: {left.stdout}\n{shown[:3000]}"


def test_a_node_without_torch_fails_preflight_and_nothing_is_launched(sandbox, nodes):
    site = next((Path(container_root(sandbox, "sb2", 200)) / VENV_DIR).glob("lib/python3*/site-packages"))
    # renamed in the container's copy only: its folders are its own, its files links
    (site / "torch").rename(site / "torch-hidden")
    try:
        done = subprocess.run(run_argv(sandbox, nodes, "[--steps, 5]"), cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300,
                              env={**os.environ, "COLUMNS": "200"})
    finally:
        (site / "torch-hidden").rename(site / "torch")
    record = last_record()
    assert done.returncode == 10, done.stdout[-6000:]
    assert "pre-flight failed, nothing was launched: sb2-200: torch" in done.stdout, done.stdout[-6000:]
    assert not (record.launch.get("targets") or {}), record.launch    # no node was started
    for host, vmid, _name in NODES:     # the containers' /var/lib/orch/runs: no folder of this run
        runs = Path(container_root(sandbox, host, vmid)).parent / "var" / "lib" / "orch" / "runs"
        assert not (runs / record.run_id).exists(), f"{runs / record.run_id}: something was launched"


def _started_then_controller_killed(sandbox, venv: str, trainer_args: str):
    """`orch run` of the two nodes, SIGKILLed once both nodes train: the record of a run
    whose nodes go on without their controller."""
    controller = subprocess.Popen(run_argv(sandbox, venv, trainer_args), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, lines = set(), []
    with sigkilled_after(controller):
        for line in controller.stdout:
            lines.append(line)
            for (_host, _vmid, name), rank in zip(NODES, range(len(NODES))):
                # each node's one rank by its global rank: sb1-200 holds rank 0, sb2-200 rank 1
                if line.startswith(f"{name} | [rank {rank}] Train - Step"):
                    seen.add(name)
            if len(seen) == 2:
                break
    record = last_record()
    assert record.verdict == "running" and seen == {name for _h, _v, name in NODES}, "".join(lines[-40:])
    return record


def test_attach_follows_both_nodes_again_as_one_run(sandbox, nodes):
    record = _started_then_controller_killed(sandbox, nodes, "[--steps, 120, --step-seconds, 0.1]")
    attached = orch(sandbox, "attach", record.run_id, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert attached.returncode == 0, attached.stdout[-6000:] + attached.stderr[-3000:]
    assert "ok: 2 nodes; sb1-200: 1 rank trained to step 120; sb2-200: 1 rank trained to step 120" \
        in attached.stdout
    final = last_record()
    assert final.run_id == record.run_id and final.verdict == "ok"
    steps = {name: max(p.step for p in final.metrics if p.target == name) for _h, _v, name in NODES}
    assert steps == {"sb1-200": 120, "sb2-200": 120}


def test_orch_stop_stops_every_node(sandbox, nodes):
    record = _started_then_controller_killed(sandbox, nodes, "[--steps, 4000, --step-seconds, 0.05]")
    stopped = orch(sandbox, "stop", record.run_id, "--grace", "5", timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "sb1-200" in stopped.stdout and "sb2-200" in stopped.stdout
    for _host, _vmid, name in NODES:
        left = orch(sandbox, "exec", name, "--", "pgrep", "-f", "[d]dp_nodes_loop", timeout=60)
        assert left.returncode == 1, f"{name}: {left.stdout}"
    assert last_record().verdict == "killed"


def test_nightly_reruns_the_two_node_job_into_one_record(sandbox, nodes):
    done = subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), "nightly", "playbooks/ddp-two-nodes.yaml",
                           "-t", NODES[0][2], "-t", NODES[1][2], "-e", f"venv={nodes}", "-e", f"script={SCRIPT}",
                           "-e", "trainer_args=[--steps, 10]"], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:]
    assert "verdict ok" in done.stdout
    record = last_record()
    markdown = (Path(record.artifacts_dir) / "report.md").read_text()
    assert "| 0 | `sb1-200` |" in markdown and "| 1 | `sb2-200` |" in markdown


def test_an_elastic_range_of_nodes_trains_too(sandbox, nodes, tmp_path):
    book = tmp_path / "elastic.yaml"
    book.write_text((REPO / "playbooks" / "ddp-two-nodes.yaml").read_text()
                    .replace("torchrun: {nnodes: 2,", 'torchrun: {nnodes: "1:2",'))
    (Path(container_root(sandbox, "sb1", 200)) / "mn-nodes.json").unlink(missing_ok=True)
    argv = run_argv(sandbox, nodes, "[--steps, 10, --nodes-file, /root/mn-nodes.json]")
    argv[argv.index("playbooks/ddp-two-nodes.yaml")] = str(book)
    done = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-6000:]
    argv_sb2 = last_record().launch["targets"]["sb2-200"]["argv"]
    assert argv_sb2[argv_sb2.index("--nnodes") + 1] == "1:2"
    seen = json.loads((Path(container_root(sandbox, "sb1", 200)) / "mn-nodes.json").read_text())
    assert seen["world_size"] == 2          # both nodes joined the one rendezvous


def test_a_node_whose_worker_hangs_stops_every_node(sandbox, nodes):
    """sb2-200's worker frozen (SIGSTOP): sb1-200's rank waits in the all-reduce, no node logs
    a step. The hang stops every node; the frozen worker, in a session of its own that the
    SIGTERM to torchrun's group does not reach, is SIGKILLed too."""
    _rank, code, output = _signal_sb2s_worker_mid_run(sandbox, nodes, "-STOP", "-e", "hang_after=15")
    record = last_record()
    assert code == 11, output[-6000:]
    assert record.verdict == "hang"
    assert "failed first" in output and "orch stopped the other node" in output
    for _host, _vmid, name in NODES:
        left = orch(sandbox, "exec", name, "--", "pgrep", "-f", "[d]dp_nodes_loop", timeout=60)
        assert left.returncode == 1, f"{name}: {left.stdout}"
