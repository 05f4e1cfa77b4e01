"""Names whose module is imported when they are first called.

The command modules take their heavy helpers (SSH through the fleet, the Proxmox API, the
playbook loader) this way, so that `orch CMD --help` imports none of them
(tests/unit/cli/test_startup.py). A stand-in for `from MODULE import NAME` where NAME is
only ever called. Its twin for IDEs and type checkers is the real import under
`if TYPE_CHECKING:`, with the lazy name in the `else:` (tests/unit/project/test_lazy_twins.py).
"""

from __future__ import annotations

import functools
import importlib


def lazy(module: str, name: str):
    """NAME of MODULE (a dotted NAME reaches into a class: "Fleet.from_path"), imported when
    first called."""
    def call(*args, **kwargs):
        return functools.reduce(getattr, name.split("."), importlib.import_module(module))(*args, **kwargs)
    call.__name__ = name
    call.__qualname__ = f"{module}.{name}"
    call.__doc__ = f"{module}.{name}, imported on first call (orchestrator.ground.lazy)."
    return call


class LazyModule:
    """A module imported when one of its names is first used: the stand-in for
    `from orchestrator import nightly` in a command module whose --help must stay light."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<module {self._name} (imported on first use)>"
