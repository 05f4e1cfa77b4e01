"""Local TCP ports that reach a port inside a container (`orch forward`), directly or by a
relay.

A container may have no address its host (or this machine) can reach, so the one way that
always works is the way every command already goes: each connection accepted on a local
port opens one exec channel running a stdlib payload in the container (payloads/forward.py,
`python3 -I -S`, under orch's reaper) that connects to 127.0.0.1:PORT there and copies
bytes both ways over the channel's stdin and stdout. The channel is an ordinary command of
the target: the host's SSH connections, their channel limit (a stock sshd's MaxSessions,
10 per connection: remote/ssh.py opens more connections, up to the host's `connections`,
then waits for a free channel) and the dead-link watchdog are the same as for `orch exec`.

Direct mode (--via direct, or auto's choice): each connection is a `direct-tcpip` channel
of the host's SSH connection to CONTAINER_ADDRESS:PORT: no process in the container, and
not a session (MaxSessions does not count it), but it needs the container's address
(inventory or Proxmox API), a listener bound to a non-loopback address there (0.0.0.0, ::
or that address: TensorBoard's and debugpy's 127.0.0.1 default is reachable only by the
relay), and a host sshd that allows TCP forwarding (AllowTcpForwarding; a refused channel
makes auto fall back to the relay for that port).

Only the user's own account: a connection from a socket of this machine owned by another
uid is closed at once, unanswered (the kernel's table of TCP sockets, /proc/net/tcp and
tcp6, says whose the peer's socket is: its `uid` column). A loopback port is otherwise open
to every account here, and what it reaches (a debugpy listener, a Jupyter) runs code in
the container as its user. With a non-loopback --bind, connections from other machines are
taken (that is what the bind asks for); other accounts here are still refused.
"""

from __future__ import annotations

import ipaddress
import os
import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from orchestrator.ground import invocation
from orchestrator.ground.errors import (BadArgument, ConnectionProblem, ContainerProblem,
                                        OrchError, PythonUnavailable)
from orchestrator.payloads import compact_source
from orchestrator.remote.container import Target, no_python3
from orchestrator.remote.paramiko_lib import READ_AT_ONCE
from orchestrator.remote.payload_api import SYSTEM_PYTHON

DEFAULT_BIND = "127.0.0.1"
DEFAULT_MAX_CONNECTIONS = 64   # at once per forward; more are closed at once, said on stderr
NOT_CONNECTED = 3              # the payload's exit status: nothing listens on the port there
ACCEPT_POLL_S = 0.5            # how often the accept loop looks at the stop flag
CLOSE_GRACE_S = 1.0            # closing: how long relays may end by themselves (EOF both ways)
CHUNK = 1 << 16
_SPEC = re.compile(r"(?:(\d{1,5}):)?(\d{1,5})")

Say = Callable[[str], None]


@dataclass(frozen=True)
class PortSpec:
    """One forward: local_port on bind (0: any free port) to remote_port in the container."""

    local_port: int
    remote_port: int
    bind: str = DEFAULT_BIND


def parse_spec(text: str, bind: str = DEFAULT_BIND) -> PortSpec:
    """`PORT` (the same number here) or `LOCALPORT:PORT`, as ssh -L orders them."""
    found = _SPEC.fullmatch(text.strip())
    if not found:
        raise BadArgument(f"port spec {text!r}: expected PORT or LOCALPORT:PORT (e.g. 6006 "
                          "or 16006:6006)")
    remote = int(found.group(2))
    local = int(found.group(1)) if found.group(1) is not None else remote
    if not 1 <= remote <= 65535 or not 0 <= local <= 65535:
        raise BadArgument(f"port spec {text!r}: ports are 1-65535 (a local port of 0 takes "
                          "any free one)")
    return PortSpec(local, remote, bind)


def relay_argv(port: int, probe: bool = False) -> list[str]:
    return [SYSTEM_PYTHON, "-I", "-S", "-c", compact_source("forward"), str(port),
            *(["probe"] if probe else [])]


def probe(target: Target, port: int) -> bool:
    """Whether a socket listens on `port` in the target now (see listeners)."""
    return bool(listeners(target, port))


def listeners(target: Target, port: int) -> list[str]:
    """The local addresses the sockets listening on `port` in the target are bound to,
    seen in the kernel's tables without connecting (a one-client server such as debugpy's
    would take a test connection for its client). Raises what a command there raises
    (host unreachable, no such container, no python3)."""
    result = target.run(relay_argv(port, probe=True), timeout=30)
    if result.exit_code == NOT_CONNECTED:
        return []
    if result.exit_code == 0:
        lines = result.stdout.decode(errors="replace").splitlines()[:16]
        return [line.strip() for line in lines if 0 < len(line.strip()) <= 45]
    raise _relay_failure(target, result)


VIAS = ("auto", "direct", "relay")
WILDCARDS = ("0.0.0.0", "::")


def choose_way(via: str, port: int, located, bound: list[str]) -> tuple[str, str]:
    """("direct" | "relay", why) for one port: direct needs the container's address (a
    targets.addresses.Located, or None) and a listener bound to it or to a wildcard. An
    address only the container's own network reports (its root chooses it, and a direct
    channel goes wherever it says, from the host) is used by --via direct alone. --via
    direct without them is a BadArgument."""
    address = located.address if located is not None else None
    reachable = [b for b in bound if b in WILDCARDS or (address is not None and b == address)]
    if via == "relay":
        return "relay", "--via relay"
    if address is None:
        why = "the container's address is unknown (no `address:` and no Proxmox API answer)"
    elif via == "auto" and not located.trusted:
        return "relay", (f"its address {address} comes from {located.source}, not from the "
                         "inventory or its Proxmox config (--via direct would use it)")
    elif not bound:
        why = "nothing listens there yet"
    elif not reachable:
        why = (f"its server listens on {', '.join(bound)} only, reachable from inside the "
               "container alone")
    else:
        return "direct", (f"{address}:{port} (from {located.source}) through the host's SSH "
                          "connection")
    if via == "direct":
        raise BadArgument(f"--via direct: port {port} cannot be reached directly: {why}",
                          hint="bind the server to 0.0.0.0 in the container, or use "
                               "--via relay (or auto)")
    return "relay", why


def _relay_failure(target: Target, result) -> OrchError:
    if no_python3(result) or result.exit_code in (126, 127):
        return PythonUnavailable(f"{target.name}: the forward's relay needs python3 in the "
                                 f"container: {' '.join(result.stderr_tail(1))}",
                                 hint=f"`orch inventory check {target.name}` says how to "
                                      "install it")
    tail = "; ".join(result.stderr_tail(2)) or "no message"
    return OrchError(f"{target.name}: the forward's relay ended with exit code "
                     f"{result.exit_code}: {tail}")


class _ClientGone(Exception):
    """The local client's socket failed under a write. Not an OSError, which the
    transport would take for a broken link."""


class _ClientReader:
    """The local socket as the command's stdin (read(n); b"" at its end or on an error).
    No fileno: the transport would read the descriptor itself, without the error rule."""

    def __init__(self, sock: socket.socket, counted: Callable[[int], None]):
        self._sock = sock
        self._counted = counted

    def read(self, size: int = CHUNK) -> bytes:
        try:
            data = self._sock.recv(min(size, CHUNK) if size and size > 0 else CHUNK)
        except OSError:
            return b""
        self._counted(len(data))
        return data


@dataclass
class Stats:
    """What a forward carried (for its closing line, and tests)."""

    accepted: int = 0
    refused: int = 0          # over max_connections: closed at once
    not_listening: int = 0    # nothing accepted the connection in the container
    active: int = 0
    peak_active: int = 0
    bytes_in: int = 0         # local client -> container
    bytes_out: int = 0        # container -> local client
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, count: int) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + count)
            if name == "active":
                self.peak_active = max(self.peak_active, self.active)


class Forwarder:
    """Listening sockets for `specs` and one relay (a thread and a channel) per accepted
    connection. open() binds them, serve() accepts until stop() or a fatal error (the
    link lost, the container gone), close() ends every connection."""

    def __init__(self, target: Target, specs: list[PortSpec], *,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, say: Say = lambda _: None):
        self.target = target
        # remote port -> the container's address for a direct-tcpip channel; absent: relay
        self.direct: dict[int, str] = {}
        self._channels: set = set()   # the open direct channels, closed by close()
        self.specs = specs
        self.max_connections = max(1, max_connections)
        self.say = say
        self.stats = Stats()
        self.listeners: list[tuple[socket.socket, PortSpec]] = []
        self.fatal: Optional[OrchError] = None
        self._stopping = threading.Event()
        self._clients: set = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._waiting_said = False

    # -- listening --------------------------------------------------------------------
    def open(self) -> list[tuple[str, int, int]]:
        """Bind every spec; returns (address, local port, remote port) of each."""
        try:
            for spec in self.specs:
                self.listeners.append((self._listen(spec), spec))
        except BaseException:
            self.close()
            raise
        return [(sock.getsockname()[0], sock.getsockname()[1], spec.remote_port)
                for sock, spec in self.listeners]

    @staticmethod
    def _listen(spec: PortSpec) -> socket.socket:
        try:
            infos = socket.getaddrinfo(spec.bind, spec.local_port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except socket.gaierror as error:
            raise BadArgument(f"--bind {spec.bind!r}: not an address here ({error.strerror})") from None
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(64)
        except OSError as error:
            sock.close()
            raise BadArgument(f"cannot listen on {spec.bind}:{spec.local_port}: "
                              f"{error.strerror or error}",
                              hint="pick another local port (LOCALPORT:PORT, or 0:PORT for "
                                   "any free one)") from None
        return sock

    # -- accepting --------------------------------------------------------------------
    def serve(self, until: Optional[float] = None) -> None:
        """Accept connections until stop(), a fatal error (raised here) or `until` (a
        time.monotonic() value; None: no end)."""
        by_socket = {sock: spec for sock, spec in self.listeners}
        while not self._stopping.is_set():
            if until is not None and time.monotonic() >= until:
                return
            try:
                ready, _, _ = select.select(list(by_socket), [], [], ACCEPT_POLL_S)
            except (OSError, ValueError):
                break   # a listener closed under select: stop() ran
            for sock in ready:
                self._accept(sock, by_socket[sock])
        if self.fatal is not None:
            raise self.fatal

    def _accept(self, listener: socket.socket, spec: PortSpec) -> None:
        try:
            client, peer = listener.accept()
        except OSError:
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stats.add("accepted", 1)
        refusal = _other_account(client, peer, spec.bind)
        if refusal:
            self.stats.add("refused", 1)
            self.say(f"refused a connection from {_peer(peer)}: {refusal}")
            _close(client)
            return
        if self.stats.active >= self.max_connections:
            self.stats.add("refused", 1)
            self.say(f"refused a connection from {_peer(peer)}: {self.max_connections} "
                     "connections are open already (--max-connections)")
            _close(client)
            return
        self._note_if_waiting()
        thread = threading.Thread(target=invocation.bind(self._relay), name="orch-forward",
                                  args=(client, peer, spec), daemon=True)
        with self._lock:
            # started under the lock: close() joins only threads that have started
            self._clients.add(client)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            self.stats.add("active", 1)
            thread.start()

    def _note_if_waiting(self) -> None:
        """Say once when a new connection has to wait for a free SSH channel of the host."""
        settings = getattr(self.target.host, "settings", None)
        if settings is None or self._waiting_said:
            return
        channels = settings.max_sessions * max(1, settings.connections)
        if self.stats.active >= channels:
            self._waiting_said = True
            self.say(f"{self.stats.active} connections are open: more wait for a free SSH "
                     f"channel of host {self.target.host.name} ({settings.connections} "
                     f"connection(s) x {settings.max_sessions} channels; the inventory's "
                     "`connections` raises it)")

    # -- one connection ---------------------------------------------------------------
    def _relay(self, client: socket.socket, peer, spec: PortSpec) -> None:
        address = self.direct.get(spec.remote_port)
        if address is not None and self._direct(client, peer, spec, address):
            return
        self._by_relay(client, peer, spec)

    def _direct(self, client: socket.socket, peer, spec: PortSpec, address: str) -> bool:
        """One connection as a direct-tcpip channel; False (the relay takes it, and every
        later one of the port) when the host refuses to open it."""
        try:
            channel = self.target.host.connect().open_channel(
                "direct-tcpip", (address, spec.remote_port), _origin(peer), timeout=10)
        except Exception as error:   # paramiko's ChannelException, SSHException, OSError
            with self._lock:
                first = self.direct.pop(spec.remote_port, None) is not None
            if first:
                self.say(f"port {spec.remote_port}: the host did not open a direct channel "
                         f"to {address}:{spec.remote_port} ({error}; its sshd may forbid TCP "
                         "forwarding: AllowTcpForwarding): by relay from now on")
            return False
        with self._lock:
            self._channels.add(channel)
        try:
            _pump(client, channel, self.stats)
        finally:
            channel.close()
            with self._lock:
                self._clients.discard(client)
                self._channels.discard(channel)
            _shut(client)
            _close(client)
            self.stats.add("active", -1)
        return True

    def _by_relay(self, client: socket.socket, peer, spec: PortSpec) -> None:
        try:
            result = self.target.run(
                relay_argv(spec.remote_port), timeout=None, capture=False, kill_on_close=True,
                stdin=_ClientReader(client, lambda n: self.stats.add("bytes_in", n)),
                on_stdout=lambda chunk: self._to_client(client, chunk))
            if result.exit_code == NOT_CONNECTED:
                self.stats.add("not_listening", 1)
                self.say(f"connection from {_peer(peer)}: nothing listens on port "
                         f"{spec.remote_port} in {self.target.name} ("
                         f"{_why_not(result)})")
            elif result.exit_code != 0 and not self._stopping.is_set():
                self.say(f"connection from {_peer(peer)}: {_relay_failure(self.target, result)}")
        except _ClientGone:
            pass   # the local client closed: its channel closed with it
        except (ConnectionProblem, ContainerProblem) as error:
            if not self._stopping.is_set():
                self._fail(error)
        except OrchError as error:
            if not self._stopping.is_set():
                self.say(f"connection from {_peer(peer)}: {error}")
        finally:
            with self._lock:
                self._clients.discard(client)
            # shut down first: the stdin thread may still wait in recv() on it, and a close
            # alone sends nothing while a call holds the socket (the client would hang)
            _shut(client)
            _close(client)
            self.stats.add("active", -1)

    def _to_client(self, client: socket.socket, chunk: bytes) -> None:
        try:
            client.sendall(chunk)
        except OSError:
            raise _ClientGone() from None
        self.stats.add("bytes_out", len(chunk))

    def _fail(self, error: OrchError) -> None:
        """The first fatal error stops the forward (every later one is its consequence),
        said about the forward rather than about the relay's command line."""
        with self._lock:
            if self.fatal is None:
                self.fatal = _restated(error, self.target)
        self._stopping.set()

    # -- ending -----------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping.set()

    def close(self, wait: float = 5.0) -> None:
        """Stop accepting, close every local connection (their channels close with their
        commands: the reaper ends each relay in the container) and wait for the relays."""
        self._stopping.set()
        for sock, _ in self.listeners:
            _close(sock)
        with self._lock:
            clients, threads = list(self._clients), list(self._threads)
            channels = list(self._channels)
        for client in clients:
            _shut(client)
        for channel in channels:   # a server that keeps its side open: no relay to reap
            _quietly_close(channel)
        deadline = time.monotonic() + wait
        for thread in threads:
            thread.join(max(0.0, min(deadline, time.monotonic() + CLOSE_GRACE_S) - time.monotonic()))
        if any(thread.is_alive() for thread in threads):
            # a server that keeps its side open (a debugger): close the relays' channels
            invocation.current().interrupt.close_filed()
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))


def _restated(error: OrchError, target: Target) -> OrchError:
    """A relay's host or container error as the forward's: same type (its exit code), its
    message naming the forward; a lost link's cause (a dead link's keepalives) kept."""
    if getattr(error, "why", None) is not None:   # ConnectionLost: its message names the relay
        why = f" ({error.why})" if error.why else ""
        restated = type(error)(f"the connection to host {target.host.name} broke{why}: "
                               f"the forward to {target.name} stopped",
                               hint="check the host is up, then run orch forward again")
        restated.why = error.why
        return restated
    return error


TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def _other_account(client: socket.socket, peer, bind: str) -> Optional[str]:
    """Why a connection may not be served (another account of this machine owns its
    socket, or whose it is cannot be told on a loopback port), or None."""
    try:
        uid = peer_uid(client.getsockname(), peer)
    except OSError:
        uid = None
    if uid is None:
        if _is_loopback(bind):
            return "no socket of this machine is it (it closed at once?): not served"
        return None       # another machine: a non-loopback --bind asks for those
    if uid != os.getuid():
        return (f"its socket belongs to uid {uid}, not to you: orch forward serves your "
                "own account only")
    return None


def peer_uid(ours, peer) -> Optional[int]:
    """The uid owning the socket of this machine whose local end is `peer` and whose remote
    end is `ours` (the accepted socket's own address), from the kernel's tables; None when
    no socket of this machine (of this network namespace) is it."""
    # the peer's line: its local end is the peer, its remote end us (in either table's form)
    wanted = {(theirs, mine) for theirs in _table_address(peer) for mine in _table_address(ours)}
    for table in TCP_TABLES:
        try:
            with open(table) as handle:
                next(handle, None)                      # the header
                for line in handle:
                    fields = line.split()
                    if len(fields) > 7 and (fields[1], fields[2]) in wanted:
                        return int(fields[7])
        except FileNotFoundError:
            continue
    return None


def _table_address(address) -> tuple:
    """ADDRESS:PORT as /proc/net/tcp{,6} print it: the address's 32-bit words in host order
    (little-endian here) as hex, the port as 4 hex digits; an IPv4 address both as itself
    and IPv4-mapped (tcp6's form of it)."""
    host, port = address[0], address[1]
    ip = ipaddress.ip_address(host.split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    forms = []
    if ip.version == 4:
        forms.append("%08X:%04X" % (struct.unpack("<I", ip.packed)[0], port))
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    words = struct.unpack("<4I", ip.packed)
    forms.append("%08X%08X%08X%08X:%04X" % (*words, port))
    return tuple(forms)


def _is_loopback(bind: str) -> bool:
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return bind == "localhost"


def _quietly_close(channel) -> None:
    try:
        channel.close()
    except Exception:   # paramiko's errors on an already broken transport
        pass


def _origin(peer) -> tuple[str, int]:
    return (peer[0], peer[1]) if isinstance(peer, tuple) and len(peer) >= 2 else ("127.0.0.1", 0)


def _pump(client: socket.socket, channel, stats: Stats) -> None:
    """Bytes both ways between the local client and a direct-tcpip channel; the client's
    end half-closes the channel (as ssh -L), the channel's end ends the connection."""
    def upstream():
        try:
            while True:
                data = client.recv(CHUNK)
                if not data:
                    break
                channel.sendall(data)
                stats.add("bytes_in", len(data))
            channel.shutdown_write()
        except (OSError, EOFError):
            pass
    thread = threading.Thread(target=upstream, name="orch-forward-up", daemon=True)
    thread.start()
    try:
        while True:
            data = channel.recv(READ_AT_ONCE)   # a whole window at once: see READ_AT_ONCE
            if not data:
                break
            client.sendall(data)
            stats.add("bytes_out", len(data))
    except (OSError, EOFError):
        pass


def _why_not(result) -> str:
    tail = " ".join(result.stderr_tail(1))
    return tail.rsplit(": ", 1)[-1] if ": " in tail else (tail or "refused")


def _peer(peer) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)


def _shut(sock: socket.socket) -> None:
    """Wake a relay blocked reading this socket: its stdin ends, its channel follows."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def url(address: str, port: int) -> str:
    """How the forward is reached, as printed: http://127.0.0.1:6006 (an IPv6 address in
    brackets; a wildcard bind is reached on localhost)."""
    if address in ("0.0.0.0", "::", ""):
        address = "127.0.0.1"
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"
