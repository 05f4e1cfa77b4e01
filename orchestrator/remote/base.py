"""What every transport shares: the Result of a command and the Transport interface.

A command is always an argv list here. Only the transport that must hand a string to a
shell (SSH's exec request) turns it into one, with shlex.join, exactly once.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from orchestrator.errors import CommandFailed

# Called with each chunk of bytes as it arrives (stdout or stderr).
OutputCallback = Callable[[bytes], None]

DEFAULT_TIMEOUT = 120.0


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
        shown = shlex.join(self.argv)
        return shown if len(shown) <= width else shown[: width - 3] + "..."

    def check(self, what: Optional[str] = None) -> "Result":
        """Return self when the command succeeded, else raise CommandFailed."""
        if self.exit_code != 0:
            raise CommandFailed(self, what=what)
        return self


@dataclass
class RunOptions:
    """How to run one command; shared by every transport."""

    stdin: Optional[bytes] = None
    timeout: Optional[float] = DEFAULT_TIMEOUT
    env: dict[str, str] = field(default_factory=dict)
    on_stdout: Optional[OutputCallback] = None
    on_stderr: Optional[OutputCallback] = None


class Transport:
    """Runs argv lists somewhere: this machine, a Proxmox host, or a container on one."""

    name: str = "transport"

    def run(self, argv: Sequence[str], *, stdin: Optional[bytes] = None,
            timeout: Optional[float] = DEFAULT_TIMEOUT, env: Optional[dict] = None,
            on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None, check: bool = False) -> Result:
        options = RunOptions(stdin=stdin, timeout=timeout, env=dict(env or {}),
                             on_stdout=on_stdout, on_stderr=on_stderr)
        result = self._run(validate_argv(argv), options)
        return result.check() if check else result

    def _run(self, argv: list[str], options: RunOptions) -> Result:  # pragma: no cover
        raise NotImplementedError

    def spawn(self, argv: Sequence[str]) -> "Process":  # pragma: no cover
        """Start a long-lived command and keep its stdin/stdout open."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def validate_argv(argv: Sequence[str]) -> list[str]:
    """An argv must be a non-empty list of strings without NUL bytes (no OS can pass those)."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a list of arguments, not a string")
    argv = list(argv)
    if not argv:
        raise ValueError("empty command")
    for arg in argv:
        if not isinstance(arg, str):
            raise TypeError(f"argument {arg!r} is not a string")
        if "\0" in arg:
            raise ValueError(f"argument {arg!r} contains a NUL byte, which no command can receive")
    return argv


class LineSplitter:
    """Turns chunks of bytes into whole lines (the last partial line is kept until flushed)."""

    def __init__(self, on_line: Callable[[str], None]):
        self._on_line = on_line
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self._on_line(line.decode("utf-8", "replace"))

    def flush(self) -> None:
        if self._pending:
            line, self._pending = self._pending, b""
            self._on_line(line.decode("utf-8", "replace"))


class Process:
    """A long-lived command with its stdin and stdout kept open (see remote/session.py)."""

    def write(self, data: bytes) -> None:  # pragma: no cover
        raise NotImplementedError

    def readline(self, timeout: Optional[float]) -> bytes:
        """One line including its newline; b"" at end of output; raises TimeoutError."""
        raise NotImplementedError  # pragma: no cover

    def close(self) -> None:  # pragma: no cover
        raise NotImplementedError


class BufferedLines:
    """Line reading over a `read_some(timeout) -> bytes | None` function (None: no data yet)."""

    def __init__(self, read_some):
        self._read_some = read_some
        self._buffer = b""

    def readline(self, timeout: Optional[float]) -> bytes:
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("no answer in time")
            chunk = self._read_some(left)
            if chunk is None:
                continue
            if chunk == b"":
                line, self._buffer = self._buffer, b""
                return line
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"
