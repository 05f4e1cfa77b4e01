"""One request of the agent: a command line run for one client.

A request runs the very click command line `orch` would run, in a thread of its own, with
what the client handed over: its stdin/stdout/stderr (the fds themselves, so output goes
straight to the caller), its environment, working directory and terminal size. They travel
as the command's Invocation (orchestrator/ground/invocation.py), handed to click as `obj`:
nothing process-wide is swapped, so requests running at once never see each other's. The
client's signals set the invocation's interrupt token, which closes the request's channels
and sessions; the command's thread wakes and stops as the direct path would
(docs/guide/agent.md).
"""

from __future__ import annotations

import io
import time
import traceback
from typing import Optional

import click

from orchestrator.cli import app as cli
from orchestrator.ground.invocation import Invocation


class Request:
    """One command line run for one client."""

    def __init__(self, number: int, message: dict):
        self.number = number
        self.argv = [str(arg) for arg in message["argv"]]
        self.prog_name = message.get("prog_name") or "orch"
        self.cwd = str(message["cwd"])
        self.env = {str(k): str(v) for k, v in message["env"].items()}
        size = message.get("term_size")
        self.term_size = (int(size[0]), int(size[1])) if size else None
        self.started = time.time()
        self.finished = False
        self._stdio = message.get("stdio") or [{}, {}, {}]
        self.stdin = self.stdout = self.stderr = None   # attach(): the client's own fds
        self.invocation: Optional[Invocation] = None

    def attach(self, fds: list[int]) -> None:
        """The client's stdin, stdout and stderr (they come with its "go")."""
        self.stdin, self.stdout, self.stderr = _streams(fds, self._stdio)
        self.invocation = Invocation(self.stdin, self.stdout, self.stderr, env=self.env,
                                     cwd=self.cwd, term_size=self.term_size)

    def run(self) -> int:
        code = self._click()
        self.finish()
        return code

    def _click(self) -> int:
        """The command line as click's standalone mode runs it on the direct path, its
        messages written to the client's stderr rather than the agent's."""
        try:
            return cli.main.main(args=self.argv, prog_name=self.prog_name, obj=self.invocation,
                                 standalone_mode=False) or 0
        except SystemExit as done:   # a signal's exit (128+N), or code that exits anyway
            return _exit_code(done.code, self.stderr)
        except click.ClickException as error:
            error.show(file=self.stderr)
            return error.exit_code
        except click.Abort:
            self._write("Aborted!\n")
            return 1
        except Exception:  # a bug: the direct path prints the traceback too
            self._write(traceback.format_exc())
            return 1

    def _write(self, text: str) -> None:
        try:
            self.stderr.write(text)
            self.stderr.flush()
        except Exception:
            pass

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

    def interrupt(self, number: int) -> None:
        """The client got signal `number`: stop the command as the direct path would. The
        token closes this request's channels and sessions (their remote commands run under
        the reaper or the session's server, which kill them when the channel closes; other
        requests' stay) and the command's thread, woken, raises what the signal would."""
        if self.invocation is not None and not self.finished:
            self.invocation.interrupt.set(number)


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

