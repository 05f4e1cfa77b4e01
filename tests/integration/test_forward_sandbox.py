"""orch forward against the sandbox (real sshd, real LXC, real pct): a real HTTP server
(python3 -m http.server) in a container, reached only through the relay (it listens on the
container's 127.0.0.1): a big response intact (sha256), connections at once, the server
closing first, the client closing first, 100 fetches at once, 12 connections at once on one
SSH connection of a stock sshd (MaxSessions 10), a link that breaks under a relay, and a
debugpy listener answering a DAP initialize request through `orch forward`; and the way
each port goes: a server bound to 0.0.0.0 direct (a direct-tcpip channel of the host's SSH
connection to the CT's address, no relay in the container), one on 127.0.0.1 by relay, and
--via direct refused for the latter."""

from __future__ import annotations

import concurrent.futures
import fcntl
import glob
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from orchestrator.ground.errors import ConnectionLost
from orchestrator.remote import forward, transfer
from orchestrator.targets.fleet import Fleet
from tests.support.forwarders import forwarders_in_threads

pytestmark = pytest.mark.sandbox

BIG_MB = 30
DEBUGPY = "debugpy==1.8.22"
DEBUGPY_CACHE = os.path.expanduser("~/.cache/orch-test/debugpy-wheel")
# Constant text: the folder and port arrive as $1 and $2. setsid: the server outlives this
# command's reaper; its pid is kept for the teardown.
START_SERVER = ('cd "$1" && head -c "$3" /dev/urandom > big.bin && printf small > small.txt '
                '&& sha256sum big.bin | cut -d" " -f1 && { setsid python3 -m http.server "$2" '
                '--bind "$4" >/dev/null 2>&1 </dev/null & echo $! > pid; }')


@pytest.fixture(scope="module")
def web(ct, request):
    """(port, sha256 of big.bin) of an HTTP server in sb1-200 on its 127.0.0.1 only (or on
    the address given as the fixture's param)."""
    folder = f"/tmp/fwd-test-{secrets.token_hex(4)}"
    port = 20000 + secrets.randbelow(20000)
    ct.run(["mkdir", "-p", folder], timeout=30).check()
    digest = ct.run(["sh", "-c", START_SERVER, "sh", folder, str(port), str(BIG_MB << 20),
                     getattr(request, "param", "127.0.0.1")], timeout=120).check().text.strip()
    deadline = time.monotonic() + 20
    while not forward.probe(ct, port):
        assert time.monotonic() < deadline, "the container's http.server did not start"
        time.sleep(0.2)
    yield port, digest
    ct.run(["sh", "-c", 'kill "$(cat "$1/pid")"; rm -rf "$1"', "sh", folder], timeout=30)


@pytest.fixture
def serving():
    """serve(target, port, **options) -> (Forwarder, local port), accepting in a thread."""
    with forwarders_in_threads() as start:
        def serve(target, port, **options):
            forwarder, [local] = start(target, port, **options)
            return forwarder, local
        yield serve


def fetch_sha(url):
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=120) as response:
        for piece in iter(lambda: response.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def read_all(sock):
    chunks = []
    for chunk in iter(lambda: sock.recv(65536), b""):
        chunks.append(chunk)
    return b"".join(chunks)


def wait_for(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def start_forward(sandbox, port):
    """`orch forward sb1-200 0:PORT` as a user starts it, in the background: its first stderr
    line says the local URL; terminate() stops it and its stderr then says what it carried."""
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", str(sandbox.inventory_path),
                             "forward", "sb1-200", f"0:{port}"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "ORCH_AGENT": "off"})


def test_the_command_forwards_two_big_downloads_at_once_intact(sandbox, web):
    port, digest = web
    process = start_forward(sandbox, port)
    try:
        line = process.stderr.readline()
        assert line.startswith("http://127.0.0.1:") and f"sb1-200:{port} (relay: its server " \
            "listens on 127.0.0.1 only" in line, line
        url = line.split()[0]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            shas = list(pool.map(fetch_sha, [f"{url}/big.bin"] * 2))
        assert shas == [digest, digest]
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "forward stopped: 2 connection(s)" in err, err


def test_the_server_closing_first_ends_the_client_s_connection(ct, web, serving):
    port, _ = web
    forwarder, local = serving(ct, port)
    with socket.create_connection(("127.0.0.1", local), timeout=60) as client:
        # HTTP/1.0: the server answers and closes; the client only reads
        client.sendall(b"GET /small.txt HTTP/1.0\r\n\r\n")
        answer = read_all(client)
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"\r\n\r\nsmall")
    wait_for(lambda: forwarder.stats.active == 0)


def test_the_client_closing_first_frees_its_channel(ct, web, serving):
    port, digest = web
    forwarder, local = serving(ct, port)
    for _ in range(3):   # a request never finished, then the client goes away
        client = socket.create_connection(("127.0.0.1", local), timeout=60)
        client.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        client.close()
    half = socket.create_connection(("127.0.0.1", local), timeout=60)
    half.sendall(b"GET /big.bin HTTP/1.0\r\n\r\n")
    half.shutdown(socket.SHUT_WR)   # done sending: the answer must still come whole
    body = read_all(half).split(b"\r\n\r\n", 1)[1]
    half.close()
    assert hashlib.sha256(body).hexdigest() == digest
    wait_for(lambda: forwarder.stats.active == 0)
    wait_for(lambda: ct.host.usage()["channels_in_use"] == 0)


def test_a_hundred_fetches_at_once(ct, web, serving):
    port, _ = web
    forwarder, local = serving(ct, port)
    with concurrent.futures.ThreadPoolExecutor(25) as pool:
        bodies = list(pool.map(lambda _: urllib.request.urlopen(
            f"http://127.0.0.1:{local}/small.txt", timeout=120).read(), range(100)))
    assert bodies == [b"small"] * 100
    assert forwarder.stats.accepted == 100 and forwarder.stats.peak_active > 1


def test_twelve_connections_at_once_on_one_ssh_connection_of_ten_channels(sandbox, web, serving,
                                                                           tmp_path):
    """connections: 1 for sb1: a stock sshd's 10 channels are all there is. The 11th and
    12th connection wait for a free channel and are served once one frees."""
    port, _ = web
    text = sandbox.inventory_path.read_text().replace(
        "node: sb1, iface: orch-sb1}", "node: sb1, iface: orch-sb1, connections: 1}")
    assert "connections: 1" in text
    (tmp_path / "inventory.yaml").write_text(text)
    with Fleet.from_path(str(tmp_path / "inventory.yaml")) as fleet:
        target = fleet.targets(["sb1-200"])[0]
        forwarder, local = serving(target, port)
        clients = [socket.create_connection(("127.0.0.1", local), timeout=120) for _ in range(12)]
        wait_for(lambda: forwarder.stats.active == 12)
        # a connection counts as active when accepted; its channel opens on its own thread
        # a moment later, so the host's one SSH connection may not be up yet
        wait_for(lambda: target.host.usage()["channels_in_use"] > 0)
        usage = target.host.usage()
        assert usage["connections"] == 1 and usage["channels_in_use"] <= 10
        for client in clients:
            client.sendall(b"GET /small.txt HTTP/1.0\r\n\r\n")
        answers = [read_all(client) for client in clients]
        for client in clients:
            client.close()
        assert all(a.startswith(b"HTTP/1.0 200") and a.endswith(b"small") for a in answers)
        assert any("wait for a free SSH channel of host sb1" in line for line in forwarder.said)
        wait_for(lambda: forwarder.stats.active == 0)


def test_a_link_broken_under_a_relay_stops_the_forward_with_a_clear_message(sandbox, web,
                                                                            serving):
    port, _ = web
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        target = fleet.targets(["sb1-200"])[0]
        forwarder, local = serving(target, port)
        client = socket.create_connection(("127.0.0.1", local), timeout=60)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        client.sendall(b"GET /big.bin HTTP/1.0\r\n\r\n")
        client.recv(65536)             # the download has begun; it stalls on our window
        target.host.close()            # orch's own connections only: the host stays up
        wait_for(lambda: hasattr(forwarder, "raised"))
        client.close()
    error = forwarder.raised
    assert isinstance(error, ConnectionLost), error
    assert "the connection to host sb1 broke" in str(error)
    assert "the forward to sb1-200 stopped" in str(error)


# ----------------------------------------------------------------- a debugger
def debugpy_wheel() -> str:
    """debugpy's wheel for the container's python (3.11), downloaded once into a cache
    folder (CI downloads it once)."""
    os.makedirs(DEBUGPY_CACHE, exist_ok=True)
    with open(DEBUGPY_CACHE + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not glob.glob(f"{DEBUGPY_CACHE}/debugpy-*.whl"):
            done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                                   "--only-binary=:all:", "--python-version", "3.11",
                                   "--platform", "manylinux_2_34_x86_64", "-d", DEBUGPY_CACHE,
                                   DEBUGPY], capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                pytest.skip(f"cannot download {DEBUGPY}: {done.stderr.strip()[-300:]}")
    return sorted(glob.glob(f"{DEBUGPY_CACHE}/debugpy-*.whl"))[-1]


# Constant text: the folder ($1) and the port ($2) are data. The program waits for a client.
LISTEN = ("import sys, time; sys.path.insert(0, sys.argv[1]); import debugpy; "
          "debugpy.listen(('127.0.0.1', int(sys.argv[2]))); time.sleep(300)")
START_DEBUGPY = ('python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" '
                 '"$1/debugpy.whl" "$1/site" && { setsid python3 -c "$3" "$1/site" "$2" '
                 '>"$1/log" 2>&1 </dev/null & echo $! > "$1/pid"; }')


def dap_message(sock, held: bytearray) -> dict:
    """One DAP message (Content-Length header, JSON body) from sock."""
    while b"\r\n\r\n" not in held:
        held += sock.recv(4096)
    head, _, rest = bytes(held).partition(b"\r\n\r\n")
    size = int(head.split(b":", 1)[1])
    while len(rest) < size:
        rest += sock.recv(4096)
    held[:] = rest[size:]
    return json.loads(rest[:size])


def test_a_debugpy_listener_answers_initialize_through_the_forward(sandbox, ct):
    """Through the command, which looks at the port first: that look must not be a
    connection, or debugpy's adapter would take it for its one client."""
    folder = f"/tmp/fwd-debugpy-{secrets.token_hex(4)}"
    port = 20000 + secrets.randbelow(20000)
    ct.run(["mkdir", "-p", folder], timeout=30).check()
    try:
        transfer.push(ct, debugpy_wheel(), f"{folder}/debugpy.whl")
        ct.run(["sh", "-c", START_DEBUGPY, "sh", folder, str(port), LISTEN], timeout=120).check()
        deadline = time.monotonic() + 30
        while not forward.probe(ct, port):
            assert time.monotonic() < deadline, ct.run(["cat", f"{folder}/log"], timeout=30).text
            time.sleep(0.3)
        process = start_forward(sandbox, port)
        try:
            local = int(process.stderr.readline().split()[0].rsplit(":", 1)[1])
            body = json.dumps({"seq": 1, "type": "request", "command": "initialize",
                               "arguments": {"adapterID": "orch", "clientID": "orch-test"}}).encode()
            with socket.create_connection(("127.0.0.1", local), timeout=60) as client:
                client.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
                held = bytearray()
                message = dap_message(client, held)
                while message["type"] != "response":   # events (telemetry, output) come first
                    message = dap_message(client, held)
        finally:
            process.terminate()
            process.communicate(timeout=30)
        assert message["command"] == "initialize" and message["success"] is True, message
        assert "supportsConfigurationDoneRequest" in message["body"]
    finally:
        ct.run(["sh", "-c", 'kill "$(cat "$1/pid")"; rm -rf "$1"', "sh", folder], timeout=30)


@pytest.mark.parametrize("target, said", [
    ("sb1-202", "is not running"),      # stopped
    ("sb1:299", "no such container"),
])
def test_a_container_that_cannot_run_the_relay_exits_4_with_no_url(sandbox, target, said):
    out = subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(sandbox.inventory_path),
                          "forward", target, "0:6006"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "ORCH_AGENT": "off"})
    assert out.returncode == 4, out.stderr
    assert said in out.stderr and "Traceback" not in out.stderr and "http://" not in out.stderr


# Relays of orch forward running in the container now: their argv is `python3 -I -S -c ...`
RELAYS = ("import os\nn = 0\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n"
          "    try:\n        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
          "    except OSError:\n        continue\n"
          "    n += argv[1:4] == [b'-I', b'-S', b'-c'] and b'orch-forward' in argv[4]\n"
          "print(n)\n")


@pytest.mark.parametrize("web, way, relaying", [
    ("0.0.0.0", "direct: 10.88.1.200:{port} (from the inventory) through the host's SSH", "0"),
    ("127.0.0.1", "relay: its server listens on 127.0.0.1 only", "1"),
], indirect=["web"])
def test_a_server_bound_to_any_address_goes_direct_with_no_relay_in_the_container(
        sandbox, ct, web, way, relaying):
    """auto: direct (no process in the container) to a server on 0.0.0.0; by relay (one
    relay process during the download) to one on the container's loopback."""
    port, digest = web
    process = start_forward(sandbox, port)
    try:
        line = process.stderr.readline()
        assert f"sb1-200:{port} (" + way.format(port=port) in line, line
        url = line.split()[0]
        relays = []
        with urllib.request.urlopen(f"{url}/big.bin", timeout=120) as response:
            digest_now = hashlib.sha256(response.read(1 << 20))
            relays.append(ct.run(["python3", "-c", RELAYS], timeout=30).check().text.strip())
            for piece in iter(lambda: response.read(1 << 20), b""):
                digest_now.update(piece)
        assert digest_now.hexdigest() == digest and relays == [relaying]
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0 and "forward stopped: 1 connection(s)" in err, err


def test_via_direct_to_a_server_on_the_containers_loopback_exits_2_saying_why(sandbox, web):
    port, _ = web
    done = subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(sandbox.inventory_path),
                           "forward", "--via", "direct", "sb1-200", f"0:{port}"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ORCH_AGENT": "off"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"--via direct: port {port} cannot be reached directly: its server listens on " \
           "127.0.0.1 only" in done.stderr


def test_the_hosts_openssh_gives_the_connection_aes_gcm(ct):
    """The cipher of a bulk transfer: AES-GCM, one AEAD call per packet (CTR's per-packet HMAC
    in Python cost a third of a download's throughput, docs/benchmarks/speed.md)."""
    transport = ct.host.connect()
    assert (transport.local_cipher, transport.remote_cipher) == ("aes128-gcm@openssh.com",) * 2
