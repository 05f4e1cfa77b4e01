"""Read lines of one source file of an installed package, by a path relative to the package.

Shipped into a container and run with the container's (venv's) python; standard library
only, Python 3.8+. The package is found without importing it (see _locate.py).

Args::

    {"package": "torch", "path": "fx/_symbolic_trace.py", "start_line": 1,
     "end_line": null, "max_bytes": 65536}

Result::

    {"event": "result", "package": "torch", "version": "2.13.0+cpu",
     "path": "fx/_symbolic_trace.py", "start_line": 1, "end_line": 80, "total_lines": 1290,
     "text": "...", "truncated": false, "bytes": 2811}

The path is data, never a way out of the package: absolute paths, '..' parts and anything
whose real path (symlinks resolved) is not inside the package's real directory are refused
with kind "outside-package".
"""

import os
import sys

from _protocol import *  # orch: inlined when shipped
from _locate import *  # orch: inlined when shipped


ARG_SPEC = {"package": (str, "torch"), "path": (str, REQUIRED), "start_line": (int, 1),
            "end_line": (int, None), "max_bytes": (int, 65536)}


def inside_package(package_dir, relative):
    """The real path of `relative` under package_dir; PayloadError when it leaves it."""
    if not relative or "\0" in relative:
        raise PayloadError("the path is empty or has a NUL byte", "bad-args")
    if os.path.isabs(relative) or relative.startswith("~"):
        raise PayloadError("%r is absolute: give a path relative to the package" % relative,
                           "outside-package")
    parts = relative.replace("\\", "/").split("/")
    if ".." in parts:
        raise PayloadError("%r has a '..' part: only files inside the package can be read"
                           % relative, "outside-package")
    root = os.path.realpath(package_dir)
    real = os.path.realpath(os.path.join(root, relative))
    if os.path.commonpath([root, real]) != root:
        raise PayloadError("%r leads outside the package (a symlink to %s)" % (relative, real),
                           "outside-package")
    if not os.path.isfile(real):
        raise PayloadError("%r is not a file of the package (in %s)" % (relative, root), "not-found")
    return real


def run(args):
    found = locate(args["package"])
    if not os.path.isdir(found["package_dir"]):
        raise PayloadError("%s is a single module, not a package directory" % args["package"],
                           "bad-args")
    real = inside_package(found["package_dir"], args["path"])
    start = max(1, args["start_line"])
    end = args["end_line"]
    with open(real, encoding="utf-8", errors="replace") as handle:
        lines = handle.read().splitlines()
    last = len(lines) if end is None else min(end, len(lines))
    chosen, size, truncated = [], 0, False
    for line in lines[start - 1:last]:
        size += len(line.encode("utf-8")) + 1
        if size > args["max_bytes"]:
            truncated = True
            break
        chosen.append(line)
    return {"package": args["package"], "version": found["version"], "path": args["path"],
            "start_line": start, "end_line": start + len(chosen) - 1, "total_lines": len(lines),
            "text": "\n".join(chosen) + ("\n" if chosen else ""), "truncated": truncated,
            "bytes": sum(len(line.encode("utf-8")) + 1 for line in chosen)}


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
