"""`orch explain` into a real container over SSH and `pct exec`: the node-meta race run in
the container (its own torch 2.13 venv), its log explained with the container's python;
and the same container explaining a log written on another machine (frames matched by
their path after site-packages/)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from orchestrator.targets.fleet import Fleet
from tests.integration.torch_seed import remove_venv, seed_torch_venv
from tests.torch.test_explain_fx_race import NODE_META_RUN

HOST, VMID = "sb2", 201
VENV = "explain-venv"        # its own name: other tests seed /root/venv and torch-venv
pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def inventory(sandbox, tmp_path_factory):
    seed_torch_venv(sandbox, HOST, VMID, VENV)
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    data["containers"][f"{HOST}-{VMID}"]["venv"] = f"/root/{VENV}"
    path = tmp_path_factory.mktemp("explain") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    yield str(path)
    remove_venv(sandbox, HOST, VMID, VENV)


@pytest.fixture(scope="module")
def container_log(inventory, tmp_path_factory) -> str:
    """The race, run in the container; its output as the launcher would keep it."""
    with Fleet.from_path(inventory) as fleet:
        target = fleet.targets([f"{HOST}-{VMID}"])[0]
        done = target.run([f"/root/{VENV}/bin/python", "-c", NODE_META_RUN], timeout=300)
    text = done.stdout.decode() + done.stderr.decode()
    assert "KeyError: 'custom'" in text and f"/root/{VENV}/lib/" in text, text[-2000:]
    path = tmp_path_factory.mktemp("log") / "output.log"
    path.write_text(text)
    return str(path)


def explain(inventory, log):
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", inventory,
                          "explain", "--log", log, "-t", f"{HOST}-{VMID}", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    [result] = json.loads(out.stdout)
    return result


def test_a_containers_own_crash_explained_in_the_container(inventory, container_log):
    result = explain(inventory, container_log)
    assert result["python"] == f"/root/{VENV}/bin/python"
    frame = result["failures"][0]["frames"][-1]
    assert frame["file"].startswith(f"/root/{VENV}/lib/") and frame["record"] == "ok"
    assert result["candidates"][0]["name"] == "current_meta"
    assert result["remedies"][0]["commands"][0] == f"orch patch fx-threads apply -t {HOST}-{VMID}"


def test_a_log_from_another_machine_matches_by_site_packages(inventory, container_log, tmp_path):
    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_text(open(container_log).read().replace(f"/root/{VENV}/", "/home/me/venv/"))
    result = explain(inventory, str(elsewhere))
    frame = result["failures"][0]["frames"][-1]
    assert frame["file"].startswith("/home/me/venv/") and frame["available"]
    assert frame["relpath"] == "torch/fx/traceback.py" and frame["version"] == "2.13.0+cpu"
    assert result["candidates"][0]["name"] == "current_meta"
