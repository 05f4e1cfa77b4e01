"""One reused SSH connection per Proxmox host (paramiko), with host keys checked.

Why paramiko directly rather than one `ssh` process per command: a connection is set up
once (about 190 ms here) and every later command costs one channel (a few ms with
TCP_NODELAY, which paramiko does not set by itself). Host keys come from known_hosts; an
unknown key is refused unless the user asked for trust-on-first-use, a changed key always.
"""

from __future__ import annotations

import os
import select
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import paramiko

from orchestrator.errors import (AuthRefused, CommandTimeout, HostKeyChanged, HostKeyUnknown,
                                 HostUnreachable)
from orchestrator.remote.base import BufferedLines, Process, Result, RunOptions, Transport, validate_argv

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


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
    keepalive: int = 15
    trust_on_first_use: bool = False

    def known_hosts_name(self) -> str:
        """The name a host key is filed under in known_hosts, as OpenSSH writes it."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise _UnknownKey(hostname, key)


class _TrustFirstUse(paramiko.MissingHostKeyPolicy):
    """Records a new key in known_hosts; only used when the user asked for it explicitly."""

    def __init__(self, known_hosts_path: str):
        self.path = known_hosts_path

    def missing_host_key(self, client, hostname, key):
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="ascii") as handle:
            handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class _UnknownKey(Exception):
    def __init__(self, hostname, key):
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


def fingerprint(key: paramiko.PKey) -> str:
    return key.fingerprint if hasattr(key, "fingerprint") else key.get_name()


class SshHost(Transport):
    """Commands on a host through one lazily opened, reused SSH connection."""

    def __init__(self, settings: SshSettings):
        self.settings = settings
        self.name = settings.name
        self._client: Optional[paramiko.SSHClient] = None
        self._jump_host: Optional[SshHost] = None
        self._lock = threading.Lock()

    # -- connection -------------------------------------------------------------------
    def connect(self) -> paramiko.Transport:
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                self._client.close()
                self._client = None
            self._client = self._open_client()
            return self._client.get_transport()

    def _open_client(self) -> paramiko.SSHClient:
        s = self.settings
        known_hosts = os.path.expanduser(s.known_hosts)
        client = paramiko.SSHClient()
        if os.path.exists(known_hosts):
            client.load_host_keys(known_hosts)
        client.set_missing_host_key_policy(
            _TrustFirstUse(known_hosts) if s.trust_on_first_use else _RefuseUnknown())
        sock = self._open_socket()
        try:
            client.connect(
                s.address, port=s.port, username=s.user, sock=sock,
                key_filename=[os.path.expanduser(p) for p in s.identity] or None,
                timeout=s.connect_timeout, banner_timeout=s.connect_timeout,
                auth_timeout=s.connect_timeout, allow_agent=True, look_for_keys=not s.identity)
        except _UnknownKey as unknown:
            sock.close()
            raise HostKeyUnknown(
                f"host {s.name} ({unknown.hostname}) offered a host key that is not in "
                f"{s.known_hosts}: {unknown.key.get_name()} {fingerprint(unknown.key)}",
                hint="check the fingerprint with the host's administrator, then add it with "
                     "`ssh-keyscan` to known_hosts, or rerun with --trust-new-host-keys") from None
        except paramiko.BadHostKeyException as bad:
            sock.close()
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
            raise HostUnreachable(f"SSH to host {s.name} ({s.address}:{s.port}) failed: {error}") from None
        transport = client.get_transport()
        transport.set_keepalive(s.keepalive)
        return client

    def _open_socket(self):
        s = self.settings
        if s.jump is not None:
            return self._open_via_jump()
        try:
            sock = socket.create_connection((s.address, s.port), timeout=s.connect_timeout)
        except OSError as error:
            raise HostUnreachable(
                f"cannot reach host {s.name} at {s.address}:{s.port}: {error.strerror or error}",
                hint="check the address in the inventory and that sshd runs there") from None
        # Without this each channel pays a delayed-ACK stall of about 55 ms.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _open_via_jump(self):
        s = self.settings
        if self._jump_host is None:
            self._jump_host = SshHost(s.jump)
        try:
            return self._jump_host.connect().open_channel(
                "direct-tcpip", (s.address, s.port), ("127.0.0.1", 0), timeout=s.connect_timeout)
        except (paramiko.SSHException, OSError) as error:
            raise HostUnreachable(
                f"cannot reach host {s.name} through jump host {s.jump.name}: {error}") from None

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
        if self._jump_host is not None:
            self._jump_host.close()

    # -- commands ---------------------------------------------------------------------
    def _run(self, argv: list[str], options: RunOptions) -> Result:
        started = time.monotonic()
        channel = self._open_channel(min(options.timeout or 30.0, 30.0))
        # exec_command waits for the server's reply without a timeout of its own: a timer
        # that closes the channel makes every step of the command honour the deadline.
        timer = _ChannelDeadline(channel, options.timeout)
        try:
            for key, value in options.env.items():
                channel.update_environment({key: value})  # best effort; sshd may refuse
            channel.exec_command(shlex.join(argv))
            if options.stdin is not None:
                threading.Thread(target=_send_stdin, args=(channel, options.stdin), daemon=True).start()
            else:
                channel.shutdown_write()
            stdout, stderr = _drain(channel, options)
            exit_code = channel.recv_exit_status() if not timer.fired else -1
        except (paramiko.SSHException, OSError, EOFError):
            if not timer.fired:
                raise HostUnreachable(f"the connection to host {self.name} broke during "
                                      f"{shlex.join(argv)[:80]}") from None
            stdout = stderr = b""
        finally:
            timer.cancel()
            channel.close()
        result = Result(argv, exit_code if not timer.fired else 124, stdout, stderr,
                        time.monotonic() - started, self.name)
        if timer.fired:
            raise CommandTimeout(
                f"command {result.display()} on host {self.name} did not finish within "
                f"{options.timeout:g} s", result=result,
                hint="the host may be unreachable or the command slow; raise --timeout if it is slow")
        return result

    def spawn(self, argv) -> Process:
        channel = self._open_channel(30.0)
        channel.exec_command(shlex.join(validate_argv(argv)))
        return _ChannelProcess(channel)

    def _open_channel(self, timeout):
        transport = self.connect()
        try:
            return transport.open_session(timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as error:
            # One reconnect: a dropped connection is normal after a network blip.
            if transport.is_active():
                raise CommandTimeout(f"host {self.name} did not open a channel within "
                                     f"{timeout:g} s: {error}") from None
            self.close()
            try:
                return self.connect().open_session(timeout=timeout)
            except (paramiko.SSHException, OSError, EOFError) as again:
                raise HostUnreachable(f"host {self.name} is not answering: {again}") from None


class _ChannelProcess(Process):
    def __init__(self, channel):
        self._channel = channel
        self._lines = BufferedLines(self._read_some)

    def _read_some(self, timeout):
        if not self._channel.recv_ready():
            if self._channel.closed or self._channel.eof_received:
                return b""
            select.select([self._channel], [], [], timeout)
            if not self._channel.recv_ready():
                return b"" if self._channel.eof_received else None
        return self._channel.recv(65536)

    def write(self, data: bytes) -> None:
        try:
            self._channel.sendall(data)
        except (OSError, paramiko.SSHException, EOFError) as error:
            raise BrokenPipeError(str(error)) from None

    def readline(self, timeout):
        return self._lines.readline(timeout)

    def close(self) -> None:
        self._channel.close()


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
        self._channel.close()

    def cancel(self):
        if self._timer is not None:
            self._timer.cancel()


_STDIN_PIECE = 1 << 16


def _send_stdin(channel, data: bytes) -> None:
    try:
        # In pieces: paramiko's sendall re-slices (copies) the rest of its input after every
        # packet, which makes one large input quadratic (a 190 MB wheel took minutes).
        view = memoryview(data)
        for start in range(0, len(view), _STDIN_PIECE):
            channel.sendall(view[start:start + _STDIN_PIECE].tobytes())
        channel.shutdown_write()
    except (OSError, paramiko.SSHException, EOFError):
        pass  # the channel closed (command ended or deadline): its exit status tells the story


def _drain(channel, options: RunOptions):
    """Read stdout and stderr together until both end, so neither pipe can fill and block."""
    out, err = [], []

    def drain_once() -> bool:
        got = False
        while channel.recv_ready():
            chunk = channel.recv(65536)
            if not chunk:
                break
            got = True
            out.append(chunk)
            if options.on_stdout:
                options.on_stdout(chunk)
        while channel.recv_stderr_ready():
            chunk = channel.recv_stderr(65536)
            got = True
            err.append(chunk)
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
    return b"".join(out), b"".join(err)
