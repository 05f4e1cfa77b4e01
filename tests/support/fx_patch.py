"""The fx_patch payload loaded as a module, as the container's python would run it."""

from __future__ import annotations

import types

from orchestrator.payloads import payload_source


def load_fx_patch_module():
    """The payload as shipped (helpers inlined), loaded as a module for its functions."""
    module = types.ModuleType("fx_patch_shipped")
    exec(compile(payload_source("fx_patch"), "fx_patch.py", "exec"), module.__dict__)
    return module


FX_PATCH = load_fx_patch_module()
