"""`orch stacks` in a real sandbox container: a deadlocked process launched detached there,
its threads read with pystack (ptrace, as root in the unprivileged LXC container) over SSH
and `pct exec`, and the wait graph names the holder and the waiters. A container without
pystack gets the real pystack wheel carried in from a wheelhouse here (and unpacked into
orch's own folder there, not into any venv); a wheel for another machine is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import textwrap

import pytest
import yaml

from orchestrator.remote.payload_api import launcher, stop_run
from orchestrator.targets.fleet import Fleet
from tests.integration.torch_seed import container_root, remove_venv, seed_torch_venv
from tests.support.pystackenv import foreign_wheelhouse, pystack_venv, pystack_wheelhouse
from tests.support.stack_texts import DEADLOCK

HOST, VMID = "sb2", 201
NAME = f"{HOST}-{VMID}"
VENV = "stacks-venv"
TORCH_VENV = "stacks-torch-venv"
RUN_DIR = "/root/.orch-stacks-test"

# Real torch 2.13: drafter-0 holds the trainer's lock inside torch.compile, whose backend
# never returns; drafter-1 reaches the lock while torch.fx symbolically traces a function
# that takes it; drafter-2 waits on it plainly.
COMPILE_HANG = textwrap.dedent('''
    import threading
    import torch
    import torch.fx

    compile_lock = threading.Lock()
    in_backend = threading.Event()
    never = threading.Event()

    def stuck_backend(gm, example_inputs):
        in_backend.set()
        never.wait()                   # a backend compile that never ends
        return gm.forward

    def first():
        step = torch.compile(lambda x: x * 2 + 1, backend=stuck_backend)
        with compile_lock:
            step(torch.ones(3))

    def traced(x):
        with compile_lock:             # reached while FX traces this function
            return x + 1

    def second():
        in_backend.wait(300)
        torch.fx.symbolic_trace(traced)

    def third():
        in_backend.wait(300)
        with compile_lock:
            pass

    threads = [threading.Thread(target=f, name=f"drafter-{n}", daemon=True)
               for n, f in enumerate((first, second, third))]
    for t in threads: t.start()
    in_backend.wait(300)
    print("ready", flush=True)
    for t in threads: t.join()
''')

# Real torch 2.13: drafter-0 takes the trainer's lock with acquire() and dies inside
# torch.compile (its backend raises); the other two wait on the lock forever: the H200's
# one-drafter-errored-others-silent run.
DIED_IN_COMPILE = textwrap.dedent('''
    import threading
    import torch

    compile_lock = threading.Lock()
    taken = threading.Event()

    def failing_backend(gm, example_inputs):
        raise RuntimeError("inductor failed in the compile")

    def first():
        step = torch.compile(lambda x: x * 2 + 1, backend=failing_backend)
        compile_lock.acquire()
        taken.set()
        step(torch.ones(3))

    def others():
        taken.wait(300)
        with compile_lock:
            pass

    threads = [threading.Thread(target=first, name="drafter-0", daemon=True)]
    threads += [threading.Thread(target=others, name=f"drafter-{n}", daemon=True) for n in (1, 2)]
    for t in threads: t.start()
    threads[0].join()
    print("ready", flush=True)
    for t in threads: t.join()
''')

# torchrun with 2 ranks (gloo, CPU): rank 0 is in a "compile" that never ends, so rank 1
# waits for it in the barrier
RANKS_HANG = textwrap.dedent('''
    import time
    import torch.distributed as dist

    def compile_step():
        time.sleep(600)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} ready", flush=True)
    if rank == 0:
        compile_step()
    dist.barrier()
''')


@pytest.fixture(scope="module")
def inventory(sandbox, tmp_path_factory):
    root = container_root(sandbox, HOST, VMID)
    venv = os.path.join(root, VENV)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(["cp", "-al", pystack_venv(), venv], check=True)
    for name, text in (("hang.py", DEADLOCK), ("compile_hang.py", COMPILE_HANG), ("ranks_hang.py", RANKS_HANG),
                       ("died_in_compile.py", DIED_IN_COMPILE)):
        with open(os.path.join(root, name), "w") as handle:
            handle.write(text)
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    data["containers"][NAME]["venv"] = f"/root/{VENV}"
    path = tmp_path_factory.mktemp("stacks") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    # the same container with no venv: its own /usr/bin/python3, which has no pystack
    data["containers"][NAME].pop("venv")
    (path.parent / "bare.yaml").write_text(yaml.safe_dump(data))
    yield str(path)
    shutil.rmtree(venv, ignore_errors=True)
    for name in ("hang.py", "compile_hang.py", "ranks_hang.py", "died_in_compile.py"):
        os.unlink(os.path.join(root, name))


@pytest.fixture(scope="module")
def torch_inventory(sandbox, inventory):
    """The container with a real torch venv, which has no pystack (orch carries it in)."""
    seed_torch_venv(sandbox, HOST, VMID, TORCH_VENV)
    data = yaml.safe_load(open(inventory).read())
    data["containers"][NAME]["venv"] = f"/root/{TORCH_VENV}"
    path = os.path.join(os.path.dirname(inventory), "torch.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(data, handle)
    yield path
    remove_venv(sandbox, HOST, VMID, TORCH_VENV)


def stacks_of_the_deadlock(inventory: str, python: str, *options: str, sandbox, script: str = "hang.py",
                           argv: tuple = (), ready: tuple = ("ready",), then: tuple = ()):
    """`orch stacks --pid` of SCRIPT run detached in the container by PYTHON (or of ARGV),
    once its log says each of READY (torch takes seconds to import); with THEN, once more
    with each of its option tuples added, and a list of the outputs."""
    log = os.path.join(container_root(sandbox, HOST, VMID), os.path.basename(RUN_DIR), "output.log")
    if os.path.exists(log):
        os.unlink(log)                       # the launcher appends: an earlier run's "ready"
    with Fleet.from_path(inventory) as fleet:
        target = fleet.targets([NAME])[0]
        started = launcher(target, "start", RUN_DIR, argv=list(argv) or [python, f"/root/{script}"],
                           env={}, venv=None, cwd="/root")
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not all(r in _text(log) for r in ready):
                time.sleep(0.5)
            time.sleep(2.0)                  # threads at their locks
            outs = [subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", inventory,
                                    "stacks", "--pid", str(started["pid"]), "-t", NAME, "--json", *options,
                                    *more], capture_output=True, text=True, timeout=300)
                    for more in [()] + list(then)]
            return (outs if then else outs[0]), started["pid"]
        finally:
            stop_run(target, RUN_DIR, grace=2.0)


def _text(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def assert_the_deadlock_is_read(out) -> dict:
    assert out.stdout and "Traceback" not in out.stderr, (out.returncode, out.stderr)
    assert out.returncode == 1, out.stderr
    [result] = json.loads(out.stdout)
    [lock] = result["locks"]
    assert lock["key"] == "hang.py:compile_lock"
    assert [h["inside"] for h in lock["holders"]] == ["compile_step (hang.py:7)"]
    assert len(lock["waiters"]) == 2
    return result


def test_stacks_of_a_deadlock_in_a_container(inventory, sandbox):
    out, _ = stacks_of_the_deadlock(inventory, f"/root/{VENV}/bin/python", sandbox=sandbox)
    assert_the_deadlock_is_read(out)


def test_a_container_without_pystack_gets_it_carried_in(inventory, sandbox):
    tools = os.path.join(os.path.dirname(container_root(sandbox, HOST, VMID)), "var", "lib", "orch", "tools")
    shutil.rmtree(tools, ignore_errors=True)         # a first time: nothing of orch's there yet
    bare = os.path.join(os.path.dirname(inventory), "bare.yaml")
    out, _ = stacks_of_the_deadlock(bare, "/usr/bin/python3", "--wheelhouse", pystack_wheelhouse(),
                                    sandbox=sandbox)
    result = assert_the_deadlock_is_read(out)
    assert "has no pystack: carrying pystack-1.7.2-cp311" in out.stderr
    [folder] = os.listdir(tools)
    assert folder.startswith("pystack-1.7.2-cp311-cp311-") and folder in result["tool"]
    assert os.path.isfile(os.path.join(tools, folder, "pystack", "__main__.py"))
    again, _ = stacks_of_the_deadlock(bare, "/usr/bin/python3", "--wheelhouse", pystack_wheelhouse(),
                                    sandbox=sandbox)
    assert_the_deadlock_is_read(again)
    assert "carrying" not in again.stderr           # already there (its sha256): nothing sent


def test_a_wheel_for_another_machine_is_refused_before_anything_is_pushed(inventory, sandbox):
    root = os.path.dirname(container_root(sandbox, HOST, VMID))
    bare = os.path.join(os.path.dirname(inventory), "bare.yaml")
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", bare, "stacks",
                          "--pid", "1", "-t", NAME, "--wheelhouse", foreign_wheelhouse()],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr     # 2: usage
    assert "no pystack wheel in" in out.stderr and "fits" in out.stderr
    assert "aarch64" in out.stderr and "x86_64" in out.stderr and "pip download" in out.stderr
    wheelhouse = os.path.join(root, "var", "lib", "orch", "wheelhouse")
    pushed = os.listdir(wheelhouse) if os.path.isdir(wheelhouse) else []
    assert not any("aarch64" in name for name in pushed), pushed


@pytest.mark.torch
def test_a_thread_stuck_inside_a_real_torch_compile_is_labelled(torch_inventory, sandbox):
    out, _ = stacks_of_the_deadlock(torch_inventory, f"/root/{TORCH_VENV}/bin/python",
                                 "--wheelhouse", pystack_wheelhouse(), script="compile_hang.py",
                                 sandbox=sandbox)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    [result] = json.loads(out.stdout)
    [lock] = [lock for lock in result["locks"] if lock["key"] == "compile_hang.py:compile_lock"]
    first, traced, third = [f"compile_hang.py:{n}" for n, line in enumerate(COMPILE_HANG.splitlines(), 1)
                            if "with compile_lock:" in line]
    [holder] = lock["holders"]
    assert holder["where"] == first and holder["compile"] == ["torch._dynamo"]
    waiting = {w["where"]: w["compile"] for w in lock["waiters"]}
    assert waiting[third] == []                                          # drafter-2: plain
    assert "torch.fx" in waiting[traced]                                 # drafter-1: FX tracing
    assert "inside a compile (torch._dynamo)" in lock["sentence"]
    in_compile = [t for t in result["threads"] if t["compile"]]
    assert len(in_compile) == 2 and any("stuck_backend" == f["function"] for t in in_compile
                                        for f in t["frames"])


@pytest.mark.torch
def test_under_a_real_torchrun_each_ranks_worker_is_read(torch_inventory, sandbox):
    python = f"/root/{TORCH_VENV}/bin/python"
    argv = (python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "/root/ranks_hang.py")
    ready = ("rank 0 ready", "rank 1 ready")
    (out, one, missing), torchrun = stacks_of_the_deadlock(
        torch_inventory, python, "--wheelhouse", pystack_wheelhouse(), argv=argv, ready=ready,
        sandbox=sandbox, then=(("--rank", "1"), ("--rank", "5")))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    results = json.loads(out.stdout)
    assert [(r["rank"], r["world_size"], r["launcher_pid"]) for r in results] == \
        [(0, 2, torchrun), (1, 2, torchrun)], out.stderr
    assert all(r["pid"] != torchrun for r in results)
    functions = [{f["function"] for t in r["threads"] for f in t["frames"]} for r in results]
    assert "compile_step" in functions[0] and "barrier" in functions[1], functions
    assert [r["rank"] for r in json.loads(one.stdout)] == [1], one.stderr
    assert missing.returncode == 2 and "has no rank 5 below it (its ranks: 0, 1)" in missing.stderr


@pytest.mark.torch
def test_a_run_whose_drafter_died_inside_a_real_compile_holding_the_lock(torch_inventory, sandbox,
                                                                        tmp_path, monkeypatch):
    """`orch stacks RUN`: the live stacks show two waiters and no holder; the run's log has
    drafter-0's traceback from inside torch.compile, whose frame took the lock and never
    let it go: "drafter-0 (dead) died inside a compile (torch._dynamo) holding ..."."""
    from orchestrator.runs.model import RunRecord, StepResult
    from orchestrator.runs.store import RunStore

    python = f"/root/{TORCH_VENV}/bin/python"
    log = os.path.join(container_root(sandbox, HOST, VMID), os.path.basename(RUN_DIR), "output.log")
    if os.path.exists(log):
        os.unlink(log)
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path / "data"))
    with Fleet.from_path(torch_inventory) as fleet:
        target = fleet.targets([NAME])[0]
        argv = [python, "/root/died_in_compile.py"]
        started = launcher(target, "start", RUN_DIR, argv=argv, env={}, venv=None, cwd="/root")
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and "ready" not in _text(log):
                time.sleep(0.5)
            time.sleep(1.0)
            record = RunRecord(run_id="20261202-0400-abcdef", playbook="p.yaml", playbook_sha256="", name="p")
            record.steps.append(StepResult("launch", "launch", NAME, "changed",
                                           data={"run_dir": RUN_DIR, "pid": started["pid"], "argv": argv}))
            with RunStore() as store:
                store.begin(record)
                store.save_step(record.run_id, record.steps[0])
            out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", torch_inventory,
                                  "stacks", "last", "--json", "--wheelhouse", pystack_wheelhouse()],
                                 capture_output=True, text=True, timeout=300)
        finally:
            stop_run(target, RUN_DIR, grace=2.0)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    [result] = json.loads(out.stdout)
    [lock] = [lock for lock in result["locks"] if lock["key"] == "died_in_compile.py:compile_lock"]
    [holder] = lock["holders"]
    assert holder["thread"] == "drafter-0 (dead)" and "torch._dynamo" in holder["compile"]
    # torch 2.13 prints the backend's error on the message's second line, which is not read
    # the backend's own error is on the line after torch's "raised:", part of the message
    assert holder["died"] == ("torch._dynamo.exc.BackendCompilerFailed: backend='failing_backend' "
                              "raised: RuntimeError: inductor failed in the compile")
    assert lock["sentence"].startswith("drafter-0 (dead) died inside a compile (torch._dynamo")
    assert " holding died_in_compile.py:compile_lock (" in lock["sentence"]
    [waiting] = [n for n, line in enumerate(DIED_IN_COMPILE.splitlines(), 1) if "with compile_lock:" in line]
    assert len(lock["waiters"]) == 2 and lock["sentence"].endswith(
        f"wait on died_in_compile.py:compile_lock (died_in_compile.py:{waiting})")
