"""Payloads: stdlib-only scripts shipped into a container over stdin and run there with the
container's own python as `PYTHON - ARGS_JSON`. Each prints JSON lines; the last line is
{"event": "result", ...} or {"event": "error", "message": ...}.

Code several payloads share lives once (_protocol.py, _locate.py, _statedir.py, ...); a
payload imports it with a marked line that payload_source() replaces by the module's text,
so what is shipped is always one self-contained script. _statedir.py imports nothing
else, so the controller reads STATE_DIR from it too.

This package only builds the scripts; orchestrator.remote.payload_api runs them on a Target.
It imports nothing of orch's, so the transports (remote/) may use it for their own helpers.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import threading
from importlib import resources

# CPython keeps the ast module's recursion counter per interpreter, not per thread: two
# threads turning source into ast objects at once can fail with "SystemError: AST
# constructor recursion depth mismatch" (python/cpython#106905; seen when two nodes'
# collect steps compacted a payload at the same moment). Every ast parse the controller
# makes holds this lock (the payloads themselves run single-threaded in the containers).
AST_LOCK = threading.Lock()

INLINE_MARK = re.compile(r"^from (_\w+) import \*  # orch: inlined when shipped$", re.MULTILINE)


@functools.lru_cache(maxsize=None)   # shipped again and again (a monitor's every reconnect)
def payload_source(name: str) -> bytes:
    """The payload as one script: each marked shared-module import replaced by its text."""
    return _inline(_read(name), set()).encode()


@functools.lru_cache(maxsize=None)
def compact_source(name: str) -> str:
    """The payload without docstrings and comments, for `python3 -c SOURCE`: what runs as
    an argv shows in the container's `ps`, the shorter the better."""
    source = payload_source(name).decode()
    with AST_LOCK:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
        return ast.unparse(tree)


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.py").read_text(encoding="utf-8")


def _inline(text: str, done: set) -> str:
    def replace(match: re.Match) -> str:
        module = match.group(1)
        if module in done:
            return ""
        done.add(module)
        return f"# --- {module}.py, inlined by orch ---\n{_inline(_read(module), done)}# --- end {module}.py ---"
    return INLINE_MARK.sub(replace, text)


def with_args(source: bytes, args: dict) -> bytes:
    """The script with its arguments inside it, for `PYTHON -` with no argument at all: the
    first line sets sys.argv[1] before the payload runs. What travels on stdin is never in any
    argv that `ps` shows, on the host (pct exec, lxc-attach) or in the container (the payload
    and the processes it forks), so secrets (a launch step's env) go this way."""
    encoded = json.dumps(args)
    header = ("import sys as _orch_sys; _orch_sys.argv[1:] = [%r]"
              "  # orch: arguments shipped with the script, not in argv\n" % encoded)
    return header.encode() + source
