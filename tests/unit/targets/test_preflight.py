"""A multi-node run's pre-flight: the payload on this machine (a real listener and real
connections on localhost), the judging with the payloads' shapes, and preflight() over fake
nodes. The sandbox test runs it across two sandbox hosts."""

import hashlib
import json
import socket
import subprocess
import sys

import pytest

from orchestrator.ground.errors import PayloadError, PythonUnavailable
from orchestrator.remote import payload_api
from orchestrator.targets import preflight as pf
from orchestrator.targets.preflight import PreflightRow, preflight, render_preflight
from tests.fixtures.payloads import PAYLOADS, run_payload

GIB = 1 << 30


# --- the payload, for real, on this machine ---------------------------------------------------

NONCES = [f"nonce-{i}" for i in range(5)]


def hashed(nonces):
    return [hashlib.sha256(n.encode()).hexdigest() for n in nonces]


def start_listener(port: int, token: str = "t0k", nonces=NONCES, host=None) -> subprocess.Popen:
    args = {"action": "listen", "port": port, "token": token, "nonces": hashed(nonces),
            "host": host, "seconds": 20, "stop_on_stdin": True}
    process = subprocess.Popen([sys.executable, "-u", str(PAYLOADS / "preflight.py"),
                                json.dumps(args)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert json.loads(process.stdout.readline()) == {"event": "listening", "port": port}
    return process


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check(port: int, token: str = "t0k", timeout: float = 2.0, nonce: str = NONCES[0],
          host: str = "127.0.0.1"):
    return run_payload(sys.executable, "preflight", {
        "action": "check", "host": host, "port": port, "token": token, "nonce": nonce,
        "timeout": timeout}, timeout=30).expect_result()


def test_the_payload_listens_answers_with_the_token_and_lets_go_on_stdin():
    port = free_port()
    listener = start_listener(port)
    try:
        result = check(port)
        assert result["endpoint"]["ok"] is True and result["endpoint"]["error"] is None
        assert check(port, token="another", nonce=NONCES[1])["endpoint"]["error"] == \
            "something else answers on that port"
        assert "lo" in result["interfaces"]
        assert result["shm"]["path"] == "/dev/shm" and result["shm"]["total_bytes"] > 0
        out, _ = listener.communicate("stop\n", timeout=10)
    finally:
        listener.kill()
    assert json.loads(out.splitlines()[-1]) == {"event": "result", "accepted": 2, "refused": 0}
    with socket.socket() as again:        # the port is free once it has stopped
        again.bind(("", port))


def test_connections_without_a_nodes_nonce_take_no_nodes_place():
    """Whoever connects first (a scanner, another account) once took the listener's slots
    (it answered every connection, counting to the number of nodes) and the nodes that came
    next found the port closed. Now only a node's own nonce counts, once; others get nothing."""
    port = free_port()
    listener = start_listener(port, nonces=NONCES[:2])
    try:
        for said in (b"", b"guess\n", b"x" * 4096):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as intruder:
                try:
                    intruder.sendall(said)
                    answer = intruder.recv(64)
                except OSError:                           # reset: the listener closed on it
                    answer = b""
                assert answer == b""                      # no token for it
        assert check(port, nonce=NONCES[0])["endpoint"]["ok"] is True
        assert check(port, nonce=NONCES[0])["endpoint"]["ok"] is False   # used: not twice
        assert check(port, nonce=NONCES[1])["endpoint"]["ok"] is True
        out, _ = listener.communicate(timeout=10)         # every node came: it ended
    finally:
        listener.kill()
    assert json.loads(out.splitlines()[-1]) == {"event": "result", "accepted": 2, "refused": 4}


def test_the_listener_binds_the_endpoints_address():
    port = free_port()
    listener = start_listener(port, host="127.0.0.1")
    try:
        assert check(port, host="127.0.0.2", nonce=NONCES[0])["endpoint"]["error"] == \
            "Connection refused"                         # another address of this machine
        assert check(port, host="127.0.0.1", nonce=NONCES[0])["endpoint"]["ok"] is True
        listener.communicate("stop\n", timeout=10)
    finally:
        listener.kill()


def test_a_taken_port_is_its_own_error_and_a_closed_one_is_refused():
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        failed = run_payload(sys.executable, "preflight", {
            "action": "listen", "port": port, "token": "x", "nonces": hashed(NONCES)}
        ).expect_error("port-taken")
        assert failed["message"] == f"port {port} is already in use in this container"
    closed = check(free_port())["endpoint"]
    assert closed["ok"] is False and closed["error"] == "Connection refused"


# --- judging one node, with the payload's shapes ---------------------------------------------

def test_nccl_and_gloo_pick_interfaces_as_the_libraries_do():
    names = ["eth0", "eth1", "ib0", "lo"]
    assert pf.interfaces_matching("NCCL_SOCKET_IFNAME", "eth", names) == ["eth0", "eth1"]
    assert pf.interfaces_matching("NCCL_SOCKET_IFNAME", "=eth", names) == []
    assert pf.interfaces_matching("NCCL_SOCKET_IFNAME", "=eth1,ib0", names) == ["eth1", "ib0"]
    assert pf.interfaces_matching("NCCL_SOCKET_IFNAME", "^eth", names) == ["ib0"]
    assert pf.interfaces_matching("GLOO_SOCKET_IFNAME", "eth", names) == []
    assert pf.interfaces_matching("GLOO_SOCKET_IFNAME", "ib0,eth9", names) == ["ib0"]


def test_a_missing_interface_names_what_the_container_has():
    (row,) = pf.interface_rows("n2", ["eth0", "lo"], {"GLOO_SOCKET_IFNAME": "ib0"})
    assert row.failed and row.detail == ("GLOO_SOCKET_IFNAME=ib0 names no interface of the "
                                         "container (it has eth0, lo)")
    assert "set GLOO_SOCKET_IFNAME to one of them" in row.fix


def test_shm_below_the_threshold_fails_with_the_proxmox_fix():
    small = pf.shm_row("n1", {"path": "/dev/shm", "total_bytes": 64 << 20, "free_bytes": 0}, GIB)
    assert small.failed and small.detail == "/dev/shm is 64.0 MiB, below the 1.0 GiB the run wants"
    assert "lxc.mount.entry: tmpfs dev/shm" in small.fix
    assert pf.shm_row("n1", {"total_bytes": 8 * GIB}, GIB).status == "ok"
    assert pf.shm_row("n1", {"path": "/dev/shm", "error": "No such file"}, GIB).failed


def test_gpus_no_nvidia_smi_is_a_note_on_a_cpu_run_and_a_failure_on_a_gpu_run():
    assert pf.gpu_row("n1", None, 0) == PreflightRow(
        "n1", "gpus", "note", "no GPU check (no nvidia-smi; the run asks for no GPUs)")
    assert pf.gpu_row("n1", None, 2).failed
    gpus = [{"index": 0, "memory_used_mib": 3.0}, {"index": 1, "memory_used_mib": 40960.0},
            {"index": 2, "memory_used_mib": None}]
    taken = pf.gpu_row("n1", gpus, 3)
    assert taken.failed and taken.detail == ("2 of 3 GPU(s) free (GPU 1: 40960 MiB used); "
                                             "the run wants 3 per node")
    assert pf.gpu_row("n1", gpus, 2).status == "ok"
    assert pf.gpu_row("n1", {"error": "NVML: driver mismatch"}, 2).failed


def test_an_unreachable_endpoint_names_the_node_the_endpoint_and_the_fix():
    row = pf.endpoint_row("n2", {"ok": False, "error": "timed out after 3s", "seconds": 3.0},
                          ("10.88.1.200", 29500), "n1")
    assert row.failed and row.detail == ("cannot reach the rendezvous endpoint "
                                         "10.88.1.200:29500 (listened on in n1): timed out "
                                         "after 3s")
    assert "let TCP port 29500 through to n1" in row.fix


# --- judging across nodes ------------------------------------------------------------------------

def patched(version="2.13.0+cpu", status="patched"):
    return {"event": "result", "torch_version": version, "status": status}


def test_a_different_torch_fails_naming_the_node_and_the_others_version():
    rows = pf.torch_rows({"n1": patched(), "n2": patched("2.12.1+cpu"), "n3": patched()},
                         "fx-threads")
    failed = [r for r in rows if r.failed]
    assert [(r.node, r.check, r.detail) for r in failed] == [
        ("n2", "torch", "torch 2.12.1+cpu here, 2.13.0+cpu on n1, n3")]


def test_on_a_tie_the_first_node_is_the_reference():
    rows = pf.torch_rows({"n1": patched(status="patched"), "n2": patched(status="vulnerable")},
                         "fx-threads")
    (failed,) = [r for r in rows if r.failed]
    assert (failed.node, failed.detail) == ("n2", "fx-threads patch vulnerable here, patched on n1")
    assert "orch patch fx-threads apply" in failed.fix


def test_require_patch_fails_every_unpatched_node_even_when_all_agree():
    rows = pf.torch_rows({"n1": patched(status="vulnerable"), "n2": patched(status="vulnerable")},
                         "fx-threads", require_patch=True)
    assert [r.node for r in rows if r.failed] == ["n1", "n2"]


def test_no_torch_or_no_venv_is_named_per_node():
    rows = pf.torch_rows({"n1": patched(),
                          "n2": PayloadError("n2: torch is not installed", kind="not-installed"),
                          "n3": PythonUnavailable("n3: cannot run /root/venv/bin/python",
                                                  hint="is the venv bootstrapped?")},
                         "fx-threads")
    by_node = {r.node: r for r in rows if r.failed}
    assert by_node["n2"].detail == "no torch in the node's venv"
    assert by_node["n3"].fix == "is the venv bootstrapped?" and set(by_node) == {"n2", "n3"}


# --- preflight() over fake nodes -----------------------------------------------------------------

class FakeNode:
    def __init__(self, name, gpus=()):
        self.name, self.gpus = name, list(gpus)


class FakeListener:
    def __init__(self, lines):
        self.lines, self.written, self.closed = list(lines), [], False

    def readline(self, timeout):
        return self.lines.pop(0).encode() + b"\n" if self.lines else b""

    def write(self, data):
        self.written.append(data)

    def close(self):
        self.closed = True


@pytest.fixture
def fakes(monkeypatch):
    state = {"listener": FakeListener(['{"event": "listening", "port": 29500}',
                                       '{"event": "result", "accepted": 2}']),
             "reach": {}, "torch": {}, "calls": []}

    def check(node, host, port, token, nonce, connect_timeout, gpus, connect):
        state["calls"].append((node.name, host, port, connect_timeout, connect))
        state.setdefault("nonces", {})[node.name] = nonce
        return {"event": "result", "endpoint": state["reach"].get(node.name, {"ok": True, "seconds": 0.01}),
                "shm": {"path": "/dev/shm", "total_bytes": 4 * GIB, "free_bytes": 4 * GIB},
                "interfaces": ["eth0", "lo"], "gpus": None}
    monkeypatch.setattr(payload_api, "preflight_listener", lambda *a: state["listener"])
    monkeypatch.setattr(payload_api, "preflight_check", check)
    monkeypatch.setattr(payload_api, "fx_patch", lambda node, action, patch_set: state["torch"].get(
        node.name, patched()))
    return state


def test_every_node_passes_and_the_listener_is_stopped(fakes):
    rows = preflight([FakeNode("n1"), FakeNode("n2")], ("10.88.1.200", 29500),
                     socket_ifnames={"GLOO_SOCKET_IFNAME": "eth0"})
    assert pf.failures(rows) == []
    assert {(r.node, r.check) for r in rows} >= {(n, c) for n in ("n1", "n2") for c in (
        "endpoint", "torch", "fx-patch", "gpus", "shm", "interface")}
    assert sorted(fakes["calls"]) == [("n1", "10.88.1.200", 29500, 3.0, True),
                                      ("n2", "10.88.1.200", 29500, 3.0, True)]
    assert fakes["listener"].written == [b"stop\n"] and fakes["listener"].closed
    assert render_preflight(rows).startswith("pre-flight: 2 node(s) ready\n")


def test_one_unreachable_node_and_one_other_torch_are_both_reported(fakes):
    fakes["reach"]["n2"] = {"ok": False, "error": "timed out after 3s", "seconds": 3.0}
    fakes["torch"]["n1"] = patched("2.11.0")
    rows = preflight([FakeNode("n1"), FakeNode("n2"), FakeNode("n3")], ("10.88.1.200", 29500))
    assert [(r.node, r.check) for r in pf.failures(rows)] == [("n2", "endpoint"), ("n1", "torch")]
    text = render_preflight(rows)
    assert text.splitlines()[0] == ("pre-flight: 2 failure(s) on 2 of 3 node(s); nothing "
                                    "was launched")
    assert "fix:" in text and "torch 2.11.0 here, 2.13.0+cpu on n2, n3" in text


def test_a_taken_port_fails_on_the_listener_node_and_skips_the_connects(fakes):
    fakes["listener"] = FakeListener(['{"event": "error", "kind": "port-taken", '
                                      '"message": "port 29500 is already in use"}'])
    rows = preflight([FakeNode("n1"), FakeNode("n2")], ("10.88.1.200", 29500))
    (failed,) = pf.failures(rows)
    assert (failed.node, failed.check) == ("n1", "endpoint")
    assert failed.detail == "the rendezvous port 29500 is already in use in n1"
    assert "ss -ltnp" in failed.fix
    assert not [r for r in rows if r.check == "endpoint" and r.node == "n2"]
    assert [call[-1] for call in fakes["calls"]] == [False, False]   # nobody connects in vain
