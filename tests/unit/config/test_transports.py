"""config/transports.py is the one table of transports: the inventory validates against it,
and no other module decides by a transport's name."""

from __future__ import annotations

import ast
import os

import pytest

import orchestrator
from orchestrator.config import transports
from orchestrator.config.inventory import load_inventory
from orchestrator.ground.errors import ConfigError

PACKAGE = os.path.dirname(orchestrator.__file__)


def _comparisons_with_a_transport_name():
    """`X.transport == "ssh"`, `transport != "local"`, `get("transport") == ...`: a decision
    by name, outside the table."""
    names = set(transports.TRANSPORTS)
    found = []
    for folder, _dirs, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path.endswith(os.path.join("config", "transports.py")):
                continue
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Compare) and any(
                        isinstance(side, ast.Constant) and side.value in names
                        for side in [node.left, *node.comparators]) and "transport" in ast.unparse(node):
                    found.append(f"{os.path.relpath(path, PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_decides_by_a_transports_name():
    assert _comparisons_with_a_transport_name() == [], "ask config/transports.py's capabilities"


def test_the_inventory_refuses_a_transport_the_table_lacks(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  pve: {transport: telnet, address: a}\n")
    with pytest.raises(ConfigError, match=r"inventory.yaml:2:.*transport must be 'ssh' or 'local', not 'telnet'"):
        load_inventory(str(path))


@pytest.mark.parametrize("text, problem", [
    ("hosts:\n  here: {transport: local}\ncontainers:\n  c: {host: here, vmid: 200}\n",
     "host 'here' is local: it has no containers"),
    ("hosts:\n  here: {transport: local}\nclusters:\n  lab: [here]\n",
     "host 'here' is local: it cannot be a cluster node"),
    ("hosts:\n  pve: {transport: ssh}\n", "host 'pve' needs an address"),
])
def test_what_a_host_can_be_asked_follows_its_transports_capabilities(tmp_path, text, problem):
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem):
        load_inventory(str(path))


def test_every_host_knows_its_capabilities(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  pve: {address: 10.1.2.6}\n  here: {transport: local}\n")
    hosts = load_inventory(str(path)).hosts
    assert hosts["pve"].kind is transports.SSH and hosts["pve"].kind.proxmox
    assert hosts["here"].kind is transports.LOCAL and not hosts["here"].kind.over_ssh
