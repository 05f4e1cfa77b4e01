"""Containers on a real Debian 12 root (their own /usr and /etc, systemd as PID 1, eth0 on
the bridge but no route out), and orch bootstrapping one that has python3 and nothing else.

A sandbox of its own (host sbr1, its own state directory), so the shared one keeps its
fast bind-mounted containers: CT 200 goes from bare to the DFlash demo's verdict ok, CT 201
loses its python3 package. The root is built once by mmdebstrap from the machine's apt
sources and cached under ~/.cache/orch/sandbox-roots (about 30 s the first time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import orch_sandbox as sb
from orchestrator.targets.fleet import Fleet
from orchestrator.runs.store import RunStore

pytestmark = pytest.mark.sandbox

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORCH = [sys.executable, "-c", "from orchestrator.cli.app import main; main()"]
BARE, NO_PYTHON = "sbr1-200", "sbr1-201"
APT_FIX = ["orch exec sbr1-201 -- apt-get update",
           "orch exec sbr1-201 -- env DEBIAN_FRONTEND=noninteractive apt-get install -y "
           "--no-install-recommends python3"]


@pytest.fixture(scope="module")
def real_root(sandbox, tmp_path_factory):
    """One host, two containers, both on their own Debian 12 root."""
    state = tmp_path_factory.mktemp("real-root") / "state"
    handle = sb.up(1, 2, 0, prefix="sbr", state_dir=state, real_root=(200, 201))
    fleet = Fleet.from_path(str(handle.inventory_path))
    yield handle, fleet
    fleet.close()
    sb.down(purge=True, state_dir=state, prefix="sbr")


def orch(handle, *args, timeout=900):
    done = subprocess.run([*ORCH, "-i", str(handle.inventory_path), *args], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout


def in_container(fleet, name, *argv, timeout=60):
    return fleet.targets([name])[0].run(list(argv), timeout=timeout)


def systemd_state(fleet, name, timeout=120.0):
    """`systemctl is-system-running --wait`, once systemd's bus exists: on a loaded machine
    PID 1 may still be starting, and before its socket is there systemctl fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        state = in_container(fleet, name, "systemctl", "is-system-running", "--wait",
                             timeout=timeout)
        if "Failed to connect to bus" not in state.error_text or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def test_a_real_root_is_debian_12_with_systemd_as_pid_1_and_no_route_out(real_root):
    handle, fleet = real_root
    assert in_container(fleet, BARE, "cat", "/etc/os-release").text.count('VERSION_ID="12"') == 1
    assert in_container(fleet, BARE, "cat", "/proc/1/comm").text == "systemd\n"
    state = systemd_state(fleet, BARE)
    assert state.text.strip() == "running", state.text + state.error_text
    # eth0 on the bridge, as every sandbox container; systemd keeps the address LXC set
    assert in_container(fleet, BARE, "ls", "/sys/class/net").text.split() == ["eth0", "lo"]
    assert "10.88.1.200" in in_container(fleet, BARE, "cat", "/proc/net/fib_trie").text
    # its own /usr: what the machine has (rg, ensurepip) is not there
    probe = ("import importlib.util, shutil, socket\n"
             "print(shutil.which('rg'), importlib.util.find_spec('ensurepip'))\n"
             "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=3)\n"
             "except OSError as error:\n    print(error.errno)\n")
    lines = in_container(fleet, BARE, "python3", "-c", probe).text.split("\n")
    assert lines[0] == "None None" and lines[1] == "101"      # ENETUNREACH: no route out
    venv = in_container(fleet, BARE, "python3", "-m", "venv", "/tmp/v")
    assert venv.exit_code != 0 and "ensurepip is not" in venv.text + venv.error_text
    roots = [ct["root"] for ct in sb.status(handle.state_dir)["hosts"][0]["containers"]]
    assert roots == ["debian-12", "debian-12"]


def test_python3_missing_is_reported_with_the_distribution_fix(real_root, tmp_path):
    handle, fleet = real_root
    removed = in_container(fleet, NO_PYTHON, "dpkg", "--remove", "--force-depends",
                           "python3", "python3-minimal")
    assert removed.ok, removed.error_text
    assert in_container(fleet, NO_PYTHON, "python3", "-V").exit_code == 127

    code, output = orch(handle, "inventory", "check", "-t", NO_PYTHON, "--json")
    assert code == 1, output
    row = json.loads(output)[0]
    assert row["fix"] == APT_FIX and row["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert row["problems"] == ["python3 is not installed (Debian GNU/Linux 12 (bookworm)): "
                               + "; ".join(APT_FIX)]

    book = tmp_path / "bootstrap.yaml"
    book.write_text("name: bare-bootstrap\nsteps:\n  - bootstrap:\n      venv: /root/venv\n"
                    "      packages: [mpmath==1.3.0]\n")
    code, output = orch(handle, "run", str(book), "-t", NO_PYTHON)
    assert code == 10, output
    assert "python3 is not installed in sbr1-201" in output and APT_FIX[1] in output
    # asked to install it, apt runs, but the container cannot reach its sources
    book.write_text(book.read_text() + "      install_python: true\n")
    code, output = orch(handle, "run", str(book), "-t", NO_PYTHON)
    assert code == 10, output
    # a failed step shows its last 25 lines (apt-get update's are before them) and keeps the
    # whole output in the run's folder
    assert "apt-get install -y --no-install-recommends python3" in output
    assert "must reach its package sources" in output and "-bootstrap-sbr1-201.log" in output


def test_a_bare_offline_debian_root_goes_to_the_dflash_demo_verdict_ok(real_root):
    """bootstrap, grep, patch, verify, launch, monitor: one `orch run`, torch 2.13 CPU."""
    handle, fleet = real_root
    code, output = orch(handle, "run", "playbooks/dflash-bare.yaml", "-t", BARE)
    assert code == 0, output[-6000:]
    assert ("created the venv /root/venv with /usr/bin/python3 --without-pip "
            "(this python has no ensurepip)") in output
    assert "installed pip " in output and "into the venv from the pushed wheel " in output
    assert ("installed torch==2.13.0 from the pushed wheelhouse /var/lib/orch/wheelhouse "
            "(--no-index)") in output
    assert "(searched with the stdlib engine: no ripgrep in the container)" in output
    assert "watch the first launch: failed fx-race" in output
    assert "verdict: ok (exit 0)" in output
    with RunStore() as store:
        record = store.get("last")
    assert record.verdict == "ok" and record.summary["drafters_ok"] == 3
    assert record.targets[0].fx_tls_state == "patched"
    assert any(line.startswith("torch==2.13.0") for line in record.targets[0].pip_freeze)

    code, output = orch(handle, "grep-torch", "--def", "is_fx_symbolic_tracing", "-t", BARE,
                        "--json")
    assert code == 0, output
    found = json.loads(output)[0]
    assert (found["engine"], found["engine_reason"]) == ("python", "no ripgrep in the container")
    code, output = orch(handle, "grep-torch", "-F", "_is_fx_tracing_flag", "-t", BARE)
    assert "(engine: python, no ripgrep in the container)" in output
    code, output = orch(handle, "inventory", "check", "-t", BARE, "--json")
    row = json.loads(output)[0]
    assert code == 0 and row["python_version"].startswith("3.11.") and row["ripgrep"] is False


def test_up_remakes_a_container_whose_kind_of_root_changed(real_root):
    """Last in this module: CT 201 (python3 removed above) goes back to the machine's root."""
    handle, fleet = real_root
    again = sb.up(1, 2, 0, prefix="sbr", state_dir=handle.state_dir, real_root=(200,))
    assert sb.status(handle.state_dir)["healthy"]
    has_rg = "import shutil; print(shutil.which('rg') is not None)"
    assert in_container(fleet, NO_PYTHON, "python3", "-c", has_rg).text == "True\n"
    assert in_container(fleet, BARE, "python3", "-c", has_rg).text == "False\n"
    assert ("sbr1-200: {host: sbr1, vmid: 200, venv: /root/venv, address: 10.88.1.200}"
            "   # own debian-12 root") in \
        again.inventory_path.read_text()
