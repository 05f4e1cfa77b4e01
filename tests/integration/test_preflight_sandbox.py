"""A multi-node run's pre-flight across two sandbox hosts: the rendezvous node is CT 200 of
sb1, the other nodes are on sb2, reached over the hosts' shared bridge.

The nodes get real torch 2.13 (the shared test venv, hard-linked: torch_seed.py); one node
gets a venv whose torch is the stand-in package with another version, for the mismatch.
"""

from __future__ import annotations

import glob
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.targets import preflight as pf
from orchestrator.targets.addresses import container_address
from orchestrator.targets.fleet import Fleet
from tests.fixtures.payloads import FAKE_TORCH_VERSION, install_fake_torch
from tests.integration.torch_seed import container_root, remove_venv, seed_torch_venv

pytestmark = pytest.mark.sandbox

VENV, FAKE_VENV = "venv-preflight", "venv-fake-torch"
PORT = 29533
NODES = {"sb1-200": VENV, "sb2-200": VENV, "sb2-201": FAKE_VENV}


@pytest.fixture(scope="module")
def fleet(sandbox, tmp_path_factory):
    for name, venv in NODES.items():
        host, vmid = name.split("-")
        if venv == VENV:
            seed_torch_venv(sandbox, host, int(vmid), VENV)
    made = sandbox.pct("sb2", "exec", "201", "--", "python3", "-m", "venv", "--without-pip",
                       f"/root/{FAKE_VENV}")
    assert made.returncode == 0, made.stderr
    site = glob.glob(f"{container_root(sandbox, 'sb2', 201)}/{FAKE_VENV}/lib/python3*/"
                     "site-packages")[0]
    install_fake_torch(Path(site))
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    for name, venv in NODES.items():
        data["containers"][name]["venv"] = f"/root/{venv}"
    path = tmp_path_factory.mktemp("preflight") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    with Fleet.from_path(str(path)) as fleet:
        yield fleet
    for name, venv in NODES.items():
        host, vmid = name.split("-")
        remove_venv(sandbox, host, int(vmid), venv)


def run_preflight(fleet, names, **options):
    nodes = fleet.targets(names)
    endpoint = (container_address(fleet, nodes[0]), PORT)
    started = time.monotonic()
    rows = pf.preflight(nodes, endpoint, socket_ifnames={"GLOO_SOCKET_IFNAME": "eth0"},
                        **options)
    return rows, time.monotonic() - started


def failed(rows):
    return [(r.node, r.check) for r in pf.failures(rows)]


def test_two_nodes_on_two_hosts_pass_in_seconds_and_leave_the_port_free(fleet):
    rows, seconds = run_preflight(fleet, ["sb1-200", "sb2-200"])
    assert failed(rows) == [], pf.render_preflight(rows)
    assert seconds < 20, seconds
    endpoint = {r.node: r.detail for r in rows if r.check == "endpoint"}
    assert endpoint["sb2-200"].startswith("reaches 10.88.1.200:29533")
    torch = {r.node: r.detail for r in rows if r.check == "torch"}
    assert torch == {"sb1-200": "torch 2.13.0+cpu", "sb2-200": "torch 2.13.0+cpu"}
    assert {r.status for r in rows if r.check == "gpus"} == {"note"}     # CPU: no nvidia-smi
    # the listener is gone: torchrun could bind the rendezvous port right away
    rendezvous = fleet.targets(["sb1-200"])[0]
    bind = rendezvous.run(["python3", "-c", "import socket; s = socket.socket(); "
                           f"s.bind(('', {PORT})); print('bound')"], timeout=30)
    assert bind.text == "bound\n", bind.error_text


def test_an_unreachable_rendezvous_port_fails_naming_the_node_before_anything_runs(
        sandbox, fleet):
    sandbox.block_container_port("sb1", 200, PORT)
    try:
        rows, seconds = run_preflight(fleet, ["sb1-200", "sb2-200"])
    finally:
        sandbox.clear_firewall("sb1")
    assert failed(rows) == [("sb2-200", "endpoint")]
    (row,) = pf.failures(rows)
    assert row.detail == ("cannot reach the rendezvous endpoint 10.88.1.200:29533 (listened on "
                          "in sb1-200): timed out after 3s")
    assert "let TCP port 29533 through to sb1-200" in row.fix and seconds < 25


def test_a_taken_rendezvous_port_is_its_own_error(fleet):
    squatter = fleet.targets(["sb1-200"])[0].spawn(
        ["python3", "-c", "import socket, sys, time; s = socket.create_server(('', "
         f"{PORT})); print('up', flush=True); sys.stdin.read()"])
    try:
        assert squatter.readline(20) == b"up\n"
        rows, _ = run_preflight(fleet, ["sb1-200", "sb2-200"])
    finally:
        squatter.close()
    assert failed(rows) == [("sb1-200", "endpoint")]
    assert pf.failures(rows)[0].detail == "the rendezvous port 29533 is already in use in sb1-200"


def test_a_node_with_another_torch_fails_naming_it(fleet):
    rows, _ = run_preflight(fleet, ["sb1-200", "sb2-201"])
    assert ("sb2-201", "torch") in failed(rows)
    (row,) = [r for r in pf.failures(rows) if r.check == "torch"]
    assert row.detail == f"torch {FAKE_TORCH_VERSION} here, 2.13.0+cpu on sb1-200"
    text = pf.render_preflight(rows)
    assert text.startswith("pre-flight: ") and "nothing was launched" in text.splitlines()[0]
