"""Proxmox's real semantics, end to end against the sandbox: pct's exit codes and PATH,
start tasks (UPID) and their errors, stderr noise around pvesh's JSON, node names and
field types, and the HTTPS API with an API token (docs/design/proxmox-semantics.md)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time

import pytest
import yaml

from orchestrator.ground.errors import ContainerNotRunning, NoSuchContainer, OrchError
from orchestrator.targets.fleet import Fleet

# the PATH orch gives commands in containers: Debian's for root, not pct's
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
pytestmark = pytest.mark.sandbox

LOCALE_WARNING = ("perl: warning: Setting locale failed.\n"
                  "perl: warning: Please check that your locale settings:\n"
                  "\tLANGUAGE = (unset),\n\tLC_ALL = (unset),\n\tLANG = \"de_AT.UTF-8\"\n"
                  "    are supported and installed on your system.\n"
                  "perl: warning: Falling back to the standard locale (\"C\").\n")


@pytest.fixture(scope="module")
def fleet(sandbox):
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        yield fleet


def orch(*args, inventory, env=None, timeout=90):
    return subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(inventory), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def on_host(sandbox, host, *argv, input=None):
    return sandbox.run_on_host(host, list(argv), input=input, timeout=60)


@pytest.fixture
def stopped_202(sandbox):
    """CT 202 of sb1, stopped, with no hookscript, before and after the test."""
    sandbox.stop_container("sb1", 202)
    yield 202
    sandbox.set_hookscript("sb1", 202, None)
    sandbox.stop_container("sb1", 202)


# --- 1. pct's errors: by their text, whatever the exit code -----------------------------------

def test_pct_exits_with_errno_not_255(sandbox):
    assert on_host(sandbox, "sb1", "pct", "exec", "999", "--", "true").returncode == 2
    assert on_host(sandbox, "sb1", "pct", "exec", "202", "--", "true").returncode == 2


def test_pct_errors_are_recognised_whatever_the_exit_code(sandbox, fleet):
    with pytest.raises(ContainerNotRunning, match="container '202' not running!"):
        fleet.targets(["sb1-202"])[0].run(["true"])
    with pytest.raises(NoSuchContainer, match="nodes/sb1/lxc/999.conf' does not exist"):
        fleet.targets(["sb1:999"])[0].run(["true"])
    for target, text, sentence in (
            ("sb1-202", "is not running", "container '202' not running!"),
            ("sb1:999", "no such container", "Configuration file 'nodes/sb1/lxc/999.conf' does not exist")):
        out = orch("exec", target, "--", "true", inventory=sandbox.inventory_path)
        assert out.returncode == 4, out.stderr
        assert text in out.stderr and "Traceback" not in out.stderr
        # exec streams the command's stderr, pct's sentence with it: shown once, not twice
        assert out.stderr.count(sentence) == 1, out.stderr


@pytest.mark.parametrize("sentence", ["container '200' not running!",
                                      "Configuration file 'nodes/sb1/lxc/200.conf' does not exist"])
def test_a_command_printing_pcts_sentence_keeps_its_own_result(fleet, sentence):
    ct = fleet.targets(["sb1-200"])[0]
    result = ct.run(["sh", "-c", 'printf "%s\\n" "$1" >&2; exit 2', "sh", sentence])
    assert (result.exit_code, result.error_text) == (2, sentence + "\n")


# --- 2. PATH ------------------------------------------------------------------------------------

def test_pct_gives_commands_its_own_path(sandbox):
    result = on_host(sandbox, "sb1", "pct", "exec", "200", "--", "printenv", "PATH")
    assert result.stdout == b"/sbin:/bin:/usr/sbin:/usr/bin\n"


def test_orch_runs_container_commands_under_a_path_it_sets(sandbox, fleet, tmp_path):
    ct = fleet.targets(["sb1-200"])[0]
    assert ct.run(["printenv", "PATH"], check=True).text == CONTAINER_PATH + "\n"
    # an inventory env PATH wins, through the same wrapper (pct would reset it)
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    data["containers"]["sb1-200"]["env"] = {"PATH": "/opt/tools/bin:/usr/bin:/bin"}
    with Fleet(_inventory(tmp_path, data)) as other:
        pinned = other.targets(["sb1-200"])[0]
        assert pinned.run(["printenv", "PATH"], check=True).text == "/opt/tools/bin:/usr/bin:/bin\n"


def _inventory(tmp_path, data):
    from orchestrator.config.inventory import load_inventory
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_inventory(str(path))


# --- 6. root, node name, field types ------------------------------------------------------------

def test_pct_and_pvesh_want_root(sandbox):
    for tool in (["pct", "status", "200"], ["pct", "exec", "200", "--", "true"],
                 ["pvesh", "get", "/nodes"]):
        result = on_host(sandbox, "sb1", "setpriv", "--reuid=65534", "--regid=65534",
                         "--clear-groups", *tool)
        assert (result.returncode, result.stderr) == (255, b"please run as root\n"), tool


def test_the_node_name_drops_the_domain(sandbox):
    on_host(sandbox, "sb1", "hostname", "sb1.cluster.example")
    try:
        assert on_host(sandbox, "sb1", "pct", "exec", "200", "--", "true").returncode == 0
        nodes = json.loads(on_host(sandbox, "sb1", "pvesh", "get", "/nodes",
                                   "--output-format", "json").stdout)
        assert [n["node"] for n in nodes] == ["sb1"]
        assert on_host(sandbox, "sb1", "pct", "status", "200").stdout == b"status: running\n"
    finally:
        on_host(sandbox, "sb1", "hostname", "sb1")


def test_cpus_is_the_configs_text_and_orch_makes_it_a_number(sandbox):
    raw = json.loads(on_host(sandbox, "sb1", "pvesh", "get", "/nodes/sb1/lxc",
                             "--output-format", "json").stdout)
    assert all(isinstance(item["cpus"], str) for item in raw)
    assert not any("template" in item for item in raw)   # only when set
    out = orch("ct", "status", "sb1-200", "--json", inventory=sandbox.inventory_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cpus"] == int(raw[0]["cpus"])


# --- 3./4. start tasks -----------------------------------------------------------------------------

def test_pvesh_prints_the_upid_and_exits_0_when_the_start_task_fails(sandbox, stopped_202):
    sandbox.set_hookscript("sb1", 202, "#!/bin/sh\necho checking GPUs\nexit 3\n")
    result = on_host(sandbox, "sb1", "pvesh", "create", "/nodes/sb1/lxc/202/status/start",
                     "--output-format", "json")
    assert result.returncode == 0
    upid = json.loads(result.stdout.decode().splitlines()[-1])
    assert upid.startswith("UPID:sb1:") and ":vzstart:202:root@pam:" in upid
    assert result.stderr.decode().startswith("hookscript error for 202 on pre-start")
    status = json.loads(on_host(sandbox, "sb1", "pvesh", "get", f"/nodes/sb1/tasks/{upid}/status",
                                "--output-format", "json").stdout)
    assert status["status"] == "stopped"
    assert status["exitstatus"].startswith("hookscript error for 202 on pre-start")


def test_orch_reports_a_failed_start_with_the_tasks_error(sandbox, stopped_202):
    sandbox.set_hookscript("sb1", 202, "#!/bin/sh\necho checking GPUs\nexit 3\n")
    started = time.monotonic()
    out = orch("ct", "start", "sb1-202", "--wait", "60", inventory=sandbox.inventory_path)
    took = time.monotonic() - started
    assert out.returncode == 1, out.stderr
    assert "hookscript error for 202 on pre-start" in out.stderr
    assert "exit code 3" in out.stderr and "checking GPUs" in out.stderr
    assert took < 30, "orch waited for --wait instead of reading the task"
    assert not sandbox.container_running("sb1", 202)


def test_a_start_slower_than_the_api_timeout_is_waited_for(sandbox, fleet, stopped_202,
                                                          monkeypatch):
    from orchestrator.targets import proxmox
    monkeypatch.setattr(proxmox, "API_TIMEOUT", 1.0)
    sandbox.set_hookscript("sb1", 202, "#!/bin/sh\nsleep 3\n")
    client = proxmox.ProxmoxClient(fleet.inventory.hosts["sb1"], fleet.host("sb1"))
    assert client.start(202, wait_s=20)["exitstatus"] == "OK"
    assert sandbox.container_running("sb1", 202)


# --- 5. stderr noise around pvesh's JSON ----------------------------------------------------------

def test_a_pvesh_warning_on_stderr_changes_nothing_but_a_warning(sandbox):
    clean = orch("ct", "list", "sb1", "--json", inventory=sandbox.inventory_path)
    sandbox.set_knob("sb1", "perl-warning", LOCALE_WARNING)
    try:
        raw = on_host(sandbox, "sb1", "pvesh", "get", "/nodes", "--output-format", "json")
        assert raw.returncode == 0 and raw.stderr.decode() == LOCALE_WARNING
        noisy = orch("ct", "list", "sb1", "--json", inventory=sandbox.inventory_path)
    finally:
        sandbox.set_knob("sb1", "perl-warning", None)
    assert (clean.returncode, noisy.returncode) == (0, 0), noisy.stderr
    strip = lambda rows: [{k: v for k, v in r.items() if k != "uptime"} for r in json.loads(rows)]
    assert strip(noisy.stdout) == strip(clean.stdout)
    assert "perl: warning: Setting locale failed." in noisy.stderr


# --- 7. the HTTPS API with an API token ------------------------------------------------------------

def https_inventory(sandbox, tmp_path, **api):
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    for name in ("sb1", "sb2"):
        data["hosts"][name]["api"] = {"url": sandbox.api_url(name),
                                      "token_id": sandbox.api_token_id,
                                      "token_secret_env": "ORCH_TEST_PVE_SECRET", **api}
        if "ca_file" in api:
            data["hosts"][name]["api"]["ca_file"] = str(sandbox.api_ca_file(name))
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def secret(sandbox):
    return {"ORCH_TEST_PVE_SECRET": sandbox.api_token_secret()}


def raw_request(sandbox, host, path, headers=None):
    """One request with http.client, the CA pinned: what the server answers, as is."""
    context = ssl.create_default_context(cafile=str(sandbox.api_ca_file(host)))
    address = sandbox.address(host)
    with socket.create_connection((address, 8006), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="fe80::2") as tls:
            connection = http.client.HTTPSConnection(address, 8006)
            connection.sock = tls
            connection.request("GET", path, headers=headers or {})
            answer = connection.getresponse()
            return answer.status, answer.reason, answer.read()


def test_the_api_checks_the_token_as_proxmox_does(sandbox):
    sandbox.set_knob("sb1", "auth-failure-delay", "0.3")
    try:
        good = {"Authorization": f"PVEAPIToken={sandbox.api_token_id}={sandbox.api_token_secret()}"}
        status, _, body = raw_request(sandbox, "sb1", "/api2/json/nodes/sb1/lxc", good)
        assert status == 200 and [c["vmid"] for c in json.loads(body)["data"]] == [200, 201, 202]
        started = time.monotonic()
        assert raw_request(sandbox, "sb1", "/api2/json/nodes")[:3] == (401, "No ticket", b"")
        assert time.monotonic() - started >= 0.3      # unauthenticated calls are delayed
        bad = {"Authorization": f"PVEAPIToken={sandbox.api_token_id}=not-the-secret"}
        assert raw_request(sandbox, "sb1", "/api2/json/nodes", bad)[:2] == (
            401, "Authentication failed!")
        status, reason, _ = raw_request(sandbox, "sb1",
                                        "/api2/json/nodes/sb1/lxc/999/status/current", good)
        assert (status, reason) == (500, "Configuration file 'nodes/sb1/lxc/999.conf' does not exist")
    finally:
        sandbox.set_knob("sb1", "auth-failure-delay", None)


def test_ct_list_status_start_over_https_with_a_token(sandbox, tmp_path, secret, stopped_202):
    inventory = https_inventory(sandbox, tmp_path, ca_file=True)
    listing = orch("ct", "list", "sb1", "sb2", "--json", inventory=inventory, env=secret)
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert {(r["node"], r["vmid"], r["status"]) for r in rows} >= {
        ("sb1", 200, "running"), ("sb1", 202, "stopped"), ("sb2", 201, "running")}
    status = orch("ct", "status", "sb2-201", "--json", inventory=inventory, env=secret)
    assert json.loads(status.stdout)["status"] == "running"
    missing = orch("ct", "status", "sb1:999", inventory=inventory, env=secret)
    assert missing.returncode == 4 and "999.conf' does not exist" in missing.stderr
    start = orch("ct", "start", "sb1-202", inventory=inventory, env=secret)
    assert start.returncode == 0, start.stderr
    assert sandbox.container_running("sb1", 202)
    for out in (listing, status, missing, start):
        assert secret["ORCH_TEST_PVE_SECRET"] not in out.stdout + out.stderr


def test_a_failed_start_over_https_reports_the_tasks_error(sandbox, tmp_path, secret, stopped_202):
    sandbox.set_hookscript("sb1", 202, "#!/bin/sh\necho no GPU for you\nexit 1\n")
    inventory = https_inventory(sandbox, tmp_path, ca_file=True)
    out = orch("ct", "start", "sb1-202", "--wait", "60", inventory=inventory, env=secret)
    assert out.returncode == 1
    assert "hookscript error for 202 on pre-start" in out.stderr and "no GPU for you" in out.stderr


def test_a_wrong_token_is_a_clear_error_without_the_secret(sandbox, tmp_path):
    sandbox.set_knob("sb1", "auth-failure-delay", "0.1")
    try:
        inventory = https_inventory(sandbox, tmp_path, ca_file=True)
        out = orch("ct", "list", "sb1", "--json", inventory=inventory,
                   env={"ORCH_TEST_PVE_SECRET": "wrong-secret-1234"})
    finally:
        sandbox.set_knob("sb1", "auth-failure-delay", None)
    assert out.returncode == 1
    assert "refused API token root@pam!orch: 401 Authentication failed!" in (
        json.loads(out.stdout)[0]["error"])
    assert "wrong-secret-1234" not in out.stdout + out.stderr


def test_an_untrusted_certificate_is_refused_unless_pinned(sandbox, tmp_path, secret):
    plain = https_inventory(sandbox, tmp_path)
    refused = orch("ct", "status", "sb1-200", inventory=plain, env=secret)
    assert refused.returncode == 1
    assert "certificate is not trusted" in refused.stderr
    assert sandbox.api_fingerprint("sb1") in refused.stderr      # what to pin, shown
    pinned = https_inventory(sandbox, tmp_path, fingerprint=sandbox.api_fingerprint("sb1"))
    ok = orch("ct", "status", "sb1-200", "--json", inventory=pinned, env=secret)
    assert ok.returncode == 0 and json.loads(ok.stdout)["status"] == "running", ok.stderr
    wrong = https_inventory(sandbox, tmp_path, fingerprint="AB" * 32)
    out = orch("ct", "status", "sb1-200", inventory=wrong, env=secret)
    assert out.returncode == 1 and "not the pinned" in out.stderr
    off = https_inventory(sandbox, tmp_path, verify_ssl=False)
    out = orch("ct", "status", "sb1-200", inventory=off, env=secret)
    assert out.returncode == 2 and "verify_ssl: false is not supported" in out.stderr


# --- 8. clusters -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(sandbox, tmp_path_factory):
    """Two hosts as one cluster "lab" (clu1: CTs 200, 201; clu2: CTs 300, 301), a sandbox
    of its own so the shared one stays standalone."""
    import orch_sandbox as sb
    state = tmp_path_factory.mktemp("cluster") / "state"
    try:
        yield sb.up(hosts_count=2, containers_count=2, stopped=0, prefix="clu",
                    state_dir=state, cluster="lab")
    finally:
        sb.down(purge=True, state_dir=state, prefix="clu")


def test_cluster_nodes_share_etc_pve_and_pct_stays_on_its_node(cluster):
    # clu1 sees clu2's config in the shared /etc/pve, but pct exec only runs its own CTs
    shown = on_host(cluster, "clu1", "cat", "/etc/pve/nodes/clu2/lxc/300.conf")
    assert b"hostname: CT300" in shown.stdout
    away = on_host(cluster, "clu1", "pct", "exec", "300", "--", "true")
    assert (away.returncode, away.stderr) == (
        2, b"Configuration file 'nodes/clu1/lxc/300.conf' does not exist\n")
    nodes = json.loads(on_host(cluster, "clu2", "pvesh", "get", "/nodes",
                               "--output-format", "json").stdout)
    assert [node["node"] for node in nodes] == ["clu1", "clu2"]


def test_ct_list_over_a_cluster_shows_each_containers_node(cluster):
    out = orch("ct", "list", "lab", "--json", inventory=cluster.inventory_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["vmid"], r["node"], r["host"], r["status"]) for r in rows] == [
        (200, "clu1", "clu1", "running"), (201, "clu1", "clu1", "running"),
        (300, "clu2", "clu2", "running"), (301, "clu2", "clu2", "running")]
    assert rows[2]["inventory"] == "clu2-300"


def test_a_cluster_target_by_vmid_finds_its_node(cluster):
    out = orch("exec", "lab:300", "--", "hostname", inventory=cluster.inventory_path)
    assert (out.returncode, out.stdout) == (0, "CT300\n"), out.stderr
    status = orch("ct", "status", "lab:201", "--json", inventory=cluster.inventory_path)
    assert json.loads(status.stdout)["status"] == "running", status.stderr
    nowhere = orch("exec", "lab:999", "--", "true", inventory=cluster.inventory_path)
    assert nowhere.returncode == 4
    assert "CT 999 is on no node of cluster lab" in nowhere.stderr


def test_a_cluster_container_in_the_inventory_follows_its_node(cluster, tmp_path):
    data = yaml.safe_load(cluster.inventory_path.read_text())
    data["containers"]["moving"] = {"cluster": "lab", "vmid": 301}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    with Fleet.from_path(str(path)) as fleet:
        target = fleet.targets(["moving"])[0]
        assert target.host.name == "clu2"
        assert target.run(["hostname"], check=True).text == "CT301\n"


def test_a_perl_warning_before_pcts_own_error_changes_nothing(sandbox, fleet):
    sandbox.set_knob("sb1", "perl-warning", LOCALE_WARNING)
    try:
        raw = on_host(sandbox, "sb1", "pct", "exec", "202", "--", "true")
        assert raw.stderr.decode() == LOCALE_WARNING + "container '202' not running!\n"
        with pytest.raises(ContainerNotRunning):
            fleet.targets(["sb1-202"])[0].run(["true"])
        ran = fleet.targets(["sb1-200"])[0].run(["sh", "-c", "echo out; exit 3"])
        assert (ran.exit_code, ran.text, ran.error_text) == (3, "out\n", LOCALE_WARNING)
    finally:
        sandbox.set_knob("sb1", "perl-warning", None)


def test_over_https_a_start_slower_than_wait_is_reported_as_still_running(
        sandbox, tmp_path, secret, stopped_202, monkeypatch):
    from orchestrator.targets import proxmox
    from orchestrator.config.inventory import load_inventory
    sandbox.set_hookscript("sb1", 202, "#!/bin/sh\nsleep 3\n")
    monkeypatch.setenv("ORCH_TEST_PVE_SECRET", secret["ORCH_TEST_PVE_SECRET"])
    spec = load_inventory(str(https_inventory(sandbox, tmp_path, ca_file=True))).hosts["sb1"]
    client = proxmox.ProxmoxClient(spec, None)
    started = time.monotonic()
    with pytest.raises(OrchError, match=r"task UPID:sb1:\S+ still runs after 1 s") as raised:
        client.start(202, wait_s=1)
    assert time.monotonic() - started < 3       # the API answered the UPID at once
    # the task goes on in the background and ends well
    upid = str(raised.value).split("task ", 1)[1].split()[0]
    assert client.wait_task(upid, 20, what="the start")["exitstatus"] == "OK"
    assert sandbox.container_running("sb1", 202)
