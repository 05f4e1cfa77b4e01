"""The local transport: commands run on this machine, as argv lists, never through a shell."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from contextlib import contextmanager

from orchestrator.ground import invocation, paths
from orchestrator.ground.errors import CommandTimeout, OrchError
from orchestrator.remote.base import (BufferedProcess, OutputKeeper, Process, Result, RunOptions,
                                      Transport, stdin_pieces, validate_argv)

_READ_SLICE_S = 0.25


class LocalTransport(Transport):
    def __init__(self, name: str = "local"):
        self.name = name

    @contextmanager
    def terminal(self, argv, term: str, size: tuple[int, int]):
        """argv on a new pty of `size` (columns, lines) with TERM `term`, as SshHost.terminal;
        yields (channel, why): a local command has no link to lose."""
        channel = _PtyChannel(validate_argv(argv), term, size)
        try:
            yield channel, lambda: ""
        finally:
            channel.close()

    def _run(self, argv: list[str], options: RunOptions) -> Result:
        started = time.monotonic()
        command = invocation.current()   # its environment and folder, as a shell's would be
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.PIPE if options.stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={**command.env, **options.env}, cwd=command.cwd, start_new_session=True,
                umask=paths.user_umask())
        except FileNotFoundError:
            raise OrchError(f"{argv[0]}: command not found on {self.name}") from None
        except PermissionError:
            raise OrchError(f"{argv[0]}: permission denied on {self.name}") from None
        readers = [_start_reader(process, process.stdout, options.on_stdout, options.capture),
                   _start_reader(process, process.stderr, options.on_stderr, options.capture)]
        if options.stdin is not None:
            threading.Thread(target=_feed_stdin, args=(process.stdin, options.stdin),
                             daemon=True).start()
        # the command's interrupt kills it, as Ctrl-C in a shell would its process group
        forget = command.interrupt.on_set(lambda: _kill_group(process))
        try:
            exit_code = process.wait(timeout=options.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            result = _collect(argv, process.wait(), readers, started, self.name)
            raise CommandTimeout(
                f"command {result.display()} on {self.name} did not finish within "
                f"{options.timeout:g} s and was killed", result=result) from None
        finally:
            forget()
        return _collect(argv, exit_code, readers, started, self.name)


    def spawn(self, argv) -> Process:
        try:
            process = subprocess.Popen(validate_argv(argv), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       start_new_session=True, umask=paths.user_umask())
        except (FileNotFoundError, PermissionError) as error:
            raise OrchError(f"{argv[0]}: {error.strerror} on {self.name}") from None
        return _LocalProcess(process)


class _LocalProcess(BufferedProcess):
    def __init__(self, process: subprocess.Popen):
        self._process = process
        super().__init__()
        # close() may run in another thread while a reader waits (a session closed under
        # its command): the pipe is closed only between reads, and a read after it is the
        # end of the output, never a ValueError from a closed file (or a read from the
        # unrelated file that got its descriptor number meanwhile)
        self._pipe_lock = threading.Lock()
        self._closed = False

    def _read_some(self, timeout):
        with self._pipe_lock:
            if self._closed:
                return b""
            # in slices, so a close() waits at most one slice for the lock
            wait = _READ_SLICE_S if timeout is None else min(timeout, _READ_SLICE_S)
            ready, _, _ = select.select([self._process.stdout], [], [], wait)
            return os.read(self._process.stdout.fileno(), 65536) if ready else None

    def write(self, data: bytes) -> None:
        try:
            self._process.stdin.write(data)
            self._process.stdin.flush()
        except (ValueError, OSError) as error:  # closed, or the process is gone
            raise BrokenPipeError(str(error)) from None

    def close(self) -> None:
        # SIGTERM first: a command server stops the command it runs (in a group of its own)
        # before it exits, as it does when its SSH channel closes
        _stop_group(self._process, signal.SIGTERM)
        # the process has exited: a reader's select sees the end at once and lets go
        with self._pipe_lock:
            self._closed = True
            for pipe in (self._process.stdin, self._process.stdout):
                pipe.close()


class _Reader(threading.Thread):
    """Drains one pipe so the child never blocks on a full pipe, forwarding chunks live."""

    def __init__(self, process, pipe, callback, capture: bool = True):
        super().__init__(daemon=True)
        self.process, self.pipe, self.callback = process, pipe, callback
        self.output, self.error = OutputKeeper(capture), None

    def run(self) -> None:
        for chunk in iter(lambda: self.pipe.read1(65536), b""):
            self.output.add(chunk)
            if self.callback and self.error is None:
                try:
                    self.callback(chunk)
                except BaseException as error:  # the caller's sink failed: stop the command,
                    self.error = error            # and let the caller's thread raise it
                    _kill_group(self.process)
        self.pipe.close()


def _start_reader(process, pipe, callback, capture: bool = True) -> _Reader:
    reader = _Reader(process, pipe, callback, capture)
    reader.start()
    return reader


def _feed_stdin(pipe, stdin) -> None:
    try:
        for piece in stdin_pieces(stdin):
            pipe.write(piece)
            pipe.flush()
        pipe.close()
    except (BrokenPipeError, ValueError):  # the command stopped reading; its exit code tells
        pass


def _take_the_terminal() -> None:
    """In the child: the pty becomes the new session's terminal, and Ctrl-C and Ctrl-\\ do
    there what they do on any terminal. orch's own dispositions are not the command's: an
    orch started with SIGINT ignored (a script's background job) would pass that on, and a
    shell on the pty could then not even trap Ctrl-C."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    for number in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)


class _PtyChannel:
    """A command on a pty of its own on this machine, with the methods of an SSH channel
    that remote/terminal.py's relay uses: the local half of `orch shell` for a host orch
    runs on (the controller on the Proxmox node itself)."""

    def __init__(self, argv, term: str, size: tuple[int, int]):
        command = invocation.current()
        self._master, slave = pty.openpty()
        self.resize_pty(*size, fd=slave)
        try:
            # setsid (start_new_session), then the pty becomes the session's terminal:
            # Ctrl-C there is a SIGINT to the command's foreground job, not to orch
            self._process = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, cwd=command.cwd,
                env={**command.env, "TERM": term}, start_new_session=True,
                preexec_fn=_take_the_terminal)
        except OSError as error:
            os.close(self._master)
            raise OrchError(f"{argv[0]}: {error.strerror or error}") from None
        finally:
            os.close(slave)
        self.closed = False

    def fileno(self) -> int:
        return self._master

    def recv(self, size: int) -> bytes:
        try:
            data = os.read(self._master, size)
        except OSError:   # EIO: every holder of the pty's other side is gone
            data = b""
        self.closed = self.closed or not data
        return data

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._master, view):]

    def resize_pty(self, width: int, height: int, fd=None) -> None:
        # on the master side too: the kernel sends SIGWINCH to the pty's foreground job
        fcntl.ioctl(self._master if fd is None else fd, termios.TIOCSWINSZ,
                    struct.pack("HHHH", height, width, 0, 0))

    def shutdown_write(self) -> None:
        pass   # a terminal has no end of input of its own: Ctrl-D is a key like the others

    def exit_status_ready(self) -> bool:
        return self._process.poll() is not None

    @property
    def exit_status(self) -> int:
        code = self._process.returncode
        return 128 - code if code < 0 else code   # killed by signal N: 128+N, as a shell says

    def close(self) -> None:
        """Hang up, as a closed terminal does: the command's group gets SIGHUP."""
        if self._process.poll() is None:
            _stop_group(self._process, signal.SIGHUP)
        if self._master >= 0:
            os.close(self._master)
            self._master = -1


def _kill_group(process: subprocess.Popen, number: int = signal.SIGKILL) -> None:
    try:
        os.killpg(process.pid, number)
    except ProcessLookupError:
        pass


def _stop_group(process: subprocess.Popen, first: int) -> None:
    """Signal the process's group with `first`, give it 5 s to exit, then SIGKILL; returns
    when the process has exited."""
    _kill_group(process, first)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.wait()


def _collect(argv, exit_code, readers, started, target) -> Result:
    for reader in readers:
        reader.join(timeout=5)
    for reader in readers:
        if reader.error is not None:
            raise reader.error
    # A negative code means "killed by signal N"; report it the way a shell would.
    code = 128 - exit_code if exit_code < 0 else exit_code
    stdout, stderr = (reader.output.value() for reader in readers)
    return Result(argv, code, stdout, stderr, time.monotonic() - started, target)
