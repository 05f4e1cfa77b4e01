"""The sandbox's inventory with every host's known_hosts pointed at a file of the test's own, for
the tests of host-key checking (what is known, revoked, hashed or trusted on first use)."""

from __future__ import annotations

import yaml


def inventory_with_known_hosts(sandbox, tmp_path, known_hosts_text: str) -> tuple[str, str]:
    """Writes known_hosts_text to tmp_path/known_hosts and a copy of the sandbox's inventory
    whose hosts all read it; returns the paths of (the inventory, the known_hosts file)."""
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    known = tmp_path / "known_hosts"
    known.write_text(known_hosts_text)
    for host in data["hosts"].values():
        host["known_hosts"] = str(known)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path), str(known)
