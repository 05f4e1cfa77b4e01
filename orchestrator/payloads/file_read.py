"""Read a byte range of one file, only inside allowed folders: the container's end of the
MCP `read_file` tool (a client's read-only pull), and of every read of a run's logs (MCP
`run_log`, `orch explain` and `explain_run`), which once used a plain `tail`: a log
replaced by a link to /etc/shadow was read through it.

Shipped into a container and run with its python3; standard library only, Python 3.8+.

Args::

    {"path": "/var/lib/orch/runs/RUN/launch/output.log", "roots": ["/var/lib/orch/runs"],
     "offset": 0, "length": 65536, "tail": false}

tail: the file's last `length` bytes, whatever offset says (`tail -c`, for a log's end).

The allowance is checked on real paths, here where the files are: the path's real path
(symlinks resolved) must be inside one root's real path before it is opened, and the
opened descriptor's own path (/proc/self/fd) must be so as well, so a link swapped in
between the two cannot lead outside. Only regular files are read (a fifo or a device is
refused before a byte is read; opened non-blocking, so a fifo cannot hang the open).

Events: {"event": "chunk", "data": BASE64} (at most 256 KiB each), then the result::

    {"event": "result", "path": PATH, "size": N, "offset": O, "bytes": B,
     "sha256": HEX (of the B bytes sent), "eof": bool}

Errors: kinds "outside-allowance" (not inside a root: nothing is said of what is there),
"missing", "not-a-file", "bad-args", "os-error".
"""

import base64
import hashlib
import os
import stat
import sys

from _protocol import *  # orch: inlined when shipped

ARG_SPEC = {"path": (str, REQUIRED), "roots": (list, REQUIRED), "offset": (int, 0),
            "length": (int, 65536), "tail": (bool, False)}
CHUNK = 256 << 10


def inside(real, roots):
    for root in roots:
        base = os.path.realpath(root)
        if real == base or real.startswith(base.rstrip("/") + "/"):
            return True
    return False


def refuse(path, roots):
    raise PayloadError("%s is not inside the folders this client may read (%s)"
                       % (path, ", ".join(roots)), "outside-allowance")


def open_inside(path, roots):
    """A descriptor of path, a regular file whose real path is inside a root."""
    if not path.startswith("/") or "\0" in path:
        raise PayloadError("%r: give an absolute path" % path, "bad-args")
    if not inside(os.path.realpath(path), roots):
        refuse(path, roots)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise PayloadError("%s: no such file" % path, "missing")
    except OSError as error:
        raise PayloadError("%s: %s" % (path, error.strerror), "os-error")
    try:
        if not inside(os.readlink("/proc/self/fd/%d" % fd), roots):
            refuse(path, roots)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PayloadError("%s is not a regular file" % path, "not-a-file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_range(args):
    roots = [r for r in args["roots"] if isinstance(r, str) and r.startswith("/")]
    if not roots or args["offset"] < 0 or args["length"] < 0:
        raise PayloadError("roots must be absolute folders; offset and length >= 0", "bad-args")
    path = args["path"]
    fd = open_inside(path, roots)
    digest, sent = hashlib.sha256(), 0
    try:
        size = os.fstat(fd).st_size
        offset = max(0, size - args["length"]) if args["tail"] else min(args["offset"], size)
        os.lseek(fd, offset, os.SEEK_SET)
        while sent < args["length"]:
            data = os.read(fd, min(CHUNK, args["length"] - sent))
            if not data:
                break
            digest.update(data)
            sent += len(data)
            emit("chunk", data=base64.b64encode(data).decode("ascii"))
    finally:
        os.close(fd)
    return {"path": path, "size": size, "offset": offset, "bytes": sent,
            "sha256": digest.hexdigest(), "eof": offset + sent >= size}


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, read_range))
