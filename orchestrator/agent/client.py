"""The thin client of the warm agent: which commands it takes, handing one over (argv,
environment, the caller's fds), starting the agent on first use.

This module imports neither click nor paramiko: handing a command to the agent costs a
Python start and a few stdlib imports. The rules (docs/guide/agent.md):
- before the agent says "accepted", any trouble (no agent, one that will not start in
  time, a refused request, a dead socket) means: run the command here instead;
- after "accepted", the command belongs to the agent: if the agent is lost, orch says so
  and exits EXIT_AGENT_LOST (255). It never runs the command a second time.
An agent that does not answer (frozen, overloaded) costs at most ACCEPT_WAIT_S before the
command runs here; one that accepted and then stopped answering is given the user's
`exec --timeout` and USER_TIMEOUT_GRACE_S more, then orch says so and exits 255. The
client confirms "accepted" with "go", which carries its fds 0, 1 and 2; the agent runs
nothing without it, so a client that gave up on a slow "accepted" never leaves a second
run behind, nor its fds (its caller's pipes) in a frozen agent's queue.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from orchestrator.agent import protocol  # stdlib only: no click, no paramiko, no typing
from orchestrator.ground import commands   # the one table of commands, and what the agent runs

PATCH_ACTIONS_IN_AGENT = {"status", "diff"}   # apply/revert change files: they stay here
START_WAIT_S = 10.0
# How long a client waits for a running agent to connect and say "accepted"; it takes a few
# ms, this bounds a frozen (SIGSTOPped) or stuck agent's cost to every quick command.
ACCEPT_WAIT_S = 3.0
# After an accepted `exec --timeout N` the agent kills the command at N s and needs a few
# seconds for the kill (payload grace 2 s, the session's wait 5 s); past N + this the
# client stops waiting for an agent that no longer answers.
USER_TIMEOUT_GRACE_S = 8.0
OFF_VALUES = {"off", "0", "no", "false"}
ENV_SWITCH = "ORCH_AGENT"                   # on (default) | off | require (tests: no fallback)


def is_fast_command(args: list[str]) -> bool:
    """Whether the agent runs this command line (orch's own options come first)."""
    index = _command_index(args)
    if index is None:
        return False
    name, rest = args[index], args[index + 1:]
    if _asks_for_help(rest) or not commands.agent_runs(name, rest[0] if rest else None):
        return False
    if name == "patch":
        return _first_positional(rest[1:]) in PATCH_ACTIONS_IN_AGENT
    return True


def _asks_for_help(rest: list[str]) -> bool:
    """`orch CMD ... --help`: click prints the help while it parses, to the process's own
    stdout, before the command's invocation exists; in the agent that is the agent's
    stdout, and the user would see nothing. Help needs no connection: the direct path
    prints it. Words after `--` are the remote command's own."""
    words = rest[:rest.index("--")] if "--" in rest else rest
    return "--help" in words or "-h" in words


def _command_index(args: list[str]) -> int | None:
    """Where the command's name is, after orch's own options; None when there is none or an
    option means the agent is not for this command line."""
    index = 0
    while index < len(args):
        word = args[index]
        if word in ("-i", "--inventory"):
            index += 2
        elif word.startswith("--inventory=") or (word.startswith("-i") and len(word) > 2
                                                 and not word.startswith("--")):
            index += 1
        elif word.startswith("-"):
            # --no-agent, --version, --help; and --trust-new-host-keys, which writes
            # known_hosts: a one-off that needs no warm connection
            return None
        else:
            return index
    return None


def _first_positional(args: list[str]) -> str | None:
    index = 0
    while index < len(args):
        word = args[index]
        if word in ("-t", "--target"):
            index += 2
        elif word.startswith("-"):
            index += 1
        else:
            return word
    return None


# ------------------------------------------------------------------ talking to the agent
def run_in_agent(args: list[str]) -> int | None:
    """The command's exit code from the agent; None when it did not accept the command
    within ACCEPT_WAIT_S (the agent then runs nothing: it waits for our "go")."""
    try:
        sock = connect() or (start_agent() and wait_for_agent())
        if not sock:
            return None
    except protocol.UntrustedAgent as error:   # never hand a command across uids
        sys.stderr.write(f"orch: note: not using the agent: {error}; running the command here\n")
        return None
    except OSError:
        return None
    with sock:
        reader = protocol.Reader(sock)
        try:
            sock.settimeout(ACCEPT_WAIT_S)
            protocol.send(sock, _run_message(args))
            reply, _ = reader.receive()
            if not reply or reply.get("type") != "accepted":
                return None
            # Once "go" is sent the command runs and may write to our stdout at once: a
            # signal (Ctrl-C, SIGTERM) from then on is the command's, so it must find the
            # forwarding handlers in place even if this process is not scheduled again
            # before its first output reaches the caller (a loaded machine). Held until then.
            with _signals_held():
                socket.send_fds(sock, [protocol.encode({"type": "go"})], [0, 1, 2])
                _forward_signals(sock)
        except (OSError, ValueError):   # a timeout too: the agent does not answer
            return None
        timeout = user_timeout(args)
        sock.settimeout(None if timeout is None else timeout + USER_TIMEOUT_GRACE_S)
        return _wait_for_exit(sock, reader, timeout)


def user_timeout(args: list[str]) -> float | None:
    """`exec --timeout N`'s N (orch's options come before the target); None without one."""
    index = _command_index(args)
    if index is None or args[index] != "exec":
        return None
    rest = args[index + 1:]
    for position, word in enumerate(rest):
        value = None
        if word == "--timeout" and position + 1 < len(rest):
            value = rest[position + 1]
        elif word.startswith("--timeout="):
            value = word.split("=", 1)[1]
        elif word == "--" or not word.startswith("-"):
            return None   # the target: the command's own options follow
        if value is not None:
            try:
                seconds = float(value)
            except ValueError:
                return None   # click says what is wrong with it
            return seconds if seconds >= 0 else None
    return None


def _run_message(args: list[str]) -> dict:
    return {"type": "run", "argv": args, "prog_name": "orch",
            "cwd": os.getcwd(), "env": dict(os.environ), "term_size": _terminal_size(),
            "stdio": [_stream_info(stream) for stream in (sys.stdin, sys.stdout, sys.stderr)]}


def _stream_info(stream) -> dict:
    """How Python here would have set up this stream: the agent makes its copy alike."""
    if stream is None:
        return {"encoding": "utf-8", "errors": "strict"}
    return {"encoding": stream.encoding, "errors": stream.errors}


def _terminal_size() -> list[int] | None:
    """The size rich would find from fds 0, 1, 2 (the agent has no terminal of its own)."""
    for fd in (0, 1, 2):
        try:
            size = os.get_terminal_size(fd)
            return [size.columns, size.lines]
        except OSError:
            continue
    return None


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _signals_held:
    """FORWARDED_SIGNALS blocked inside (kept pending, delivered when it ends)."""

    def __enter__(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)


def _forward_signals(sock: socket.socket) -> None:
    """From now on a signal of FORWARDED_SIGNALS goes to the agent, for the command it runs."""
    def forward(number, frame):
        try:
            protocol.send(sock, {"type": "signal", "signum": number})
        except OSError:
            pass  # the agent is gone: the read in _wait_for_exit says so
    for number in FORWARDED_SIGNALS:
        signal.signal(number, forward)


def _wait_for_exit(sock: socket.socket, reader: protocol.Reader,
                   timeout: float | None = None) -> int:
    try:
        message, _ = reader.receive()
    except TimeoutError:
        sys.stderr.write(
            f"orch: error: the orch agent did not end this command within its --timeout of "
            f"{timeout:g} s (and {USER_TIMEOUT_GRACE_S:g} s for the kill): the agent does not "
            "answer, the command may still be running. `orch agent status` shows the agent; "
            "`--no-agent` runs commands without it.\n")
        return protocol.EXIT_AGENT_LOST
    except (OSError, ValueError):
        message = None
    if message and message.get("type") == "exit":
        return int(message["code"])
    sys.stderr.write("orch: error: the orch agent ended while it ran this command: its outcome "
                     "is unknown (orch does not run it again). `orch agent status` shows the "
                     "agent; `--no-agent` runs commands without it.\n")
    return protocol.EXIT_AGENT_LOST


def connect(path: str | None = None) -> socket.socket | None:
    """A connection to this installation's agent; None when none listens (no socket file,
    or a stale one left by an agent that died). Nothing is sent here: UntrustedAgent when
    the folder is unsafe or the listener is another uid (docs/guide/agent.md, Security model)."""
    path = path or protocol.socket_path()
    problem = protocol.unsafe_dir(os.path.dirname(path))
    if problem:
        raise protocol.UntrustedAgent(problem)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(ACCEPT_WAIT_S)   # a frozen agent's full backlog blocks a connect
    try:
        sock.connect(path)
        uid = protocol.peer_uid(sock)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError:
        sock.close()
        raise
    if uid != os.getuid():
        sock.close()
        raise protocol.UntrustedAgent(f"{path} is served by uid {uid}, not by uid {os.getuid()}")
    return sock


def start_agent(extra_env: dict | None = None) -> bool:
    """Start an agent in the background, detached from this terminal. Several clients may
    start one at once: the agents agree through a lock file, the losers exit."""
    directory = protocol.private_dir(protocol.agent_dir())
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (f"import sys; sys.path.insert(0, {package_parent!r}); "
            "from orchestrator.agentd.server import main; main()")
    env = {**_agent_environment(os.environ), **(extra_env or {}), "ORCH_AGENT_DIR": directory}
    pid = os.fork()
    if pid == 0:  # the child: a new session, then a grandchild that is nobody's child
        try:
            os.setsid()
            if os.fork() == 0:
                os.chdir("/")
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.closerange(3, 256)
                os.execve(sys.executable, [sys.executable, "-c", code], env)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return True


# What the agent process itself keeps of the environment that started it: each command runs
# with its own client's environment, so no client's secrets (a token's variable,
# SSH_AUTH_SOCK) stay in the agent for the next client to inherit.
AGENT_ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "VIRTUAL_ENV",
                  "ORCH_AGENT_IDLE", "ORCH_AGENT_DIR")
AGENT_ENV_KEEP_PREFIXES = ("LC_", "PYTHON")


def _agent_environment(environ) -> dict:
    return {k: v for k, v in environ.items()
            if k in AGENT_ENV_KEEP or k.startswith(AGENT_ENV_KEEP_PREFIXES)}


def wait_for_agent(timeout: float = START_WAIT_S) -> socket.socket | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock = connect()
        if sock:
            return sock
        time.sleep(0.01)
    return None

