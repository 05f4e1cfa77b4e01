"""Test-only stand-in for the thread-local FX flag patch, applied in memory.

Put this folder on PYTHONPATH: when torch imports torch.fx._symbolic_trace, the module is
built from its source with the module-level `_is_fx_tracing_flag` reads and writes turned
into per-thread ones (the shape of the upstream fix, pytorch PR 168999). Nothing on disk
changes, so the shared torch venv stays pristine. Prints whether it applied to stderr; if
torch's source no longer has the expected shape it changes nothing and says so.
"""

import importlib.abc
import importlib.util
import sys

TARGET = "torch.fx._symbolic_trace"

HELPERS = '''
import threading as _fx_tls_threading
_is_fx_tracing_tls = _fx_tls_threading.local()


def _get_is_fx_tracing():
    return getattr(_is_fx_tracing_tls, "value", False)


def _set_is_fx_tracing(value):
    _is_fx_tracing_tls.value = value
'''

# (old, new, expected count); every edit must apply or none is made
EDITS = [
    ("_is_fx_tracing_flag = False\n", "_is_fx_tracing_flag = False\n" + HELPERS, 1),
    ("        global _is_fx_tracing_flag\n", "", 1),
    ("old_is_fx_tracing_flag = _is_fx_tracing_flag",
     "old_is_fx_tracing_flag = _get_is_fx_tracing()", 1),
    ("_is_fx_tracing_flag = True", "_set_is_fx_tracing(True)", 1),
    ("_is_fx_tracing_flag = old_is_fx_tracing_flag",
     "_set_is_fx_tracing(old_is_fx_tracing_flag)", 1),
    ("return _is_fx_tracing_flag and not", "return _get_is_fx_tracing() and not", 1),
    ("    return _is_fx_tracing_flag\n", "    return _get_is_fx_tracing()\n", 1),
]


def patched_source(src):
    for old, new, count in EDITS:
        if src.count(old) != count:
            return None
        src = src.replace(old, new)
    return src


class _Loader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # find the real file, then load it ourselves
        try:
            real = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        self.origin = real.origin
        return importlib.util.spec_from_file_location(name, real.origin, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        with open(self.origin) as f:
            src = f.read()
        new = patched_source(src)
        sys.stderr.write("fx-tls-sim: applied\n" if new else "fx-tls-sim: NOT applied\n")
        exec(compile(new or src, self.origin, "exec"), module.__dict__)


sys.meta_path.insert(0, _Loader())
