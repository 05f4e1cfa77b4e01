"""Names whose module is imported when they are first called.

The command modules take their heavy helpers (SSH through the fleet, the Proxmox API, the
playbook loader) this way, so that `orch CMD --help` imports none of them
(tests/unit/test_cli_startup.py). A stand-in for `from MODULE import NAME` where NAME is
only ever called.
"""

from __future__ import annotations

import importlib


def lazy(module: str, name: str):
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)
    call.__name__ = name
    call.__qualname__ = f"{module}.{name}"
    call.__doc__ = f"{module}.{name}, imported on first call (orchestrator.lazy)."
    return call
