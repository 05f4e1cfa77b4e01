"""The sandbox itself: real sshd and LXC behind emulated pct/pvesh that behave like Proxmox's.

Most tests use the shared session sandbox (conftest.py) and leave it as they found it.
The down/up tests build a separate one-host sandbox (host sbt1, its own state directory),
so they never disturb the shared one that other tests may be using at the same time.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import orch_sandbox as sb
from orch_sandbox import hosts, layout, system

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
HOSTILE = ["plain", "two words", "", "'single'", '"double"', "$(echo pwned)", "`id`",
           "a;b", "a && b", "x | y", "line1\nline2", "tab\there", "ünïcödé ✓", "-n",
           "--leading", "--", "*", "~", "\\back\\slash", "$HOME", "!bang", "{a,b}", "%%s"]
PRINT_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"
STATUS_FIELDS = {"vmid", "type", "status", "name", "cpus", "maxmem", "maxswap", "mem",
                 "swap", "disk", "maxdisk", "uptime", "cpu", "netin", "netout", "diskread",
                 "diskwrite"}


def ssh(sandbox, host: str, argv: list[str], *, input: bytes | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess:
    """The manual way: plain OpenSSH with the sandbox's ssh_config, argv quoted once."""
    return subprocess.run(sandbox.ssh_argv(host, shlex.join(argv)), input=input,
                          capture_output=True, timeout=timeout)


def on_host(sandbox, host: str, *argv: str, input: bytes | None = None):
    return sandbox.run_on_host(host, list(argv), input=input, timeout=30)


def orch_sandbox_cli(*args: str, env: dict | None = None, user: list[str] | None = None):
    # through orch's own group: commands return their exit codes, and the group makes them
    # the status (a bare click group would exit 0 whatever the command returned)
    argv = [*(user or []), sys.executable, "-m", "orchestrator", "sandbox", *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, **(env or {})})


# --- up and the files it writes ------------------------------------------------------------

def test_up_is_idempotent_and_reuses_the_running_hosts(sandbox):
    before = sb.status()
    inventory = sandbox.inventory_path.read_text()
    started = time.monotonic()
    again = sb.up()
    elapsed = time.monotonic() - started
    after = sb.status()
    assert after["healthy"], after
    assert [h["holder_pid"] for h in after["hosts"]] == [h["holder_pid"] for h in before["hosts"]]
    assert [h["sshd_pid"] for h in after["hosts"]] == [h["sshd_pid"] for h in before["hosts"]]
    assert again.inventory_path.read_text() == inventory
    assert elapsed < 2.0, f"a warm up took {elapsed:.2f} s"


def test_inventory_has_the_shape_the_loader_reads(sandbox):
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    assert set(data) == {"hosts", "containers", "groups", "default_target"}
    sb1 = data["hosts"]["sb1"]
    assert sb1 == {"address": "fe80::2%orch-sb1", "port": 22, "user": "root",
                   "identity": str(sandbox.identity), "known_hosts": str(sandbox.known_hosts),
                   "node": "sb1", "iface": "orch-sb1"}
    assert data["containers"]["sb2-202"] == {"host": "sb2", "vmid": 202, "venv": "/root/venv",
                                             "address": "10.88.2.202"}
    assert data["groups"]["running"] == ["sb1-200", "sb1-201", "sb2-200", "sb2-201"]
    assert data["groups"]["sb1"] == ["sb1-200", "sb1-201", "sb1-202"]
    assert data["default_target"] == "sb1-200"


def test_known_hosts_is_keyed_by_the_inventory_address(sandbox):
    import paramiko

    keys = paramiko.HostKeys(str(sandbox.known_hosts))
    for host in ("sb1", "sb2"):
        assert keys.lookup(sandbox.address(host)) is not None, host


def test_paramiko_connects_with_the_inventory_settings(sandbox):
    import paramiko

    client = paramiko.SSHClient()
    client.load_host_keys(str(sandbox.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(sandbox.address("sb2"), 22, username="root",
                   key_filename=str(sandbox.identity), look_for_keys=False,
                   allow_agent=False, timeout=10)
    try:
        _, stdout, stderr = client.exec_command("pct exec 201 -- hostname", timeout=10)
        assert stdout.read() == b"CT201\n"
        assert stderr.read() == b""   # the host's shell start-up prints nothing
    finally:
        client.close()


# --- pct exec through plain ssh ----------------------------------------------------------------

def test_pct_exec_round_trips_argv_through_plain_ssh(sandbox):
    result = ssh(sandbox, "sb1", ["pct", "exec", "200", "--", "python3", "-c", PRINT_ARGV,
                                  *HOSTILE])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == HOSTILE


def test_pct_exec_without_dashes_parses_options_like_getopt(sandbox):
    plain = ssh(sandbox, "sb2", ["pct", "exec", "201", "hostname"])
    assert (plain.returncode, plain.stdout) == (0, b"CT201\n")
    # like the real pct: without `--`, the command's own options are pct's (and unknown)
    dashed = ssh(sandbox, "sb2", ["pct", "exec", "201", "python3", "-c", "pass"])
    assert dashed.returncode == 255
    assert dashed.stderr.startswith(b"Unknown option: c\n400 unable to parse option\n")


def test_pct_exec_passes_exit_status_and_stdin(sandbox):
    assert ssh(sandbox, "sb1", ["pct", "exec", "200", "--", "sh", "-c", "exit 42"]).returncode == 42
    payload = b"import sys\nprint('payload ran', sys.argv[1:])\n"
    result = ssh(sandbox, "sb1", ["pct", "exec", "200", "--", "python3", "-", "a b"],
                 input=payload)
    assert result.stdout == b"payload ran ['a b']\n", result.stderr
    content = bytes(range(256)) * 64
    put = ssh(sandbox, "sb1", ["pct", "exec", "200", "--", "sh", "-c", "cat > /tmp/blob"],
              input=content)
    assert put.returncode == 0, put.stderr
    got = ssh(sandbox, "sb1", ["pct", "exec", "200", "--", "cat", "/tmp/blob"])
    assert got.stdout == content


def test_pct_exec_keep_env(sandbox):
    # run_cli_handler sets this PATH before anything runs; keep-env hands it on
    kept = on_host(sandbox, "sb1", "pct", "exec", "200", "--", "printenv", "PATH")
    assert kept.stdout == b"/sbin:/bin:/usr/sbin:/usr/bin\n"
    cleared = on_host(sandbox, "sb1", "pct", "exec", "200", "--keep-env", "0", "--",
                      "printenv", "PATH")
    assert cleared.stdout == b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"


# --- pct errors, texts and exit codes as Proxmox prints them ------------------------------

# exit codes: perl's die exits with errno when one is set (ENOENT after a config lookup),
# else 255
@pytest.mark.parametrize("argv, code, message", [
    (["exec", "999", "--", "true"], 2, "Configuration file 'nodes/sb1/lxc/999.conf' does not exist\n"),
    (["exec", "202", "--", "true"], 2, "container '202' not running!\n"),
    (["exec", "200"], 255, "missing command at /usr/share/perl5/PVE/CLI/pct.pm line 270.\n"),
    (["status", "999"], 2, "Configuration file 'nodes/sb1/lxc/999.conf' does not exist\n"),
    (["push", "202", "/etc/hostname", "/tmp/x"], 255, "can only push files to a running CT\n"),
    (["stop", "202"], 255, "CT 202 not running\n"),
    (["start", "200"], 255, "CT 200 already running\n"),
])
def test_pct_errors(sandbox, argv, code, message):
    result = on_host(sandbox, "sb1", "pct", *argv)
    assert (result.returncode, result.stderr.decode(), result.stdout) == (code, message, b"")


@pytest.mark.parametrize("bad", ["20", "0200", "abc", "1234567890", "²⁰⁰"])
def test_pct_rejects_a_bad_vmid(sandbox, bad):
    for command in (["exec", bad, "--", "true"], ["status", bad]):
        result = on_host(sandbox, "sb1", "pct", *command)
        assert result.returncode == 255
        assert "value does not look like a valid VM ID" in result.stderr.decode()


def test_pct_errors_through_plain_ssh(sandbox):
    result = ssh(sandbox, "sb2", ["pct", "exec", "202", "--", "true"])
    assert (result.returncode, result.stderr) == (2, b"container '202' not running!\n")


def test_pct_status_and_list_formats(sandbox):
    assert on_host(sandbox, "sb1", "pct", "status", "200").stdout == b"status: running\n"
    assert on_host(sandbox, "sb1", "pct", "status", "202").stdout == b"status: stopped\n"
    row = "%-10s %-10s %-12s %-20s\n"
    expected = (row % ("VMID", "Status", "Lock", "Name") + row % ("200", "running", "", "CT200")
                + row % ("201", "running", "", "CT201") + row % ("202", "stopped", "", "CT202"))
    assert on_host(sandbox, "sb2", "pct", "list").stdout.decode() == expected


def test_pct_config(sandbox):
    lines = on_host(sandbox, "sb1", "pct", "config", "201").stdout.decode().splitlines()
    assert "hostname: CT201" in lines
    assert lines == sorted(lines)


# --- pvesh ------------------------------------------------------------------------------------

def pvesh_json(sandbox, host: str, path: str):
    result = on_host(sandbox, host, "pvesh", "get", path, "--output-format", "json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""              # proxmoxer reads any stderr as an error
    text = result.stdout.decode()
    assert text.endswith("\n") and text.count("\n") == 1, "one line of JSON"
    data = json.loads(text)
    assert text.strip() == json.dumps(data, sort_keys=True, separators=(",", ":"))
    return data


def test_pvesh_nodes_and_version(sandbox):
    nodes = pvesh_json(sandbox, "sb1", "/nodes")
    assert [(n["node"], n["status"], n["type"]) for n in nodes] == [("sb1", "online", "node")]
    assert {"release", "version", "repoid"} <= set(pvesh_json(sandbox, "sb2", "/version"))


def test_pvesh_lxc_list(sandbox):
    containers = pvesh_json(sandbox, "sb2", "/nodes/sb2/lxc")
    assert [(c["vmid"], c["status"], c["name"]) for c in containers] == [
        (200, "running", "CT200"), (201, "running", "CT201"), (202, "stopped", "CT202")]
    for ct in containers:
        assert STATUS_FIELDS <= set(ct), STATUS_FIELDS - set(ct)
        assert ct["type"] == "lxc"
        assert ("pid" in ct) == (ct["status"] == "running")


def test_pvesh_status_current(sandbox):
    running = pvesh_json(sandbox, "sb1", "/nodes/sb1/lxc/200/status/current")
    assert STATUS_FIELDS <= set(running)
    assert running["status"] == "running" and running["pid"] > 1
    stopped = pvesh_json(sandbox, "sb1", "/nodes/sb1/lxc/202/status/current")
    assert stopped["status"] == "stopped" and "pid" not in stopped


def test_pvesh_errors(sandbox):
    unknown = on_host(sandbox, "sb1", "pvesh", "get", "/nowhere", "--output-format", "json")
    assert (unknown.returncode, unknown.stderr) == (1, b"No 'get' handler defined for '/nowhere'\n")
    missing = on_host(sandbox, "sb1", "pvesh", "get", "/nodes/sb1/lxc/999/status/current",
                      "--output-format", "json")
    assert missing.returncode == 2    # ENOENT of the config lookup
    assert b"Configuration file 'nodes/sb1/lxc/999.conf' does not exist" in missing.stderr


def test_pvesh_through_plain_ssh(sandbox):
    result = ssh(sandbox, "sb2", ["pvesh", "get", "/nodes/sb2/lxc/201/status/current",
                                  "--output-format", "json"])
    assert result.returncode == 0 and result.stderr == b""
    assert json.loads(result.stdout)["name"] == "CT201"


# --- push and pull ------------------------------------------------------------------------------

def test_pct_push_and_pull(sandbox, tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(100_000))
    pushed = on_host(sandbox, "sb2", "pct", "push", "201", str(source), "/root/pushed.bin",
                     "--perms", "640", "--user", "nobody", "--group", "65534")
    assert pushed.returncode == 0, pushed.stderr
    listing = on_host(sandbox, "sb2", "pct", "exec", "201", "--", "stat", "-c", "%a %u %g %s",
                      "/root/pushed.bin")
    assert listing.stdout == b"640 65534 65534 100000\n"
    target = tmp_path / "pulled.bin"
    pulled = on_host(sandbox, "sb2", "pct", "pull", "201", "/root/pushed.bin", str(target),
                     "--perms", "0600")
    assert pulled.returncode == 0, pulled.stderr
    assert target.read_bytes() == source.read_bytes()
    assert target.stat().st_mode & 0o777 == 0o600
    missing = on_host(sandbox, "sb2", "pct", "push", "201", str(tmp_path / "nope"), "/tmp/x")
    assert (missing.returncode, missing.stderr) == (
        255, f"failed to open {tmp_path / 'nope'} for reading\n".encode())


# --- the containers -------------------------------------------------------------------------------

def test_containers_look_like_small_debian_systems(sandbox):
    script = ("import os, socket, sys, venv, shutil\n"
              "print(socket.gethostname(), sys.executable, sys.version_info[:2],\n"
              "      bool(shutil.which('rg')), os.access('/etc', os.W_OK),\n"
              "      os.access('/dev/shm', os.W_OK), os.access('/root', os.W_OK))\n")
    result = on_host(sandbox, "sb1", "pct", "exec", "201", "--", "python3", "-",
                     input=script.encode())
    # pct's PATH (/sbin:/bin:/usr/sbin:/usr/bin) finds python3 in /bin (merged /usr)
    assert result.stdout == b"CT201 /bin/python3 (3, 11) True False True True\n", result.stderr


def test_two_hosts_have_separate_containers_with_the_same_vmid(sandbox):
    marker = f"only-on-sb1-{os.getpid()}"
    on_host(sandbox, "sb1", "pct", "exec", "200", "--", "sh", "-c", f"echo {marker} > /root/m")
    other = on_host(sandbox, "sb2", "pct", "exec", "200", "--", "cat", "/root/m")
    assert marker.encode() not in other.stdout
    assert on_host(sandbox, "sb1", "pct", "exec", "200", "--", "cat", "/root/m").stdout == (
        marker.encode() + b"\n")


def test_stop_and_start_container_helpers(sandbox):
    sandbox.stop_container("sb2", 201)
    try:
        assert on_host(sandbox, "sb2", "pct", "status", "201").stdout == b"status: stopped\n"
        assert not sandbox.container_running("sb2", 201)
    finally:
        sandbox.start_container("sb2", 201)
    assert on_host(sandbox, "sb2", "pct", "exec", "201", "--", "true").returncode == 0


def test_pct_start_and_stop(sandbox):
    assert on_host(sandbox, "sb2", "pct", "start", "202").returncode == 0
    try:
        assert on_host(sandbox, "sb2", "pct", "exec", "202", "--", "hostname").stdout == b"CT202\n"
    finally:
        assert on_host(sandbox, "sb2", "pct", "stop", "202").returncode == 0
    assert on_host(sandbox, "sb2", "pct", "status", "202").stdout == b"status: stopped\n"


# --- faults ---------------------------------------------------------------------------------------

def connects(address: str, timeout: float) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout):
            return True
    except OSError:
        return False


def test_link_down_cuts_the_host_off_and_link_up_restores_it(sandbox):
    address = sandbox.address("sb2")
    assert connects(address, 2)
    sandbox.link_down("sb2")
    try:
        assert not sandbox.link_is_up("sb2")
        assert not connects(address, 0.5)
    finally:
        sandbox.link_up("sb2")
    sb.wait_until_reachable(sandbox.layout)
    assert ssh(sandbox, "sb2", ["pct", "exec", "200", "--", "true"]).returncode == 0


def test_a_changed_host_key_is_refused_and_restored(sandbox):
    with sandbox.changed_host_key("sb1"):
        result = ssh(sandbox, "sb1", ["true"])
        assert result.returncode == 255
        assert b"REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr
    assert ssh(sandbox, "sb1", ["true"]).returncode == 0


def test_stopped_sshd_refuses_connections(sandbox):
    sandbox.stop_sshd("sb1")
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((sandbox.address("sb1"), 22), timeout=2).close()
    finally:
        sandbox.start_sshd("sb1")
    assert ssh(sandbox, "sb1", ["true"]).returncode == 0


def test_up_repairs_what_tests_broke(sandbox):
    sandbox.link_down("sb2")
    sandbox.stop_container("sb1", 200)
    sandbox.start_container("sb1", 202)
    sandbox.regenerate_host_key("sb2")
    sb.up()
    sb.wait_until_reachable(sandbox.layout)   # the repaired link takes a moment
    report = sb.status()
    assert report["healthy"], report
    assert ssh(sandbox, "sb2", ["pct", "exec", "200", "--", "true"]).returncode == 0


# --- the command line -------------------------------------------------------------------------------

def test_status_cli(sandbox):
    result = orch_sandbox_cli("status", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["healthy"] and [h["name"] for h in report["hosts"]] == ["sb1", "sb2"]
    text = orch_sandbox_cli("status")
    assert text.returncode == 0 and "CT 202  stopped  10.88.1.202" in text.stdout


def test_status_cli_says_what_is_missing_when_not_root(sandbox):
    if not os.path.exists("/usr/bin/setpriv"):
        pytest.skip("setpriv (util-linux) is needed to drop root for this test")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run([*nobody, sys.executable, "-c", "import orchestrator, click"],
                           cwd=REPO, capture_output=True)
    if probe.returncode != 0:
        pytest.skip("the user nobody cannot import orch from this checkout")
    result = orch_sandbox_cli("status", user=nobody)
    assert result.returncode == 2
    assert "not running as root" in result.stderr and "Traceback" not in result.stderr


def test_describe_missing_names_the_packages():
    text = sb.describe([sb.Missing("lxc-start not found", "lxc"),
                        sb.Missing("sshd not found", "openssh-server")])
    assert "lxc-start not found: apt-get install -y lxc" in text
    assert text.endswith("apt-get install -y lxc openssh-server")


# --- a separate sandbox for down/up --------------------------------------------------------------

def _in_another_sandbox(pid: int) -> bool:
    """A process of a second sandbox on this machine (its own ORCH_SANDBOX_CGROUP): not ours."""
    try:
        cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    return "/orch-sandbox" in cgroups and f"/{layout.CGROUP_ROOT}/" not in cgroups


def machine_traces(state_dir: Path, host: str = "sbt1") -> list[str]:
    """Everything of host `host` and state_dir that the machine still shows."""
    traces = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    switch = layout.switch_netns(host.rstrip("0123456789"))   # the one switch of its prefix
    traces += [f"netns {line}" for line in netns.splitlines()
               if f"orch-{host}" in line or line.split()[0] == switch]
    if Path(f"/sys/class/net/orch-{host}").exists():
        traces.append(f"link orch-{host}")
    for pid in system.all_pids():
        title = " ".join(system.cmdline(pid))
        if system.alive(pid) and (str(state_dir) in title or f"sandbox-host:{host}" in title) \
                and not _in_another_sandbox(pid):
            traces.append(f"process {pid}: {title}")
    for pid in system.pids_in_cgroup_tree(f"{layout.CGROUP_ROOT}/{host}"):
        traces.append(f"process {pid} in cgroup {layout.CGROUP_ROOT}/{host}")
    for hierarchy in system.cgroup_hierarchies():
        if (hierarchy / layout.CGROUP_ROOT / host).exists():
            traces.append(f"cgroup {hierarchy}/{layout.CGROUP_ROOT}/{host}")
    for mountinfo in Path("/proc").glob("[0-9]*/mountinfo"):
        try:
            if str(state_dir) in mountinfo.read_text():
                traces.append(f"mount of {state_dir} seen by {mountinfo.parent.name}")
        except OSError:
            pass
    return traces


@pytest.fixture
def separate_sandbox(sandbox, tmp_path):
    """A one-host sandbox of its own; `sandbox` only to skip (or fail) the same way."""
    state = tmp_path / "state"
    yield state
    sb.down(purge=True, state_dir=state, prefix="sbt")


def test_down_leaves_nothing_and_up_works_again(separate_sandbox):
    state = separate_sandbox
    handle = sb.up(1, 2, 1, prefix="sbt", state_dir=state)
    assert ssh(handle, "sbt1", ["pct", "exec", "200", "--", "hostname"]).stdout == b"CT200\n"
    assert machine_traces(state)
    known_hosts = handle.known_hosts.read_text()

    started = time.monotonic()
    assert sb.down(state_dir=state) == ["sbt1"]
    assert time.monotonic() - started < 10
    assert machine_traces(state) == []
    assert sorted(p.name for p in state.iterdir()) == [
        ".lock", "id_ed25519", "id_ed25519.pub", "keys", "logs"]

    again = sb.up(1, 2, 1, prefix="sbt", state_dir=state)
    assert again.known_hosts.read_text() == known_hosts, "host keys survive down"
    assert ssh(again, "sbt1", ["pct", "exec", "200", "--", "true"]).returncode == 0
    sb.down(purge=True, state_dir=state)
    assert not state.exists()
    assert machine_traces(state) == []


def test_up_and_down_clean_after_a_killed_run(separate_sandbox):
    state = separate_sandbox
    handle = sb.up(1, 2, 0, prefix="sbt", state_dir=state)
    # a run killed half-way: records gone, sshd killed, processes and namespace still there
    os.kill(hosts.sshd_pid(handle.paths, "sbt1"), 9)
    (state / "layout.json").unlink()
    again = sb.up(1, 2, 0, prefix="sbt", state_dir=state)
    assert sb.status(state)["healthy"]
    assert ssh(again, "sbt1", ["pct", "exec", "201", "--", "true"]).returncode == 0
    (state / "layout.json").unlink()
    (state / "hosts" / "sbt1" / "ready").unlink()
    assert sb.down(state_dir=state, prefix="sbt") == ["sbt1"]
    assert machine_traces(state) == []
