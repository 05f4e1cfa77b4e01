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

import pytest
import yaml

from orchestrator.remote.payload_api import launcher, stop_run
from orchestrator.targets.fleet import Fleet
from tests.integration.torch_seed import container_root
from tests.pystackenv import foreign_wheelhouse, pystack_venv, pystack_wheelhouse
from tests.unit.test_stacks import DEADLOCK

HOST, VMID = "sb2", 201
NAME = f"{HOST}-{VMID}"
VENV = "stacks-venv"


@pytest.fixture(scope="module")
def inventory(sandbox, tmp_path_factory):
    root = container_root(sandbox, HOST, VMID)
    venv = os.path.join(root, VENV)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(["cp", "-al", pystack_venv(), venv], check=True)
    with open(os.path.join(root, "hang.py"), "w") as handle:
        handle.write(DEADLOCK)
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    data["containers"][NAME]["venv"] = f"/root/{VENV}"
    path = tmp_path_factory.mktemp("stacks") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    # the same container with no venv: its own /usr/bin/python3, which has no pystack
    data["containers"][NAME].pop("venv")
    (path.parent / "bare.yaml").write_text(yaml.safe_dump(data))
    yield str(path)
    shutil.rmtree(venv, ignore_errors=True)
    os.unlink(os.path.join(root, "hang.py"))


def stacks_of_the_deadlock(inventory: str, python: str, *options: str):
    """`orch stacks --pid` of hang.py run detached in the container by PYTHON."""
    with Fleet.from_path(inventory) as fleet:
        target = fleet.targets([NAME])[0]
        run_dir = "/root/.orch-stacks-test"
        started = launcher(target, "start", run_dir, argv=[python, "/root/hang.py"],
                           env={}, venv=None, cwd="/root")
        try:
            time.sleep(2.0)                  # threads at their locks
            return subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", inventory,
                                   "stacks", "--pid", str(started["pid"]), "-t", NAME, "--json", *options],
                                  capture_output=True, text=True, timeout=300)
        finally:
            stop_run(target, run_dir, grace=2.0)


def assert_the_deadlock_is_read(out) -> dict:
    assert out.stdout and "Traceback" not in out.stderr, (out.returncode, out.stderr)
    assert out.returncode == 1, out.stderr
    [result] = json.loads(out.stdout)
    [lock] = result["locks"]
    assert lock["key"] == "hang.py:compile_lock"
    assert [h["inside"] for h in lock["holders"]] == ["compile_step (hang.py:7)"]
    assert len(lock["waiters"]) == 2
    return result


def test_stacks_of_a_deadlock_in_a_container(inventory):
    out = stacks_of_the_deadlock(inventory, f"/root/{VENV}/bin/python")
    assert_the_deadlock_is_read(out)


def test_a_container_without_pystack_gets_it_carried_in(inventory, sandbox):
    tools = os.path.join(os.path.dirname(container_root(sandbox, HOST, VMID)), "var", "lib", "orch", "tools")
    shutil.rmtree(tools, ignore_errors=True)         # a first time: nothing of orch's there yet
    bare = os.path.join(os.path.dirname(inventory), "bare.yaml")
    out = stacks_of_the_deadlock(bare, "/usr/bin/python3", "--wheelhouse", pystack_wheelhouse())
    result = assert_the_deadlock_is_read(out)
    assert "has no pystack: carrying pystack-1.7.2-cp311" in out.stderr
    [folder] = os.listdir(tools)
    assert folder.startswith("pystack-1.7.2-cp311-cp311-") and folder in result["tool"]
    assert os.path.isfile(os.path.join(tools, folder, "pystack", "__main__.py"))
    again = stacks_of_the_deadlock(bare, "/usr/bin/python3", "--wheelhouse", pystack_wheelhouse())
    assert_the_deadlock_is_read(again)
    assert "pushing wheel" not in again.stderr      # already there: checked by sha256, not sent


def test_a_wheel_for_another_machine_is_refused_before_anything_is_pushed(inventory, sandbox):
    root = os.path.dirname(container_root(sandbox, HOST, VMID))
    bare = os.path.join(os.path.dirname(inventory), "bare.yaml")
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", bare, "stacks",
                          "--pid", "1", "-t", NAME, "--wheelhouse", foreign_wheelhouse()],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "no pystack wheel in" in out.stderr and "fits" in out.stderr
    assert "aarch64" in out.stderr and "x86_64" in out.stderr and "pip download" in out.stderr
    wheelhouse = os.path.join(root, "var", "lib", "orch", "wheelhouse")
    pushed = os.listdir(wheelhouse) if os.path.isdir(wheelhouse) else []
    assert not any("aarch64" in name for name in pushed), pushed
