"""Payloads: stdlib-only scripts shipped into a container over stdin and run there with the
container's own python as `PYTHON - ARGS_JSON`. Each prints JSON lines; the last line is
{"event": "result", ...} or {"event": "error", "message": ...}.

Code several payloads share lives once, in _protocol.py and _locate.py; a payload imports it
with a marked line that payload_source() replaces by the module's text, so what is shipped
is always one self-contained script.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Callable, Optional

from orchestrator.errors import OrchError, PayloadError
from orchestrator.remote.base import LineSplitter
from orchestrator.remote.container import Target

EventCallback = Callable[[dict], None]


INLINE_MARK = re.compile(r"^from (_\w+) import \*  # orch: inlined when shipped$", re.MULTILINE)


def payload_source(name: str) -> bytes:
    """The payload as one script: each marked shared-module import replaced by its text."""
    return _inline(_read(name), set()).encode()


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


def run_payload(target: Target, name: str, args: dict, *, python: Optional[str] = None,
                timeout: float = 300.0, on_event: Optional[EventCallback] = None,
                args_on_stdin: bool = False) -> dict:
    """Run payload `name` on target and return its result event (raise PayloadError on error).
    args_on_stdin: ship the arguments inside the script on stdin instead of in argv (for
    secrets; see with_args)."""
    python = python or target.python()
    events: list[dict] = []

    def on_line(line: str) -> None:
        event = _parse_event(line)
        if event is None:
            return
        events.append(event)
        if on_event and event.get("event") not in ("result", "error"):
            on_event(event)

    splitter = LineSplitter(on_line)
    if args_on_stdin:
        argv, script = [python, "-"], with_args(payload_source(name), args)
    else:
        argv, script = [python, "-", json.dumps(args)], payload_source(name)
    result = target.run(argv, stdin=script,
                        timeout=timeout, on_stdout=splitter.feed)
    splitter.flush()
    final = events[-1] if events else None
    if final and final.get("event") == "result":
        return final
    if final and final.get("event") == "error":
        raise PayloadError(f"{target.name}: {final.get('message', 'the payload failed')}")
    if result.exit_code in (126, 127) or "No such file or directory" in result.error_text[:500]:
        raise OrchError(f"{target.name}: cannot run {python}: {result.stderr_tail(1)}",
                        hint="is the venv bootstrapped? (the venv: key of the inventory, "
                             "or a bootstrap step in the playbook)")
    raise PayloadError(f"{target.name}: payload {name} ended with exit code {result.exit_code} "
                       "and no result:\n" + "\n".join("  | " + l for l in result.stderr_tail()))


def _parse_event(line: str) -> Optional[dict]:
    line = line.strip()
    if not line.startswith("{"):
        return None  # a library printed something of its own; not ours
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "event" in event else None
