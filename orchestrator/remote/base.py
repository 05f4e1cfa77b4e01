"""What every transport shares: the Result of a command and the Transport interface.

A command is always an argv list here. Only the transport that must hand a string to a
shell (SSH's exec request) turns it into one, with shlex.join, exactly once.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator, Optional, Sequence, Union

from orchestrator.ground import invocation
from orchestrator.ground.errors import (BadArgument, CommandFailed, CommandTimeout, ConnectionLost,
                                        OrchError)

# Called with each chunk of bytes as it arrives (stdout or stderr).
OutputCallback = Callable[[bytes], None]

# What a command reads: all of it at once, or a binary stream read as it arrives
# (orch exec forwards its own stdin this way, so `(cat; sleep 8) | orch exec ...` streams).
Stdin = Union[bytes, BinaryIO, None]

DEFAULT_TIMEOUT = 120.0
# Linux refuses one argv string longer than this (MAX_ARG_STRLEN, 32 pages, NUL included).
MAX_ARG_BYTES = 131072 - 1
STDIN_PIECE = 1 << 16


@dataclass
class Result:
    """One finished command: what ran, where, how it ended, and everything it printed."""

    argv: list[str]
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: float
    target: str = "local"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def error_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def stderr_tail(self, lines: int = 8) -> list[str]:
        return [line for line in self.error_text.splitlines() if line.strip()][-lines:]

    def display(self, width: int = 80) -> str:
        return display_argv(self.argv, width)

    def check(self, what: Optional[str] = None) -> "Result":
        """Return self when the command succeeded, else raise CommandFailed."""
        if self.exit_code != 0:
            raise CommandFailed(self, what=what)
        return self


@dataclass
class RunOptions:
    """How to run one command; shared by every transport."""

    stdin: Stdin = None
    timeout: Optional[float] = DEFAULT_TIMEOUT
    env: dict[str, str] = field(default_factory=dict)
    on_stdout: Optional[OutputCallback] = None
    on_stderr: Optional[OutputCallback] = None
    # False: output goes only to the callbacks (Result.stdout/stderr keep only their last
    # few KiB), so a command printing gigabytes costs no memory; orch exec streams this way.
    capture: bool = True
    # True: the command's process group is killed when orch stops waiting for it (timeout,
    # Ctrl-C, a lost connection). Container targets reap every command (see Target._run).
    kill_on_close: bool = False
    # True: argv is `python3 - ARGS` of a stdlib payload, which a container may run in a
    # fork of a python3 already running there (the reaper's, a warm session's) instead of
    # a new interpreter (payloads/_inproc.py); other transports run it as it is.
    in_python: bool = False
    # True: a stream of bulk data (orch cp): it gets an SSH channel of its own, never a warm
    # session, whose server would relay every byte once more through Python in the container
    bulk: bool = False


class Transport:
    """Runs argv lists somewhere: this machine, a Proxmox host, or a container on one."""

    name: str = "transport"

    def run(self, argv: Sequence[str], *, stdin: Stdin = None,
            timeout: Optional[float] = DEFAULT_TIMEOUT, env: Optional[dict] = None,
            on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None, check: bool = False,
            capture: bool = True, kill_on_close: bool = False,
            in_python: bool = False, bulk: bool = False) -> Result:
        options = RunOptions(stdin=stdin, timeout=timeout, env=validate_env(env or {}),
                             on_stdout=on_stdout, on_stderr=on_stderr, capture=capture,
                             kill_on_close=kill_on_close, in_python=in_python, bulk=bulk)
        # The command's interrupt closes its channel or kills its process (the transports
        # file them under it): what comes back then is that interrupt, not a broken channel
        interrupt = invocation.current().interrupt
        interrupt.check()
        try:
            result = self._run(validate_argv(argv), options)
        except OrchError:
            interrupt.check()
            raise
        interrupt.check()
        return result.check() if check else result

    def _run(self, argv: list[str], options: RunOptions) -> Result:  # pragma: no cover
        raise NotImplementedError

    def spawn(self, argv: Sequence[str]) -> "Process":  # pragma: no cover
        """Start a long-lived command and keep its stdin/stdout open."""
        raise NotImplementedError

    def close(self) -> None:
        pass


# Bytes of a streamed (not captured) output kept in its Result: enough for the last error
# lines (pct's own sentence ends its stderr), at a constant cost in memory.
STREAMED_TAIL_BYTES = 4096


class OutputKeeper:
    """What one output stream leaves in the Result: all of it when capturing, only its
    last STREAMED_TAIL_BYTES when the caller streams it through a callback."""

    def __init__(self, capture: bool):
        self.capture = capture
        self._chunks: list[bytes] = []
        self._tail = b""

    def add(self, chunk: bytes) -> None:
        if self.capture:
            self._chunks.append(chunk)
        else:
            self._tail = (self._tail + chunk)[-STREAMED_TAIL_BYTES:]

    def value(self) -> bytes:
        return b"".join(self._chunks) if self.capture else self._tail


def with_env(assignments: Sequence[str], argv: Sequence[str]) -> list[str]:
    """`env -- K=V ... ARGV`. env takes every leading word with '=' as an assignment, so a
    program whose own name has one is run through sh's exec, which takes it as a name."""
    runner = ["sh", "-c", 'exec "$@"', "sh"] if "=" in argv[0] else []
    return ["env", "--", *assignments, *runner, *argv]


def validate_argv(argv: Sequence[str]) -> list[str]:
    """An argv must be a non-empty list of strings without NUL bytes (no OS can pass those)."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a list of arguments, not a string")
    argv = list(argv)
    if not argv:
        raise ValueError("empty command")
    if argv[0] == "":
        raise BadArgument("the command's program is an empty string: it names nothing to run",
                          hint="give the program's name or path first (`-- sh -c ''` for a shell)")
    for index, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise TypeError(f"argument {arg!r} is not a string")
        if "\0" in arg:
            raise BadArgument(f"argument {arg!r} contains a NUL byte, which no command can receive")
        size = len(_encodable(arg, f"argument {index}"))
        if size > MAX_ARG_BYTES:
            raise BadArgument(
                f"argument {index} ({_preview(arg)}) is {size} bytes: Linux passes at most "
                f"{MAX_ARG_BYTES} bytes in one argument (MAX_ARG_STRLEN)",
                hint="pass large data on standard input or in a file")
    return argv


def display_argv(argv: Sequence[str], width: int = 80) -> str:
    """argv as a user would type it, cut to width; a non-UTF-8 byte (a lone surrogate
    here) is shown as \\udcXX and never crashes a print."""
    shown = shlex.join(argv).encode("utf-8", "backslashreplace").decode("utf-8")
    return shown if len(shown) <= width else shown[: width - 3] + "..."


def validate_env(env: dict) -> dict[str, str]:
    """Names and values any exec can carry: a name is non-empty without '=', no NUL anywhere."""
    checked = {}
    for name, value in env.items():
        name, value = str(name), str(value)
        if not name or "=" in name or "\0" in name:
            raise BadArgument(f"environment variable name {name!r} is not valid "
                              "(it must be non-empty, without '=' or NUL)")
        if "\0" in value:
            raise BadArgument(f"environment variable {name} has a NUL byte in its value")
        _encodable(name, "an environment variable name")
        _encodable(value, f"environment variable {name}")
        checked[name] = value
    return checked


def encode_arg(text: str) -> bytes:
    """An argument's bytes on the wire: UTF-8, with the undecodable bytes Python kept from
    the command line (lone surrogates, PEP 383) given back as the very same bytes."""
    return text.encode("utf-8", "surrogateescape")


def _encodable(text: str, what: str) -> bytes:
    try:
        return encode_arg(text)
    except UnicodeEncodeError as error:  # a surrogate that stands for no byte
        raise BadArgument(f"{what} ({_preview(text)}) holds {text[error.start]!r}, which is "
                          "no character and no byte: it cannot be sent") from None


def _preview(arg: str) -> str:
    return repr(arg[:20] + "...") if len(arg) > 20 else repr(arg)


def stdin_pieces(stdin: Stdin) -> Iterator[bytes]:
    """The command's input in pieces of at most STDIN_PIECE bytes, read as it arrives."""
    if stdin is None:
        return
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        view = memoryview(stdin)
        for start in range(0, len(view), STDIN_PIECE):
            yield view[start:start + STDIN_PIECE].tobytes()
        return
    fileno = getattr(stdin, "fileno", None)
    if fileno is not None:
        try:
            fd = fileno()
        except (OSError, ValueError):
            fd = None
        if fd is not None:
            # os.read returns what is there now: a line typed into a pipe goes on at once
            for piece in iter(lambda: os.read(fd, STDIN_PIECE), b""):
                yield piece
            return
    reader = getattr(stdin, "read1", None) or stdin.read
    for piece in iter(lambda: reader(STDIN_PIECE), b""):
        yield piece


def stdin_bytes(stdin: Stdin) -> Optional[bytes]:
    """All of the input at once (for transports that need it whole)."""
    if stdin is None or isinstance(stdin, bytes):
        return stdin
    return b"".join(stdin_pieces(stdin))


class LineSplitter:
    """Turns chunks of bytes into whole lines (the last partial line is kept until flushed).

    Linear in the output: each chunk is searched once for its newlines. A line longer than
    max_line is passed on in pieces of max_line bytes, so what is held stays bounded (a
    command that never prints a newline)."""

    MAX_LINE = 8 << 20     # above the launcher's largest event (1 MiB of text, JSON-escaped)

    def __init__(self, on_line: Callable[[str], None], max_line: int = MAX_LINE):
        self._on_line = on_line
        self._max_line = max_line
        self._pending: list[bytes] = []
        self._held = 0

    def feed(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            self._hold(chunk[start:end])
            self._emit()
            start = end + 1
        self._hold(chunk[start:])

    def flush(self) -> None:
        if self._held:
            self._emit()

    def _hold(self, piece: bytes) -> None:
        while piece:
            if self._held >= self._max_line:
                self._emit()
            take = self._max_line - self._held
            self._pending.append(piece[:take])
            self._held += min(take, len(piece))
            piece = piece[take:]

    def _emit(self) -> None:
        line, self._pending, self._held = b"".join(self._pending), [], 0
        self._on_line(line.decode("utf-8", "replace"))


def command_timeout(shown: str, where: str, timeout: float, result: Optional[Result]) -> CommandTimeout:
    """The error for a command that outlived its timeout; `where`: "on host H", "in T"."""
    return CommandTimeout(
        f"command {shown} {where} did not finish within {timeout:g} s", result=result,
        hint="the host may be unreachable or the command slow; raise --timeout if it is slow")


def connection_lost(host: str, shown: str, duration: float, where: str = "",
                    why: str = "") -> ConnectionLost:
    """The error for a command whose connection broke while it ran: its outcome is unknown.
    why: what orch knows of the cause (the host stopped answering keepalives)."""
    error = ConnectionLost(
        f"the connection to host {host} broke while {shown} ran{where} "
        f"(after {duration:.1f} s{'; ' + why if why else ''}): its outcome is unknown",
        hint="the command may still be running there; check before running it again")
    error.why = why
    return error


class Process:
    """A long-lived command with its stdin and stdout kept open (see remote/session.py)."""

    def write(self, data: bytes) -> None:  # pragma: no cover
        raise NotImplementedError

    def readline(self, timeout: Optional[float]) -> bytes:
        """One line including its newline; b"" at end of output; raises TimeoutError."""
        raise NotImplementedError  # pragma: no cover

    def read(self, size: int, timeout: Optional[float]) -> bytes:
        """Exactly size bytes; fewer only at end of output; raises TimeoutError (and then
        keeps what it got for the next call)."""
        raise NotImplementedError  # pragma: no cover

    def close(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def lost_reason(self) -> str:
        """Why its connection was closed under it, when orch closed it (a dead link)."""
        return ""


class BufferedProcess(Process):
    """A Process whose lines and sized reads come from its own `_read_some(timeout)`
    (bytes; None: no data yet; b"": the end), buffered by BufferedLines."""

    def __init__(self):
        self._lines = BufferedLines(self._read_some)

    def _read_some(self, timeout: Optional[float]) -> Optional[bytes]:  # pragma: no cover
        raise NotImplementedError

    def readline(self, timeout: Optional[float]) -> bytes:
        return self._lines.readline(timeout)

    def read(self, size: int, timeout: Optional[float]) -> bytes:
        return self._lines.read(size, timeout)


class BufferedLines:
    """Line reading over a `read_some(timeout) -> bytes | None` function (None: no data yet).

    Linear in the input: the buffer is a bytearray appended to in place, and a line's end
    is searched for in the bytes not yet searched only (a long line arriving in many small
    chunks was searched again from its start, and copied, for every chunk)."""

    def __init__(self, read_some):
        self._read_some = read_some
        self._buffer = bytearray()
        self._searched = 0      # no newline in _buffer[:_searched]

    def readline(self, timeout: Optional[float]) -> bytes:
        end = self._fill(self._line_end, timeout)
        return self._take(len(self._buffer) if end is None else end)

    def read(self, size: int, timeout: Optional[float]) -> bytes:
        end = self._fill(lambda: size if len(self._buffer) >= size else None, timeout)
        return self._take(len(self._buffer) if end is None else end)

    def _line_end(self) -> Optional[int]:
        at = self._buffer.find(b"\n", self._searched)
        if at < 0:
            self._searched = len(self._buffer)
            return None
        return at + 1

    def _take(self, end: int) -> bytes:
        data = bytes(self._buffer[:end])
        del self._buffer[:end]      # from the front of a bytearray: no copy of the rest
        self._searched = 0
        return data

    def _fill(self, enough, timeout: Optional[float]) -> Optional[int]:
        """Read until enough() gives where the answer ends (returned) or the output ends
        (None); TimeoutError at the deadline, with what was read kept for the next call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            end = enough()
            if end is not None:
                return end
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("no answer in time")
            chunk = self._read_some(left)
            if chunk == b"":
                return None
            if chunk is not None:
                self._buffer += chunk
