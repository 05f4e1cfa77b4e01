"""Shared payload code (inlined when shipped): `python3 - ARGS` without a new interpreter.

The reaper and the exec server are python3 already. For a stdlib payload (the probe) they
fork, and the child runs the script that comes on stdin as `python3 - ARGS` would, with
the environment the command would get: about 1 ms of CPU instead of an interpreter's start
(10-30 ms). Only for argv [python3, "-", ...] whose python3 is the one running here, and
only when orch asks (a payload that needs site, e.g. one importing a venv's packages, runs
as a command). The child is a process of its own: nothing it does reaches its parent.
"""

import os
import sys

IN_PYTHON = "--in-python"


def runs_here(argv):
    """argv is `python3 - ...`: the script on stdin, run by this process's python3."""
    return len(argv) >= 2 and os.path.basename(argv[0]) == "python3" and argv[1] == "-"


def run_here(argv, env, script=None, code=None):
    """In a forked child whose fds 0-2 are the command's: run the script (given, or on
    stdin; code: it compiled already) as the __main__ of a fresh namespace, then exit with
    its code (never returns)."""
    status = 1
    try:
        os.environb.clear()
        os.environb.update(env)
        sys.argv = list(argv[1:])
        # new objects for fds 0-2: the parent's may hold buffered bytes of its own
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")
        # bytes, as python3 reads them: a coding declaration is honoured
        source = sys.stdin.buffer.read() if script is None else script
        status = 0
        try:
            exec(code or compile(source, "<stdin>", "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            status = exit_code(stop.code)
        except BaseException as error:   # told as python3 tells it: from the script down
            import traceback   # only for a script that failed: a start costs none
            traceback.print_exception(type(error), error, error.__traceback__.tb_next)
            status = 1
    except BaseException:
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = status or 120   # as Python says of an unflushable stdout at exit
    os._exit(status)


def exit_code(value):
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    sys.stderr.write("%s\n" % (value,))
    return 1
