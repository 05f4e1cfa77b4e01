"""The agent: one background process per user and installation that runs orch's quick
commands with warm SSH connections (docs/agent.md).

Each request runs the very click command line `orch` would run, in a thread of its own, with
what the client handed over: its stdin/stdout/stderr (the fds themselves, so output goes
straight to the caller), its environment, working directory and terminal size. Python's
process-wide state is made per request for these threads (and the threads they start):
sys.stdin/stdout/stderr, os.environ, orch's rich consoles and signal.signal dispatch to the
request the running thread belongs to. Fleets (inventory + open SSH connections) are lent
from a pool keyed by everything the direct path would read to open them.
"""

from __future__ import annotations

import ctypes
import fcntl
import io
import itertools
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import weakref
from collections.abc import MutableMapping
from typing import Optional

import paramiko
from rich.console import Console

from orchestrator import __version__, cli, console
from orchestrator.agent import protocol
from orchestrator.agent.client import FAST_COMMANDS
from orchestrator.config.inventory import inventory_path
from orchestrator.errors import OrchError
from orchestrator.fleet import SSH_CONFIG, Fleet

_local = threading.local()


def current() -> Optional["Request"]:
    """The request the running thread works for (None: the agent's own threads)."""
    return getattr(_local, "request", None)


# ------------------------------------------------------------------ requests
class _Exited(SystemExit):
    """Raised in a request's thread for SIGTERM/SIGHUP: exits with 128+N, as exec's own
    SIGTERM handler does on the direct path."""


def _exit_class(code: int) -> type:
    return type(f"Exit{code}", (_Exited,), {"__init__": lambda self: SystemExit.__init__(self, code)})


class Request:
    """One command line run for one client."""

    def __init__(self, number: int, message: dict, fds: list[int]):
        self.number = number
        self.argv = [str(arg) for arg in message["argv"]]
        self.prog_name = message.get("prog_name") or "orch"
        self.cwd = message["cwd"]
        self.env = {str(k): str(v) for k, v in message["env"].items()}
        self.term_size = message.get("term_size")
        self.started = time.time()
        self.finished = False
        self.leaving = False
        self._lock = threading.Lock()
        self.interrupted: Optional[int] = None
        self.handlers: dict[int, object] = {}
        self.channels: "weakref.WeakSet" = weakref.WeakSet()
        self.lent = []
        self.thread_id: Optional[int] = None
        self.stdin, self.stdout, self.stderr = _streams(fds, message.get("stdio") or [{}, {}, {}])
        self._consoles: dict[str, Console] = {}

    def console(self, which: str) -> Console:
        """orch's rich console for this request, made as console.py makes its own but for
        the client's stream, environment and terminal size."""
        if which not in self._consoles:
            # rich reads the size from fds 0-2, the agent's own: pass the client's (a new
            # pseudo-terminal says 0 x 0, which rich takes as unknown: so do we)
            columns, lines = self.term_size or (0, 0)
            options = {}
            if columns > 0 and "COLUMNS" not in self.env:
                options["width"] = columns
            if lines > 0 and "LINES" not in self.env:
                options["height"] = lines
            self._consoles[which] = Console(
                file=self.stdout if which == "out" else self.stderr, stderr=which == "err",
                highlight=False, soft_wrap=True, _environ=self.env, **options)
        return self._consoles[which]

    def run(self) -> int:
        _local.request = self
        self.thread_id = threading.get_ident()
        try:
            try:
                code = self._click()
            finally:
                with self._lock:
                    self.leaving = True
                    # an interrupt that came too late to matter must not hit what follows
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)
        except BaseException:  # it came between the command's end and the line above
            code = 130 if self.interrupted == signal.SIGINT else 128 + (self.interrupted or 0)
        self._finish()
        _local.request = None
        return code

    def _click(self) -> int:
        try:
            cli.main.main(args=self.argv, prog_name=self.prog_name)
            return 0
        except SystemExit as done:
            return _exit_code(done.code, self.stderr)
        except KeyboardInterrupt:  # outside orch's own handling (while click parses)
            return 130
        except Exception:  # a bug: the direct path prints the traceback too
            try:
                self.stderr.write(traceback.format_exc())
            except Exception:
                pass
            return 1

    def _finish(self) -> None:
        for stream in (self.stdout, self.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        self.finished = True
        for stream in (self.stdin, self.stdout, self.stderr):
            try:
                stream.close()
            except Exception:
                pass
        _restore_std_streams()

    def interrupt(self, number: int) -> None:
        """The client got signal `number`: stop the command as the direct path would."""
        with self._lock:
            if self.leaving or self.thread_id is None:
                return
            self.interrupted = number
            handler = self.handlers.get(number)
            if number == signal.SIGINT and handler in (None, signal.default_int_handler):
                error = KeyboardInterrupt
            else:
                error = _exit_class(128 + number)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id),
                                                       ctypes.py_object(error))
        self.close_channels()

    def close_channels(self) -> None:
        """Close this request's SSH channels: its remote commands run under the reaper,
        which kills them when their channel closes. Other requests' channels stay."""
        for channel in list(self.channels):
            try:
                channel.close()
            except Exception:
                pass


def _streams(fds: list[int], stdio: list[dict]):
    """Text streams over the client's fds, buffered as Python buffers its own."""
    def info(index):
        return stdio[index] if index < len(stdio) and stdio[index] else {}
    stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(fds[0], "r")),
                             encoding=info(0).get("encoding") or "utf-8",
                             errors=info(0).get("errors") or "strict")
    outputs = []
    for index in (1, 2):
        raw = io.FileIO(fds[index], "w")
        tty = raw.isatty()
        outputs.append(io.TextIOWrapper(io.BufferedWriter(raw),
                                        encoding=info(index).get("encoding") or "utf-8",
                                        errors=info(index).get("errors") or "strict",
                                        line_buffering=tty or index == 2))
    return stdin, outputs[0], outputs[1]


def _exit_code(code, stderr) -> int:
    """What the process's exit status would be for sys.exit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        stderr.write(f"{code}\n")
        stderr.flush()
    except Exception:
        pass
    return 1


# ------------------------------------------------------------------ per-request process state
class _RequestStream:
    """Stands for sys.stdin/stdout/stderr: each thread sees its request's stream."""

    def __init__(self, which: str, fallback):
        self._which = which
        self._fallback = fallback

    def _target(self):
        request = current()
        if request is None or request.finished:
            return self._fallback
        return getattr(request, self._which)

    def write(self, data):
        return self._target().write(data)

    def flush(self):
        return self._target().flush()

    def fileno(self):
        return self._target().fileno()

    def isatty(self):
        return self._target().isatty()

    def __iter__(self):
        return iter(self._target())

    def __getattr__(self, name):
        return getattr(self._target(), name)


class _RequestConsole:
    """Stands for console.out / console.err: the request's own rich Console."""

    def __init__(self, which: str, fallback: Console):
        self._which = which
        self._fallback = fallback

    def __getattr__(self, name):
        request = current()
        target = self._fallback if request is None or request.finished else request.console(self._which)
        return getattr(target, name)


class _RequestEnviron(MutableMapping):
    """Stands for os.environ: a request's threads see the client's environment."""

    def __init__(self, base):
        self._base = base

    def _env(self):
        request = current()
        return self._base if request is None else request.env

    def __getitem__(self, key):
        return self._env()[key]

    def __setitem__(self, key, value):
        self._env()[key] = value

    def __delitem__(self, key):
        del self._env()[key]

    def __iter__(self):
        return iter(list(self._env()))

    def __len__(self):
        return len(self._env())

    def copy(self) -> dict:
        return dict(self._env())


_STD_STREAMS: dict[str, object] = {}


def _restore_std_streams() -> None:
    """A command may replace sys.stdout (click does on a broken pipe): put ours back."""
    for name, stream in _STD_STREAMS.items():
        if getattr(sys, name) is not stream:
            setattr(sys, name, stream)


def _install_process_hooks() -> None:
    for name in ("stdin", "stdout", "stderr"):
        _STD_STREAMS[name] = _RequestStream(name, getattr(sys, name))
    _restore_std_streams()
    console.out = _RequestConsole("out", console.out)
    console.err = _RequestConsole("err", console.err)
    os.environ = _RequestEnviron(os.environ)

    # threads a request starts (each_concurrently's pool, stdin feeders) work for it too
    original_init = threading.Thread.__init__
    original_bootstrap = threading.Thread._bootstrap_inner

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._orch_request = current()

    def bootstrap(self):
        _local.request = getattr(self, "_orch_request", None)
        original_bootstrap(self)
    threading.Thread.__init__ = init
    threading.Thread._bootstrap_inner = bootstrap

    # signal handlers belong to the main thread: a request's are kept for the request
    original_signal, original_getsignal = signal.signal, signal.getsignal

    def request_signal(number, handler):
        request = current()
        if request is None:
            return original_signal(number, handler)
        previous = request_getsignal(number)
        request.handlers[number] = handler
        return previous

    def request_getsignal(number):
        request = current()
        if request is None:
            return original_getsignal(number)
        default = signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
        return request.handlers.get(number, default)
    signal.signal, signal.getsignal = request_signal, request_getsignal

    # every channel is filed under its request, so an interrupt closes just those
    original_open_session = paramiko.Transport.open_session

    def open_session(self, *args, **kwargs):
        channel = original_open_session(self, *args, **kwargs)
        request = current()
        if request is not None:
            request.channels.add(channel)
            if request.interrupted is not None:
                channel.close()
        return channel
    paramiko.Transport.open_session = open_session


# ------------------------------------------------------------------ warm fleets
def _file_stamp(path: str):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_ino)


class _Pooled:
    def __init__(self, key, fleet: Fleet, stamp):
        self.key, self.fleet, self.stamp = key, fleet, stamp
        self.leases = 0
        self.retired = False
        self.last_used = time.time()


class LentFleet:
    """A warm fleet as one command sees it: closing it closes only that command's channels
    (each_concurrently closes the fleet on Ctrl-C; others share the connections)."""

    def __init__(self, pooled: _Pooled, request: Request):
        self._pooled = pooled
        self._request = request

    def close(self) -> None:
        self._request.close_channels()

    def __getattr__(self, name):
        return getattr(self._pooled.fleet, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FleetPool:
    """Fleets kept open between commands, one per (inventory file, trust flag, HOME,
    SSH_AUTH_SOCK); one whose inventory, ssh_config, known_hosts or identity files changed
    is retired (closed once no command uses it) and the next command opens a new one."""

    def __init__(self):
        self._pooled: dict[tuple, _Pooled] = {}
        self._lock = threading.Lock()
        self._cwd_lock = threading.Lock()

    def lend(self, inventory_option: Optional[str], trust_on_first_use: bool) -> LentFleet:
        request = current()
        # the inventory's path is relative to the client's directory: resolve and read it
        # there, one request at a time (the working directory is the process's)
        with self._cwd_lock:
            os.chdir(request.cwd)
            try:
                path = os.path.abspath(inventory_path(inventory_option))
                key = (path, trust_on_first_use, os.environ.get("HOME"),
                       os.environ.get("SSH_AUTH_SOCK"))
                pooled = self._usable(key)
                if pooled is None:
                    fleet = Fleet.from_path(inventory_option, trust_on_first_use=trust_on_first_use)
                    pooled = _Pooled(key, fleet, _stamp(fleet, path))
                    with self._lock:
                        self._pooled[key] = pooled
                with self._lock:
                    pooled.leases += 1
                    pooled.last_used = time.time()
            finally:
                os.chdir("/")
        request.lent.append(pooled)
        # the cluster cache lives for one command, as on the direct path (a container may
        # have moved to another node since the last command)
        pooled.fleet.forget_clusters()
        return LentFleet(pooled, request)

    def _usable(self, key) -> Optional[_Pooled]:
        with self._lock:
            pooled = self._pooled.get(key)
        if pooled is None:
            return None
        if _stamp(pooled.fleet, key[0]) == pooled.stamp:
            return pooled
        self._retire(pooled)
        return None

    def _retire(self, pooled: _Pooled) -> None:
        with self._lock:
            if self._pooled.get(pooled.key) is pooled:
                del self._pooled[pooled.key]
            pooled.retired = True
            close = pooled.leases == 0
        if close:
            pooled.fleet.close()

    def give_back(self, request: Request) -> None:
        for pooled in request.lent:
            if request.interrupted is not None:
                # the interrupt was raised asynchronously in the command's thread: in a rare
                # race it lands inside paramiko between a lock's acquire and its try. Open
                # new connections rather than risk a stuck one.
                self._retire(pooled)
            with self._lock:
                pooled.leases -= 1
                pooled.last_used = time.time()
                close = pooled.retired and pooled.leases == 0
            if close:
                pooled.fleet.close()

    def close_all(self) -> None:
        with self._lock:
            pooled = list(self._pooled.values())
            self._pooled.clear()
        for entry in pooled:
            entry.fleet.close()

    def describe(self) -> list[dict]:
        with self._lock:
            pooled = list(self._pooled.values())
        return [{"inventory": p.key[0], "trust_new_host_keys": p.key[1], "commands_running": p.leases,
                 "idle_s": round(time.time() - p.last_used, 1), "hosts": p.fleet.open_hosts()}
                for p in pooled]


def _stamp(fleet: Fleet, inventory_file: str) -> tuple:
    """What the direct path reads to open the fleet's connections, as (file, mtime, size,
    inode): the inventory, ~/.ssh/config, each host's known_hosts and identity files."""
    files = [inventory_file, os.path.expanduser(SSH_CONFIG)]
    for spec in fleet.inventory.hosts.values():
        if spec.transport != "ssh":
            continue
        try:
            settings = fleet.ssh_settings(spec)
        except OrchError:
            continue
        while settings is not None:
            files.append(os.path.expanduser(settings.known_hosts))
            files.extend(os.path.expanduser(p) for p in settings.identity)
            settings = settings.jump
    return tuple((f, _file_stamp(f)) for f in files)


# ------------------------------------------------------------------ the server
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

    # -- life ------------------------------------------------------------------------
    def serve(self) -> None:
        self._listener = self._bind()
        threading.Thread(target=self._watch_idle, name="idle", daemon=True).start()
        while not self._stopping.is_set():
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
        self._stopping.set()
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
        reason = ("no fds" if len(fds) != 3 else "stopping" if self._stopping.is_set()
                  else "orch's code changed since the agent started" if _code_changed() else None)
        if reason:
            for fd in fds:
                os.close(fd)
            protocol.send(conn, {"type": "refused", "reason": reason})
            if reason.startswith("orch's code"):
                _log(self.directory, f"agent {os.getpid()}: {reason}: exiting")
                self.stop()
            return
        try:
            request = Request(next(self._numbers), message, fds)
        except Exception:  # a malformed request: nothing runs
            for fd in fds:
                os.close(fd)
            protocol.send(conn, {"type": "refused", "reason": "malformed request"})
            return
        with self._lock:
            self.served += 1
            self.active[request.number] = request
        try:
            protocol.send(conn, {"type": "accepted", "pid": os.getpid()})
        except OSError:  # the client left before it knew: the command never starts
            self._done(request)
            request._finish()
            return
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

    def _done(self, request: Request) -> None:
        self.pool.give_back(request)
        with self._lock:
            self.active.pop(request.number, None)
            self.last_active = time.monotonic()

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


_CODE_STAMPS: dict[str, int] = {}


def _remember_code() -> None:
    """The files of orch's own modules as loaded now (an upgrade or an edit in place keeps
    the socket name: the agent must not go on serving the old code)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and os.path.abspath(path).startswith(package + os.sep):
            try:
                _CODE_STAMPS[path] = os.stat(path).st_mtime_ns
            except OSError:
                pass


def _code_changed() -> bool:
    for path, stamp in _CODE_STAMPS.items():
        try:
            if os.stat(path).st_mtime_ns != stamp:
                return True
        except OSError:
            return True
    return False


def _same_user(conn: socket.socket) -> bool:
    """SO_PEERCRED: only our own uid may use the agent (the 0700 folder is the first wall)."""
    credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", credentials)
    return uid == os.getuid()


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


def main() -> None:
    """Run the agent in this process until it idles out or is stopped. One per socket: a
    second one started at the same time finds the lock taken and leaves."""
    directory = protocol.private_dir(protocol.agent_dir())
    lock = open(os.path.join(directory, f"agent-{protocol.install_tag()}.lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return
    os.chdir("/")
    for name in FAST_COMMANDS:   # import them now: the first command is as quick as the next
        cli.load_command(name)
    _install_process_hooks()
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
