"""The proxmoxer client over a pvesh-speaking transport (a fake here; the sandbox tests use
the emulated pvesh over real SSH)."""

import json

import pytest

from orchestrator.config.inventory import HostSpec
from orchestrator.ground.errors import ConfigError, NoSuchContainer, OrchError
from orchestrator.targets.proxmox import ProxmoxClient, TaskFailed
from orchestrator.remote.base import Result, Transport

CONTAINERS = [{"vmid": 201, "name": "b", "status": "stopped", "type": "lxc"},
              {"vmid": 200, "name": "a", "status": "running", "type": "lxc"}]


UPID = "UPID:pve1:00001234:00005678:65000000:vzstart:200:root@pam:"
LOCALE_WARNING = (b"perl: warning: Setting locale failed.\n"
                  b"perl: warning: Falling back to the standard locale (\"C\").\n")


class FakePvesh(Transport):
    name = "pve"

    def __init__(self, stderr=b"", task_error=None):
        self.calls = []
        self.stderr = stderr
        self.task_error = task_error

    def _run(self, argv, options):
        self.calls.append(argv)
        result = self._answer(argv)
        if result.exit_code == 0:
            result.stderr = self.stderr + result.stderr
        return result

    def _answer(self, argv):
        verb, path = argv[1], argv[2]
        if path == f"/nodes/pve1/tasks/{UPID}/status":
            return self._ok({"status": "stopped", "exitstatus": self.task_error or "OK"})
        if path == f"/nodes/pve1/tasks/{UPID}/log":
            return self._ok([{"n": 1, "t": "hook says no"}, {"n": 2, "t": "TASK ERROR: x"}])
        if path == "/nodes":
            return self._ok([{"node": "pve1", "status": "online"}])
        if path == "/nodes/pve1/lxc":
            return self._ok(CONTAINERS)
        if path == "/nodes/pve1/lxc/200/status/current":
            return self._ok({"vmid": 200, "status": "running"})
        if path == "/nodes/pve1/lxc/200/status/start" and verb == "create":
            # as the real pvesh: the task's error on stderr, the UPID on stdout, exit 0
            answer = self._ok(UPID)
            answer.stderr = (self.task_error + "\n").encode() if self.task_error else b""
            return answer
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
    assert client.start(200)["exitstatus"] == "OK"
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


def test_stderr_noise_around_the_json_is_a_warning_not_an_error():
    warnings = []
    client = ProxmoxClient(HostSpec(name="pve", address="a"), FakePvesh(stderr=LOCALE_WARNING),
                           warn=warnings.append)
    assert [c["vmid"] for c in client.containers()] == [200, 201]
    assert warnings and "perl: warning: Setting locale failed." in warnings[0]


def test_a_failed_start_task_is_reported_with_its_error_and_log():
    client = ProxmoxClient(HostSpec(name="pve", address="a", node="pve1"),
                           FakePvesh(task_error="hookscript error for 200 on pre-start"))
    with pytest.raises(OrchError, match="(?s)hookscript error for 200 on pre-start.*hook says no"):
        client.start(200)


def test_cpus_given_as_text_become_numbers():
    from orchestrator.targets.proxmox import typed
    assert typed({"cpus": "2", "vmid": "200"}) == {"cpus": 2, "vmid": 200}
    assert typed({"cpus": "1.5"})["cpus"] == 1.5


def test_https_refuses_verification_off_and_bad_pins(monkeypatch):
    monkeypatch.setenv("PROXMOX_TOKEN_SECRET", "x")
    base = {"url": "https://pve:8006", "token_id": "root@pam!orch"}
    for api, message in (({"verify_ssl": False}, "not supported"),
                         ({"fingerprint": "AB:CD"}, "64 hex digits"),
                         ({"ca_file": "/nonexistent/ca.pem"}, "does not exist")):
        with pytest.raises(ConfigError, match=message):
            ProxmoxClient(HostSpec(name="pve", address="a", api={**base, **api}), None)


@pytest.mark.parametrize("url, expected", [
    ("https://pve.example:8006", ("pve.example", 8006)),
    ("https://10.1.2.6", ("10.1.2.6", 8006)),
    ("https://[fe80::2%orch-SB1]:8443/", ("fe80::2%orch-SB1", 8443)),   # zone kept as is
])
def test_https_urls_with_link_local_ipv6(url, expected):
    from orchestrator.targets.proxmox import _split_url
    assert _split_url("pve", url) == expected


@pytest.mark.parametrize("url", ["http://pve:8006", "pve:8006", "https://fe80::2:8006",
                                 "https://pve:8006/api2/json"])
def test_bad_https_urls_are_config_errors(url):
    from orchestrator.targets.proxmox import _split_url
    with pytest.raises(ConfigError, match="must look like https://HOST"):
        _split_url("pve", url)


def test_fingerprints_in_either_spelling():
    from orchestrator.targets.proxmox import normalise_fingerprint
    digest = "ab" * 32
    assert normalise_fingerprint(":".join(["AB"] * 32)) == digest.upper()
    assert normalise_fingerprint(digest) == digest.upper()
    assert normalise_fingerprint("AB:CD") is None


class StartingPvesh(FakePvesh):
    """CT 200's status answers in turn (the last one repeats): how a start looks from outside."""

    def __init__(self, statuses, **kwargs):
        super().__init__(**kwargs)
        self.statuses = list(statuses)

    def _answer(self, argv):
        if argv[2] == "/nodes/pve1/lxc/200/status/current":
            status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
            return self._ok({"vmid": 200, "status": status})
        return super()._answer(argv)

    def started(self) -> bool:
        return any(argv[2].endswith("/status/start") for argv in self.calls)


def starting_client(statuses, **kwargs):
    fake = StartingPvesh(statuses, **kwargs)
    return ProxmoxClient(HostSpec(name="pve", address="a", node="pve1"), fake), fake


def test_ensure_running_starts_then_waits_until_it_runs(monkeypatch):
    monkeypatch.setattr("orchestrator.targets.proxmox.RUNNING_POLL_S", 0.01)
    client, fake = starting_client(["stopped", "stopped", "stopped", "running"])
    assert client.ensure_running(200, wait_s=5) is True
    assert fake.started() and fake.statuses == ["running"]


def test_ensure_running_leaves_a_running_container_alone():
    client, fake = starting_client(["running"])
    assert client.ensure_running(200, wait_s=5) is False
    assert not fake.started()


def test_ensure_running_says_when_a_started_container_never_runs(monkeypatch):
    monkeypatch.setattr("orchestrator.targets.proxmox.RUNNING_POLL_S", 0.01)
    client, _ = starting_client(["stopped"])
    with pytest.raises(OrchError, match=r"^ct1 \(CT 200 on host pve\): its start task ended OK but "
                                        r"it does not run after 0.2 s$"):
        client.ensure_running(200, wait_s=0.2, label="ct1 (CT 200 on host pve)")
    with pytest.raises(OrchError, match=r"^CT 200 on host pve: its start task"):
        client.ensure_running(200, wait_s=0.05)


def test_ensure_running_reports_a_failed_start_task_without_waiting_for_the_status():
    client, fake = starting_client(["stopped"], task_error="startup for container '200' failed")
    began = len(fake.calls)
    with pytest.raises(TaskFailed, match="starting CT 200 on host pve failed: startup for container"):
        client.ensure_running(200, wait_s=30)
    statuses_asked = [a for a in fake.calls[began:] if a[2].endswith("/status/current")]
    assert len(statuses_asked) == 1    # the one before the start; none after the task failed
