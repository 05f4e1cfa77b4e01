"""Fan-out over more containers of one host than a stock sshd allows channels on one
connection (MaxSessions 10): a sandbox of its own, one host with 12 running containers,
each with a real torch 2.13 venv. exec, grep-torch and patch fx-tls must succeed on all 12.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.torch_seed import seed_torch_venv

COUNT = 12
pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def wide(sandbox, tmp_path_factory):
    """`sandbox` first: it checks the machine can run one (else skip or, in CI, fail)."""
    import orch_sandbox as sb

    state = tmp_path_factory.mktemp("wide-sandbox")
    handle = sb.up(hosts_count=1, containers_count=COUNT, stopped=0, prefix="wide", state_dir=state)
    try:
        for vmid in range(200, 200 + COUNT):
            seed_torch_venv(handle, "wide1", vmid, "venv")
        yield handle
    finally:
        sb.down(state_dir=state)


def orch(handle, *args, timeout=600):
    out = subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(handle.inventory_path),
                          *args], capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def test_exec_on_every_container_of_one_host(wide):
    out = orch(wide, "exec", "wide1", "--", "hostname")
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == sorted(
        f"[wide1-{vmid}] CT{vmid}" for vmid in range(200, 200 + COUNT))


def test_grep_torch_and_patch_on_every_container_of_one_host(wide):
    out = orch(wide, "grep-torch", "--def", "is_fx_symbolic_tracing", "-t", "wide1", "--json")
    reports = json.loads(out.stdout)
    assert out.returncode == 0, out.stderr
    assert len(reports) == COUNT and all(r.get("hits", 0) > 0 for r in reports), reports
    out = orch(wide, "patch", "fx-tls", "status", "-t", "wide1", "--json")
    assert [r.get("status") for r in json.loads(out.stdout)] == ["vulnerable"] * COUNT, out.stdout
    out = orch(wide, "patch", "fx-tls", "apply", "-t", "wide1", "--json")
    assert out.returncode == 0, out.stderr
    assert [r.get("status") for r in json.loads(out.stdout)] == ["patched"] * COUNT
    out = orch(wide, "patch", "fx-tls", "revert", "-t", "wide1", "--json")
    assert out.returncode == 0, out.stderr
    out = orch(wide, "patch", "fx-tls", "status", "-t", "wide1", "--json")
    assert [r.get("status") for r in json.loads(out.stdout)] == ["vulnerable"] * COUNT
