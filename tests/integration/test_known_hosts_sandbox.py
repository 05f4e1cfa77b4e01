"""known_hosts as OpenSSH writes it, against the sandbox's real sshd (docs/design/security.md, "The
controller"): @revoked keys refused, @cert-authority lines skipped with a reason, trust on
first use writing hashed lines into a hashed file and never "recording" into /dev/null."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from orchestrator.remote.paramiko_lib import paramiko
from tests.support.known_hosts import inventory_with_known_hosts

ORCH = [sys.executable, "-m", "orchestrator"]


def _key_lines(sandbox) -> dict[str, str]:
    """host name in the inventory -> 'keytype base64' of its host key."""
    lines = dict(line.split(None, 1) for line in sandbox.known_hosts.read_text().splitlines() if line)
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    return {name: lines[host["address"]] for name, host in data["hosts"].items()}


def _address(sandbox, name: str) -> str:
    return yaml.safe_load(sandbox.inventory_path.read_text())["hosts"][name]["address"]


def orch(inventory, *args):
    return subprocess.run([*ORCH, "-i", inventory, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ORCH_AGENT": "off"})


def test_revoked_key_is_refused_even_where_another_line_lists_it(sandbox, tmp_path):
    keys = _key_lines(sandbox)
    text = (f"{_address(sandbox, 'sb1')} {keys['sb1']}\n@revoked * {keys['sb1']}\n"
            f"{_address(sandbox, 'sb2')} {keys['sb2']}\n")
    inventory, _ = inventory_with_known_hosts(sandbox, tmp_path, text)
    for extra in ([], ["--trust-new-host-keys"]):
        out = orch(inventory, *extra, "exec", "sb1-200", "--", "true")
        assert out.returncode == 255 and "marks @revoked" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    assert orch(inventory, "exec", "sb2-200", "--", "true").returncode == 0   # not revoked


def test_cert_authority_lines_are_skipped_with_a_reason(sandbox, tmp_path):
    keys = _key_lines(sandbox)
    text = (f"@cert-authority *.example.org {keys['sb1']}\n"
            f"{_address(sandbox, 'sb2')} {keys['sb2']}\nbroken-line ssh-ed25519 %%%notbase64\n")
    inventory, _ = inventory_with_known_hosts(sandbox, tmp_path, text)
    assert orch(inventory, "exec", "sb2-200", "--", "true").returncode == 0
    out = orch(inventory, "exec", "sb1-200", "--", "true")   # known only through a CA: unknown
    assert out.returncode == 255 and "@cert-authority lines, which orch does not use" in out.stderr
    assert "Traceback" not in out.stderr


def test_trust_on_first_use_writes_hashed_into_a_hashed_file(sandbox, tmp_path):
    keys = _key_lines(sandbox)
    hashed_sb2 = paramiko.HostKeys.hash_host(_address(sandbox, "sb2"))
    inventory, known = inventory_with_known_hosts(sandbox, tmp_path, f"{hashed_sb2} {keys['sb2']}\n")
    assert orch(inventory, "exec", "sb1-200", "--", "true").returncode == 255   # unknown yet
    assert orch(inventory, "--trust-new-host-keys", "exec", "sb1-200", "--", "true").returncode == 0
    lines = open(known).read().splitlines()
    assert len(lines) == 2 and all(line.startswith("|1|") for line in lines)
    assert _address(sandbox, "sb1") not in open(known).read()
    assert orch(inventory, "exec", "sb1-200", "--", "true").returncode == 0     # now known


def test_trust_on_first_use_into_dev_null_trusts_nothing(sandbox, tmp_path):
    inventory, _ = inventory_with_known_hosts(sandbox, tmp_path, "")
    data = yaml.safe_load(open(inventory))
    for host in data["hosts"].values():
        host["known_hosts"] = "/dev/null"
    open(inventory, "w").write(yaml.safe_dump(data))
    for _ in range(2):   # each time: nothing was "recorded", nothing is accepted
        out = orch(inventory, "--trust-new-host-keys", "exec", "sb1-200", "--", "true")
        assert out.returncode == 255 and "/dev/null is not a regular file" in out.stderr, out.stderr


def test_trust_on_first_use_follows_hash_known_hosts_in_ssh_config(sandbox, tmp_path):
    from orchestrator.targets.fleet import Fleet
    inventory, known = inventory_with_known_hosts(sandbox, tmp_path, "")
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n    HashKnownHosts yes\n")
    with Fleet.from_path(inventory, trust_on_first_use=True, ssh_config_path=str(config)) as fleet:
        assert fleet.targets(["sb1-200"])[0].run(["true"]).exit_code == 0
    (line,) = open(known).read().splitlines()
    assert line.startswith("|1|") and _address(sandbox, "sb1") not in line
