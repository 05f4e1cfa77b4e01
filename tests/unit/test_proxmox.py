"""The proxmoxer client over a pvesh-speaking transport (a fake here; the sandbox tests use
the emulated pvesh over real SSH)."""

import json

import pytest

from orchestrator.config.inventory import HostSpec
from orchestrator.errors import ConfigError, NoSuchContainer
from orchestrator.proxmox import ProxmoxClient
from orchestrator.remote.base import Result, Transport

CONTAINERS = [{"vmid": 201, "name": "b", "status": "stopped", "type": "lxc"},
              {"vmid": 200, "name": "a", "status": "running", "type": "lxc"}]


class FakePvesh(Transport):
    name = "pve"

    def __init__(self):
        self.calls = []

    def _run(self, argv, options):
        self.calls.append(argv)
        verb, path = argv[1], argv[2]
        if path == "/nodes":
            return self._ok([{"node": "pve1", "status": "online"}])
        if path == "/nodes/pve1/lxc":
            return self._ok(CONTAINERS)
        if path == "/nodes/pve1/lxc/200/status/current":
            return self._ok({"vmid": 200, "status": "running"})
        if path == "/nodes/pve1/lxc/200/status/start" and verb == "create":
            return self._ok("UPID:pve1:00001234:00005678:65000000:vzstart:200:root@pam:")
        return Result(argv, 2, b"", f"Configuration file 'nodes/pve1/lxc/{path.split('/')[4]}.conf' does not exist\n".encode(), 0.0)

    @staticmethod
    def _ok(data):
        return Result([], 0, json.dumps(data).encode(), b"", 0.0)


def test_lists_sorted_and_finds_the_node():
    fake = FakePvesh()
    client = ProxmoxClient(HostSpec(name="pve", address="a"), fake)
    assert [c["vmid"] for c in client.containers()] == [200, 201]
    assert fake.calls[0] == ["pvesh", "get", "/nodes", "--output-format", "json"]


def test_status_start_and_unknown_container():
    client = ProxmoxClient(HostSpec(name="pve", address="a", node="pve1"), FakePvesh())
    assert client.status(200)["status"] == "running"
    assert str(client.start(200)).startswith("UPID:")
    with pytest.raises(NoSuchContainer, match="CT 999"):
        client.status(999)


def test_https_needs_the_secret_from_the_environment(monkeypatch):
    monkeypatch.delenv("PROXMOX_TOKEN_SECRET", raising=False)
    spec = HostSpec(name="pve", address="a", api={"url": "https://pve:8006", "token_id": "root@pam!orch"})
    with pytest.raises(ConfigError, match="export PROXMOX_TOKEN_SECRET"):
        ProxmoxClient(spec, FakePvesh())


def test_https_client_never_shows_the_secret(monkeypatch):
    monkeypatch.setenv("PROXMOX_TOKEN_SECRET", "s3cr3t-value")
    spec = HostSpec(name="pve", address="a", api={"url": "https://pve:8006", "token_id": "root@pam!orch"})
    client = ProxmoxClient(spec, FakePvesh())
    assert "s3cr3t-value" not in repr(client.api)
