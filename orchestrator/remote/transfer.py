"""The controller's end of `orch cp`: a file or a tree pushed into a Target or pulled from
one, as one framed tar stream over one exec channel (the format and both of its ends are in
payloads/_tarstream.py; payloads/cp.py is the container's end, run with its python3).

Nothing is held whole: a push reads each file in pieces as the channel takes them (the
stream is a generator behind the command's stdin), a pull hands the channel's output to
the receiver through a small bounded queue, so orch's memory does not grow with the size
of what is copied. Both ends compute every file's sha256 as it streams; the receiver
compares them with the sender's manifest before it renames anything into place, and the
controller compares the two tree digests once more.

A pull's stream comes from the container, which may be hostile: the receiver takes only the
top entry it asked for (the basename of the path pulled), writes modes under this user's
umask without setuid, setgid or sticky bits (unless asked: special), and leaves a folder it
merges into as it was. A push drops those bits too unless asked (the push step asks: its
mode is the playbook's own).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Callable, Optional

from orchestrator.ground import paths
from orchestrator.ground.errors import BadArgument, OrchError, PayloadError
from orchestrator.payloads import compact_source
from orchestrator.payloads._tarstream import (Receiver, TransferError, destination, measure,
                                              send_frames, source_problem, top_name, tree_digest)
from orchestrator.remote.base import LineSplitter
from orchestrator.remote.container import Target
from orchestrator.remote.payload_api import SYSTEM_PYTHON, parse_event, payload_outcome

DataCallback = Callable[[int], None]
QUEUE_BYTES = 4 << 20    # a pull's output waiting for the receiver (more when one read is larger)


def cp_argv(action: str, path: str, recursive: bool = False,
            last_bytes: Optional[int] = None, special: bool = False) -> list[str]:
    """The container's end: the payload's source in argv (stdin carries the stream), -I -S
    as the reaper runs (stdlib only; PYTHON* variables and the current folder are not its)."""
    args = json.dumps({"action": action, "path": path, "recursive": recursive,
                       **({"last_bytes": last_bytes} if last_bytes is not None else {}),
                       **({"special": True} if special else {})})
    return [SYSTEM_PYTHON, "-I", "-S", "-c", compact_source("cp"), args]


def remote_path(target: Target, path: str) -> str:
    """A path in the target as scp reads it: relative ones (and ~) are in the home folder."""
    if path.startswith("/"):
        return path
    if path in ("", "~", "~/"):
        return target.home().rstrip("/") + "/"
    if path.startswith("~/"):
        return target.expand(path)
    return target.home().rstrip("/") + "/" + path


def push(target: Target, source: str, dest: str, *, recursive: bool = False,
         on_data: Optional[DataCallback] = None,
         on_size: Optional[Callable[[dict], None]] = None,
         timeout: Optional[float] = None, special: bool = False) -> dict:
    """Copy the local file or tree `source` to `dest` in target; returns what was written
    (files, dirs, links, bytes, digest, path, skipped, seconds). on_size gets the total
    ({"bytes", "files"}) first, on_data every piece of file data as it is sent. special:
    keep setuid, setgid and sticky bits (dropped otherwise)."""
    problem = source_problem(source, recursive)
    if problem:
        raise BadArgument(str(problem))
    if on_size:
        try:
            on_size(measure(source))
        except OSError as error:   # a folder we may not list: the stream says it, as X
            on_size({"bytes": None, "files": None, "error": error.strerror})
    started = time.monotonic()
    hashes: dict = {}
    skipped: list = []
    stream = _GeneratorReader(send_frames(source, on_data=on_data, skipped=skipped, hashes=hashes))
    events: list = []
    splitter = LineSplitter(lambda line: _keep_event(events, line))
    result = target.run(cp_argv("receive", remote_path(target, dest), special=special), stdin=stream,
                        timeout=timeout, on_stdout=splitter.feed, kill_on_close=True, bulk=True)
    splitter.flush()
    final = payload_outcome(target, "cp", SYSTEM_PYTHON, events[-1] if events else None, result)
    _same_digest(target, final.get("digest"), tree_digest(hashes))
    return _summary(final, skipped, started)


def pull(target: Target, source: str, dest: str, *, recursive: bool = False,
         on_data: Optional[DataCallback] = None,
         on_size: Optional[Callable[[dict], None]] = None,
         timeout: Optional[float] = None, last_bytes: Optional[int] = None,
         special: bool = False) -> dict:
    """Copy the file or tree `source` of target to the local `dest`; returns what was written.
    last_bytes: source is one file, and only its last last_bytes bytes are copied (`tail -c`,
    verified as a whole copy is). special: keep setuid, setgid and sticky bits."""
    _check_local_dest(dest)
    started = time.monotonic()
    pipe = _ChunkQueue()
    path = remote_path(target, source)
    receiver = Receiver(dest, on_data=on_data, on_size=on_size, top=top_name(path),
                        folders=recursive, umask=user_umask(), special=special)
    outcome: dict = {}

    def receive() -> None:
        try:
            outcome["done"] = receiver.receive(pipe.read_exact)
        except BaseException as error:   # reported by the caller's thread
            outcome["error"] = error
        finally:
            pipe.close_reader()

    worker = threading.Thread(target=receive, name="orch-cp-receive", daemon=True)
    worker.start()
    result = None
    try:
        result = target.run(cp_argv("send", path, recursive, last_bytes),
                            timeout=timeout, on_stdout=pipe.put, capture=False,
                            kill_on_close=True, bulk=True)
    except _ReceiverGone:
        pass   # the receiver failed first: its error is the one to tell
    finally:
        pipe.end()
        worker.join()
    error = outcome.get("error")
    if error is not None:
        raise _restated(target, error, result) from None
    return _summary(outcome["done"], [], started)


def user_umask() -> int:
    """The umask of the user orch runs for (not the 077 orch holds for its own files):
    what a pulled file's mode is narrowed by, as cp and scp narrow it."""
    mask = paths.user_umask()
    if mask >= 0:
        return mask
    try:   # Linux 4.7+: read it without changing the process's (other threads create files)
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _restated(target: Target, error: BaseException, result) -> BaseException:
    """The receiver's error said about the target; a payload that could not start (no
    python3) is said as every payload says it."""
    if isinstance(error, OSError):   # this machine's side: a full disk, a folder we may not write
        return OrchError(f"{target.name}: writing {error.filename or 'the copy'}: "
                         f"{error.strerror or error}")
    if not isinstance(error, TransferError):
        return error
    if result is not None and result.exit_code != 0 and error.kind in ("bad-stream", "truncated"):
        try:
            payload_outcome(target, "cp", SYSTEM_PYTHON, None, result)
        except OrchError as typed:   # PythonUnavailable, or the payload's stderr
            return typed
    return PayloadError(f"{target.name}: {error}", kind=error.kind)


def _check_local_dest(dest: str) -> None:
    try:
        destination(dest, "", False)
    except TransferError as error:
        raise BadArgument(str(error)) from None


def _same_digest(target: Target, theirs: Optional[str], ours: str) -> None:
    if theirs != ours:
        raise PayloadError(f"{target.name}: the written files' sha256 digest {theirs} is not "
                           f"the one sent ({ours})", kind="hash-mismatch")


def _summary(done: dict, skipped: list, started: float) -> dict:
    keys = ("files", "dirs", "links", "bytes", "digest", "path")
    return {**{key: done.get(key) for key in keys}, "skipped": skipped,
            "seconds": round(time.monotonic() - started, 3)}


def _keep_event(events: list, line: str) -> None:
    event = parse_event(line)
    if event is not None:
        events.append(event)


class _GeneratorReader:
    """A generator of bytes as a file with read(n), for a command's stdin (no fileno: the
    transport reads it piece by piece as the channel takes them)."""

    def __init__(self, pieces):
        self._pieces = iter(pieces)
        self._held = memoryview(b"")
        self._at = 0

    def read(self, size: int = -1) -> bytes:
        while self._at >= len(self._held):
            piece = next(self._pieces, None)
            if piece is None:
                return b""
            # an offset into the piece, not the rest re-sliced (copied) after every read
            self._held, self._at = memoryview(piece), 0
        end = len(self._held) if size is None or size < 0 else self._at + size
        piece = self._held[self._at:end].tobytes()
        self._at += len(piece)
        return piece


class _ReceiverGone(Exception):
    """The receiver stopped (its own error): the channel's output has nowhere to go.
    Not an OSError, which the transport would take for a broken link."""


class _ChunkQueue:
    """The channel's output (put, from the transport's thread) as read_exact(n) for the
    receiver's thread, bounded by bytes: when the receiver is slower than the link the
    transport waits, and SSH's window stops the sender."""

    def __init__(self, limit: int = QUEUE_BYTES):
        self._limit = limit
        self._chunks: collections.deque = collections.deque()
        self._queued = 0                     # bytes in _chunks
        self._changed = threading.Condition()
        self._held = memoryview(b"")         # the chunk being read, from _at
        self._at = 0
        self._ended = False                  # the writer's end() (no more chunks)
        self._reader_closed = False

    def put(self, chunk: bytes) -> None:
        with self._changed:
            # one chunk always fits, however large: the window bounds it
            while self._queued and self._queued + len(chunk) > self._limit:
                if self._reader_closed:
                    break
                self._changed.wait(0.2)
            if self._reader_closed:
                raise _ReceiverGone()
            self._chunks.append(chunk)
            self._queued += len(chunk)
            self._changed.notify_all()

    def end(self) -> None:
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def close_reader(self) -> None:
        with self._changed:
            self._reader_closed = True
            self._changed.notify_all()

    def read_exact(self, size: int) -> bytes:
        """size bytes, fewer only at the end of the output."""
        pieces, have = [], 0
        while have < size:
            if self._at >= len(self._held) and not self._next_chunk():
                break
            # an offset into the chunk, not its rest re-sliced (copied) after every read
            take = self._held[self._at:self._at + size - have]
            self._at += len(take)
            pieces.append(take)
            have += len(take)
        return b"".join(pieces)

    def _next_chunk(self) -> bool:
        with self._changed:
            while not self._chunks and not self._ended:
                self._changed.wait()
            if not self._chunks:
                return False
            chunk = self._chunks.popleft()
            self._queued -= len(chunk)
            self._changed.notify_all()
        self._held, self._at = memoryview(chunk), 0
        return True
