"""The direct path's early SSH connection (orchestrator/remote/early.py) against the sandbox's
real sshd: a right guess carries the command, a wrong one (an index that names the other
host) changes nothing the command does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from orchestrator.remote import early
from orchestrator.targets.fleet import Fleet


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    monkeypatch.setenv("ORCH_DATA_DIR", str(folder))
    yield folder
    early._discard_unclaimed()


@pytest.fixture
def marker(sandbox):
    """A file only sb1's CT 200 has: proof of where a command ran (sb2's CT 200 is its twin)."""
    path = f"/tmp/orch-early-{uuid.uuid4().hex}"
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        [ct] = fleet.targets(["sb1-200"])
        assert ct.run(["touch", path]).exit_code == 0
        yield path
        ct.run(["rm", "-f", path])


def direct_exec(sandbox, *argv):
    return subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i",
                           str(sandbox.inventory_path), "exec", *argv],
                          capture_output=True, text=True, timeout=60, env=os.environ)


def test_the_early_connection_carries_the_command(sandbox, data_dir, marker):
    inventory = str(sandbox.inventory_path)
    assert direct_exec(sandbox, "sb1-200", "--", "test", "-e", marker).returncode == 0
    index = json.loads((data_dir / early.INDEX_NAME).read_text())   # written by that command
    entry = index["inventories"][os.path.realpath(inventory)]
    assert entry["targets"]["sb1-200"] == "sb1" and entry["hosts"]["sb1"]["known_hosts"]
    early.start(["-i", inventory, "--no-agent", "exec", "sb1-200", "--", "true"])
    pending = early._pending
    assert pending is not None
    with Fleet.from_path(inventory) as fleet:
        [ct] = fleet.targets(["sb1-200"])
        assert ct.run(["test", "-e", marker]).exit_code == 0
        assert fleet.host("sb1").connect() is pending.client().get_transport()
    assert direct_exec(sandbox, "sb1-200", "--", "test", "-e", marker).returncode == 0


def test_a_wrong_guess_changes_nothing(sandbox, data_dir, marker):
    inventory = str(sandbox.inventory_path)
    assert direct_exec(sandbox, "sb1-200", "--", "true").returncode == 0
    index_file = data_dir / early.INDEX_NAME
    index = json.loads(index_file.read_text())
    entry = index["inventories"][os.path.realpath(inventory)]
    entry["targets"]["sb1-200"] = "sb2"   # a stale or wrong index: the other host
    index_file.write_text(json.dumps(index))
    assert early.guess(["-i", inventory, "exec", "sb1-200", "true"])["name"] == "sb2"
    out = direct_exec(sandbox, "sb1-200", "--", "test", "-e", marker)
    assert out.returncode == 0, out.stderr   # ran on sb1, where the marker is
    assert direct_exec(sandbox, "sb2-200", "--", "test", "-e", marker).returncode == 1
