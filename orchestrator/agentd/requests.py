"""One request of the agent, and the process-wide Python state made per request.

A request runs the very click command line `orch` would run, in a thread of its own, with
what the client handed over: its stdin/stdout/stderr (the fds themselves, so output goes
straight to the caller), its environment, working directory and terminal size.
install_process_hooks() makes sys.stdin/stdout/stderr, os.environ, orch's rich consoles and
signal.signal dispatch to the request the running thread belongs to (threads a request
starts work for it too). docs/guide/agent.md says why each is needed.
"""

from __future__ import annotations

import ctypes
import io
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import MutableMapping
from contextlib import contextmanager
from typing import Optional

from rich.console import Console

from orchestrator.cli import app as cli

from orchestrator.ground import console
from orchestrator.remote.paramiko_lib import paramiko

_local = threading.local()


def current() -> Optional["Request"]:
    """The request the running thread works for (None: the agent's own threads)."""
    return getattr(_local, "request", None)


@contextmanager
def detached():
    """What opens here outlives the request (a warm session's channel): it is not filed
    under the request, so the request's end or interrupt does not close it. It still reads
    the request's environment (HOME for ~ paths, SSH_AUTH_SOCK), never the agent's own."""
    request, _local.request = current(), None
    environ, _local.environ = getattr(_local, "environ", None), (request.env if request else None)
    try:
        yield
    finally:
        _local.request, _local.environ = request, environ


@contextmanager
def holding(closable):
    """While a command of this request runs in closable (a warm session), an interrupt of
    the request closes it, as it closes the request's own channels."""
    request = current()
    if request is None:
        yield
        return
    request.channels.add(closable)
    if request.interrupted is not None:
        closable.close()
    try:
        yield
    finally:
        request.channels.discard(closable)


class _Exited(SystemExit):
    """Raised in a request's thread for SIGTERM/SIGHUP: exits with 128+N, as exec's own
    SIGTERM handler does on the direct path."""


def _exit_class(code: int) -> type:
    return type(f"Exit{code}", (_Exited,), {"__init__": lambda self: SystemExit.__init__(self, code)})


class Request:
    """One command line run for one client."""

    def __init__(self, number: int, message: dict):
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
        self._stdio = message.get("stdio") or [{}, {}, {}]
        self.stdin = self.stdout = self.stderr = None   # attach(): the client's own fds
        self._consoles: dict[str, Console] = {}

    def attach(self, fds: list[int]) -> None:
        """The client's stdin, stdout and stderr (they come with its "go")."""
        self.stdin, self.stdout, self.stderr = _streams(fds, self._stdio)

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
            self._consoles[which] = console.make_console(
                file=self.stdout if which == "out" else self.stderr, stderr=which == "err",
                _environ=self.env, **options)
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
        self.finish()
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

    def finish(self) -> None:
        """Flush and close the streams passed by the client (it sees EOF once the agent is done
        with them): at the end of the command, or when the client left before it started."""
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
        if request is not None:
            return request.env
        detached_env = getattr(_local, "environ", None)
        return self._base if detached_env is None else detached_env

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


def install_process_hooks() -> None:
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
        self._orch_environ = getattr(_local, "environ", None)

    def bootstrap(self):
        _local.request = getattr(self, "_orch_request", None)
        _local.environ = getattr(self, "_orch_environ", None)
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
