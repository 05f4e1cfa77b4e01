"""Warm command sessions in a container: one channel, one interpreter, many commands.

Every plain command costs a new SSH channel, a `pct exec` (Perl on a real Proxmox host), a
shell and the reaper's interpreter: about 25 ms here. A session pays those once: it starts
the exec_server payload with the container's python3 over one channel and runs each command
through it, streaming (output as it comes, input as it is typed, a kill on timeout or
Ctrl-C): about 2 ms a command. The agent (docs/guide/agent.md) and the MCP server use them.

- ExecSession: one server, one command at a time.
- SessionPool: a few sessions per container, lent one command at a time.
- SessionTarget: a container Target that runs its commands through the pool when a session
  is free and can take the command, else on a channel of their own, as Target does.

A command is never run twice: the session falls back to the plain path only when the
server said it did not start the command (SessionUnavailable); after it started, a lost
session is the same ConnectionLost the plain path reports.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from typing import Optional

from orchestrator.ground import invocation
from orchestrator.ground.errors import ConnectionLost, ConnectionProblem, OrchError
from orchestrator.payloads import compact_source
from orchestrator.remote.base import (OutputKeeper, Process, Result, RunOptions, Transport,
                                      command_timeout, connection_lost, display_argv,
                                      stdin_pieces)
from orchestrator.remote.container import Target, runs_here

START_TIMEOUT = 30.0
_HEADER = struct.Struct(">cII")   # kind, command id, body length (see payloads/exec_server.py)
_POLL_S = 0.25                    # reads wake this often, so an interrupt is never stuck
_KILL_WAIT_S = 5.0                # after a kill: the server's grace (2 s) and some slack
SESSIONS_PER_TARGET = 2
_SCRIPT_IN_REQUEST_MAX = 1 << 20


class SessionUnavailable(OrchError):
    """The session did not run the command (it could not start, it was gone before the
    command started, or the server could not exec it): run it another way."""


class _Gone(SessionUnavailable):
    """The session's channel was gone before the command started."""


class ExecSession(Transport):
    """The exec_server payload in one container, running one command at a time."""

    def __init__(self, target: Target, python: str = "python3"):
        self.target = target
        self.name = target.name
        self.python = python
        self._process: Optional[Process] = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._next_id = 0
        self._current = 0
        self._in_sync = True   # False while a command's exit has not come back

    def alive(self) -> bool:
        return self._process is not None

    # -- the server --------------------------------------------------------------------
    def start(self) -> None:
        if self._process is not None:
            return
        source = compact_source("exec_server")
        try:
            # -I -S: the server needs nothing but the stdlib; site costs ~10 ms a start
            process = self.target.spawn([self.python, "-I", "-S", "-c", source])
        except ConnectionProblem:
            raise  # the host itself (unreachable, a key refused): the plain path would fail alike
        except OrchError as error:
            raise SessionUnavailable(f"{self.target.describe()}: cannot start a command "
                                     f"session with {self.python}: {error}") from None
        self._process = process
        try:
            frame = self._read_frame(time.monotonic() + START_TIMEOUT)
        except TimeoutError:
            frame = None
        if frame is None or frame[0] != b"R":
            self.close()
            raise SessionUnavailable(f"{self.target.describe()}: no command session with "
                                     f"{self.python} (the container may be stopped or have "
                                     "no python3)")

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.close()

    # -- one command -------------------------------------------------------------------
    def _run(self, argv: list[str], options: RunOptions) -> Result:
        with self._lock:
            reused = self._process is not None
            try:
                return self._run_once(argv, options)
            except _Gone:
                if not reused:
                    raise
                # it died while idle (the container restarted, the link dropped): nothing
                # ran, so one fresh start; a second failure sends the command elsewhere
                return self._run_once(argv, options)

    def _run_once(self, argv: list[str], options: RunOptions) -> Result:
        self.start()
        self._next_id += 1
        ident = self._current = self._next_id
        started = time.monotonic()
        request, stdin = self._request(argv, options)
        body = json.dumps(request).encode()
        try:
            self._send(b"r", ident, body)
            stream = self._feed_input(ident, stdin)
        except BrokenPipeError:
            self.close()
            raise _Gone(f"{self.name}: the command session is gone") from None
        self._in_sync = False
        try:
            return self._collect(argv, ident, options, started, stream)
        except SessionUnavailable:
            raise
        except BaseException:   # a timeout, Ctrl-C, a failed sink, a lost channel
            if not self._in_sync:
                self.close()    # the server kills the command's group when the channel closes
            raise
        finally:
            self._current = 0

    def _collect(self, argv, ident, options: RunOptions, started: float, stream) -> Result:
        out, err = OutputKeeper(options.capture), OutputKeeper(options.capture)
        sinks = {b"o": (out, options.on_stdout), b"e": (err, options.on_stderr)}
        deadline = None if options.timeout is None else started + options.timeout
        began = killed = False
        while True:
            try:
                frame = self._read_frame(deadline)
            except TimeoutError:
                if killed:
                    raise self._timeout(argv, options, out, err, started) from None
                killed = True
                self._send_quietly(b"k", ident)
                deadline = time.monotonic() + _KILL_WAIT_S
                continue
            if frame is None:  # the channel closed under us
                why = self._process.lost_reason() if self._process is not None else ""
                self.close()
                if not began and not why:
                    # it ended before this command's request could matter (it died while
                    # idle); after a dead link the request may have arrived: never a rerun
                    raise _Gone(f"{self.name}: the command session ended")
                if killed:
                    raise self._timeout(argv, options, out, err, started)
                raise connection_lost(self.target.host.name, display_argv(argv),
                                      time.monotonic() - started, f" in {self.name}", why)
            kind, frame_id, body = frame
            if frame_id != ident:
                continue
            if kind == b"s":
                began = True
                if stream is not None:  # read the caller's input only once it has a reader
                    threading.Thread(target=self._send_input, args=(ident, stream),
                                     daemon=True).start()
            elif kind in sinks:
                keeper, callback = sinks[kind]
                keeper.add(body)
                if callback:
                    callback(body)
            elif kind == b"x":
                self._in_sync = True   # the server is ready for the next command
                if killed:
                    raise self._timeout(argv, options, out, err, started)
                code = json.loads(body)["code"]
                return Result(argv, code, out.value(), err.value(), time.monotonic() - started,
                              self.name)
            elif kind == b"n":
                reason = json.loads(body).get("error", "not started")
                raise SessionUnavailable(f"{self.name}: {argv[0]}: {reason}")

    def _request(self, argv: list[str], options: RunOptions) -> tuple[dict, object]:
        """The run request and the input left to send. A `python3 -` payload asked to run
        in-process (RunOptions.in_python) runs in a fork of the server's interpreter, its
        script in the request: the server compiles it once for every container's fork."""
        request: dict = {"argv": argv, "env": options.env}
        stdin = options.stdin
        if options.in_python and runs_here(argv) and argv[0] == self.python:
            request["in_python"] = True
            if isinstance(stdin, bytes) and len(stdin) <= _SCRIPT_IN_REQUEST_MAX:
                try:
                    request["script"], stdin = stdin.decode("utf-8"), None
                except UnicodeDecodeError:
                    pass   # python3 reads it as bytes from stdin: it goes there
        return request, stdin

    def _timeout(self, argv, options, out, err, started):
        result = Result(argv, 124, out.value(), err.value(), time.monotonic() - started, self.name)
        return command_timeout(display_argv(argv), f"in {self.target.describe()}",
                               options.timeout, result)

    def _feed_input(self, ident: int, stdin):
        """Send a small input at once; a stream or a large input is returned, to be sent
        from a thread once the command started (so output flows meanwhile)."""
        if stdin is None:
            self._send(b"c", ident)
            return None
        if isinstance(stdin, (bytes, bytearray, memoryview)) and len(stdin) <= 1 << 20:
            for piece in stdin_pieces(stdin):
                self._send(b"i", ident, piece)
            self._send(b"c", ident)
            return None
        return stdin

    def _send_input(self, ident: int, stdin) -> None:
        try:
            for piece in stdin_pieces(stdin):
                if self._current != ident:
                    return  # the command ended: the rest of the input is not its
                self._send(b"i", ident, piece)
            self._send(b"c", ident)
        except (OSError, ValueError):
            pass  # the session closed: the command's end says what happened

    # -- frames ------------------------------------------------------------------------
    def _send(self, kind: bytes, ident: int, body: bytes = b"") -> None:
        process = self._process
        if process is None:
            raise BrokenPipeError("the command session is closed")
        with self._write_lock:
            process.write(_HEADER.pack(kind, ident, len(body)) + body)

    def _send_quietly(self, kind: bytes, ident: int) -> None:
        try:
            self._send(kind, ident)
        except BrokenPipeError:
            pass

    def _read_frame(self, deadline: Optional[float]):
        """(kind, id, body), None at the end of the channel; TimeoutError at the deadline."""
        header = self._read(_HEADER.size, deadline)
        if len(header) < _HEADER.size:
            return None
        kind, ident, length = _HEADER.unpack(header)
        body = self._read(length, deadline) if length else b""
        return None if len(body) < length else (kind, ident, body)

    def _read(self, size: int, deadline: Optional[float]) -> bytes:
        process = self._process
        if process is None:
            return b""
        while True:
            left = _POLL_S if deadline is None else min(deadline - time.monotonic(), _POLL_S)
            if left <= 0:
                raise TimeoutError("no answer in time")
            try:
                return process.read(size, left)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class SessionPool:
    """Warm sessions, at most `per_target` for each container, each lent to one command at
    a time. A session starts detached from the command that happened to start it (its
    channel outlives that command: its interrupt does not close it); while a command runs
    in it, that command's interrupt closes it (SessionTarget)."""

    def __init__(self, per_target: int = SESSIONS_PER_TARGET):
        self.per_target = per_target
        self._idle: dict[tuple, list[ExecSession]] = {}
        self._busy: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    def key(target: Target) -> tuple:
        return (target.host.name, target.vmid, target.env.get("PATH"))

    def borrow(self, target: Target) -> Optional[ExecSession]:
        """A started session for target; None when all of its sessions are busy, or a new
        one cannot start in the container (the plain path then says why, with its typed
        errors). A host that cannot be reached raises its error here: trying again on the
        plain path would only wait for the same timeout twice."""
        key = self.key(target)
        with self._lock:
            if self._closed:
                return None
            idle = self._idle.setdefault(key, [])
            while idle:
                session = idle.pop()
                if session.alive():
                    self._busy[key] = self._busy.get(key, 0) + 1
                    return session
            if self._busy.get(key, 0) >= self.per_target:
                return None
            self._busy[key] = self._busy.get(key, 0) + 1
        session = ExecSession(target)
        try:
            with invocation.using(invocation.current().detached()):
                session.start()
        except SessionUnavailable:
            self._release(key)
            return None
        except BaseException:
            self._release(key)
            raise
        return session

    def give_back(self, target: Target, session: ExecSession) -> None:
        key = self.key(target)
        with self._lock:
            keep = session.alive() and not self._closed
            if keep:
                self._idle.setdefault(key, []).append(session)
        self._release(key)
        if not keep:
            session.close()

    def _release(self, key) -> None:
        with self._lock:
            self._busy[key] = max(0, self._busy.get(key, 0) - 1)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sessions = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for session in sessions:
            session.close()

    def describe(self) -> list[dict]:
        """Per container: its sessions idle and busy now (for `orch agent status`)."""
        with self._lock:
            rows = [{"host": key[0], "vmid": key[1],
                     "idle": sum(s.alive() for s in self._idle.get(key, [])),
                     "busy": self._busy.get(key, 0)}
                    for key in sorted(set(self._idle) | set(self._busy), key=str)]
        return [row for row in rows if row["idle"] or row["busy"]]


class SessionTarget(Target):
    """A container Target whose commands go through a warm session of the pool when one is
    free; otherwise (all busy, no python3, the container stopped, bulk data) exactly as
    Target."""

    def __init__(self, *args, sessions: SessionPool, **kwargs):
        super().__init__(*args, **kwargs)
        self.sessions = sessions
        self.via = "channel"   # how the last command went: "session" or "channel"

    def _run(self, argv, options: RunOptions) -> Result:
        session = self.sessions.borrow(self) if self.vmid and not options.bulk else None
        self.via = "channel"
        if session is None:
            return super()._run(argv, options)
        started = time.monotonic()
        interrupt = invocation.current().interrupt
        try:
            with interrupt.closing(session):
                result = session._run(argv, options)
        except SessionUnavailable:
            interrupt.check()   # the interrupt closed it: nothing runs on
            return super()._run(argv, options)   # nothing ran: the plain path runs it once
        except ConnectionLost as lost:
            if not lost.why:   # not a dead link: the host can say whether the CT stopped
                self.raise_if_stopped(argv, time.monotonic() - started)
            raise
        finally:
            self.sessions.give_back(self, session)
        self.via = "session"
        result.target = self.name
        return result
