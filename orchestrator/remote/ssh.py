"""Reused SSH connections per Proxmox host (paramiko), with host keys checked.

Why paramiko directly rather than one `ssh` process per command: a connection is set up
once (about 190 ms here) and every later command costs one channel (a few ms with
TCP_NODELAY, which paramiko does not set by itself). Host keys come from known_hosts; an
unknown key is refused unless the user asked for trust-on-first-use, a changed key always.

A stock sshd opens at most 10 session channels per connection (MaxSessions) and refuses
the 11th at once. So each connection counts its open channels and a command waits for a
free one; when all are busy a host gets another connection, up to `connections` (see
docs/design/transport.md). The environment travels inside the command (`env K=V ...`): sshd
drops SSH env requests unless AcceptEnv lets them in, and a stock one accepts LANG and
LC_* only.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import signal
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Optional

from orchestrator.config import transports
from orchestrator.ground import invocation
from orchestrator.ground.errors import (AuthRefused, ChannelRefused, CommandTimeout, HostKeyChanged,
                                 HostKeyRevoked, HostKeyUnknown, HostUnreachable, OrchError)
from orchestrator.remote.base import (BufferedProcess, OutputKeeper, Process, Result, RunOptions,
                                      Transport, command_timeout, connection_lost, encode_arg,
                                      stdin_pieces, validate_argv, with_env)
from orchestrator.remote.known_hosts import KnownHosts, RevokedKey, UnknownKey
from orchestrator.remote.paramiko_lib import READ_AT_ONCE, paramiko
from orchestrator.remote.tcp import tcp_connect

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_MAX_SESSIONS = 10     # OpenSSH's MaxSessions default, a stock Proxmox node's
DEFAULT_CONNECTIONS = 4       # per host: 40 commands at once before any waits
# Dead-link detection, as OpenSSH's ServerAliveInterval x ServerAliveCountMax: after
# ALIVE_INTERVAL s without a packet from the host orch asks it for a reply, once per
# interval; ALIVE_COUNT_MAX unanswered asks and one more interval later the connection is
# declared dead (20 s of silence by default), its commands fail with ConnectionLost and the
# next command opens a new connection (docs/design/transport.md, "Dead links").
DEFAULT_ALIVE_INTERVAL = 5.0
DEFAULT_ALIVE_COUNT_MAX = 3
# How long sshd may take to answer an exec request (it answers once it forked the command):
# a host that takes longer is not answering, whatever the command's own timeout.
EXEC_REPLY_TIMEOUT = 30.0
# sshd runs a command as `$SHELL -c COMMAND`: COMMAND is one argv string, which Linux caps
# at 128 KiB. Longer commands send their argv on stdin to a constant bash program instead.
INLINE_COMMAND_LIMIT = 100_000
# Reads NUL-terminated words from stdin, one byte at a time on a pipe (bash's read never
# takes more than it needs), so the command's own input follows unread. Constant text: the
# words arrive as data, never as code.
ARGV_FROM_STDIN = 'mapfile -t -d "" -n "$1" argv && [ "${#argv[@]}" -eq "$1" ] && exec "${argv[@]}"'

# paramiko logs a full traceback through `logging` when a peer hangs up during the
# handshake; with no handler configured Python prints it on stderr. orch reports such
# failures itself, as one line: keep paramiko's log out of the user's terminal.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


@dataclass
class SshSettings:
    """Everything needed to reach one host; built from the inventory and ~/.ssh/config."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    identity: list[str] = field(default_factory=list)
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    jump: Optional["SshSettings"] = None
    connect_timeout: float = 10.0
    alive_interval: float = DEFAULT_ALIVE_INTERVAL   # ServerAliveInterval
    alive_count_max: int = DEFAULT_ALIVE_COUNT_MAX   # ServerAliveCountMax
    trust_on_first_use: bool = False
    max_sessions: int = DEFAULT_MAX_SESSIONS   # channels at once on one connection
    connections: int = DEFAULT_CONNECTIONS     # connections at most to this host
    folder: Optional[str] = None  # where relative paths are (the caller's, in the agent)
    hash_known_hosts: bool = False  # ssh_config HashKnownHosts: trust on first use writes hashed

    def local_path(self, path: str) -> str:
        """An identity or known_hosts path as a file name here (~ expanded with the
        command's HOME)."""
        path = invocation.current().expanduser(path)
        return os.path.join(self.folder, path) if self.folder else path

    def known_hosts_name(self) -> str:
        """The name a host key is filed under in known_hosts, as OpenSSH writes it."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


def fingerprint(key: paramiko.PKey) -> str:
    return key.fingerprint if hasattr(key, "fingerprint") else key.get_name()


class SshHost(Transport):
    """Commands on a host through a few lazily opened, reused SSH connections."""

    def __init__(self, settings: SshSettings, early=None):
        self.settings = settings
        # the first connection, when the entry point started it before the CLI was imported
        # (an EarlyConnection made with these very settings: orchestrator/remote/early.py)
        self._early = early
        self.name = settings.name
        self._connections: list[_Connection] = []
        self._jump_host: Optional[SshHost] = None
        self._changed = threading.Condition()
        self._connecting = False
        self._connection_limit = max(1, settings.connections)
        # connection attempts started, and the last one's error while no later one began:
        # commands that waited for that attempt fail with it instead of each dialling again
        # (a fan-out over a down host's containers pays its connect timeout once, not once each)
        self._attempts = 0
        self._failure: Optional[tuple[int, OrchError]] = None

    # -- connections ------------------------------------------------------------------
    def connect(self) -> paramiko.Transport:
        """A live transport to the host (the first connection, opened if needed)."""
        connection = self._reserve(time.monotonic() + self.settings.connect_timeout, count=False)
        return connection.transport

    def _reserve(self, deadline: Optional[float], count: bool = True) -> "_Connection":
        """A connection with a free channel slot (counted as taken when `count`), waiting
        for one until deadline (None: as long as it takes)."""
        awaited = None   # the attempt this command waits for, begun by another
        while True:
            with self._changed:
                while True:
                    self._forget_dead()
                    for connection in self._connections:
                        if not count or connection.open < connection.capacity:
                            connection.open += count
                            return connection
                    if self._failure is not None and self._failure[0] == awaited:
                        raise self._failure[1]
                    if not self._connecting and len(self._connections) < self._connection_limit:
                        self._connecting = True
                        self._attempts += 1
                        break
                    if self._connecting:
                        awaited = self._attempts
                    invocation.current().interrupt.check()
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise CommandTimeout(
                            f"host {self.name}: every SSH channel orch may open there "
                            f"({sum(c.open for c in self._connections)} on "
                            f"{len(self._connections)} connection(s)) stayed busy until the "
                            "deadline", hint="raise the host's `connections` in the "
                                             "inventory, or run fewer commands at once")
                    self._changed.wait(1.0 if left is None else min(left, 1.0))
            try:
                return self._add_connection(count)
            except OrchError:
                with self._changed:
                    if not self._connections:
                        raise
                    # the host takes no more connections now (MaxStartups, a firewall):
                    # live with the ones it gave
                    self._connection_limit = len(self._connections)

    def _add_connection(self, count: bool) -> "_Connection":
        try:
            client = self._open_client()
        except BaseException as error:
            with self._changed:
                self._connecting = False
                if isinstance(error, OrchError) and not self._connections:
                    self._failure = (self._attempts, error)
                self._changed.notify_all()
            raise
        connection = _Connection(client, self.settings.max_sessions)
        with self._changed:
            # in one step with the flag: a thread that sees _connecting off must also see
            # the new connection, or it opens one more than `connections` allows
            connection.open += count
            self._connections.append(connection)
            self._connecting = False
            self._failure = None
            self._changed.notify_all()
        _Watchdog(client.get_transport(), self.settings.alive_interval,
                  self.settings.alive_count_max).start()
        return connection

    def _release(self, connection: "_Connection") -> int:
        """Give a channel slot back; returns how many stay open on that connection."""
        with self._changed:
            connection.open -= 1
            self._changed.notify_all()
            return connection.open

    def _forget_dead(self) -> None:
        for connection in [c for c in self._connections if not c.alive()]:
            self._connections.remove(connection)
            _quietly(connection.client.close)

    def _open_client(self) -> paramiko.SSHClient:
        early, self._early = self._early, None
        if early is not None:
            return early.client()
        return self.open_client()

    def open_client(self, sock=None) -> paramiko.SSHClient:
        """A new authenticated connection, its host key checked against known_hosts (on
        sock, an open TCP connection to the host, when given)."""
        s = self.settings
        client = paramiko.SSHClient()
        try:
            known = KnownHosts(s.local_path(s.known_hosts), hash_new=s.hash_known_hosts)
        except OSError as error:
            raise HostKeyUnknown(f"cannot read known_hosts {s.known_hosts}: "
                                 f"{error.strerror or error}") from None
        known.install(client, s.trust_on_first_use)
        sock = sock or self._open_socket()
        env = invocation.current().env
        # paramiko would find the ssh-agent and the default keys through os.environ (the
        # agent process's own): hand it the command's SSH_AUTH_SOCK and HOME's keys instead
        client._agent = _SshAgent(env.get("SSH_AUTH_SOCK"))
        try:
            client.connect(
                s.address, port=s.port, username=s.user, sock=sock,
                key_filename=[s.local_path(p) for p in s.identity] or _default_keys() or None,
                timeout=s.connect_timeout, banner_timeout=s.connect_timeout,
                auth_timeout=s.connect_timeout, allow_agent=True, look_for_keys=False,
                transport_factory=_SignalAwareTransport)
        except UnknownKey as unknown:
            sock.close()
            raise HostKeyUnknown(
                f"host {s.name} ({unknown.hostname}) offered a host key that is not in "
                f"{s.known_hosts}: {unknown.key.get_name()} {fingerprint(unknown.key)}"
                + (f" ({unknown.why})" if unknown.why else ""),
                hint=known.unknown_hint() or "check the fingerprint with the host's administrator, "
                     "then add it with `ssh-keyscan` to known_hosts, or rerun with "
                     "--trust-new-host-keys") from None
        except (RevokedKey, paramiko.BadHostKeyException) as bad:
            sock.close()
            if isinstance(bad, RevokedKey) or known.is_revoked(bad.key):
                raise HostKeyRevoked(
                    f"host {s.name} presented a host key that {s.known_hosts} marks @revoked "
                    f"({bad.key.get_name()} {fingerprint(bad.key)}): orch refuses it",
                    hint="ask the host's administrator for its new key") from None
            raise HostKeyChanged(
                f"host {s.name} presented a DIFFERENT host key than the one in {s.known_hosts} "
                f"(got {fingerprint(bad.key)}, expected {fingerprint(bad.expected_key)}): "
                "this can mean someone is intercepting the connection",
                hint="if the host was reinstalled, remove its old line from known_hosts "
                     f"(ssh-keygen -R {shlex.quote(s.known_hosts_name())} -f {s.known_hosts})") from None
        except paramiko.AuthenticationException as error:
            sock.close()
            raise AuthRefused(f"host {s.name} refused authentication as {s.user}: {error}",
                              hint="check the identity file and the host's authorized_keys") from None
        except (paramiko.SSHException, OSError, EOFError) as error:
            sock.close()
            raise HostUnreachable(f"SSH to host {s.name} ({s.address}:{s.port}) failed: "
                                  f"{error or type(error).__name__}") from None
        return client

    def _open_socket(self):
        s = self.settings
        if s.jump is not None:
            return self._open_via_jump()
        try:
            return tcp_connect(s.address, s.port, s.connect_timeout)
        except OSError as error:
            raise self.unreachable(error) from None

    def unreachable(self, error: OSError) -> HostUnreachable:
        """The error of a TCP connection to the host that failed."""
        s = self.settings
        return HostUnreachable(
            f"cannot reach host {s.name} at {s.address}:{s.port}: {error.strerror or error}",
            hint="check the address in the inventory and that sshd runs there")

    def _open_via_jump(self):
        s = self.settings
        if self._jump_host is None:
            self._jump_host = SshHost(s.jump)
        try:
            # direct-tcpip channels are not sessions: MaxSessions does not count them
            return self._jump_host.connect().open_channel(
                "direct-tcpip", (s.address, s.port), ("127.0.0.1", 0), timeout=s.connect_timeout)
        except (paramiko.SSHException, OSError) as error:
            raise HostUnreachable(
                f"cannot reach host {s.name} through jump host {s.jump.name}: {error}") from None

    def close(self) -> None:
        with self._changed:
            connections, self._connections = self._connections, []
            self._connection_limit = max(1, self.settings.connections)
        for connection in connections:
            _quietly(connection.client.close)
        if self._jump_host is not None:
            self._jump_host.close()

    # -- channels ---------------------------------------------------------------------
    def usage(self) -> dict:
        """Connections open now and the session channels in use on them."""
        with self._changed:
            live = [c for c in self._connections if c.alive()]
            return {"transport": transports.SSH.name, "address": f"{self.settings.user}@{self.settings.address}:"
                                                   f"{self.settings.port}",
                    "connections": len(live), "channels_in_use": sum(c.open for c in live)}

    def _open_channel(self, timeout: float, wait_until: Optional[float] = None):
        """A session channel and its connection, honouring the server's channel limit:
        waits for a free slot until wait_until (None: as long as it takes), then gives the
        server `timeout` seconds to open the channel."""
        reconnected, refusals = False, 0
        interrupt = invocation.current().interrupt
        while True:
            interrupt.check()
            connection = self._reserve(wait_until)
            asked = time.monotonic()
            deadline = asked + timeout
            try:
                channel = connection.transport.open_session(timeout=timeout)
                # the command's interrupt closes it: the reaper (or the session's server)
                # then kills the remote command, and the waiting thread wakes
                interrupt.file(channel)
                return connection, channel
            except (paramiko.SSHException, OSError, EOFError) as error:
                others = self._release(connection)
                if _refused(error, connection):
                    refusals += 1
                    self._refused(connection, error, others, asked, wait_until)
                    time.sleep(min(0.02 * 2 ** refusals, 0.5))
                    continue
                if connection.alive():
                    if time.monotonic() >= deadline - 0.05:
                        raise CommandTimeout(f"host {self.name} did not open a channel within "
                                             f"{timeout:g} s: {_reason(error)}") from None
                    raise HostUnreachable(f"host {self.name} could not open a channel (failed "
                                          f"after {time.monotonic() - asked:.2f} s): "
                                          f"{_reason(error)}") from None
                if reconnected:  # one reconnect: a dropped connection is normal after a blip
                    raise HostUnreachable(f"host {self.name} is not answering: "
                                          f"{connection.lost_reason() or _reason(error)}") from None
                reconnected = True

    def _refused(self, connection, error, others: int, asked: float,
                 deadline: Optional[float]) -> None:
        """sshd said no at once (OPEN_FAILURE): it is at its MaxSessions, counting a channel
        we closed that it has not freed yet, or its limit is lower than ours. With other
        channels open, remember the lower limit and wait; else say what happened."""
        if others == 0 or (deadline is not None and time.monotonic() >= deadline):
            raise ChannelRefused(
                f"host {self.name} refused to open a session channel ({_reason(error)}) after "
                f"{time.monotonic() - asked:.2f} s, with {others} other channel(s) of orch open "
                "on that connection",
                hint="the host's sshd may allow fewer sessions (MaxSessions) than the "
                     "inventory's max_sessions; lower it for this host")
        with self._changed:
            connection.capacity = max(1, min(connection.capacity, others))

    # -- commands ---------------------------------------------------------------------
    def _run(self, argv: list[str], options: RunOptions) -> Result:
        started = time.monotonic()
        command, preamble = remote_command(argv, options.env)
        wait_until = None if options.timeout is None else started + options.timeout
        connection, channel = self._open_channel(min(options.timeout or 30.0, 30.0), wait_until)
        # exec_command waits for the server's reply without a timeout of its own: a timer
        # that closes the channel makes every step of the command honour the deadline
        # (what is left of it after waiting for a free channel).
        timer = _ChannelDeadline(channel, None if wait_until is None
                                 else max(wait_until - time.monotonic(), 0.001))
        stdout = stderr = b""
        status = None
        answered = True
        try:
            answered = _exec(channel, command)
            if answered:
                _start_input(channel, preamble, options.stdin)
                stdout, stderr = _drain(channel, options)
                # paramiko marks the status "ready" with -1 when a channel merely closed
                if channel.exit_status_ready() and channel.exit_status >= 0:
                    status = channel.exit_status
        except (paramiko.SSHException, OSError, EOFError):
            pass  # the timer closed the channel, or the connection broke: told below
        finally:
            timer.cancel()
            _quietly(channel.close)
            self._release(connection)
        result = Result(argv, 124 if timer.fired else (status if status is not None else -1),
                        stdout, stderr, time.monotonic() - started, self.name)
        if timer.fired:
            raise command_timeout(result.display(), f"on host {self.name}", options.timeout, result)
        if status is None:
            why = connection.lost_reason() or ("" if answered else _no_exec_reply())
            raise connection_lost(self.name, result.display(), result.duration, why=why)
        return result

    def spawn(self, argv) -> Process:
        command, preamble = remote_command(validate_argv(argv), {})
        connection, channel = self._open_channel(30.0, time.monotonic() + 60.0)
        try:
            if not _exec(channel, command):
                raise paramiko.SSHException(_no_exec_reply())
            if preamble:
                channel.sendall(preamble)
        except (paramiko.SSHException, OSError, EOFError) as error:
            _quietly(channel.close)
            self._release(connection)
            why = connection.lost_reason()
            raise HostUnreachable(f"host {self.name}: could not start {argv[0]}: "
                                  f"{why or error or type(error).__name__}") from None
        return _ChannelProcess(channel, lambda: self._release(connection), connection.lost_reason)


    @contextmanager
    def terminal(self, argv, term: str, size: tuple[int, int]):
        """A channel running argv on a pty of `size` (columns, lines) with TERM `term`, for
        an interactive session (`orch shell`); yields (channel, why): why() says why the
        connection was lost, "" while it was not. The channel and its slot are given back
        on leaving."""
        command, preamble = remote_command(validate_argv(argv), {})
        if preamble:   # it would arrive mixed with the keys typed
            raise OrchError(f"host {self.name}: the command is too long for a terminal")
        connection, channel = self._open_channel(30.0, time.monotonic() + 60.0)
        try:
            try:
                reply = _ChannelDeadline(channel, EXEC_REPLY_TIMEOUT)
                try:   # paramiko waits for sshd's answer to the pty request without a deadline
                    channel.get_pty(term=term, width=size[0], height=size[1])
                finally:
                    reply.cancel()
                if reply.fired or not _exec(channel, command):
                    raise paramiko.SSHException(_no_exec_reply())
            except (paramiko.SSHException, OSError, EOFError) as error:
                raise HostUnreachable(f"host {self.name}: could not start a terminal: "
                                      f"{connection.lost_reason() or error or type(error).__name__}"
                                      ) from None
            yield channel, connection.lost_reason
        finally:
            _quietly(channel.close)
            self._release(connection)


class _SshAgent(paramiko.agent.AgentSSH):
    """The ssh-agent at `path` (the command's SSH_AUTH_SOCK), as paramiko.Agent() would open
    it from os.environ; no keys when it is unset or gone (a dangling variable), as there."""

    def __init__(self, path: Optional[str]):
        super().__init__()
        if not path:
            return
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            self._connect(conn)
        except (OSError, paramiko.SSHException):
            conn.close()

    def close(self) -> None:
        self._close()


def _default_keys() -> list[str]:
    """paramiko's look_for_keys files (~/.ssh/id_rsa, id_ecdsa, id_ed25519 and their
    certificates) under the command's HOME. Given as key files they are tried before the
    agent's keys, where paramiko's own search tries them after."""
    found = []
    for name in ("rsa", "ecdsa", "ed25519"):
        for folder in (".ssh", "ssh"):
            path = invocation.current().expanduser(f"~/{folder}/id_{name}")
            if os.path.isfile(path):
                found.append(path)
    return found


def _no_exec_reply() -> str:
    return f"the host did not answer the exec request within {EXEC_REPLY_TIMEOUT:g} s"


def _exec(channel, command: bytes) -> bool:
    """Send the exec request; False when sshd did not answer within EXEC_REPLY_TIMEOUT (the
    channel is closed then: paramiko's own wait for that answer has no deadline)."""
    reply = _ChannelDeadline(channel, EXEC_REPLY_TIMEOUT)
    try:
        channel.exec_command(command)
    except (paramiko.SSHException, OSError, EOFError):
        if not reply.fired:
            raise
    finally:
        reply.cancel()
    return not reply.fired


def _quietly(close: Callable[[], object]) -> None:
    """Close a channel or client whose connection may have broken: paramiko then raises
    EOFError or OSError from the close itself, which must not escape as a bare error (click
    turns an EOFError into "Aborted!"). The command's outcome is told by its caller."""
    try:
        close()
    except (EOFError, OSError, paramiko.SSHException):
        pass


def _refused(error: Exception, connection: "_Connection") -> bool:
    """An OPEN_FAILURE answer on a live connection. paramiko keeps one saved exception per
    connection: when two opens fail at once, the second sees a bare "Unable to open channel."
    """
    if isinstance(error, paramiko.ChannelException):
        return True
    return (isinstance(error, paramiko.SSHException) and connection.alive()
            and str(error) == "Unable to open channel.")


def _reason(error: Exception) -> str:
    return getattr(error, "text", None) or str(error) or type(error).__name__


class _Connection:
    """One SSH connection and how many of its session channels are open (and may be)."""

    def __init__(self, client: paramiko.SSHClient, capacity: int):
        self.client = client
        self.capacity = max(1, capacity)
        self.open = 0
        self._transport = client.get_transport()

    def lost_reason(self) -> str:
        """Why the watchdog closed this connection ("" while it has not)."""
        return getattr(self._transport, "lost_reason", "")

    @property
    def transport(self) -> paramiko.Transport:
        return self.client.get_transport()

    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()


def remote_command(argv: list[str], env: dict) -> tuple[bytes, bytes]:
    """The exec request's command string, and bytes to send before the command's stdin.

    The environment goes into the command as `env -- K=V ... ARGV` (quoted once, here).
    A command too long for sshd's `$SHELL -c` travels on stdin instead (ARGV_FROM_STDIN).
    """
    if env:
        argv = with_env([f"{name}={value}" for name, value in env.items()], argv)
    command = encode_arg(shlex.join(argv))
    if len(command) <= INLINE_COMMAND_LIMIT:
        return command, b""
    preamble = b"".join(encode_arg(arg) + b"\0" for arg in argv)
    return encode_arg(shlex.join(["bash", "-c", ARGV_FROM_STDIN, "orch-argv", str(len(argv))])), preamble


# paramiko's own order starts with AES-CTR, whose HMAC it computes per packet beside the
# cipher; AES-GCM is one AEAD call into cryptography per packet. Measured on a direct-tcpip
# download through sshd (docs/benchmarks/speed.md): aes128-ctr + hmac-sha2-256 about 240 MB/s,
# aes128-gcm@openssh.com about 390. Both are in OpenSSH's default server list (Proxmox's
# Debian too); only the order changes, so a host without GCM still negotiates CTR.
AEAD_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def aead_first(ciphers: tuple[str, ...]) -> tuple[str, ...]:
    """The client's cipher preference with the AES-GCM ciphers it has moved to the front."""
    return tuple(c for c in AEAD_FIRST if c in ciphers) + tuple(c for c in ciphers if c not in AEAD_FIRST)


class _SignalAwareTransport(paramiko.Transport):
    """paramiko ignores "exit-signal" (a command killed by a signal), leaving the exit
    status unknown as if the connection had broken. Here it becomes 128+N, as in a shell.
    It also notes when it last heard from the host (`last_heard`, for _Watchdog), and asks
    for AES-GCM first (see AEAD_FIRST)."""

    _channel_handler_table = dict(paramiko.Transport._channel_handler_table)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        options = self.get_security_options()
        options.ciphers = aead_first(options.ciphers)
        self.last_heard = time.monotonic()
        self.lost_reason = ""
        read_message = self.packetizer.read_message

        def read_and_note():
            message = read_message()
            self.last_heard = time.monotonic()
            return message
        self.packetizer.read_message = read_and_note

    def _handle_channel_request(channel, message):  # noqa: N805 (table entry, not a method)
        start = message.packet.tell()
        if message.get_text() == "exit-signal":
            message.get_boolean()
            name = message.get_text()
            number = getattr(signal, "SIG" + name, None)
            channel.exit_status = 128 + int(number) if number is not None else 255
            channel.status_event.set()
            return
        message.packet.seek(start)
        paramiko.Channel._handle_request(channel, message)

    _channel_handler_table[paramiko.common.MSG_CHANNEL_REQUEST] = _handle_channel_request


class _Watchdog(threading.Thread):
    """Closes a connection whose host stopped answering, as OpenSSH's ServerAliveInterval x
    ServerAliveCountMax do. paramiko's own keepalive only sends (a request that wants no
    reply) and counts nothing: a dropped link looks like a quiet one for as long as TCP
    retransmits, minutes. Here, after `interval` s without a packet from the host, a
    keepalive@openssh.com request that wants a reply goes out, once per interval (sshd
    answers every global request, with a failure for one it does not know); when
    `count_max` of them went unanswered and one more interval passed, the connection is
    closed. That ends every wait on its channels at once (an exec reply, a read, a channel
    open) and SshHost drops the connection before its next command."""

    def __init__(self, transport: "_SignalAwareTransport", interval: float, count_max: int):
        super().__init__(name="ssh-alive", daemon=True)
        self.transport = transport
        self.interval = interval
        self.count_max = max(1, count_max)
        self._asking: Optional[threading.Thread] = None

    def run(self) -> None:
        if self.interval <= 0:
            return
        heard, asked = self.transport.last_heard, 0
        while self.transport.is_active():
            time.sleep(min(self.interval / 4, 0.5))
            if self.transport.last_heard != heard:
                heard, asked = self.transport.last_heard, 0
            silent = time.monotonic() - heard
            if silent >= self.interval * (self.count_max + 1):
                self.transport.lost_reason = (f"the host answered none of {asked} keepalive(s) "
                                              f"in {silent:.0f} s")
                _quietly(self.transport.close)
                return
            if silent >= self.interval * (asked + 1):
                asked += 1
                self._ask()

    def _ask(self) -> None:
        # from a thread of its own: on a dead link a send can block (a full send buffer),
        # and the count must go on meanwhile; a send still stuck is no answer either
        if self._asking is None or not self._asking.is_alive():
            self._asking = threading.Thread(target=_ask_alive, args=(self.transport,),
                                            name="ssh-alive-ask", daemon=True)
            self._asking.start()


def _ask_alive(transport: paramiko.Transport) -> None:
    message = paramiko.Message()
    message.add_byte(paramiko.common.cMSG_GLOBAL_REQUEST)
    message.add_string("keepalive@openssh.com")
    message.add_boolean(True)   # want_reply: the answer is what the watchdog counts
    try:
        transport._send_user_message(message)
    except (EOFError, OSError, paramiko.SSHException):
        pass  # the connection broke: the watchdog's count ends it


class _ChannelProcess(BufferedProcess):
    def __init__(self, channel, release: Callable[[], int], lost_reason: Callable[[], str]):
        self._channel = channel
        self._release = release
        self._released = False
        super().__init__()
        self.lost_reason = lost_reason

    def _read_some(self, timeout):
        try:
            if not self._channel.recv_ready():
                if self._channel.closed or self._channel.eof_received:
                    return b""
                select.select([self._channel], [], [], timeout)
                if not self._channel.recv_ready():
                    return b"" if self._channel.eof_received or self._channel.closed else None
            return self._channel.recv(READ_AT_ONCE)
        except (EOFError, OSError, ValueError, paramiko.SSHException):
            return b""   # the channel or its connection is gone: the end of its output

    def write(self, data: bytes) -> None:
        try:
            self._channel.sendall(data)
        except (OSError, paramiko.SSHException, EOFError) as error:
            raise BrokenPipeError(str(error)) from None

    def close(self) -> None:
        _quietly(self._channel.close)
        if not self._released:
            self._released = True
            self._release()


class _ChannelDeadline:
    def __init__(self, channel, timeout):
        self.fired = False
        self._channel = channel
        self._timer = None
        if timeout is not None:
            self._timer = threading.Timer(timeout, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self):
        self.fired = True
        _quietly(self._channel.close)

    def cancel(self):
        if self._timer is not None:
            self._timer.cancel()


def _start_input(channel, preamble: bytes, stdin) -> None:
    """Send the preamble and stdin from a thread, as it arrives; EOF when it ends."""
    if not preamble and stdin is None:
        channel.shutdown_write()
        return
    threading.Thread(target=_send_input, args=(channel, preamble, stdin), daemon=True).start()


def _send_input(channel, preamble: bytes, stdin) -> None:
    try:
        # In pieces: paramiko's sendall re-slices (copies) the rest of its input after every
        # packet, which makes one large input quadratic (a 190 MB wheel took minutes).
        for piece in stdin_pieces(preamble):
            channel.sendall(piece)
        for piece in stdin_pieces(stdin):
            if channel.closed:
                return
            channel.sendall(piece)
        channel.shutdown_write()
    except (OSError, ValueError, paramiko.SSHException, EOFError):
        pass  # the channel closed (command ended or deadline): its exit status tells the story


def _drain(channel, options: RunOptions):
    """Read stdout and stderr together until both end, so neither pipe can fill and block.
    Kept only when options.capture: a streaming caller's output costs no memory here."""
    out, err = OutputKeeper(options.capture), OutputKeeper(options.capture)

    def drain_once() -> bool:
        got = False
        while channel.recv_ready():
            chunk = channel.recv(READ_AT_ONCE)
            if not chunk:
                break
            got = True
            out.add(chunk)
            if options.on_stdout:
                options.on_stdout(chunk)
        while channel.recv_stderr_ready():
            chunk = channel.recv_stderr(READ_AT_ONCE)
            got = True
            err.add(chunk)
            if options.on_stderr:
                options.on_stderr(chunk)
        return got

    while True:
        got = drain_once()
        if channel.closed or (channel.eof_received and channel.exit_status_ready()):
            drain_once()  # whatever arrived together with the end
            break
        if not got:
            select.select([channel], [], [], 0.5)
    return out.value(), err.value()
