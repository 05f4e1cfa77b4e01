"""The agent: one background process per user and installation that runs orch's quick
commands with warm SSH connections (docs/guide/agent.md).

It listens on a Unix socket in a folder only its user can enter, checks every peer's uid,
and runs each accepted command in a thread of its own (requests.py) with a fleet lent from
its pool (pool.py). It exits when idle, when stopped, or when orch's code changed on disk.
"""

from __future__ import annotations

import fcntl
import glob
import itertools
import json
import os
import signal
import socket
import threading
import time
from typing import Optional

from orchestrator import __version__

from orchestrator.cli import app as cli
from orchestrator.agent import protocol
from orchestrator.ground import commands
from orchestrator.agentd.pool import FleetPool
from orchestrator.agentd.requests import Request

# How long an accepted request waits for its client's "go" (which follows at once).
GO_WAIT_S = 10.0
_LAST_WORDS_S = 5.0   # at exit: the longest wait for connections still being answered


class Agent:
    def __init__(self, directory: str, idle_s: float):
        self.directory = directory
        self.path = protocol.socket_path(directory)
        self.idle_s = idle_s
        self.pool = FleetPool()
        self.started = time.time()
        self.last_active = time.monotonic()
        self.active: dict[int, Request] = {}
        self.served = 0
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._listener: Optional[socket.socket] = None
        self._stopping = threading.Event()
        self._talking = 0   # connections being answered (a command's exit not yet sent)

    # -- life ------------------------------------------------------------------------
    def serve(self) -> None:
        self._listener = self._bind()
        threading.Thread(target=self._watch_idle, name="idle", daemon=True).start()
        while True:   # until stop() closes the listener (once no command runs)
            try:
                conn, _ = self._listener.accept()
            except OSError:
                break
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
        self._shutdown()

    def _bind(self) -> socket.socket:
        # a socket file left by an agent that died refuses connections: replace it
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old_umask)
        listener.listen(128)
        self._inode = os.stat(self.path).st_ino
        return listener

    def stop(self) -> None:
        """Stop once the commands running now end. Until then the socket stays open and
        refuses new commands at once ("stopping"): their clients run them in-process
        without waiting for an agent that cannot start while this one holds the lock."""
        self._stopping.set()
        with self._lock:
            idle = not self.active
        if idle:
            self._close_listener()

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()

    def _shutdown(self) -> None:
        while True:  # commands already accepted run to their end
            with self._lock:
                if not self.active:
                    break
            time.sleep(0.05)
        # and their exit codes reach their clients (sent just after a command leaves
        # `active`); a connection that says nothing is not waited for long
        deadline = time.monotonic() + _LAST_WORDS_S
        while time.monotonic() < deadline:
            with self._lock:
                if not self._talking:
                    break
            time.sleep(0.01)
        self._close_listener()
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass
        self.pool.close_all()
        _log(self.directory, f"agent {os.getpid()} stopped after {self.served} command(s)")
        os._exit(0)

    def _watch_idle(self) -> None:
        while not self._stopping.wait(min(1.0, max(self.idle_s / 4, 0.05))):
            with self._lock:
                idle = not self.active and time.monotonic() - self.last_active >= self.idle_s
            if idle:
                _log(self.directory, f"agent {os.getpid()} idle for {self.idle_s:g} s: exiting")
                self.stop()

    # -- one connection ----------------------------------------------------------------
    def _handle(self, conn: socket.socket) -> None:
        with self._lock:
            self._talking += 1
        try:
            self._converse(conn)
        finally:
            with self._lock:
                self._talking -= 1

    def _converse(self, conn: socket.socket) -> None:
        with conn:
            if not _same_user(conn):
                self._refuse(conn)
                return
            reader = protocol.Reader(conn)
            try:
                message, fds = reader.receive(want_fds=3)
            except (OSError, ValueError):
                return
            if message is None:
                return
            kind = message.get("type")
            try:
                if kind == "run":
                    self._run(conn, reader, message, fds)
                elif kind == "status":
                    protocol.send(conn, {"type": "status", **self.status()})
                elif kind == "stop":
                    protocol.send(conn, {"type": "stopping", "pid": os.getpid()})
                    self.stop()
                else:
                    protocol.send(conn, {"type": "refused", "reason": f"unknown message {kind!r}"})
            except OSError:
                pass
            finally:
                if kind != "run":
                    for fd in fds:
                        os.close(fd)

    @staticmethod
    def _refuse(conn: socket.socket) -> None:
        """Another user: its message is read (so that our answer is not lost to a reset)
        and dropped unparsed, fds closed at once; nothing runs, nothing is shown."""
        conn.settimeout(2.0)
        try:
            data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
            for fd in fds:
                os.close(fd)
            protocol.send(conn, {"type": "refused", "reason": "another user"})
            conn.shutdown(socket.SHUT_WR)
            left = protocol.MAX_MESSAGE
            while data and left > 0:  # the rest of its message, until it closes
                data = conn.recv(65536)
                left -= len(data)
        except OSError:
            pass

    def _run(self, conn, reader, message: dict, fds: list[int]) -> None:
        for fd in fds:   # the client's fds come with its "go", never with "run"
            os.close(fd)
        reason = ("stopping" if self._stopping.is_set()
                  else "orch's code changed since the agent started" if _code_changed() else None)
        if reason:
            protocol.send(conn, {"type": "refused", "reason": reason})
            if reason.startswith("orch's code"):
                _log(self.directory, f"agent {os.getpid()}: {reason}: exiting")
                self.stop()
            return
        try:
            request = Request(next(self._numbers), message)
        except Exception:  # a malformed request: nothing runs
            protocol.send(conn, {"type": "refused", "reason": "malformed request"})
            return
        with self._lock:
            self.served += 1
            self.active[request.number] = request
        fds = self._confirmed(conn, reader)
        if fds is None:  # the client left before it knew, or gave up waiting: it never starts
            self._done(request)
            request.finish()
            return
        request.attach(fds)
        threading.Thread(target=self._follow_client, args=(reader, request), daemon=True).start()
        code = 1
        try:
            code = request.run()
        finally:
            self._done(request)
        try:
            protocol.send(conn, {"type": "exit", "code": code})
        except OSError:
            pass

    @staticmethod
    def _confirmed(conn: socket.socket, reader: protocol.Reader) -> Optional[list[int]]:
        """Say "accepted" and wait for the client's "go", which brings its fds 0, 1 and 2;
        None: no "go" (nothing may run). A client that gave up waiting for "accepted" (this
        agent was frozen or slow) runs the command itself: it must never run here too, and
        its fds must not sit in this socket's queue meanwhile (they hold its caller's pipes
        open: `$(orch exec ...)` would wait for this agent)."""
        conn.settimeout(GO_WAIT_S)
        try:
            protocol.send(conn, {"type": "accepted", "pid": os.getpid()})
            message, fds = reader.receive(want_fds=3)
        except (OSError, ValueError):
            return None
        finally:
            conn.settimeout(None)
        if message and message.get("type") == "go" and len(fds) == 3:
            return fds
        for fd in fds:
            os.close(fd)
        return None

    def _done(self, request: Request) -> None:
        self.pool.give_back(request)
        with self._lock:
            self.active.pop(request.number, None)
            self.last_active = time.monotonic()
            close = self._stopping.is_set() and not self.active
        if close:
            self._close_listener()

    def _follow_client(self, reader: protocol.Reader, request: Request) -> None:
        """Signals the client forwards; a client that vanished counts as SIGHUP."""
        while not request.finished:
            try:
                message, _ = reader.receive()
            except (OSError, ValueError):
                message = None
            if message is None:
                request.interrupt(signal.SIGHUP)
                return
            if message.get("type") == "signal":
                request.interrupt(int(message["signum"]))

    def status(self) -> dict:
        with self._lock:
            running = [{"argv": r.argv, "running_s": round(time.time() - r.started, 1)}
                       for r in self.active.values()]
            idle = 0.0 if self.active else time.monotonic() - self.last_active
        return {"pid": os.getpid(), "version": __version__, "socket": self.path,
                "uptime_s": round(time.time() - self.started, 1), "idle_s": round(idle, 1),
                "idle_exit_s": self.idle_s, "commands_served": self.served,
                "running": running, "fleets": self.pool.describe()}


_CODE_STAMPS: dict[str, tuple] = {}


def _code_stamps(package: Optional[str] = None) -> dict[str, tuple]:
    """(mtime, size, inode) of every file of the installed package (payloads and templates
    too: the agent reads and caches them) and of its wheel's RECORD, found by stat alone:
    about 0.2 ms for orch's hundred files. An upgrade or an edit in place keeps the socket's
    name, so this is how the agent learns it must not go on serving the old code."""
    package = package or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    stamps = {}
    folders = [package]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":   # Python writes there itself
                        folders.append(entry.path)
                else:
                    stamps[entry.path] = _stamp(entry.path)
    for record in glob.glob(os.path.join(os.path.dirname(package), "orch-*.dist-info", "RECORD")):
        stamps[record] = _stamp(record)
    return stamps


def _stamp(path: str):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_ino)


def _remember_code() -> None:
    _CODE_STAMPS.clear()
    _CODE_STAMPS.update(_code_stamps())


def _code_changed() -> bool:
    try:
        return _code_stamps() != _CODE_STAMPS
    except OSError:   # a folder of the package went away: an upgrade in progress
        return True


def _same_user(conn: socket.socket) -> bool:
    """SO_PEERCRED: only our own uid may use the agent (the 0700 folder is the first wall)."""
    return protocol.peer_uid(conn) == os.getuid()


def _log(directory: str, line: str) -> None:
    """The agent's own log: starts, stops, its own failures. Never a command's environment."""
    try:
        with open(os.path.join(directory, f"agent-{protocol.install_tag()}.log"), "a") as log:
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
    except OSError:
        pass


def idle_seconds() -> float:
    value = os.environ.get("ORCH_AGENT_IDLE")
    if not value:
        return protocol.IDLE_DEFAULT_S
    try:
        seconds = float(value)
    except ValueError:
        return protocol.IDLE_DEFAULT_S
    return seconds if seconds > 0 else protocol.IDLE_DEFAULT_S


def _take_lock(lock, wait_s: float = 2.0) -> bool:
    """The agent's lock. Held by another agent: one starting (it serves, this one leaves) or
    one in its last milliseconds of stopping (this one serves next, so the client that
    started it need not wait out START_WAIT_S for nothing)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def main() -> None:
    """Run the agent in this process until it idles out or is stopped. One per socket: a
    second one started at the same time finds the lock taken and leaves."""
    directory = protocol.private_dir(protocol.agent_dir())
    lock = open(os.path.join(directory, f"agent-{protocol.install_tag()}.lock"), "a+")
    if not _take_lock(lock):
        return
    os.chdir("/")
    for command in commands.COMMANDS:   # those it runs, imported now: the first is as quick as the next
        if command.agent is not None:
            cli.load_command(command.name)
    _remember_code()
    agent = Agent(directory, idle_seconds())
    cli.App.fleet_lender = agent.pool
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps({"pid": os.getpid()}))  # for tests and `kill`; status says it too
    lock.flush()
    _log(directory, f"agent {os.getpid()} started (orch {__version__}, idle exit {agent.idle_s:g} s)")
    agent.serve()


if __name__ == "__main__":
    main()
