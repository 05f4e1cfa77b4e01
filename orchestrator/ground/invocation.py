"""One command's world: its streams, environment, working directory, terminal size and
interrupt, as one object handed down instead of read from process globals.

The direct path builds it from the process (`from_process`: sys.*, os.environ, the working
directory); the agent builds one per request from what the client sent (docs/guide/agent.md), so
two commands running at once in one process each see their own. The click group puts it
on the context (`App.invocation`) and makes it current for the command's thread (`using`);
code below the commands that needs it without a parameter (the consoles, a transport filing
its channels under the interrupt, the fleet reading HOME) asks `current()`. A thread a
command starts gets it explicitly (`bind`): threads never inherit it.
"""

from __future__ import annotations

import contextvars
import os
import pwd
import signal
import sys
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, TextIO


class Interrupt:
    """Set when the command is to stop (the client's Ctrl-C, SIGTERM, SIGHUP): what blocks
    on a channel or a process registers it with `closing`, and setting the token closes
    them all, which wakes the thread waiting on them; that thread then calls `check()`,
    which raises what the direct path's signal would (KeyboardInterrupt for SIGINT, else
    SystemExit(128+N), as exec's SIGTERM handler does). Nothing is raised asynchronously."""

    def __init__(self):
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._closables: "weakref.WeakSet" = weakref.WeakSet()
        self._callbacks: list[Callable[[], object]] = []
        self.signal: Optional[int] = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self, number: int = signal.SIGINT) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.signal = number
            self._event.set()
            closables, callbacks = list(self._closables), list(self._callbacks)
        for closable in closables:
            _quietly(closable.close)
        for callback in callbacks:
            _quietly(callback)

    def file(self, closable) -> None:
        """Close `closable` (a channel, a session, a process) when the token is set; at once
        when it is set already. Held weakly: a closed channel is forgotten by itself."""
        with self._lock:
            if not self._event.is_set():
                self._closables.add(closable)
                return
        _quietly(closable.close)

    def close_filed(self) -> None:
        """Close what is filed now without setting the token (the command's fleet closing:
        its channels, never the shared connections)."""
        with self._lock:
            closables = list(self._closables)
        for closable in closables:
            _quietly(closable.close)

    def forget(self, closable) -> None:
        with self._lock:
            self._closables.discard(closable)

    @contextmanager
    def closing(self, closable):
        """While inside, setting the token closes `closable`."""
        self.file(closable)
        try:
            yield closable
        finally:
            self.forget(closable)

    def on_set(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback` when the token is set (now, if it is); returns its removal."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._remove(callback)
        _quietly(callback)
        return lambda: None

    def _remove(self, callback) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def check(self) -> None:
        """Raise what the signal would have raised, when the token is set."""
        if not self._event.is_set():
            return
        if self.signal == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + (self.signal or 0))


class _Never(Interrupt):
    """The token of what outlives a command (a warm session's channel): never set, files
    nothing."""

    def set(self, number: int = signal.SIGINT) -> None:
        pass

    def file(self, closable) -> None:
        pass


@dataclass
class Invocation:
    """One command's streams, environment, folder, terminal size and interrupt."""

    stdin: TextIO
    stdout: TextIO
    stderr: TextIO
    env: Mapping[str, str]
    cwd: str
    term_size: Optional[tuple[int, int]] = None
    interrupt: Interrupt = field(default_factory=Interrupt)
    # signals reach this command as the process's own (the direct path's main thread): it
    # may install handlers; otherwise (the agent) the interrupt token is how they arrive
    owns_signals: bool = False
    consoles: dict = field(default_factory=dict, repr=False, compare=False)

    # -- paths ------------------------------------------------------------------------
    def expanduser(self, path: str) -> str:
        """os.path.expanduser with this invocation's HOME."""
        path = os.fspath(path)
        if not path.startswith("~"):
            return path
        head, sep, rest = path[1:].partition("/")
        if head:
            try:
                home = pwd.getpwnam(head).pw_dir
            except KeyError:
                return path
        else:
            home = self.env.get("HOME") or _passwd_home()
            if home is None:
                return path
        return home.rstrip("/") + (sep + rest if sep else "") if home != "/" else "/" + rest

    def path(self, path: str) -> str:
        """A path the user typed or wrote (`~` expanded, relative to the working directory),
        as an absolute file name."""
        return os.path.normpath(os.path.join(self.cwd, self.expanduser(path)))

    # -- printing ---------------------------------------------------------------------
    def console_options(self, which: str) -> dict:
        """How orch's rich console for stdout ("out") or stderr ("err") is made for this
        invocation (ground/console.py builds and keeps it in `consoles`). rich reads the
        terminal's size from fds 0-2 and its colours from os.environ, the process's: this
        passes the invocation's (a new pseudo-terminal says 0 x 0, which rich takes as
        unknown: so do we)."""
        columns, lines = self.term_size or (0, 0)
        options: dict[str, Any] = {"file": self.stdout if which == "out" else self.stderr,
                                   "_environ": dict(self.env)}
        if columns > 0 and "COLUMNS" not in self.env:
            options["width"] = columns
        if lines > 0 and "LINES" not in self.env:
            options["height"] = lines
        return options

    def discard_stdout(self) -> None:
        """The reader of stdout left (`orch exec ... | head`): what is still buffered goes
        to /dev/null, so the flush at the end cannot fail with a broken pipe (Python's
        signal docs, "Note on SIGPIPE")."""
        try:
            fd = self.stdout.fileno()
        except (OSError, ValueError, AttributeError):
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)

    # -- signals ----------------------------------------------------------------------
    @contextmanager
    def signal_handler(self, number: int, handler):
        """`handler` for signal `number` while inside, where this command owns the process's
        signals; elsewhere (the agent) the interrupt token delivers them and this does
        nothing. Yields whether the handler was installed."""
        if not self.owns_signals:
            yield False
            return
        previous = signal.signal(number, handler)
        try:
            yield True
        finally:
            signal.signal(number, previous)

    @contextmanager
    def ctrl_c_outside_locks(self):
        """Ctrl-C for the direct path's command: Python's own KeyboardInterrupt, except
        where it would land inside paramiko. Raised there, between a lock's acquire() and
        the try that releases it, it leaves the transport's send lock held, and every later
        request on that connection waits for ever (seen: an `orch run` hung 72 minutes after
        Ctrl-C). Inside paramiko the press sets the interrupt token instead, as the agent's
        client does: the token closes the command's channels, which wakes the thread, and
        the transport raises KeyboardInterrupt on its way out (remote/base.py). A second
        press raises at once, wherever it lands."""
        def on_ctrl_c(number, frame):
            if self.interrupt.is_set() or not _inside(frame, _LOCK_HOLDING_LIBRARIES):
                raise KeyboardInterrupt
            self.interrupt.set(number)
        with self.signal_handler(signal.SIGINT, on_ctrl_c):
            yield

    def detached(self) -> "Invocation":
        """The same world with an interrupt that never fires: for what is opened now to
        outlive this command (a warm session's channel)."""
        return Invocation(self.stdin, self.stdout, self.stderr, self.env, self.cwd,
                          self.term_size, interrupt=_Never())


# Libraries that take locks a KeyboardInterrupt must not land between (see
# ctrl_c_outside_locks); the packages' top-level names.
_LOCK_HOLDING_LIBRARIES = ("paramiko",)
_FRAMES_LOOKED_AT = 64   # a signal arrives deep in a call, never deeper than this below us


def _inside(frame, packages: tuple[str, ...]) -> bool:
    """Whether one of the frames from `frame` outwards runs code of one of `packages`."""
    for _ in range(_FRAMES_LOOKED_AT):
        if frame is None:
            return False
        module = frame.f_globals.get("__name__") or ""
        if module.partition(".")[0] in packages:
            return True
        frame = frame.f_back
    return False


class _ProcessInvocation(Invocation):
    """The process itself, read when asked: the streams sys holds now (pytest and click's
    test runner replace them), os.environ, the working directory of the moment."""

    def __init__(self):
        super().__init__(stdin=None, stdout=None, stderr=None, env=os.environ, cwd="",
                         owns_signals=True)

    def __getattribute__(self, name):
        if name in ("stdin", "stdout", "stderr"):
            return getattr(sys, name)
        if name == "cwd":
            return os.getcwd()
        if name == "owns_signals":
            return threading.current_thread() is threading.main_thread()
        return super().__getattribute__(name)

    def __setattr__(self, name, value):
        if name in ("stdin", "stdout", "stderr", "cwd", "owns_signals"):
            return
        super().__setattr__(name, value)

    def console_options(self, which: str) -> dict:
        return {}   # no file: rich writes to sys.stdout/sys.stderr as they are at each print


_PROCESS = _ProcessInvocation()
_CURRENT: contextvars.ContextVar[Invocation] = contextvars.ContextVar("orch_invocation")


def from_process() -> Invocation:
    """The direct path's invocation: the process's own streams, environment and folder,
    with an interrupt token of its own for each command (one set by a Ctrl-C'd command
    must not close the next one's channels: tests run many commands in one process)."""
    _PROCESS.interrupt = Interrupt()
    return _PROCESS


def current() -> Invocation:
    """The invocation the running code works for: the one `using` made current in this
    thread (or handed to it with `bind`), else the process's own."""
    return _CURRENT.get(_PROCESS)


@contextmanager
def using(invocation: Invocation):
    token = _CURRENT.set(invocation)
    try:
        yield invocation
    finally:
        _CURRENT.reset(token)


def bind(function: Callable) -> Callable:
    """`function` as it would run here, to run in another thread: it sees the current
    invocation (a thread starts with none)."""
    invocation = current()

    def bound(*args, **kwargs):
        with using(invocation):
            return function(*args, **kwargs)
    return bound


def _passwd_home() -> Optional[str]:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return None


def _quietly(close: Callable[[], object]) -> None:
    try:
        close()
    except Exception:
        pass
