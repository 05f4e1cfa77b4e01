"""orch against a target of this machine (the local transport) whose venv the test made: the
inventory of that one target and orch run on it as a user runs it, in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def local_inventory(folder: Path, venv) -> str:
    """Writes folder/inventory.yaml with one local target `dev` (the default target) whose venv is
    the folder venv; returns the inventory's path."""
    path = folder / "inventory.yaml"
    path.write_text(f"hosts:\n  here: {{transport: local}}\ncontainers:\n"
                    f"  dev: {{host: here, venv: '{venv}'}}\ndefault_target: dev\n")
    return str(path)


def orch_without_agent(inventory: str, *args, timeout: float) -> subprocess.CompletedProcess:
    """`orch --no-agent -i INVENTORY ARGS...` in a fresh process; its output as text. A traceback
    on stderr fails the test: orch says what went wrong in words."""
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", inventory, *args],
                         capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in out.stderr, out.stderr
    return out
