"""Inventory loading: the documented shape loads; each mistake names file:line:col."""

import textwrap

import pytest

from orchestrator.config.inventory import inventory_path, load_inventory
from orchestrator.errors import ConfigError, ExitCode

GOOD = """\
hosts:
  pve:   {address: 10.1.2.6, user: root}
  here:  {transport: local}
containers:
  drafters: {host: pve, vmid: 200, venv: /root/venv, gpus: [5, 6, 7]}
  dev:      {host: here, venv: ~/.cache/orch/venv}
groups:
  all-drafters: [drafters]
"""


def write(tmp_path, text):
    path = tmp_path / "inventory.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_issue_shape_loads(tmp_path):
    inventory = load_inventory(write(tmp_path, GOOD))
    assert inventory.hosts["pve"].address == "10.1.2.6"
    assert inventory.hosts["here"].transport == "local"
    drafters = inventory.containers["drafters"]
    assert (drafters.host, drafters.vmid, drafters.venv, drafters.gpus) == ("pve", 200, "/root/venv", [5, 6, 7])
    assert [c.name for c in inventory.resolve(["all-drafters"])] == ["drafters"]


def test_committed_inventory_describes_the_user_setup():
    inventory = load_inventory("inventory.yaml")
    assert inventory.hosts["pve"].address == "10.1.2.6"
    drafters = inventory.containers["drafters"]
    assert (drafters.vmid, drafters.venv, drafters.gpus) == (200, "/root/venv", [5, 6, 7])
    assert inventory.hosts[inventory.containers["dev"].host].transport == "local"


def test_resolve_host_vmid_and_dedupe(tmp_path):
    inventory = load_inventory(write(tmp_path, GOOD))
    specs = inventory.resolve(["drafters", "all-drafters", "pve:201", "pve"])
    assert [(s.name, s.host, s.vmid) for s in specs] == [
        ("drafters", "pve", 200), ("pve:201", "pve", 201), ("pve", "pve", None)]


@pytest.mark.parametrize("text, where, words", [
    ("hosts:\n  pve: {adress: 1.2.3.4}\n", ":2:9", "did you mean 'address'"),
    ("hosts:\n  pve: {address: 1.2.3.4, port: 'x'}\n", ":2:33", "port must be an integer"),
    ("hosts:\n  pve: {address: 1.2.3.4, port: 70000}\n", ":2:33", "out of range"),
    ("hosts:\n  pve: {user: root}\n", ":2:8", "needs an address"),
    ("hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: nope, vmid: 200}\n", ":4:13", "not in hosts"),
    ("hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: pve, vmid: 42}\n", ":4:24", "not a valid Proxmox id"),
    ("hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: pve, gpus: [a]}\n", ":4:25", "must be an integer"),
    ("hosts:\n  pve: {address: a}\ngroups:\n  g: [nothing]\n", ":4:7", "no container, group or host"),
    ("hosts:\n  pve: {address: a}\n  pve: {address: b}\n", ":3:3", "duplicate key 'pve'"),
    ("hosts: [\n", ":2:1", "invalid YAML"),
    ("hostz: {}\n", ":1:1", "did you mean 'hosts'"),
    ("hosts:\n  pve: {address: a, transport: telnet}\n", ":2:32", "transport must be"),
    ("hosts:\n  here: {transport: local}\ncontainers:\n  c: {host: here, vmid: 200}\n", ":4:25", "is local"),
    ("hosts:\n  pve: {address: a}\ndefault_target: x\n", ":3:17", "names no container"),
])
def test_mistakes_name_file_line_col(tmp_path, text, where, words):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    message = str(caught.value)
    assert message.startswith(path + where), message
    assert words in message
    assert caught.value.exit_code == ExitCode.USAGE


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_inventory(str(tmp_path / "absent.yaml"))


def test_unknown_target_lists_known_ones(tmp_path):
    inventory = load_inventory(write(tmp_path, GOOD))
    with pytest.raises(ConfigError, match="known targets: dev, drafters"):
        inventory.resolve(["nope"])


def test_inventory_path_order(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_INVENTORY", "/x/inv.yaml")
    assert inventory_path(None) == "/x/inv.yaml"
    assert inventory_path("mine.yaml") == "mine.yaml"
    monkeypatch.setenv("ORCH_SANDBOX_DIR", "/sb")
    assert inventory_path("sandbox") == "/sb/inventory.yaml"
