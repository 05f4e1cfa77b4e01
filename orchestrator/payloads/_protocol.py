"""Shared by every payload: arguments in, JSON lines out, errors as one error line.

Payloads start with `from _protocol import *  # orch: inlined when shipped`: run from this
folder (tests) that is a plain import; when orch ships a payload over stdin, the line is
replaced by this file's text (orchestrator.payloads.payload_source), so the script that
runs in the container is one self-contained file.
"""

import json
import os
import sys

REQUIRED = object()
_HANGUP = {"leave": False}


class PayloadError(Exception):
    """An expected failure: reported as an error event, never as a traceback."""

    def __init__(self, message, kind):
        super().__init__(message)
        self.kind = kind


def emit(event, **fields):
    line = dict(event=event)
    line.update(fields)
    try:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        if not _HANGUP["leave"]:
            raise
        os._exit(0)  # nobody listens any more (the SSH channel closed): leave quietly


def leave_quietly_on_hangup():
    """For a payload that outlives its listener's interest (the launcher's log tail): once
    the controller's channel is gone, the next emit exits instead of failing. Payloads that
    change files (fx_patch) keep the default and finish their work."""
    _HANGUP["leave"] = True


def fail(message, kind="failed", **fields):
    """Report an expected failure as the last line and exit 1 (for payloads with their own
    action dispatch; run_main does the same for PayloadError)."""
    emit("error", message=message, kind=kind, **fields)
    sys.exit(1)


def _type_ok(value, expected):
    # JSON true/false are bools, and bool is an int subclass: keep them apart.
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, expected)


def parse_args(argv, spec):
    """Validate the single JSON argv element against spec {name: (type, default)}."""
    if len(argv) != 1:
        raise PayloadError("expected exactly one argument: a JSON object of options", "bad-args")
    try:
        given = json.loads(argv[0])
    except ValueError as exc:
        raise PayloadError("the argument is not valid JSON: %s" % exc, "bad-args") from None
    if not isinstance(given, dict):
        raise PayloadError("the argument must be a JSON object", "bad-args")
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise PayloadError("unknown option(s): %s; known: %s"
                           % (", ".join(unknown), ", ".join(sorted(spec))), "bad-args")
    args = {}
    for name, (expected, default) in spec.items():
        if name not in given:
            if default is REQUIRED:
                raise PayloadError("missing required option %r" % name, "bad-args")
            args[name] = default
            continue
        value = given[name]
        if value is not None and not _type_ok(value, expected):
            raise PayloadError("option %r must be of type %s, got %r"
                               % (name, expected.__name__, value), "bad-args")
        args[name] = default if value is None else value
    return args


def run_main(argv, spec, run):
    """Parse args, run, and print the final result or error line; returns the exit code."""
    try:
        result = run(parse_args(argv[1:], spec))
    except PayloadError as exc:
        emit("error", message=str(exc), kind=exc.kind)
        return 1
    except Exception as exc:  # unexpected: still one error line, with the exception text
        emit("error", message="unexpected %s: %s" % (type(exc).__name__, exc), kind="internal")
        return 1
    emit("result", **result)
    return 0
