"""A container's address: the inventory's `address:`, else the Proxmox API's interfaces
endpoint read through the real client (pvesh over a fake transport here; the sandbox test
asks the emulated pvesh and HTTPS API)."""

import json

import pytest

from orchestrator.config.inventory import load_inventory
from orchestrator.ground.errors import ExitCode
from orchestrator.remote.base import Result, Transport
from orchestrator.remote.container import Target
from orchestrator.targets.addresses import (FROM_NAMESPACE, Located, NoAddress, container_address,
                                            locate, pick_address)
from orchestrator.targets.proxmox import ProxmoxClient

# `pvesh get /nodes/pve1/lxc/200/interfaces --output-format json` of a running CT with a
# second IPv4 on eth0 and an eth1: PVE::LXC::get_interfaces' shape (inet = the LAST IPv4)
RUNNING = json.loads(
    '[{"hardware-address":"00:00:00:00:00:00","hwaddr":"00:00:00:00:00:00","inet":"127.0.0.1/8",'
    '"inet6":"::1/128","ip-addresses":[{"ip-address":"127.0.0.1","ip-address-type":"inet",'
    '"prefix":8},{"ip-address":"::1","ip-address-type":"inet6","prefix":128}],"name":"lo"},'
    '{"hardware-address":"bc:24:11:58:01:c8","hwaddr":"bc:24:11:58:01:c8",'
    '"inet":"192.168.9.5/24","inet6":"fe80::be24:11ff:fe58:1c8/64","ip-addresses":['
    '{"ip-address":"10.88.1.200","ip-address-type":"inet","prefix":16},'
    '{"ip-address":"192.168.9.5","ip-address-type":"inet","prefix":24},'
    '{"ip-address":"fe80::be24:11ff:fe58:1c8","ip-address-type":"inet6","prefix":64}],'
    '"name":"eth0"},'
    '{"hardware-address":"bc:24:11:00:00:02","hwaddr":"bc:24:11:00:00:02","inet":"10.9.0.7/24",'
    '"ip-addresses":[{"ip-address":"10.9.0.7","ip-address-type":"inet","prefix":24}],'
    '"name":"ib0"},'
    '{"hardware-address":"bc:24:11:00:00:03","hwaddr":"bc:24:11:00:00:03",'
    '"inet6":"fd00::3/64","ip-addresses":[{"ip-address":"fd00::3","ip-address-type":"inet6",'
    '"prefix":64}],"name":"eth6"}]')
INVENTORY = """\
hosts:
  pve: {address: 10.1.2.6, node: pve1}
containers:
  fixed: {host: pve, vmid: 201, address: 10.1.3.20}
  asked: {host: pve, vmid: 200}
"""


class FakePvesh(Transport):
    """A host whose pvesh answers the interfaces path with `answer` and the config path with
    `config` (or fails with `error`)."""
    name = "pve"

    def __init__(self, answer=None, error=None, config=None):
        self.answer, self.error, self.calls = answer, error, []
        self.config = config if config is not None else {"hostname": "CT200"}

    def _run(self, argv, options):
        self.calls.append(argv)
        if self.error:
            return Result(argv, 255, b"", self.error.encode(), 0.0)
        if argv[:3] == ["pvesh", "get", "/nodes/pve1/lxc/200/config"]:
            return Result(argv, 0, json.dumps(self.config).encode() + b"\n", b"", 0.0)
        assert argv[:3] == ["pvesh", "get", "/nodes/pve1/lxc/200/interfaces"]
        return Result(argv, 0, json.dumps(self.answer).encode() + b"\n", b"", 0.0)


class FakeFleet:
    """What container_address asks of a Fleet: the inventory and a host's Proxmox client."""

    def __init__(self, tmp_path, host: FakePvesh):
        path = tmp_path / "inventory.yaml"
        path.write_text(INVENTORY)
        self.inventory = load_inventory(str(path))
        self.host = host

    def proxmox(self, host_name):
        return ProxmoxClient(self.inventory.hosts[host_name], self.host)


def target(host, name="asked", vmid=200):
    return Target(name, host, vmid)


def test_the_inventory_address_wins_and_the_api_is_not_asked(tmp_path):
    host = FakePvesh(RUNNING)
    fleet = FakeFleet(tmp_path, host)
    assert container_address(fleet, target(host, "fixed", 201)) == "10.1.3.20"
    assert container_address(fleet, target(host, "fixed", 201), interface="ib0") == "10.1.3.20"
    assert host.calls == []


def test_the_api_gives_eth0s_first_ipv4_not_the_deprecated_inet_field(tmp_path):
    host = FakePvesh(RUNNING)
    assert container_address(FakeFleet(tmp_path, host), target(host)) == "10.88.1.200"
    assert host.calls[-1][-2:] == ["--output-format", "json"]


NET0 = "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:58:01:C8,ip=10.88.1.77/16,gw=10.88.0.1,type=veth"


def test_the_proxmox_config_wins_over_what_the_container_says_and_says_so(tmp_path):
    """Root in a container sets its own addresses (`ip addr add`): the interfaces endpoint
    reports them. The address the host's config assigns is the one to trust."""
    host = FakePvesh(RUNNING, config={"net0": NET0, "net1": "name=ib0,bridge=vmbr1,ip=dhcp"})
    fleet = FakeFleet(tmp_path, host)
    assert locate(fleet, target(host)) == Located("10.88.1.77", "its Proxmox config (net0)", True)
    assert [call[2] for call in host.calls] == ["/nodes/pve1/lxc/200/config"]
    assert locate(fleet, target(host), "ib0") == Located("10.9.0.7", FROM_NAMESPACE, False)


@pytest.mark.parametrize("net0", ["name=eth0,bridge=vmbr0,ip=dhcp", "name=eth0,ip=manual",
                                  "name=eth1,ip=10.1.1.1/24", "name=eth0,ip=999.1.1.1/24",
                                  "name=eth0,ip=10.1.1.1", "garbage", 42])
def test_no_static_address_in_the_config_falls_back_to_the_containers_own_word(tmp_path, net0):
    host = FakePvesh(RUNNING, config={"net0": net0})
    assert locate(FakeFleet(tmp_path, host), target(host)) == Located("10.88.1.200", FROM_NAMESPACE, False)


def test_a_named_interface_on_request(tmp_path):
    host = FakePvesh(RUNNING)
    assert container_address(FakeFleet(tmp_path, host), target(host), interface="ib0") == "10.9.0.7"


def test_a_stopped_container_says_what_to_add_to_the_inventory(tmp_path):
    host = FakePvesh(None)              # get_interfaces returns nothing without a CT PID
    with pytest.raises(NoAddress) as caught:
        container_address(FakeFleet(tmp_path, host), target(host))
    assert "asked (CT 200 on host pve): the Proxmox API lists no interfaces (the container " \
           "is not running)" in str(caught.value)
    assert caught.value.hint == (f"add `address: IP` (where the other nodes reach it) to "
                                 f"container asked in {tmp_path / 'inventory.yaml'}")
    assert caught.value.exit_code == ExitCode.USAGE


def test_a_host_vmid_target_is_told_how_to_name_it_in_the_inventory(tmp_path):
    host = FakePvesh(None)
    with pytest.raises(NoAddress) as caught:
        container_address(FakeFleet(tmp_path, host), target(host, "pve:200"))
    assert "`pve-200: {host: pve, vmid: 200, address: IP}`" in caught.value.hint


@pytest.mark.parametrize("interface, words", [
    ("eth1", "has no interface 'eth1' (the Proxmox API lists: eth0, eth6, ib0, lo)"),
    ("eth6", "interface eth6 has no IPv4 address (fd00::3)"),
    ("lo", "interface lo has no IPv4 address (127.0.0.1, ::1)"),
])
def test_no_usable_address_names_what_the_api_lists(interface, words):
    with pytest.raises(NoAddress) as caught:
        pick_address(RUNNING, interface, what="n1")
    assert words in str(caught.value)


@pytest.mark.parametrize("answer", [
    {"data": "not a list"}, ["eth0"], [{"name": "eth0", "ip-addresses": "x"}],
    [{"name": "eth0", "ip-addresses": [{"ip-address": 167772161}, {"ip-address": "300.1.1.1"},
                                       "junk", {"ip-address": None}]}],
])
def test_a_malformed_answer_is_a_clear_error_never_a_traceback(answer):
    with pytest.raises(NoAddress):
        pick_address(answer, "eth0", what="n1")


def test_an_api_refusal_is_reported_with_the_inventory_fix(tmp_path):
    host = FakePvesh(error="403 Permission check failed (/vms/200, VM.Audit)\n")
    with pytest.raises(NoAddress) as caught:
        container_address(FakeFleet(tmp_path, host), target(host))
    assert "could not tell its address" in str(caught.value)
    assert "VM.Audit" in str(caught.value) and "add `address: IP`" in caught.value.hint
