"""The direct path's early SSH connection (orchestrator/remote/early.py), against a real SSH
server in this process (paramiko's server side on 127.0.0.1): the fleet adopts the
connection when the guess was right, closes it when it was wrong, and the host key is
checked exactly as on the normal path."""

from __future__ import annotations

import json
import os
import stat

import pytest

from orchestrator.ground.errors import HostKeyChanged, HostKeyUnknown
from orchestrator.remote import early
from orchestrator.remote.paramiko_lib import paramiko
from orchestrator.targets.fleet import Fleet
from tests.support.sshserver import SshServer


@pytest.fixture
def world(tmp_path, monkeypatch):
    """An inventory of two hosts on the one server (users root and other), its known_hosts,
    a client key; HOME in tmp_path (no ~/.ssh/config), orch's data folder empty."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    client_key = paramiko.ECDSAKey.generate()
    client_key.write_private_key_file(str(tmp_path / "id_ecdsa"))
    server = SshServer(client_key)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{server.port} {server.host_key.get_name()} "
                     f"{server.host_key.get_base64()}\n")
    common = (f"address: 127.0.0.1, port: {server.port}, identity: {tmp_path}/id_ecdsa, "
              f"known_hosts: {known}, connect_timeout: 5")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  h1: {{{common}}}\n  h2: {{{common}, user: other}}\n"
                         "containers:\n  ct1: {host: h1, vmid: 200}\n  ct2: {host: h2, vmid: 201}\n")
    yield {"server": server, "inventory": str(inventory), "known": known, "tmp": tmp_path}
    early._discard_unclaimed()
    server.close()


def remember_hosts(inventory: str) -> None:
    """What a first direct command leaves behind: the index (written when it opens a host)."""
    with Fleet.from_path(inventory) as fleet:
        fleet.host("h1")


def exec_args(inventory: str, target: str) -> list[str]:
    return ["-i", inventory, "--no-agent", "exec", "--timeout", "5", target, "--", "true"]


def test_a_right_guess_is_the_connection_the_fleet_uses(world):
    server = world["server"]
    remember_hosts(world["inventory"])
    assert server.accepted == 0   # opening a host connects nothing yet
    index_file = os.path.join(os.environ["ORCH_DATA_DIR"], early.INDEX_NAME)
    assert stat.S_IMODE(os.stat(index_file).st_mode) == 0o600
    early.start(exec_args(world["inventory"], "ct1"))
    pending = early._pending
    assert pending is not None
    with Fleet.from_path(world["inventory"]) as fleet:
        [target] = fleet.targets(["ct1"])
        transport = fleet.host("h1").connect()
        assert transport is pending.client().get_transport() and transport.is_authenticated()
        assert server.accepted == 1 and server.logins == ["root"]   # no second connection
        assert early._pending is None


@pytest.mark.parametrize("line, host", [
    (["exec", "ct1", "--", "true"], "h1"),
    (["exec", "--json", "--timeout=3", "ct2", "true"], "h2"),
    (["exec", "h2:250", "--", "true"], "h2"),
    (["grep-torch", "--def", "x", "-t", "ct2"], "h2"),
    (["grep-pkg", "numpy", "--target=ct1"], "h1"),
    (["grep-torch", "--def", "x"], "h2"),   # the inventory's default_target
])
def test_the_host_guessed_from_a_command_line(world, line, host):
    with open(world["inventory"], "a") as inventory:
        inventory.write("default_target: ct2\n")
    remember_hosts(world["inventory"])
    assert early.guess(["-i", world["inventory"], "--no-agent", *line])["name"] == host


@pytest.mark.parametrize("line", [
    ["exec", "--help"], ["exec", "--no-such-option", "ct1", "true"], ["exec"],
    ["grep-torch", "--def", "x", "-t", "ct1", "-t", "ct2"], ["grep-torch", "--help"],
    ["ct", "status", "ct1"], ["run", "playbook.yaml"], ["exec", "nosuch", "--", "true"],
])
def test_no_guess_for_other_command_lines(world, line):
    remember_hosts(world["inventory"])
    assert early.guess(["-i", world["inventory"], *line]) is None


def test_a_wrong_guess_is_closed_and_the_right_host_opened(world):
    server = world["server"]
    remember_hosts(world["inventory"])
    early.start(exec_args(world["inventory"], "ct2"))   # h2: user other
    pending = early._pending
    guessed = pending.client().get_transport()   # logged in (the CLI's imports take longer)
    with Fleet.from_path(world["inventory"]) as fleet:
        transport = fleet.host("h1").connect()
        assert transport.is_authenticated() and transport is not guessed
        assert not guessed.is_active()   # closed, unused
        assert server.accepted == 2 and server.logins == ["other", "root"]


def test_a_wrong_guess_closed_before_its_handshake_leaves_nothing_open(world):
    remember_hosts(world["inventory"])
    early.start(exec_args(world["inventory"], "ct2"))
    pending = early._pending
    with Fleet.from_path(world["inventory"]) as fleet:
        fleet.host("h1")   # claims at once: the early thread may not have begun its handshake
    pending._thread.join(timeout=5)
    assert not pending._thread.is_alive()
    assert pending._sock is None or pending._sock.fileno() == -1
    assert pending._client is None or not pending._client.get_transport().is_active()


def test_no_guess_without_a_valid_index_entry(world):
    server = world["server"]
    early.start(exec_args(world["inventory"], "ct1"))   # nothing remembered yet
    assert early._pending is None
    remember_hosts(world["inventory"])
    with open(world["inventory"], "a") as inventory:     # edited since: the entry is stale
        inventory.write("groups:\n  both: [ct1, ct2]\n")
    early.start(exec_args(world["inventory"], "ct1"))
    assert early._pending is None
    for line in (["-i", world["inventory"], "--trust-new-host-keys", "exec", "ct1", "true"],
                 ["-i", world["inventory"], "exec", "--help"],
                 ["-i", world["inventory"], "ct", "list", "ct1"]):
        remember_hosts(world["inventory"])
        early.start(line)
        assert early._pending is None, line
    assert server.accepted == 0


def test_the_host_key_is_checked_as_always(world):
    server = world["server"]
    remember_hosts(world["inventory"])
    other_key = paramiko.ECDSAKey.generate()
    world["known"].write_text(f"[127.0.0.1]:{server.port} {other_key.get_name()} "
                              f"{other_key.get_base64()}\n")   # not the server's key
    with pytest.raises(HostKeyChanged), Fleet.from_path(world["inventory"]) as fleet:
        fleet.host("h1").connect()
    assert server.accepted == 1   # the fleet's own attempt, for comparison
    early.start(exec_args(world["inventory"], "ct1"))
    with pytest.raises(HostKeyChanged), Fleet.from_path(world["inventory"]) as fleet:
        fleet.host("h1").connect()
    # the early attempt was the only one (its error is the fleet's), and it logged in nowhere
    assert server.accepted == 2 and server.logins == []
    assert world["known"].read_text().count("\n") == 1   # nothing added or replaced


def test_an_index_that_says_trust_on_first_use_is_not_believed(world):
    server = world["server"]
    world["known"].write_text("")   # the server's key is unknown
    remember_hosts(world["inventory"])
    index_file = os.path.join(os.environ["ORCH_DATA_DIR"], early.INDEX_NAME)
    with open(index_file) as handle:
        index = json.load(handle)
    for entry in index["inventories"].values():
        for host in entry["hosts"].values():
            host["trust_on_first_use"] = True
    with open(index_file, "w") as handle:
        json.dump(index, handle)
    early.start(exec_args(world["inventory"], "ct1"))
    pending = early._pending
    with pytest.raises(HostKeyUnknown):
        pending.client()
    assert world["known"].read_text() == "" and server.logins == []


def test_an_unclaimed_connection_is_closed(world):
    remember_hosts(world["inventory"])
    early.start(exec_args(world["inventory"], "ct1"))
    pending = early._pending
    transport = pending.client().get_transport()
    assert transport.is_active()
    early._discard_unclaimed()   # what runs at exit when no fleet asked for a host
    assert not transport.is_active() and early._pending is None


@pytest.mark.parametrize("damage", [
    lambda index: "not json {",
    lambda index: json.dumps({**index, "inventories": []}),
    lambda index: json.dumps(_each_host(index, lambda host: {"address": "127.0.0.1"})),
    lambda index: json.dumps(_each_host(index, lambda host: {**host, "port": "ssh"})),
    lambda index: json.dumps(_each_host(index, lambda host: {**host, "colour": "blue"})),
])
def test_a_damaged_index_means_no_guess_and_no_error(world, damage):
    remember_hosts(world["inventory"])
    index_file = os.path.join(os.environ["ORCH_DATA_DIR"], early.INDEX_NAME)
    with open(index_file) as handle:
        index = json.load(handle)
    with open(index_file, "w") as handle:
        handle.write(damage(index))
    early.start(exec_args(world["inventory"], "ct1"))
    assert early._pending is None
    remember_hosts(world["inventory"])   # and the next direct command writes it anew
    early.start(exec_args(world["inventory"], "ct1"))
    assert early._pending is not None


def _each_host(index: dict, change) -> dict:
    for entry in index["inventories"].values():
        entry["hosts"] = {name: change(host) for name, host in entry["hosts"].items()}
    return index


def test_only_the_direct_paths_fleet_writes_the_index(world):
    """The agent's fleets (the caller's folder, warm sessions) and one with another
    ssh_config are not what a direct command would compute: they leave the index alone."""
    from orchestrator.config.inventory import load_inventory
    from orchestrator.remote.session import SessionPool
    index_file = os.path.join(os.environ["ORCH_DATA_DIR"], early.INDEX_NAME)
    for fleet in (Fleet(load_inventory(world["inventory"]), cwd=str(world["tmp"])),
                  Fleet(load_inventory(world["inventory"]), sessions=SessionPool()),
                  Fleet(load_inventory(world["inventory"]), ssh_config_path=os.devnull)):
        with fleet:
            fleet.host("h1")
        assert not os.path.exists(index_file)
    remember_hosts(world["inventory"])
    assert os.path.exists(index_file)
