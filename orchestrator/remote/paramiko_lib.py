"""paramiko for all of orch, imported without invoke: `from orchestrator.remote.paramiko_lib
import paramiko`.

paramiko.config imports invoke at the top, when it is installed (Fabric brings it), for one
thing only: an ssh_config `Match exec` line runs its command with invoke.run. That import
costs about 35 ms of every orch command that opens SSH, `orch --no-agent exec` included,
which never reads such a line in almost every setup. So paramiko is imported here with
invoke held off, and paramiko.config gets a stand-in that imports invoke when a `Match exec`
first runs. sys.modules is left as it was: a later `import invoke` in the same process
(Fabric's, the benchmarks') gets the real module, and `Match exec` works as in paramiko.

paramiko's `__init__` also asks `importlib.metadata.version("paramiko")` for its own
`__version__` (its client banner carries it), and importlib.metadata imports email, zipfile,
csv and more: about 7 ms. While paramiko is imported here, `importlib.metadata` is a
stand-in whose `version("paramiko")` reads the version where importlib.metadata finds it,
the name of paramiko's `paramiko-VERSION.dist-info` folder beside the package (the wheel
standard's name); anything else it is asked, or any other layout, goes to the real module.

orch's modules take paramiko from here, never with `import paramiko` of their own (the first
import decides); tests/unit/cli/test_startup.py checks that the direct `exec` imports no invoke
and no importlib.metadata.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

# A channel's output is read all at once, up to its whole window (paramiko's 2 MiB; a pull,
# a forward's download): paramiko keeps it in an array, and a read of less deletes from the
# array's front, which moves the rest. Reading a full window 64 KiB at a time moved about
# 1 MiB per read (a 200 MB pull: 200-215 MB/s, 240-300 MB/s in whole reads).
READ_AT_ONCE = 4 << 20


class _InvokeOnFirstUse:
    """invoke, imported when paramiko first uses it (an ssh_config `Match exec`). Where invoke
    is not installed, that first use raises ImportError, as paramiko itself does then."""

    def __getattr__(self, name: str):
        return getattr(importlib.import_module("invoke"), name)

    def __repr__(self) -> str:
        return "<module invoke (imported on first use)>"


class _PackageVersions(types.ModuleType):
    """importlib.metadata while paramiko is imported: version() of a package installed as a
    wheel, from its dist-info folder's name; the real module for anything else."""

    def version(self, name: str) -> str:
        spec = importlib.util.find_spec(name)
        folders = spec.submodule_search_locations if spec else None
        if folders and len(folders) == 1:
            prefix, suffix = f"{name}-", ".dist-info"
            beside = os.path.dirname(folders[0])
            found = [entry[len(prefix):-len(suffix)] for entry in os.listdir(beside)
                     if entry.startswith(prefix) and entry.endswith(suffix)]
            if len(found) == 1:
                return found[0]
        return self.__getattr__("version")(name)

    def __getattr__(self, attribute: str):
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attribute)


def _import_paramiko():
    if "paramiko" in sys.modules or "invoke" in sys.modules:
        return importlib.import_module("paramiko")   # too late, or invoke costs nothing more
    # None in sys.modules makes `import invoke` raise ImportError, which paramiko.config
    # takes as "invoke is not installed"
    sys.modules["invoke"] = None
    versions = None
    if "importlib.metadata" not in sys.modules:
        versions = sys.modules["importlib.metadata"] = _PackageVersions("importlib.metadata")
    try:
        module = importlib.import_module("paramiko")
    finally:
        if sys.modules.get("invoke", 0) is None:
            del sys.modules["invoke"]
        if versions is not None and sys.modules.get("importlib.metadata") is versions:
            del sys.modules["importlib.metadata"]
    if importlib.util.find_spec("invoke") is not None:
        module.config.invoke = _InvokeOnFirstUse()
    return module


paramiko = _import_paramiko()
