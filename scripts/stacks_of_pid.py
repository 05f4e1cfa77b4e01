#!/usr/bin/env python3
"""`orch stacks --pid PID` on this machine with the standard library only: for a GPU machine
where orch is not installed and its dependencies (click, yaml, paramiko, jinja2, packaging)
may be absent. The same code as orch stacks (orchestrator/forensics/explain.py's take_stacks:
pystack --locals, the explain_frames payload with VENV's python, the wait graph and its
cycles); prints the DEADLOCK line(s) first, like orch stacks, and writes the JSON.

    PYTHONPATH=REPO python scripts/stacks_of_pid.py PID --venv VENV [--pystack-wheel WHEEL] [--json OUT]

pystack: VENV's own (`VENV/bin/python -m pystack`), else a pystack wheel for VENV's python
(pystack-1.7.2-cp312-abi3-manylinux2014_x86_64...whl for CPython 3.12), unpacked into a
temporary folder with zipfile and run from there, as orch carries it. It reads the process
with ptrace: run as root (or as the process's user where ptrace_scope allows it).
Exit code: 0 stacks taken, no cycle; 1 a deadlock (a cycle) or a thread waiting on a lock;
2 bad arguments or no pystack.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict

from orchestrator.ground.errors import OrchError
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.forensics.explain import take_stacks
from orchestrator.forensics.stacktool import PINNED_SHA256, RUNNER


def pystack_tool(python: str, wheel: str, scratch: str) -> tuple[list[str], str]:
    if subprocess.run([python, "-c", "import pystack"], capture_output=True).returncode == 0:
        return [python, "-m", "pystack"], f"{python} -m pystack"
    if not wheel:
        raise SystemExit(f"no pystack in {python}: give --pystack-wheel WHEEL (pip download "
                         "pystack==1.7.2 for that python on a machine with an index)")
    with open(wheel, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    if PINNED_SHA256.get(os.path.basename(wheel)) != digest:
        raise SystemExit(f"refused {wheel}: not a pystack 1.7.2 wheel PyPI publishes (sha256 {digest})")
    folder = os.path.join(scratch, os.path.basename(wheel)[:-len(".whl")])
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)
    return [python, "-c", RUNNER, folder], f"{python} with {os.path.basename(wheel)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pid", type=int)
    parser.add_argument("--venv", required=True, help="the venv whose python runs the process")
    parser.add_argument("--pystack-wheel", default="", help="a pystack wheel for that python")
    parser.add_argument("--json", dest="json_out", default="", help="write the stacks here as JSON")
    args = parser.parse_args()
    python = os.path.join(args.venv, "bin", "python")
    target = Target("here", LocalTransport("here"), venv=args.venv)
    with tempfile.TemporaryDirectory(prefix="orch-pystack-") as scratch:
        try:
            tool = pystack_tool(python, args.pystack_wheel, scratch)
            result = take_stacks(target, args.pid, tool=tool)
        except OrchError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    for cycle in result.cycles:
        print(cycle["line"])
        print(f"  {cycle['words']}")
        if cycle.get("remedy"):
            print(f"  remedy: {cycle['remedy']['summary']}")
    for lock in result.locks:
        print(f"waits: {lock['sentence']}")
    for wait in result.waits:
        if wait["how"] != "lock":
            print(f"waits: {wait['thread']} {wait['words']}")
    for thread in result.threads:
        frame = (thread["frames"] or [{}])[-1]
        print(f"{thread['label']}: {frame.get('function')} ({frame.get('file')}:{frame.get('line')})")
    if args.json_out:
        with open(args.json_out, "w") as handle:
            json.dump(asdict(result), handle, indent=1)
    return 1 if result.cycles or result.locks else 0


if __name__ == "__main__":
    sys.exit(main())
