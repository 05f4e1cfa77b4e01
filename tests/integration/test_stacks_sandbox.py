"""`orch stacks` in a real sandbox container: a deadlocked process launched detached there,
its threads read with pystack (ptrace, as root in the unprivileged LXC container) over SSH
and `pct exec`, and the wait graph names the holder and the waiters."""

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
from tests.pystackenv import pystack_venv
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
    yield str(path)
    shutil.rmtree(venv, ignore_errors=True)
    os.unlink(os.path.join(root, "hang.py"))


def test_stacks_of_a_deadlock_in_a_container(inventory):
    with Fleet.from_path(inventory) as fleet:
        target = fleet.targets([NAME])[0]
        run_dir = "/root/.orch-stacks-test"
        started = launcher(target, "start", run_dir, argv=[f"/root/{VENV}/bin/python", "/root/hang.py"],
                           env={}, venv=None, cwd="/root")
        try:
            time.sleep(2.0)                  # threads at their locks
            out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", inventory,
                                  "stacks", "--pid", str(started["pid"]), "-t", NAME, "--json"],
                                 capture_output=True, text=True, timeout=300)
        finally:
            stop_run(target, run_dir, grace=2.0)
    assert out.stdout and "Traceback" not in out.stderr, (out.returncode, out.stderr)
    assert out.returncode == 1, out.stderr
    [result] = json.loads(out.stdout)
    [lock] = result["locks"]
    assert lock["key"] == "hang.py:compile_lock"
    assert [h["inside"] for h in lock["holders"]] == ["compile_step (hang.py:7)"]
    assert len(lock["waiters"]) == 2
