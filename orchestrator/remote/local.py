"""The local transport: commands run on this machine, as argv lists, never through a shell."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time

from orchestrator.ground import invocation, paths
from orchestrator.ground.errors import CommandTimeout, OrchError
from orchestrator.remote.base import (BufferedLines, OutputKeeper, Process, Result, RunOptions,
                                      Transport, stdin_pieces, validate_argv)


class LocalTransport(Transport):
    def __init__(self, name: str = "local"):
        self.name = name

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


class _LocalProcess(Process):
    def __init__(self, process: subprocess.Popen):
        self._process = process
        self._lines = BufferedLines(self._read_some)

    def _read_some(self, timeout):
        ready, _, _ = select.select([self._process.stdout], [], [], timeout)
        return os.read(self._process.stdout.fileno(), 65536) if ready else None

    def write(self, data: bytes) -> None:
        try:
            self._process.stdin.write(data)
            self._process.stdin.flush()
        except (ValueError, OSError) as error:  # closed, or the process is gone
            raise BrokenPipeError(str(error)) from None

    def readline(self, timeout):
        return self._lines.readline(timeout)

    def read(self, size, timeout):
        return self._lines.read(size, timeout)

    def close(self) -> None:
        # SIGTERM first: a command server stops the command it runs (in a group of its own)
        # before it exits, as it does when its SSH channel closes
        _kill_group(self._process, signal.SIGTERM)
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_group(self._process)
            self._process.wait()
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


def _kill_group(process: subprocess.Popen, number: int = signal.SIGKILL) -> None:
    try:
        os.killpg(process.pid, number)
    except ProcessLookupError:
        pass


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
