"""orch's transport against the sandbox: real sshd, real LXC, emulated pct (issue 2)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from orchestrator.ground.errors import (CommandTimeout, ContainerNotRunning, HostKeyChanged,
                                 HostKeyUnknown, NoSuchContainer)
from orchestrator.targets.fleet import Fleet
from orchestrator.remote.session import ExecSession
from tests.support.known_hosts import inventory_with_known_hosts

ECHO = ["python3", "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
HOSTILE = ["", " ", "'", '"', "''", '""', "$(touch /tmp/pwned)", "`touch /tmp/pwned`", "; true",
           "a && b", "a\nb", "\ttab", "*", "~", "-n", "--", "--help", "ünïcødé ✓ 日本", "\\",
           "${HOME}", "|", ">x", "%s%%", "!"]
ARG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=30)


def orch(sandbox, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(sandbox.inventory_path), *args],
                          capture_output=True, text=True, timeout=timeout)


def no_pwned(ct):
    assert ct.run(["test", "-e", "/tmp/pwned"]).exit_code == 1, "a hostile string was executed"


def test_hostile_argv_round_trips_api_session_and_cli(cli_path, sandbox, ct):
    assert json.loads(ct.run(ECHO + HOSTILE, check=True).text) == HOSTILE
    session = ExecSession(ct)
    assert json.loads(session.run(ECHO + HOSTILE, check=True).text) == HOSTILE
    session.close()
    out = orch(sandbox, "exec", "sb1-200", "--", *ECHO, *HOSTILE)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == HOSTILE
    no_pwned(ct)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(ARG, max_size=6))
def test_any_argv_round_trips_through_the_api(ct, args):
    assert json.loads(ct.run(ECHO + args, check=True).text) == args


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(ARG, min_size=1, max_size=4))
def test_any_argv_round_trips_through_the_cli(cli_path, sandbox, args):
    out = orch(sandbox, "exec", "sb2-201", "--", *ECHO, *args)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == args


def test_every_exit_code_propagates(cli_path, sandbox, ct):
    codes = {code: ct.run(["sh", "-c", f"exit {code}"]).exit_code for code in range(256)}
    assert codes == {code: code for code in range(256)}
    for code in (0, 3, 254):
        assert orch(sandbox, "exec", "sb1-200", "--", "sh", "-c", f"exit {code}").returncode == code


def test_10mb_stdout_and_10mb_stderr_at_once(ct):
    size = 10 * 1024 * 1024
    script = ("import os, sys\nblock = bytes(range(256)) * 4096\n"
              f"for _ in range({size} // len(block)):\n"
              "    sys.stdout.buffer.write(block); sys.stderr.buffer.write(block[::-1])\n")
    result = ct.run(["python3", "-c", script], timeout=120, check=True)
    block = bytes(range(256)) * 4096
    assert hashlib.sha256(result.stdout).digest() == hashlib.sha256(block * (size // len(block))).digest()
    assert result.stderr == block[::-1] * (size // len(block))


def test_stdin_and_put_get(ct):
    data = bytes(range(256)) * 4000
    assert ct.run(["sha256sum"], stdin=data).text.split()[0] == hashlib.sha256(data).hexdigest()
    path = "/tmp/orch test 'dir'/$file"
    ct.run(["mkdir", "-p", "/tmp/orch test 'dir'"], check=True)
    ct.put(path, data)
    assert ct.get(path) == data


def test_two_containers_on_two_hosts_with_the_same_vmid(fleet):
    one, two = fleet.targets(["sb1-200", "sb2-200"])
    assert one.run(["hostname"]).text != two.run(["hostname"]).text or \
        one.host.name != two.host.name


def test_stopped_container_carries_pct_text(sandbox, fleet):
    stopped = fleet.targets(["sb1-202"])[0]
    with pytest.raises(ContainerNotRunning, match="container '202' not running"):
        stopped.run(["true"])
    out = orch(sandbox, "exec", "sb1-202", "--", "true")
    assert out.returncode == 4 and "not running" in out.stderr and "Traceback" not in out.stderr


def test_unknown_vmid_carries_pct_text(sandbox, fleet):
    with pytest.raises(NoSuchContainer, match=r"Configuration file 'nodes/sb1/lxc/999.conf' does not exist"):
        fleet.targets(["sb1:999"])[0].run(["true"])
    out = orch(sandbox, "exec", "sb1:999", "--", "true")
    assert out.returncode == 4 and "does not exist" in out.stderr


def test_unknown_host_key_is_refused_unless_trusted_explicitly(cli_path, sandbox, tmp_path):
    inventory, _ = inventory_with_known_hosts(sandbox, tmp_path, "")
    with Fleet.from_path(inventory) as fleet:
        with pytest.raises(HostKeyUnknown, match="not in .*known_hosts"):
            fleet.targets(["sb1-200"])[0].run(["true"])
    out = subprocess.run([sys.executable, "-m", "orchestrator", "-i", inventory, "exec", "sb1-200", "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 255 and "--trust-new-host-keys" in out.stderr
    with Fleet.from_path(inventory, trust_on_first_use=True) as fleet:
        assert fleet.targets(["sb1-200"])[0].run(["true"]).exit_code == 0
    assert "ssh-ed25519" in (tmp_path / "known_hosts").read_text()
    with Fleet.from_path(inventory) as fleet:  # now known: no trust option needed
        assert fleet.targets(["sb1-200"])[0].run(["true"]).exit_code == 0


def test_changed_host_key_is_always_refused(sandbox, tmp_path):
    inventory, _ = inventory_with_known_hosts(sandbox, tmp_path, sandbox.known_hosts.read_text())
    with sandbox.changed_host_key("sb2"):
        for trust in (False, True):
            with Fleet.from_path(inventory, trust_on_first_use=trust) as fleet:
                with pytest.raises(HostKeyChanged, match="DIFFERENT host key"):
                    fleet.targets(["sb2-200"])[0].run(["true"])
    with Fleet.from_path(inventory) as fleet:
        assert fleet.targets(["sb2-200"])[0].run(["true"]).exit_code == 0


def test_link_down_gives_a_timeout_then_recovers(sandbox):
    with Fleet.from_path(str(sandbox.inventory_path)) as fleet:
        ct = fleet.targets(["sb2-201"])[0]
        assert ct.run(["true"]).exit_code == 0
        timer = threading.Timer(0.5, sandbox.link_down, args=("sb2",))
        timer.start()
        started = time.monotonic()
        try:
            with pytest.raises(CommandTimeout):
                ct.run(["sleep", "20"], timeout=3)
            elapsed = time.monotonic() - started
        finally:
            timer.join()
            sandbox.link_up("sb2")
        assert elapsed < 3 + 1.5, f"timeout took {elapsed:.1f} s for a 3 s limit"
        assert ct.run(["echo", "back"], timeout=30).text == "back\n"


def test_proxmox_api_over_ssh(cli_path, sandbox):
    listing = json.loads(orch(sandbox, "ct", "list", "--json").stdout)
    states = {(row["host"], row["vmid"]): row["status"] for row in listing}
    assert states[("sb1", 200)] == "running" and states[("sb2", 202)] == "stopped"
    assert json.loads(orch(sandbox, "ct", "status", "sb2-201", "--json").stdout)["status"] == "running"
    try:
        out = orch(sandbox, "ct", "start", "sb2-202")
        assert out.returncode == 0, out.stderr
        assert json.loads(orch(sandbox, "ct", "status", "sb2-202", "--json").stdout)["status"] == "running"
    finally:
        sandbox.stop_container("sb2", 202)


def test_inventory_check_runs_all_hosts(cli_path, sandbox):
    out = orch(sandbox, "inventory", "check", "--json")
    rows = {row["target"]: row for row in json.loads(out.stdout)}
    assert out.returncode == 1  # the stopped containers are reported
    assert rows["sb1-200"]["reachable"] and rows["sb1-200"]["python_version"].startswith("3.")
    assert rows["sb1-202"]["ok"] is False and "not running" in rows["sb1-202"]["error"]


def test_proxyjump_through_a_host(sandbox, tmp_path):
    # sb1 is the jump host; through it orch reaches sb1's own sshd on its loopback, so the
    # second hop really is a direct-tcpip channel opened by the jump host's sshd.
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    sb1 = data["hosts"]["sb1"]
    key = next(line.split(None, 1)[1] for line in sandbox.known_hosts.read_text().splitlines()
               if line.startswith(sb1["address"] + " "))
    known = tmp_path / "known_hosts"
    known.write_text(sandbox.known_hosts.read_text() + f"::1 {key}\n")
    data["hosts"]["sb1"]["known_hosts"] = str(known)
    data["hosts"]["inner"] = {**sb1, "address": "::1", "jump": "sb1", "known_hosts": str(known)}
    data["containers"]["inner-200"] = {"host": "inner", "vmid": 200}
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(data))
    with Fleet.from_path(str(inventory)) as fleet:
        ct = fleet.targets(["inner-200"])[0]
        assert json.loads(ct.run(ECHO + HOSTILE, check=True).text) == HOSTILE
        assert ct.host._jump_host is not None and ct.host._jump_host.name == "sb1"
