"""Payload: the container's end of `orch cp` — stdlib only.

Run as `python3 -I -S -c SOURCE ARGS_JSON` (the source in argv, so that stdin is free for
the stream); ARGS_JSON: {"action": "receive" | "send", "path": PATH, "recursive": bool,
"last_bytes": N | null, "special": bool}.
- receive: reads a framed tar stream (_tarstream.py) on stdin and unpacks it at PATH (into
  it when it is a folder); prints one JSON result line: counts, "digest" (the sha256 over
  every file's sha256), "path" (what was written); or an error line. setuid, setgid and
  sticky bits are dropped unless "special".
- send: writes the framed stream of PATH on stdout; its failures are the stream's X frame.
  last_bytes: only the last N bytes of PATH, one regular file (`tail -c N`).
SIGTERM (the reaper's, when orch's channel closed) removes what was staged, as an error does;
once that cleanup has begun, a SIGTERM is ignored.
"""

import signal
import sys

from _protocol import *  # orch: inlined when shipped
from _tarstream import *  # orch: inlined when shipped

ARG_SPEC = {"action": (str, REQUIRED), "path": (str, REQUIRED), "recursive": (bool, False),
            "last_bytes": (int, None), "special": (bool, False)}


def _terminated(number, _frame):
    _ignore_sigterm()
    raise SystemExit(128 + number)   # unwinds: the receiver's cleanup runs


def _ignore_sigterm():
    # The cleanup must run to its end: a SIGTERM raised inside it (the reaper's, a moment
    # after the stream's EOF began it when orch's link broke) left the staged file behind
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def receive(args):
    reader = sys.stdin.buffer
    try:
        return Receiver(args["path"], on_cleanup=_ignore_sigterm,
                        special=args["special"]).receive(
            lambda size: _read_exact(reader, size))
    except TransferError as error:
        raise PayloadError(str(error), error.kind)
    except OSError as error:
        raise PayloadError("%s: %s" % (error.filename or args["path"], error.strerror), "os-error")


def _read_exact(reader, size):
    chunks, left = [], size
    while left:
        piece = reader.read(left)
        if not piece:
            break
        chunks.append(piece)
        left -= len(piece)
    return b"".join(chunks)


def send(args):
    out = sys.stdout.buffer
    path = args["path"]
    problem = source_problem(path, args["recursive"])
    try:
        if problem:
            out.write(error_frame(problem))
            return 1
        for piece in send_frames(path, last_bytes=args["last_bytes"]):
            out.write(piece)
        out.flush()
    except BrokenPipeError:
        return 1   # orch went away; nothing of ours to clean up
    return 0


def main(argv):
    signal.signal(signal.SIGTERM, _terminated)
    try:
        action = parse_args(argv[1:], ARG_SPEC)["action"]
    except PayloadError as error:   # orch never sends these: said as any payload says it
        emit("error", message=str(error), kind=error.kind)
        return 1
    if action == "send":
        return send(parse_args(argv[1:], ARG_SPEC))
    return run_main(argv, ARG_SPEC, receive)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
