"""Which inventory file a command reads. Standard library only: the entry point asks it
before yaml is imported (orchestrator/remote/early.py), the inventory loader after. No
typing either: the thin client avoids its import."""

from __future__ import annotations

import os

SANDBOX_DIR_DEFAULT = "/var/lib/orch-sandbox"


def inventory_path(explicit: str | None = None) -> str:
    """-i/--inventory, then $ORCH_INVENTORY, then ./inventory.yaml, then ~/.config/orch/."""
    chosen = explicit or os.environ.get("ORCH_INVENTORY")
    if chosen == "sandbox":
        return os.path.join(os.environ.get("ORCH_SANDBOX_DIR", SANDBOX_DIR_DEFAULT), "inventory.yaml")
    if chosen:
        return chosen
    for candidate in ("inventory.yaml", os.path.expanduser("~/.config/orch/inventory.yaml")):
        if os.path.exists(candidate):
            return candidate
    return "inventory.yaml"
