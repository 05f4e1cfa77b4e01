"""Typed errors, each with a sentence a user can act on, and orch's exit codes.

Every command maps an OrchError to its exit code in one place (cli.main), so a user
never sees a traceback for a mistake they can fix.
"""

from __future__ import annotations


class ExitCode:
    """Documented exit codes: EXIT_CODE_MEANINGS below, docs/reference/exit-codes.md."""

    OK = 0
    FAILED = 1            # the thing ran and failed (a check failed, a verdict is "failed")
    USAGE = 2             # bad command line, inventory or playbook
    UNREACHABLE = 3       # host unreachable, auth refused, host key unknown or changed
    NO_CONTAINER = 4      # no such container, or it is not running
    TIMEOUT = 5           # a remote command outlived its timeout
    REMOTE_FAILED = 6     # a remote command exited non-zero where orch needed success
    NEEDS_GPU = 7         # a check that needs a GPU the target does not have (verify compile-deadlock)
    # orch run / orch nightly verdicts
    RUN_FAILED = 10       # FX race, traceback, OOM, non-zero exit, killed
    RUN_HANG = 11         # no progress for hang_after seconds while the process lived
    RUN_DEGRADED = 12     # ran, but below the playbook's throughput threshold
    RUN_UNREACHABLE = 13  # a target could not be reached during the run
    REGRESSION = 20       # nightly: compared with the baseline, something got worse
    LOCKED = 21           # nightly: another nightly of the same playbook is running;
    #                       patch: another orch patch action on that torch outlasted the wait
    INTERRUPTED = 130     # Ctrl-C (128 + SIGINT), as shells report it
    # orch exec: the remote exit code is passed through; orch's own failures use 255, as ssh does
    EXEC_ORCH_ERROR = 255


# What each code means to a user: the text of docs/reference/exit-codes.md (orchestrator.cli.reference).
EXIT_CODE_MEANINGS = {
    ExitCode.OK: "ok",
    ExitCode.FAILED: "failed: a check failed, no grep hit, a target vulnerable, a command refused",
    ExitCode.USAGE: "usage: bad command line, inventory or playbook (the message names file:line:col)",
    ExitCode.UNREACHABLE: "unreachable: host down, authentication refused, host key unknown or changed",
    ExitCode.NO_CONTAINER: "no such container, or it is not running",
    ExitCode.TIMEOUT: "a remote command timed out",
    ExitCode.REMOTE_FAILED: "a remote command orch needed failed (exit code and last stderr lines shown)",
    ExitCode.RUN_FAILED: "run failed: FX race, traceback, OOM, non-zero exit, killed, collective or "
                         "rendezvous timeout; abandoned (its orch died without a verdict: settled by "
                         "attach, stop or `runs abandon`)",
    ExitCode.RUN_HANG: "run hung (no progress for `hang_after` s; the process was stopped)",
    ExitCode.RUN_DEGRADED: "run degraded (below the playbook's throughput threshold), or the "
                           "recompile limit was hit",
    ExitCode.NEEDS_GPU: "needs a GPU: `orch verify compile-deadlock` on a target without CUDA (on CPU "
                        "backward runs on the calling thread and the cycle cannot form); nothing was run",
    ExitCode.RUN_UNREACHABLE: "a target was unreachable during the run",
    ExitCode.REGRESSION: "nightly: a regression against the baseline",
    ExitCode.LOCKED: "busy: another nightly of the same playbook is still running, or another "
                     "`patch` apply/revert held the torch tree's lock for 15 s",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C): `orch run` says whether a launched run goes on (the "
                          "record stays running for `orch attach`) or nothing was launched (recorded "
                          "as interrupted); `patch ... apply`/`revert` let the change finish and print "
                          "its outcome",
    ExitCode.EXEC_ORCH_ERROR: "`orch exec` and `orch shell`: orch's own errors (host unreachable, a "
                              "connection lost or a dead link mid-command, a timeout; an agent that accepted `exec "
                              "--timeout N` and did not answer within N + 8 s); any quick command: the "
                              "warm agent ended while it ran the command (its outcome is unknown; it "
                              "is never run a second time)",
}


class OrchError(Exception):
    """Base of every error orch reports to a user (message, not traceback)."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class ConfigError(OrchError):
    """A mistake in an inventory or playbook; the message names file:line:col."""

    exit_code = ExitCode.USAGE


class BadArgument(OrchError, ValueError):
    """An argument or environment value no command can receive (NUL byte, too long)."""

    exit_code = ExitCode.USAGE


class ConnectionProblem(OrchError):
    exit_code = ExitCode.UNREACHABLE


class HostUnreachable(ConnectionProblem):
    pass


class ConnectionLost(HostUnreachable):
    """The connection broke while a command ran: its outcome is unknown. why: what orch
    knows of the cause ("" when the connection merely closed)."""

    why = ""


class ChannelRefused(ConnectionProblem):
    """The host's sshd refused to open a session channel (MaxSessions, or a policy)."""


class AuthRefused(ConnectionProblem):
    pass


class HostKeyUnknown(ConnectionProblem):
    pass


class HostKeyChanged(ConnectionProblem):
    pass


class HostKeyRevoked(ConnectionProblem):
    """The host's key is marked @revoked in known_hosts."""


class ContainerProblem(OrchError):
    exit_code = ExitCode.NO_CONTAINER


class NoSuchContainer(ContainerProblem):
    pass


class ContainerNotRunning(ContainerProblem):
    pass


class CommandTimeout(OrchError):
    exit_code = ExitCode.TIMEOUT

    def __init__(self, message: str, *, result=None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.result = result


class CommandFailed(OrchError):
    """A remote command exited non-zero; carries its Result (exit code, last stderr lines)."""

    exit_code = ExitCode.REMOTE_FAILED

    def __init__(self, result, *, what: str | None = None):
        self.result = result
        tail = result.stderr_tail()
        head = what or f"command {result.display()} on {result.target}"
        message = f"{head} failed with exit code {result.exit_code}"
        if tail:
            message += ":\n" + "\n".join("  | " + line for line in tail)
        super().__init__(message)


class PayloadError(OrchError):
    """A payload ran in the container but reported an error it found (JSON 'error' line);
    kind is the payload's word for it ("bad-args", "not-installed", ...), when it gave one."""

    def __init__(self, message: str, *, kind: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.kind = kind


class PatchBusy(PayloadError):
    """Another orch patch action holds the torch tree's lock (readers share it; a change
    holds it alone) for longer than the payload waits: try again."""

    exit_code = ExitCode.LOCKED


class PayloadNoResult(PayloadError):
    """A payload ended (crashed, was killed) without its result or error line."""


class PythonUnavailable(OrchError):
    """The interpreter a payload needs cannot run in the container (missing venv, no python3)."""
