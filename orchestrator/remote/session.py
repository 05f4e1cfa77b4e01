"""A persistent command session in a target: one channel, one interpreter, many commands.

Every plain command costs a new SSH channel, a `pct exec` (Perl on a real Proxmox host) and
a process start. A session pays those once: it starts the exec_server payload with the
container's python over one channel and sends it each command as a JSON line. Use it for
many short commands in a row; output arrives when a command ends (not streamed).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Optional

from orchestrator.errors import CommandTimeout, OrchError
from orchestrator.payloads import payload_source
from orchestrator.remote.base import Process, Result, RunOptions, Transport, stdin_bytes
from orchestrator.remote.container import Target

START_TIMEOUT = 30.0


class ExecSession(Transport):
    def __init__(self, target: Target, python: str = "python3"):
        self.target = target
        self.name = target.name
        self.python = python
        self._process: Optional[Process] = None
        self._lock = threading.Lock()
        self._next_id = 0

    def _start(self) -> Process:
        source = payload_source("exec_server").decode()
        try:
            process = self.target.spawn([self.python, "-u", "-c", source])
        except OrchError as error:
            raise OrchError(f"{self.target.describe()}: cannot start a command session with "
                            f"{self.python}: {error}") from None
        try:
            hello = process.readline(START_TIMEOUT)
        except TimeoutError:
            process.close()
            raise OrchError(f"{self.target.describe()}: the command session did not start "
                            f"within {START_TIMEOUT:g} s") from None
        if not hello.startswith(b'{"ready"'):
            process.close()
            raise OrchError(f"{self.target.describe()}: cannot start a command session with "
                            f"{self.python}: {hello.decode(errors='replace').strip() or 'no answer'}")
        return process

    def _run(self, argv: list[str], options: RunOptions) -> Result:
        with self._lock:
            try:
                return self._request(argv, options)
            except (BrokenPipeError, ConnectionError, EOFError):
                self.close()  # the channel dropped: one fresh start, then the error stands
                return self._request(argv, options)

    def _request(self, argv: list[str], options: RunOptions) -> Result:
        if self._process is None:
            self._process = self._start()
        self._next_id += 1
        stdin = stdin_bytes(options.stdin)
        request = {"id": self._next_id, "argv": argv, "timeout": options.timeout, "env": options.env,
                   "stdin": None if stdin is None else base64.b64encode(stdin).decode()}
        started = time.monotonic()
        self._process.write((json.dumps(request) + "\n").encode())
        try:
            line = self._process.readline(None if options.timeout is None else options.timeout + 10)
        except TimeoutError:
            self.close()
            raise CommandTimeout(f"{self.name}: no answer to {argv[0]} within {options.timeout:g} s") from None
        if not line:
            self._process = None
            raise EOFError("session ended")
        return self._result(argv, json.loads(line), options, time.monotonic() - started)

    def _result(self, argv, reply: dict, options: RunOptions, duration: float) -> Result:
        if "error" in reply:
            if reply.get("kind") == "timeout":
                raise CommandTimeout(f"command {argv[0]} on {self.name} did not finish within "
                                     f"{options.timeout:g} s")
            raise OrchError(f"{self.name}: {reply['error']}")
        stdout, stderr = base64.b64decode(reply["stdout"]), base64.b64decode(reply["stderr"])
        for data, callback in ((stdout, options.on_stdout), (stderr, options.on_stderr)):
            if data and callback:
                callback(data)
        if not options.capture:
            stdout = stderr = b""
        return Result(argv, reply["exit_code"], stdout, stderr, duration, self.name)

    def close(self) -> None:
        if self._process is not None:
            self._process.close()
            self._process = None
