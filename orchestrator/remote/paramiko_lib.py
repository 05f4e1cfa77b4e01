"""paramiko for all of orch, imported without invoke: `from orchestrator.remote.paramiko_lib
import paramiko`.

paramiko.config imports invoke at the top, when it is installed (Fabric brings it), for one
thing only: an ssh_config `Match exec` line runs its command with invoke.run. That import
costs about 35 ms of every orch command that opens SSH, `orch --no-agent exec` included,
which never reads such a line in almost every setup. So paramiko is imported here with
invoke held off, and paramiko.config gets a stand-in that imports invoke when a `Match exec`
first runs. sys.modules is left as it was: a later `import invoke` in the same process
(Fabric's, the benchmarks') gets the real module, and `Match exec` works as in paramiko.

orch's modules take paramiko from here, never with `import paramiko` of their own (the first
import decides); tests/unit/test_cli_startup.py checks that the direct `exec` imports no invoke.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys


class _InvokeOnFirstUse:
    """invoke, imported when paramiko first uses it (an ssh_config `Match exec`). Where invoke
    is not installed, that first use raises ImportError, as paramiko itself does then."""

    def __getattr__(self, name: str):
        return getattr(importlib.import_module("invoke"), name)

    def __repr__(self) -> str:
        return "<module invoke (imported on first use)>"


def _import_paramiko():
    if "paramiko" in sys.modules or "invoke" in sys.modules:
        return importlib.import_module("paramiko")   # too late, or invoke costs nothing more
    # None in sys.modules makes `import invoke` raise ImportError, which paramiko.config
    # takes as "invoke is not installed"
    sys.modules["invoke"] = None
    try:
        module = importlib.import_module("paramiko")
    finally:
        if sys.modules.get("invoke", 0) is None:
            del sys.modules["invoke"]
    if importlib.util.find_spec("invoke") is not None:
        module.config.invoke = _InvokeOnFirstUse()
    return module


paramiko = _import_paramiko()
