"""`orch inventory list` and `orch validate -t`: what a new user tries first, on an inventory
file only (no host is contacted)."""

from __future__ import annotations

import json
import textwrap

from click.testing import CliRunner

from orchestrator.cli.app import main

INVENTORY = """\
hosts:
  pve1: {address: 10.1.2.6, user: root, api: {url: "https://pve1:8006", token_id: "root@pam!orch", token_secret_env: PVE_TOKEN}}
  pve2: {address: 10.1.2.7}
containers:
  node1: {host: pve1, vmid: 200, env: {HF_TOKEN: hf_s3cr3t}}
  node2: {host: pve2, vmid: 200}
groups:
  nodes: [node1, node2]
  pve1: [node1]
"""


def invoke(tmp_path, *args):
    path = tmp_path / "inventory.yaml"
    path.write_text(textwrap.dedent(INVENTORY))
    return CliRunner().invoke(main, ["-i", str(path), *args])


def test_inventory_list_resolves_every_target_name_once_and_keeps_secrets_out(tmp_path):
    listed = invoke(tmp_path, "inventory", "list", "--json")
    assert listed.exit_code == 0, listed.output
    data = json.loads(listed.stdout)
    rows = {row["name"]: row for row in data["targets"]}
    # pve1 is a group and a host: as a target it is the group (resolution order)
    assert [(name, row["kind"]) for name, row in rows.items()] == [
        ("node1", "container"), ("node2", "container"), ("nodes", "group"), ("pve1", "group"),
        ("pve2", "host")]
    assert rows["nodes"]["containers"] == ["node1", "node2"]
    assert rows["node1"]["resolves_to"] == "pve1:200" and rows["node1"]["env_names"] == ["HF_TOKEN"]
    assert [h["name"] for h in data["hosts"]] == ["pve1", "pve2"] and data["hosts"][0]["api"] is True
    table = invoke(tmp_path, "inventory", "list")
    assert table.exit_code == 0 and "pve1:200" in table.stdout and "hosts: pve1 (ssh 10.1.2.6)" in table.stdout
    for output in (listed.output, table.output):
        assert "s3cr3t" not in output


def test_the_unknown_target_hint_names_each_target_once(tmp_path):
    done = invoke(tmp_path, "validate", _playbook(tmp_path), "-t", "nope")
    assert done.exit_code == 2
    assert "known targets: node1, node2, nodes, pve1, pve2 (or HOST:VMID)" in done.output


def _playbook(tmp_path) -> str:
    path = tmp_path / "two-nodes.yaml"
    path.write_text("name: two-nodes\nsteps:\n  - ensure: {}\n")
    return str(path)


def test_validate_checks_the_targets_given_with_t(tmp_path):
    done = invoke(tmp_path, "validate", _playbook(tmp_path), "-t", "node1", "-t", "node2", "--json")
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert data["ok"] and data["targets"] == ["node1", "node2"] and data["warnings"] == []
    # without -t, a playbook that names no targets is valid with a warning
    plain = invoke(tmp_path, "validate", _playbook(tmp_path))
    assert plain.exit_code == 0 and "orch run` will need -t TARGET" in plain.output
