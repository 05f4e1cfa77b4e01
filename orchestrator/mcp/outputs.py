"""exec's output, bounded while it streams.

The answer carries each stream's first max_output_bytes, its byte count and stderr's last
TAIL_BYTES (where a failing command says why). An output larger than the answer is also
written, as it arrives, to a file of this server session (up to SPOOL_MAX_BYTES a stream;
SESSION_MAX_BYTES for all of a session, the oldest outputs dropped first), which the client
reads page by page as an MCP resource:

    orch://outputs/{output}/{stream}{?offset,length}     stream: stdout | stderr

So the server's memory does not grow with a command's output (docs/design/mcp.md has the figures),
and nothing of it lands on disk unless it is larger than the answer. The session's budget
is one, shared by every capture as it writes (concurrent execs once wrote 447 MB past it,
checked only as each ended): a capture gets room from it before each write, the oldest
finished outputs dropped to make room; with no room left its spool stops (its answer still
says the stream's whole size). The files live in a
0700 directory under the run store's directory (its name holds the server's pid), removed
when the server stops, or by the next server when the first was killed.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import tempfile
import threading
from typing import BinaryIO, Optional

SPOOL_MAX_BYTES = 256 << 20
SESSION_MAX_BYTES = 1 << 30
TAIL_BYTES = 8 << 10
PAGE_MAX_BYTES = 1 << 20
STREAMS = ("stdout", "stderr")
URI = "orch://outputs/{output}/{stream}"
URI_TEMPLATE = URI + "{?offset,length}"
PREFIX = "mcp-outputs-"
_SESSION_DIR = re.compile(re.escape(PREFIX) + r"(?P<pid>\d+)-\w+$")


class OutputGone(LookupError):
    """An output this session never had, or has dropped (its size cap, the server restarted)."""


class OutputSpool:
    """The spooled outputs of one server session: files named by orch, never by a client."""

    def __init__(self, parent: str):
        self.parent = parent
        self.root: Optional[str] = None
        self._lock = threading.Lock()
        self._next = 0
        self._files: collections.OrderedDict[str, dict[str, str]] = collections.OrderedDict()
        self._sizes: dict[str, int] = {}     # bytes granted to each output (reserve)
        self._live: set = set()              # outputs whose exec still runs

    def new_id(self) -> str:
        with self._lock:
            self._next += 1
            output = f"exec-{self._next}"
            self._live.add(output)
            return output

    def create(self, output: str, stream: str) -> BinaryIO:
        with self._lock:
            if self.root is None:
                os.makedirs(self.parent, mode=0o700, exist_ok=True)
                _sweep_dead_sessions(self.parent)
                self.root = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self.parent)  # 0700
            path = os.path.join(self.root, f"{output}.{stream}")
            self._files.setdefault(output, {})[stream] = path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        return os.fdopen(fd, "wb")

    def reserve(self, output: str, wanted: int) -> int:
        """Room (bytes, up to wanted) for output to write now, in the session's one budget:
        the oldest finished outputs are dropped to make it."""
        with self._lock:
            total = sum(self._sizes.values())
            while total + wanted > SESSION_MAX_BYTES:
                oldest = next((o for o in self._files if o not in self._live and o != output), None)
                if oldest is None:
                    break
                total -= self._drop(oldest)
            granted = max(0, min(wanted, SESSION_MAX_BYTES - total))
            self._sizes[output] = self._sizes.get(output, 0) + granted
            return granted

    def finished(self, output: str) -> None:
        """output's exec ended: its spool may be dropped for later ones."""
        with self._lock:
            self._live.discard(output)
            if output not in self._files:
                self._sizes.pop(output, None)

    def discard(self, output: str) -> None:
        with self._lock:
            self._live.discard(output)
            self._drop(output)

    def _drop(self, output: str) -> int:
        for path in self._files.pop(output, {}).values():
            _remove(path)
        return self._sizes.pop(output, 0)

    def read(self, output: str, stream: str, offset: int, length: int) -> tuple[bytes, int]:
        """(up to length bytes from offset, the spooled size)."""
        with self._lock:
            path = self._files.get(output, {}).get(stream)
        if path is None:
            raise OutputGone(f"no output {output}/{stream} in this server session (outputs are "
                             "kept while the server runs, the oldest dropped past "
                             f"{SESSION_MAX_BYTES >> 20} MiB)")
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(max(0, offset))
                return handle.read(max(1, min(length, PAGE_MAX_BYTES))), size
        except FileNotFoundError:
            raise OutputGone(f"output {output}/{stream} was dropped (the session's size cap)") from None

    def close(self) -> None:
        with self._lock:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
            self.root, self._files = None, collections.OrderedDict()
            self._sizes, self._live = {}, set()


class StreamCapture:
    """One stream of one exec, fed chunk by chunk (a transport's on_stdout/on_stderr)."""

    def __init__(self, stream: str, head_bytes: int, spool: OutputSpool, output: str):
        self.stream, self.head_bytes, self.spool, self.output = stream, head_bytes, spool, output
        self.head = bytearray()
        self.tail = b""
        self.size = 0
        self.spooled = 0
        self._file: Optional[BinaryIO] = None

    def __call__(self, chunk: bytes) -> None:
        kept = max(0, min(len(chunk), self.head_bytes - self.size))
        self.size += len(chunk)
        self.head += chunk[:kept]
        self.tail = (self.tail + chunk[-TAIL_BYTES:])[-TAIL_BYTES:]
        if self.size > self.head_bytes:   # more than the answer holds: spool all of it
            if self._file is None:
                self._file = self.spool.create(self.output, self.stream)
                self._spool(bytes(self.head))
            self._spool(chunk[kept:])

    def _spool(self, data: bytes) -> None:
        room = SPOOL_MAX_BYTES - self.spooled
        if room > 0 and data:
            room = self.spool.reserve(self.output, min(room, len(data)))
            self._file.write(data[:room])
            self.spooled += room

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def answer(self, with_tail: bool = False) -> dict:
        truncated = self.size > self.head_bytes
        head = whole_utf8(bytes(self.head), at_end=not truncated)
        answer = {self.stream: head.decode("utf-8", "replace"),
                  f"{self.stream}_bytes": self.size, f"{self.stream}_truncated": truncated,
                  f"{self.stream}_resource": URI.format(output=self.output, stream=self.stream)
                  if self._file is not None else None}
        if with_tail:
            answer[f"{self.stream}_tail"] = self.tail.decode("utf-8", "replace") if truncated else ""
        return answer


def whole_utf8(data: bytes, at_end: bool) -> bytes:
    """A page cut at max_bytes may end inside a UTF-8 character: leave that character's
    first bytes for the next page (next_offset points at it), so no page decodes to U+FFFD
    where the log has a real character."""
    if at_end:
        return data
    for cut in range(0, min(3, len(data) - 1) + 1):
        try:
            (data[:len(data) - cut] if cut else data).decode("utf-8")
            return data[:len(data) - cut] if cut else data
        except UnicodeDecodeError as error:
            if error.reason != "unexpected end of data":
                return data  # not UTF-8 anyway: the bytes as they are
    return data


def _sweep_dead_sessions(parent: str) -> None:
    """Spools of servers that were killed (no close()): their pid is in the name."""
    for entry in os.listdir(parent):
        match = _SESSION_DIR.match(entry)
        if match and not _alive(int(match["pid"])):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
