"""Collect the files a trainer writes as data (TensorBoard event files) from under one path,
bounded, for the controller to parse.

Shipped into a container and run with its python3; standard library only, Python 3.8+.
Nothing is parsed here: the bytes go back as they are (base64) and orch reads them with a
maintained reader on the controller.

Args::

    {"path": "/root/outputs/runs", "name_contains": "tfevents", "max_bytes": 16777216,
     "max_files": 64, "max_depth": 4}

PATH is a file (collected whatever its name) or a folder searched to max_depth levels for
files whose name contains name_contains (symlinks are not followed). Events, per file in
order of path: {"event": "chunk", "file": I, "data": BASE64} (at most 512 KiB of the file
each) then {"event": "file", "file": I, "path": RELATIVE, "size": N, "read": N}. A file is
read up to what is left of max_bytes for all of them ("read" < "size": cut there).

Result::

    {"event": "result", "path": "/root/outputs/runs", "files": 2, "bytes": 81234,
     "left_out": 0, "cut": false}

left_out counts the files past max_files or past the byte budget; cut is true when any
file was read only in part. A missing path is the error kind "missing".
"""

import base64
import os
import sys

from _protocol import *  # orch: inlined when shipped

ARG_SPEC = {"path": (str, REQUIRED), "name_contains": (str, "tfevents"),
            "max_bytes": (int, 16 << 20), "max_files": (int, 64), "max_depth": (int, 4)}
CHUNK = 512 << 10   # raw bytes per event: far below the controller's 8 MiB line limit


def find(root, name_contains, max_depth):
    """(relative path, full path) of the matching regular files under root, sorted."""
    found = []
    base_depth = root.rstrip("/").count("/")
    for folder, dirs, files in os.walk(root, followlinks=False):
        if folder.rstrip("/").count("/") - base_depth >= max_depth:
            dirs[:] = []
        dirs.sort()
        for name in files:
            full = os.path.join(folder, name)
            if name_contains in name and os.path.isfile(full) and not os.path.islink(full):
                found.append((os.path.relpath(full, root), full))
    return sorted(found)


def send(index, relative, full, budget):
    """Emit one file's first `budget` bytes; returns how many were read."""
    size = os.path.getsize(full)
    read = 0
    with open(full, "rb") as handle:
        while read < min(size, budget):
            data = handle.read(min(CHUNK, budget - read))
            if not data:
                break
            read += len(data)
            emit("chunk", file=index, data=base64.b64encode(data).decode("ascii"))
    emit("file", file=index, path=relative, size=size, read=read)
    return read, size


def collect(args):
    root = args["path"]
    if not os.path.exists(root):
        raise PayloadError("%s: no such file or folder" % root, "missing")
    if os.path.isfile(root):
        files = [(os.path.basename(root), root)]
    else:
        files = find(root, args["name_contains"], max(0, args["max_depth"]))
    budget, total, sent, cut = max(0, args["max_bytes"]), 0, 0, False
    for index, (relative, full) in enumerate(files[:max(0, args["max_files"])]):
        if budget - total <= 0:
            break
        try:
            read, size = send(index, relative, full, budget - total)
        except OSError as error:
            emit("file", file=index, path=relative, error=error.strerror or str(error))
            sent += 1
            continue
        total += read
        sent += 1
        cut = cut or read < size
    return {"path": root, "files": sent, "bytes": total, "left_out": len(files) - sent,
            "cut": cut}


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, collect))
