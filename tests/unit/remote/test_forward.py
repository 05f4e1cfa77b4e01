"""orch forward's relay on this machine: the real payload (payloads/forward.py) run by the
local transport, real sockets on both sides; SSH and pct are the sandbox tests'
(tests/integration/test_forward_sandbox.py). Fakes stand in for a link that breaks."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.ground.errors import BadArgument, ConnectionLost, HostUnreachable
from orchestrator.remote import forward
from orchestrator.targets.addresses import FROM_NAMESPACE, Located
from orchestrator.remote.base import Result, Transport
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from tests.support.cli import inventory, orch  # noqa: F401 (a fixture)
from tests.support.forwarders import forwarders_in_threads
from tests.support.listeners import accept_in_a_thread


@pytest.mark.parametrize("text, spec", [
    ("6006", (6006, 6006)), ("16006:6006", (16006, 6006)), ("0:8888", (0, 8888)),
    (" 5678 ", (5678, 5678)),
])
def test_port_specs(text, spec):
    parsed = forward.parse_spec(text, "::1")
    assert (parsed.local_port, parsed.remote_port, parsed.bind) == (*spec, "::1")


@pytest.mark.parametrize("text", ["", "abc", "6006:", ":6006", "1:2:3", "0", "70000", "1:99999",
                                  "-1"])
def test_bad_port_specs_are_refused_with_the_form(text):
    with pytest.raises(BadArgument) as raised:
        forward.parse_spec(text)
    assert f"port spec {text!r}:" in str(raised.value)


def test_urls():
    assert forward.url("127.0.0.1", 6006) == "http://127.0.0.1:6006"
    assert forward.url("0.0.0.0", 8888) == "http://127.0.0.1:8888"
    assert forward.url("::1", 8888) == "http://[::1]:8888"


class Server:
    """A TCP server on 127.0.0.1 with a behaviour per connection, in a thread."""

    def __init__(self, handle):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handle = handle
        accept_in_a_thread(self.sock, self._start_one)

    def _start_one(self, conn):
        threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            self.handle(conn)
        finally:
            conn.close()

    def close(self):
        try:   # wakes the accept(): a close alone leaves the socket listening meanwhile
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def read_all(conn):
    chunks = []
    while True:
        data = conn.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def digest_of_input(conn):
    """Reads until the client's EOF, answers the sha256 of what came: only a half-close
    relayed through lets this answer arrive."""
    conn.sendall(hashlib.sha256(read_all(conn)).hexdigest().encode())


@pytest.fixture
def started():
    """forwarders(target, ports...) -> (Forwarder, [local port]), served in a thread."""
    with forwarders_in_threads() as start:
        yield start


def local_target():
    return Target("here", LocalTransport())


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def test_bytes_go_both_ways_and_a_half_close_reaches_the_server(started):
    server = Server(digest_of_input)
    forwarder, [port] = started(local_target(), server.port)
    data = os.urandom(3 << 20)
    with connect(port) as client:
        client.sendall(data)
        client.shutdown(socket.SHUT_WR)   # the client closes first (its write side)
        assert read_all(client).decode() == hashlib.sha256(data).hexdigest()
    wait_for(lambda: forwarder.stats.active == 0)
    assert forwarder.stats.bytes_in == len(data) and forwarder.stats.bytes_out == 64


def test_the_server_closing_first_closes_the_client_with_everything_sent(started):
    body = os.urandom(5 << 20)
    server = Server(lambda conn: conn.sendall(body))
    forwarder, [port] = started(local_target(), server.port)
    with connect(port) as client:
        assert hashlib.sha256(read_all(client)).digest() == hashlib.sha256(body).digest()
    wait_for(lambda: forwarder.stats.active == 0)


def test_connections_run_at_once(started):
    gate = threading.Barrier(4, timeout=20)

    def together(conn):   # answers only once all four connections are in
        conn.recv(16)
        gate.wait()
        conn.sendall(b"all here")
    server = Server(together)
    forwarder, [port] = started(local_target(), server.port)
    clients = [connect(port) for _ in range(4)]
    for client in clients:
        client.sendall(b"hi")
    assert [read_all(c) for c in clients] == [b"all here"] * 4
    assert forwarder.stats.peak_active == 4
    for client in clients:
        client.close()


def test_nothing_listening_closes_the_connection_and_says_so(started):
    free = socket.create_server(("127.0.0.1", 0))
    port_nobody_uses = free.getsockname()[1]
    free.close()
    forwarder, [port] = started(local_target(), port_nobody_uses)
    with connect(port) as client:
        assert read_all(client) == b""
    wait_for(lambda: forwarder.stats.not_listening == 1)
    assert any(f"nothing listens on port {port_nobody_uses}" in line for line in forwarder.said)
    assert not forward.probe(local_target(), port_nobody_uses)


def test_the_probe_sees_a_listener_without_connecting_to_it():
    """A one-client server (debugpy's adapter) would take a test connection for its client."""
    accepted = []
    server = Server(accepted.append)
    try:
        assert forward.probe(local_target(), server.port)
        time.sleep(0.2)
        assert accepted == []
    finally:
        server.close()
    assert not forward.probe(local_target(), server.port)


def test_connections_beyond_the_limit_are_refused_and_the_others_go_on(started):
    release = threading.Event()

    def hold(conn):
        release.wait(20)
        conn.sendall(b"done")
    server = Server(hold)
    forwarder, [port] = started(local_target(), server.port, max_connections=2)
    held = [connect(port) for _ in range(2)]
    wait_for(lambda: forwarder.stats.active == 2)
    with connect(port) as third:
        assert read_all(third) == b""
    assert forwarder.stats.refused == 1
    assert any("2 connections are open already" in line for line in forwarder.said)
    release.set()
    assert [read_all(c) for c in held] == [b"done"] * 2


CLIENT_AS = r"""
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20) as client:
    data = b""
    try:
        client.sendall(b"import os; os.system('touch /tmp/pwned')\n")
        client.shutdown(socket.SHUT_WR)
    except OSError:   # refused so fast that the connection is gone already (reset, not connected)
        print(0)
        sys.exit(0)
    while True:
        try:
            piece = client.recv(65536)
        except ConnectionResetError:
            break
        if not piece:
            break
        data += piece
print(len(data))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a client of another uid needs root to start")
def test_another_account_of_this_machine_is_refused_unanswered(started):
    """A loopback port is open to every account here: through the debugpy recipe, any of
    them ran code in the trainer. Only the user's own uid is served now."""
    server = Server(digest_of_input)
    forwarder, [port] = started(local_target(), server.port)
    # the system python: this venv's may be in a folder uid 65534 cannot enter
    other = subprocess.run(["/usr/bin/python3", "-I", "-c", CLIENT_AS, str(port)], user=65534,
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == "0"                  # nothing came back, nothing relayed
    assert forwarder.stats.refused == 1 and forwarder.stats.bytes_in == 0
    assert any("its socket belongs to uid 65534, not to you" in line for line in forwarder.said)
    mine = subprocess.run([sys.executable, "-I", "-c", CLIENT_AS, str(port)],
                          capture_output=True, text=True, timeout=60)
    assert mine.stdout.strip() == "64"                  # our own account: served


def test_the_kernels_table_names_the_peers_uid():
    for host, family in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)):
        with socket.create_server((host, 0), family=family) as listener, \
                socket.create_connection((host, listener.getsockname()[1])) as client:
            accepted, peer = listener.accept()
            with accepted:
                assert forward.peer_uid(accepted.getsockname(), peer) == os.getuid()
                assert forward.peer_uid(accepted.getsockname(), (host, 1)) is None
            assert client


def test_a_port_taken_here_is_a_bad_argument():
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        forwarder = forward.Forwarder(local_target(),
                                      [forward.PortSpec(taken.getsockname()[1], 80)])
        with pytest.raises(BadArgument, match="cannot listen on 127.0.0.1"):
            forwarder.open()
        assert forwarder.listeners == [] or all(s.fileno() == -1 for s, _ in forwarder.listeners)
    finally:
        taken.close()


class BrokenLink(Transport):
    """A host whose link breaks under the first relay: its command raises ConnectionLost
    once the client has sent something."""

    name = "far"

    def _run(self, argv, options):
        next(iter(lambda: options.stdin.read(1024), b""), None)
        error = ConnectionLost("the connection to host far broke while python3 -I -S -c ... ran")
        error.why = "the host answered none of 3 keepalive(s) in 20 s"
        raise error


def test_a_lost_link_stops_the_forward_with_a_clear_message(started):
    forwarder, [port] = started(Target("ct", BrokenLink(), vmid=200), 6006)
    with connect(port) as client:
        client.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert read_all(client) == b""
    wait_for(lambda: hasattr(forwarder, "raised"))
    error = forwarder.raised
    assert isinstance(error, ConnectionLost) and isinstance(error, HostUnreachable)
    assert str(error).startswith("the connection to host far broke (the host answered none of "
                                 "3 keepalive(s) in 20 s): the forward to ct stopped")
    with pytest.raises(OSError):   # the listener is closed: nothing new is accepted
        forwarder.close()
        connect(port).recv(1)


def test_closing_ends_a_relay_whose_server_never_closes(started):
    server = Server(lambda conn: time.sleep(30))
    forwarder, [port] = started(local_target(), server.port)
    client = connect(port)
    wait_for(lambda: forwarder.stats.active == 1)
    began = time.monotonic()
    forwarder.close(wait=3)
    assert read_all(client) == b""
    assert time.monotonic() - began < 5
    client.close()


def wait_for(condition, timeout=20):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# -- the command ----------------------------------------------------------------------
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_command_prints_the_url_relays_and_stops_on_a_signal(inventory, stop):
    server = Server(lambda conn: conn.sendall(b"hello from the target"))
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", inventory,
                                "forward", "dev2", f"0:{server.port}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "ORCH_AGENT": "off"})
    try:
        line = process.stderr.readline()
        assert line.startswith("http://127.0.0.1:") and f"-> dev2:{server.port} (relay: " in line
        local = int(line.split()[0].rsplit(":", 1)[1])
        with connect(local) as client:
            assert read_all(client) == b"hello from the target"
    finally:
        process.send_signal(stop)   # SIGINT: Ctrl-C
        _, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "forward stopped: 1 connection(s)" in err and "Traceback" not in err


@pytest.mark.parametrize("args, said", [
    (["dev2", "abc"], "port spec 'abc'"),
    (["dev2"], "Missing argument"),
    (["both", "6006"], "names 2 targets: a forward goes to one"),
    (["--bind", "no such address!", "dev2", "6006"], "--bind 'no such address!'"),
])
def test_bad_command_lines_exit_2(inventory, args, said):
    out = orch("-i", inventory, "forward", *args)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr


# -- direct or relay ------------------------------------------------------------------
CONFIGURED = Located("10.0.0.5", "its Proxmox config (net0)", True)
ITS_OWN = Located("10.0.0.5", FROM_NAMESPACE, False)


@pytest.mark.parametrize("located, bound, way", [
    (CONFIGURED, ["0.0.0.0"], "direct"), (CONFIGURED, ["::"], "direct"),
    (CONFIGURED, ["10.0.0.5"], "direct"), (CONFIGURED, ["127.0.0.1"], "relay"),
    (CONFIGURED, ["::1"], "relay"), (None, ["0.0.0.0"], "relay"), (CONFIGURED, [], "relay"),
    (ITS_OWN, ["0.0.0.0"], "relay"),
])
def test_auto_goes_direct_only_to_a_known_address_with_a_listener_bound_to_it(located, bound, way):
    assert forward.choose_way("auto", 6006, located, bound)[0] == way
    assert forward.choose_way("relay", 6006, located, bound)[0] == "relay"


def test_the_way_says_where_the_address_came_from():
    way, why = forward.choose_way("auto", 6006, CONFIGURED, ["0.0.0.0"])
    assert way == "direct" and why == ("10.0.0.5:6006 (from its Proxmox config (net0)) through "
                                       "the host's SSH connection")
    way, why = forward.choose_way("auto", 6006, ITS_OWN, ["0.0.0.0"])
    assert way == "relay" and "comes from the container's own network" in why
    way, why = forward.choose_way("direct", 6006, ITS_OWN, ["0.0.0.0"])   # asked for: used, and said
    assert way == "direct" and "(from the container's own network (its root sets it))" in why


def test_via_direct_to_a_loopback_listener_says_why_it_cannot():
    with pytest.raises(BadArgument, match="port 6006 cannot be reached directly: its server "
                                          "listens on 127.0.0.1 only"):
        forward.choose_way("direct", 6006, CONFIGURED, ["127.0.0.1"])


class FakeChannel:
    """A direct-tcpip channel as paramiko's: here a plain TCP connection."""

    def __init__(self, destination):
        self.sock = socket.create_connection(destination, timeout=30)

    def recv(self, size):
        return self.sock.recv(size)

    def sendall(self, data):
        self.sock.sendall(data)

    def shutdown_write(self):
        self.sock.shutdown(socket.SHUT_WR)

    def close(self):
        self.sock.close()


class DirectHost(LocalTransport):
    """A host whose SSH connection opens direct-tcpip channels (or refuses: forbid)."""

    def __init__(self, forbid=False):
        super().__init__()
        self.opened, self.forbid = [], forbid

    def connect(self):
        return self

    def open_channel(self, kind, destination, origin, timeout=None):
        if self.forbid:
            raise forward_error("Administratively prohibited")
        self.opened.append((kind, destination))
        return FakeChannel(destination)


def forward_error(text):
    import paramiko
    return paramiko.ChannelException(1, text)


def test_a_direct_port_goes_by_direct_tcpip_channels_with_the_half_close(started):
    server = Server(digest_of_input)
    host = DirectHost()
    forwarder, [port] = started(Target("ct", host, vmid=200), server.port)
    forwarder.direct[server.port] = "127.0.0.1"
    payload = os.urandom(3 << 20)
    with connect(port) as client:
        client.sendall(payload)
        client.shutdown(socket.SHUT_WR)
        assert read_all(client) == hashlib.sha256(payload).hexdigest().encode()
    assert host.opened == [("direct-tcpip", ("127.0.0.1", server.port))]


def test_a_refused_direct_channel_falls_back_to_the_relay_and_says_so(started):
    server = Server(lambda conn: conn.sendall(b"by relay"))
    forwarder, [port] = started(Target("ct", DirectHost(forbid=True)), server.port)
    forwarder.direct[server.port] = "127.0.0.1"
    for _ in range(2):
        with connect(port) as client:
            assert read_all(client) == b"by relay"
    assert server.port not in forwarder.direct
    assert [s for s in forwarder.said if "AllowTcpForwarding" in s] and len(forwarder.said) == 1
