"""Ctrl-C on `orch run` against a sandbox container (real sshd, real LXC): what orch says
about the launch matches what the container has (tests/unit/remote/test_run_interrupt.py does the
same on this machine)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid

import pytest

from orchestrator.targets.fleet import Fleet
from orchestrator.remote.payload_api import launcher, stop_run
from orchestrator.runs.store import RunStore
from tests.support.interrupts import GOES_ON, NOTHING, interrupt_when

pytestmark = pytest.mark.sandbox

TARGET = "sb1-200"


@pytest.fixture
def book(sandbox, tmp_path, monkeypatch):
    run_dir = f"/var/tmp/orch-interrupt-{uuid.uuid4().hex[:8]}"
    (tmp_path / "inventory.yaml").write_text(sandbox.inventory_path.read_text())
    (tmp_path / "book.yaml").write_text(
        f"name: interrupt\ntargets: [{TARGET}]\nvars: {{before: 0}}\nsteps:\n"
        "  - shell: [sleep, '{{ before }}']\n"
        f"  - launch: {{command: [sleep, '30'], venv: false, run_dir: {run_dir}}}\n"
        "  - monitor: {hang_after: 600, gpu_every: 0}\n")
    fleet = Fleet.from_path(str(sandbox.inventory_path))
    target = fleet.targets([TARGET])[0]
    yield tmp_path, target, run_dir
    if launcher(target, "status", run_dir)["state"] != "missing":
        stop_run(target, run_dir, grace=2)
    target.run(["rm", "-rf", run_dir])
    fleet.close()


def test_ctrl_c_before_and_during_the_launch_in_a_container(book):
    folder, target, run_dir = book
    code, output = interrupt_when(folder, f"> {TARGET} 1/3", "-e", "before=3")
    assert code == 130 and NOTHING in output and GOES_ON not in output, output
    with RunStore() as store:
        assert store.get("last").verdict == "interrupted"
    assert launcher(target, "status", run_dir)["state"] == "missing"

    code, output = interrupt_when(folder, f"> {TARGET} 2/3")
    assert code == 130, output
    state = launcher(target, "status", run_dir)["state"]
    with RunStore() as store:
        record = store.get("last")
    if GOES_ON in output:
        assert state in ("running", "starting") and record.verdict == "running"
        assert record.launch["targets"][TARGET]["run_dir"] == run_dir
    else:
        assert NOTHING in output and state == "missing" and record.verdict == "interrupted"


def orch(folder, *args):
    return subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(folder / "inventory.yaml"),
                           *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def test_a_controller_killed_before_and_after_the_launch_is_shown_and_settled(book):
    """kill -9 of `orch run`: the record once said "running" for ever (before the launch:
    attach and stop refused it; after: no hint until someone attached). Each run is named
    by the id its `orch run` printed: "last" picks by the recorded start time, and once
    named the first, already settled run here (a full suite under load)."""
    folder, target, run_dir = book
    code, output = interrupt_when(folder, f"> {TARGET} 1/3", "-e", "before=30", number=signal.SIGKILL)
    assert code == -signal.SIGKILL
    first = run_id_in(output)
    listed = orch(folder, "runs", "list")
    assert "running (controller gone)" in listed.stdout and "orch runs abandon" in listed.stderr
    stopped = orch(folder, "stop", first)
    assert stopped.returncode == 0 and "recorded as abandoned" in stopped.stderr, stopped.stderr
    assert launcher(target, "status", run_dir)["state"] == "missing"

    code, output = interrupt_when(folder, f"> {TARGET} 3/3", number=signal.SIGKILL)
    assert code == -signal.SIGKILL
    second = run_id_in(output)
    assert launcher(target, "status", run_dir)["state"] in ("running", "starting")
    listed = orch(folder, "runs", "list")
    assert "running (controller gone)" in listed.stdout and "orch attach" in listed.stderr
    assert "is gone" in orch(folder, "runs", "show", second).stdout
    assert orch(folder, "stop", second, "--grace", "1").returncode == 0
    with RunStore() as store:
        assert store.get(second).verdict == "killed"
        assert store.get(first).verdict == "abandoned"
    assert "controller gone" not in orch(folder, "runs", "list").stdout


def run_id_in(output: str) -> str:
    """The run id `orch run` prints as it starts ("  run ID  targets: ...")."""
    found = re.search(r"^\s*run (\S+)  targets:", output, re.MULTILINE)
    assert found, output
    return found.group(1)
