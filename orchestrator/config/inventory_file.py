"""Which inventory file a command reads. No yaml: the direct path's entry point asks it before
yaml is imported (orchestrator/remote/early.py), the inventory loader after."""

from __future__ import annotations

import os
from typing import Optional

from orchestrator.ground import invocation

SANDBOX_DIR_DEFAULT = "/var/lib/orch-sandbox"


def inventory_path(explicit: Optional[str] = None) -> str:
    """-i/--inventory, then $ORCH_INVENTORY, then ./inventory.yaml, then ~/.config/orch/;
    in the command's environment, and relative to its working directory (as given: the
    messages name it so; `invocation.current().path` is the file)."""
    command = invocation.current()
    chosen = explicit or command.env.get("ORCH_INVENTORY")
    if chosen == "sandbox":
        return os.path.join(command.env.get("ORCH_SANDBOX_DIR", SANDBOX_DIR_DEFAULT), "inventory.yaml")
    if chosen:
        return chosen
    for candidate in ("inventory.yaml", command.expanduser("~/.config/orch/inventory.yaml")):
        if os.path.exists(command.path(candidate)):
            return candidate
    return "inventory.yaml"
