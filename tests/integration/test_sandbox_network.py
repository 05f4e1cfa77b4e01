"""The containers' network: every container on its host's vmbr0, the hosts' bridges on one
switch, as the containers of a Proxmox cluster share a bridge (docs/design/sandbox.md).

Reached the way a user's multi-node run would: `orch exec` into one container opens a
port, `orch exec` into a container on the other host connects to it.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from orch_sandbox import layout, network

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
LISTEN = ("import socket\n"
          "server = socket.create_server(('0.0.0.0', 0))\n"
          "print(server.getsockname()[1], flush=True)\n"
          "server.settimeout(20)\n"
          "peer, (address, _) = server.accept()\n"
          "peer.sendall(b'hello from ' + socket.gethostname().encode())\n"
          "print(address, flush=True)\n")
CONNECT = ("import socket, sys\n"
           "with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:\n"
           "    print(s.recv(100).decode())\n")
# flags and addresses of lo and eth0, from /sys and `ip -j` (IFF_UP is bit 0)
LINKS = ("import json, subprocess\n"
         "def up(name):\n"
         "    return bool(int(open(f'/sys/class/net/{name}/flags').read(), 16) & 1)\n"
         "ip = json.loads(subprocess.run(['ip', '-j', '-4', 'addr'], capture_output=True,"
         " text=True).stdout)\n"
         "print(json.dumps({'lo': up('lo'), 'eth0': up('eth0'),"
         " 'inet': {i['ifname']: [a['local'] for a in i['addr_info']] for i in ip}}))\n")


def orch(inventory: Path, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "ORCH_AGENT": "off"}
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", str(inventory), *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def orch_exec(inventory: Path, target: str, *argv: str) -> str:
    process = orch(inventory, "exec", target, "--", *argv)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return out


def address_of(sandbox, target: str) -> str:
    host, _, vmid = target.partition("-")
    return sandbox.host(host).container(int(vmid)).address


def test_a_container_on_sb1_reaches_a_port_opened_in_a_container_on_sb2(sandbox):
    listener = orch(sandbox.inventory_path, "exec", "sb2-201", "--", "python3", "-c", LISTEN)
    try:
        port = listener.stdout.readline().strip()
        assert port.isdigit(), listener.stderr.read()
        answer = orch_exec(sandbox.inventory_path, "sb1-200", "python3", "-c", CONNECT,
                           address_of(sandbox, "sb2-201"), port)
        out, err = listener.communicate(timeout=30)
    finally:
        listener.kill()
    assert answer == "hello from CT201\n"
    assert out.strip() == address_of(sandbox, "sb1-200") == "10.88.1.200", err


def test_the_ssh_faults_and_the_containers_network_are_independent(sandbox):
    """block_ssh firewalls the host's own port 22 (inet input hook); bridged container
    traffic crosses the bridge's forward hook, so containers keep reaching each other."""
    peer = address_of(sandbox, "sb2-201")
    probe = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], 22), "
             "timeout=2)\nexcept ConnectionRefusedError:\n    print('reached')\n"
             "except OSError as error:\n    print(type(error).__name__)\n")
    sandbox.block_ssh("sb2", "drop")
    try:
        # nothing listens on 22 in the container: the refusal is the container's answer
        assert sandbox.pct("sb1", "exec", "200", "--", "python3", "-c", probe,
                           peer).stdout == b"reached\n"
    finally:
        sandbox.unblock_ssh("sb2")


def test_every_running_container_has_lo_and_eth0_up_with_its_layout_address(sandbox):
    for target in sandbox.targets(running=True):
        links = json.loads(orch_exec(sandbox.inventory_path, target, "python3", "-c", LINKS))
        assert links["lo"] and links["eth0"], target
        assert links["inet"] == {"lo": ["127.0.0.1"], "eth0": [address_of(sandbox, target)]}


def test_a_containers_own_name_resolves_to_its_address_as_proxmox_writes_etc_hosts(sandbox):
    """torchrun's c10d rendezvous finds the endpoint's node by resolving its own hostname."""
    resolved = orch_exec(sandbox.inventory_path, "sb2-201", "python3", "-c",
                         "import socket; print(socket.gethostbyname(socket.gethostname()))")
    assert resolved == "10.88.2.201\n"


def test_the_address_is_in_the_inventory_and_the_status(sandbox):
    import orch_sandbox as sb
    from orchestrator.config.inventory import load_inventory

    inventory = load_inventory(str(sandbox.inventory_path))
    assert inventory.containers["sb2-202"].address == "10.88.2.202"
    status = {ct["name"]: ct["address"] for host in sb.status()["hosts"]
              for ct in host["containers"]}
    assert status["sb1-201"] == "10.88.1.201"


def test_the_private_range_lives_only_in_the_sandbox_namespaces(sandbox):
    """The machine's (this test's) namespace has no address or route into 10.88/16."""
    for what in (["ip", "-4", "addr"], ["ip", "-4", "route"]):
        shown = subprocess.run(what, capture_output=True, text=True, check=True).stdout
        assert layout.CONTAINER_NETWORK_PREFIX + "." not in shown
    bridge_ports = network.link_names(layout.switch_netns(sandbox.layout.prefix))
    assert set(sandbox.host_names) <= bridge_ports


# --- the Proxmox API's view: GET /nodes/{node}/lxc/{vmid}/interfaces --------------------------

def pvesh_interfaces(sandbox, host: str, vmid: int):
    done = sandbox.run_on_host(host, ["pvesh", "get", f"/nodes/{host}/lxc/{vmid}/interfaces",
                                      "--output-format", "json"], timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_pvesh_interfaces_has_the_shape_proxmox_returns(sandbox):
    ct = sandbox.host("sb2").container(201)
    lo, eth0 = pvesh_interfaces(sandbox, "sb2", 201)
    assert lo == {"name": "lo", "hwaddr": "00:00:00:00:00:00",
                  "hardware-address": "00:00:00:00:00:00",
                  "inet": "127.0.0.1/8", "inet6": "::1/128",
                  "ip-addresses": [
                      {"ip-address": "127.0.0.1", "ip-address-type": "inet", "prefix": 8},
                      {"ip-address": "::1", "ip-address-type": "inet6", "prefix": 128}]}
    assert (eth0["name"], eth0["hwaddr"], eth0["hardware-address"], eth0["inet"]) == (
        "eth0", ct.hwaddr, ct.hwaddr, f"{ct.address}/16")
    assert eth0["ip-addresses"][0] == {"ip-address": ct.address, "ip-address-type": "inet",
                                       "prefix": 16}
    assert eth0["inet6"].startswith("fe80::")     # the kernel's link-local, as on a real CT


def test_pvesh_interfaces_of_a_stopped_or_unknown_container_is_null(sandbox):
    assert pvesh_interfaces(sandbox, "sb2", 202) is None        # stopped in the layout
    assert pvesh_interfaces(sandbox, "sb2", 999) is None        # upstream loads no config
    listed = sandbox.run_on_host("sb1", ["pvesh", "get", "/nodes/sb1/lxc/200",
                                         "--output-format", "json"], timeout=30)
    assert {"subdir": "interfaces"} in json.loads(listed.stdout)


def api_get(sandbox, host: str, path: str, headers: dict):
    """One GET to the host's HTTPS API, its CA pinned: the status and the decoded body."""
    context = ssl.create_default_context(cafile=str(sandbox.api_ca_file(host)))
    with socket.create_connection((sandbox.address(host), 8006), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="fe80::2") as tls:
            connection = http.client.HTTPSConnection(sandbox.address(host), 8006)
            connection.sock = tls
            connection.request("GET", path, headers=headers)
            answer = connection.getresponse()
            return answer.status, json.loads(answer.read())


def test_the_https_api_answers_interfaces_in_data(sandbox):
    token = {"Authorization": f"PVEAPIToken={sandbox.api_token_id}={sandbox.api_token_secret()}"}
    status, body = api_get(sandbox, "sb1", "/api2/json/nodes/sb1/lxc/200/interfaces", token)
    names = [(i["name"], i["ip-addresses"][0]["ip-address"]) for i in body["data"]]
    assert status == 200 and names == [("lo", "127.0.0.1"), ("eth0", "10.88.1.200")]
    assert api_get(sandbox, "sb1", "/api2/json/nodes/sb1/lxc/202/interfaces", token) == (
        200, {"data": None})


# --- orch's side: targets/addresses.py against the emulated API ---------------------------------

def inventory_without_addresses(sandbox, tmp_path, api: bool = False) -> Path:
    """The sandbox's inventory with no `address:`, so orch must ask the Proxmox API; with
    api, through the HTTPS API (CA pinned) instead of pvesh over SSH."""
    import yaml

    data = yaml.safe_load(sandbox.inventory_path.read_text())
    for spec in data["containers"].values():
        spec.pop("address")
    if api:
        for name in sandbox.host_names:
            data["hosts"][name]["api"] = {"url": sandbox.api_url(name),
                                          "token_id": sandbox.api_token_id,
                                          "token_secret_env": "ORCH_TEST_PVE_SECRET",
                                          "ca_file": str(sandbox.api_ca_file(name))}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("backend", ["ssh", "https"])
def test_container_address_asks_the_proxmox_api_when_the_inventory_has_none(
        sandbox, tmp_path, monkeypatch, backend):
    from orchestrator.targets.addresses import Located, NoAddress, container_address, locate
    from orchestrator.targets.fleet import Fleet

    monkeypatch.setenv("ORCH_TEST_PVE_SECRET", sandbox.api_token_secret())
    path = inventory_without_addresses(sandbox, tmp_path, api=backend == "https")
    with Fleet.from_path(str(path)) as fleet:
        running, stopped = fleet.targets(["sb2-201", "sb2-202"])
        # the host's config (net0: ip=10.88.2.201/16) first, running or not
        assert locate(fleet, running) == Located("10.88.2.201", "its Proxmox config (net0)", True)
        assert container_address(fleet, stopped) == "10.88.2.202"
        with pytest.raises(NoAddress, match="has no interface 'ib0' .*lists: eth0, lo") as caught:
            container_address(fleet, running, interface="ib0")   # no net named ib0: asked of the CT
        assert "add `address: IP`" in caught.value.hint and str(path) in caught.value.hint
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:    # the inventory's own
        assert container_address(fleet, fleet.targets(["sb2-202"])[0]) == "10.88.2.202"


# --- up and down of the network, in a sandbox of its own (prefix sbn) --------------------------

PING_PEER = ("import socket, sys\n"
             "try:\n"
             "    socket.create_connection((sys.argv[1], 22), timeout=1)\n"
             "except ConnectionRefusedError:\n"
             "    print('reached')      # the peer answered: nothing listens on 22 there\n"
             "except OSError as error:\n"
             "    print(type(error).__name__)\n")


def peer_answers(handle) -> str:
    peer = handle.host("sbn2").container(200).address
    done = handle.pct("sbn1", "exec", "200", "--", "python3", "-c", PING_PEER, peer)
    return done.stdout.decode().strip()


@pytest.fixture
def network_sandbox(sandbox, tmp_path):
    import orch_sandbox as sb

    state = tmp_path / "state"
    yield lambda: sb.up(2, 1, 0, prefix="sbn", state_dir=state)
    sb.down(purge=True, state_dir=state, prefix="sbn")
    assert "sbn" not in network.switch_prefixes(), "down removes the switch"


def test_up_rebuilds_a_removed_switch_and_down_removes_it(network_sandbox):
    handle = network_sandbox()
    assert peer_answers(handle) == "reached"     # at once: up waits for the ports' carrier
    network.remove_switch("sbn")            # as a killed run's cleanup might leave it
    assert peer_answers(handle) == "TimeoutError"
    # a host made before bridges had an address gains it on the next up
    subprocess.run(["ip", "-n", "orch-sbn1", "addr", "flush", "dev", "vmbr0"], check=True)
    again = network_sandbox()
    assert network.bridge_addresses("orch-sbn1") == {"10.88.0.1"}
    assert peer_answers(again) == "reached"
    assert "sbn" in network.switch_prefixes()


def test_a_host_reaches_its_containers_and_the_others_on_its_bridge_address(sandbox):
    """As a Proxmox node has its own address on vmbr0 (10.88.0.HOST/16 here), a host reaches
    its containers' addresses, and over the switch those of the other hosts."""
    for host, target in (("sb1", "sb1-200"), ("sb1", "sb2-201")):
        done = sandbox.run_on_host(host, ["python3", "-c", PING_PEER, address_of(sandbox, target)],
                                   timeout=30)
        assert done.stdout.decode().strip() == "reached", (host, target, done.stderr)
    shown = sandbox.run_on_host("sb2", ["ip", "-4", "-o", "addr", "show", "dev", "vmbr0"],
                                timeout=30).stdout.decode()
    assert " 10.88.0.2/16 " in shown
