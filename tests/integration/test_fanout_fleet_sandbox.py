"""Fan-out at fleet scale against stock sshds (MaxSessions 10): a sandbox of its own, 8 hosts
x 4 running containers. exec over all 32 succeeds, one SSH connection per host; three
commands in each container at once (12 channels a host) take a second connection there,
never a refusal; Ctrl-C during a fan-out ends it at once and leaves no command behind.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.targets.fleet import Fleet, fan_out

HOSTS, PER_HOST = 8, 4


@pytest.fixture(scope="module")
def fleet_bed(sandbox, tmp_path_factory):
    """`sandbox` first: it checks the machine can run one (else skip or, in CI, fail)."""
    import orch_sandbox as sb

    state = tmp_path_factory.mktemp("fleet-sandbox")
    handle = sb.up(hosts_count=HOSTS, containers_count=PER_HOST, stopped=0, prefix="fleet",
                   state_dir=state)
    try:
        yield handle
    finally:
        sb.down(state_dir=state)


def orch(handle, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i",
                           str(handle.inventory_path), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_exec_over_8_hosts_x_4_containers(fleet_bed):
    out = orch(fleet_bed, "exec", "--json", "running", "--", "hostname")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "refused" not in out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == HOSTS * PER_HOST
    assert all(row["exit_code"] == 0 and row["stdout"] == f"CT{row['target'].split('-')[1]}\n"
               for row in rows), rows


def test_one_connection_per_host_and_maxsessions_kept(fleet_bed):
    with Fleet.from_path(str(fleet_bed.inventory_path)) as fleet:
        targets = fleet.targets(["running"])
        once = fan_out(targets, lambda target: target.run(["true"]))
        assert once.ok, once.failed
        usage = fleet.open_hosts()
        assert sorted(usage) == [f"fleet{n}" for n in range(1, HOSTS + 1)]
        assert {name: host["connections"] for name, host in usage.items()} == {
            name: 1 for name in usage}
        # 12 commands at once on each host: more than sshd's 10 sessions per connection
        thrice = fan_out(targets * 3, lambda target: target.run(["sleep", "2"]), jobs=96)
        assert thrice.ok, thrice.failed
        assert all(host["connections"] == 2 for host in fleet.open_hosts().values())


def test_ctrl_c_during_a_fan_out_stops_it_at_once(fleet_bed):
    marker = "61.4242"   # a sleep no one else runs
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", "--no-agent", "-i",
                                str(fleet_bed.inventory_path), "exec", "running", "--",
                                "sleep", marker], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while _sleeps(marker) < HOSTS * PER_HOST and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sleeps(marker) == HOSTS * PER_HOST
    process.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - interrupted < 10
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    deadline = time.monotonic() + 10
    while _sleeps(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sleeps(marker) == 0


def _sleeps(marker: str) -> int:
    """How many `sleep MARKER` run on this machine (every sandbox container's included)."""
    out = subprocess.run(["pgrep", "-x", "-f", f"sleep {marker}"], capture_output=True, text=True)
    return len(out.stdout.split())
