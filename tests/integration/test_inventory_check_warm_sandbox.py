"""`orch inventory check` gives the same rows through the warm agent (the probe in a fork of
the exec server's python3) as on the direct path (in a fork of the reaper's), on containers
that differ: one with a venv whose python is not the container's python3, one whose python3
was removed (a real Debian root), a stopped one.

A sandbox of its own (host sbw1, its own state directory), so the shared one is untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

import orch_sandbox as sb
from orchestrator.targets.fleet import Fleet
from tests.support.agents import agent_pids, stop_agents

ORCH = [sys.executable, "-m", "orchestrator"]
VENV, NO_PYTHON, STOPPED = "sbw1-200", "sbw1-201", "sbw1-202"
# the venv's "python": another interpreter than the container's python3, as a venv made by
# another python is; the probe must ask it, not report the python3 it runs in
VENV_PATH = "/tmp/orch-warm-cold-venv"
VENV_PYTHON = "#!/bin/sh\necho 3.99.1\n"


@pytest.fixture(scope="module")
def bed(sandbox, tmp_path_factory):
    """One host: CT 200 with the odd venv, CT 201 on a real root without python3, CT 202
    stopped; an inventory naming the venv."""
    folder = tmp_path_factory.mktemp("warm-cold")
    handle = sb.up(1, 3, 1, prefix="sbw", state_dir=folder / "state", real_root=(201,))
    fleet = Fleet.from_path(str(handle.inventory_path))
    try:
        venv_ct, bare_ct = fleet.targets([VENV, NO_PYTHON])
        made = venv_ct.run(["sh", "-c", 'mkdir -p "$1/bin" && printf "%s" "$2" > "$1/bin/python" '
                            '&& chmod 755 "$1/bin/python"', "sh", VENV_PATH, VENV_PYTHON])
        assert made.ok, made.error_text
        removed = bare_ct.run(["dpkg", "--remove", "--force-depends", "python3",
                               "python3-minimal"], timeout=120)
        assert removed.ok, removed.error_text
        inventory = yaml.safe_load(handle.inventory_path.read_text())
        inventory["containers"][VENV]["venv"] = VENV_PATH
        path = folder / "inventory.yaml"
        path.write_text(yaml.safe_dump(inventory))
        yield path, folder
    finally:
        fleet.close()
        sb.down(purge=True, state_dir=folder / "state", prefix="sbw")


def check(inventory, env) -> tuple[int, list]:
    done = subprocess.run([*ORCH, "-i", str(inventory), "inventory", "check", "--json"],
                          env=env, capture_output=True, text=True, timeout=180)
    return done.returncode, json.loads(done.stdout)


def test_warm_and_cold_rows_are_the_same(bed):
    inventory, folder = bed
    agent_dir = str(folder / "agent")
    warm_env = {**os.environ, "ORCH_AGENT_DIR": agent_dir, "ORCH_AGENT": "require"}
    try:
        cold = check(inventory, {**warm_env, "ORCH_AGENT": "off"})
        check(inventory, warm_env)    # starts the agent and the containers' sessions
        warm = check(inventory, warm_env)
        sessions = json.loads(subprocess.run(
            [*ORCH, "agent", "status", "--json"], env=warm_env, capture_output=True,
            text=True, timeout=60).stdout)["fleets"][0]["sessions"]
    finally:
        stop_agents(agent_dir)
    assert agent_pids(agent_dir) == []
    assert warm == cold
    rows = {row["target"]: row for row in cold[1]}
    assert cold[0] == 1   # two containers have a problem
    venv = rows[VENV]
    assert venv["ok"] and venv["venv"] == {"path": VENV_PATH, "present": True,
                                           "python_version": "3.99.1"}
    assert venv["python_version"].startswith("3.") and venv["python_version"] != "3.99.1"
    assert rows[NO_PYTHON]["problems"][0].startswith("python3 is not installed (Debian GNU/Linux 12")
    assert not rows[STOPPED]["running"] and rows[STOPPED]["reachable"] and "error" in rows[STOPPED]
    # the warm check went through CT 200's warm session (CT 201 has no python3 to start one)
    assert [s["vmid"] for s in sessions if s["idle"]] == [200]
