"""Dead links, reset connections and containers stopped under a command, against the
sandbox (issue 25): every fault ends in a typed error within a stated bound, and the next
command works. (A frozen agent: tests/unit/agent/test_local.py.)

The host's packets are dropped with the sandbox's fault injection (nftables in sb2's own
namespace). The sandbox is shared: every test removes its fault in a `finally`, and keeps
the outage to a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import yaml

from orchestrator.ground.errors import ConnectionLost, ConnectionProblem
from orchestrator.targets.fleet import Fleet
from orchestrator.remote.session import SessionPool

ORCH = [sys.executable, "-m", "orchestrator"]
INTERVAL, COUNT_MAX = 1, 2
BOUND = INTERVAL * (COUNT_MAX + 1)    # silence after which a connection is dead (OpenSSH's rule)
SLACK = 3.0                           # a loaded 2-core machine, the process's exit


@pytest.fixture()
def quick_alive(sandbox, tmp_path):
    """The sandbox's inventory with sb2 declared dead after BOUND s of silence."""
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    data["hosts"]["sb2"].update(alive_interval=INTERVAL, alive_count_max=COUNT_MAX,
                                connect_timeout=3)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def orch(inventory, *args, timeout=120, env=None):
    return subprocess.run([*ORCH, "-i", str(inventory), *args], capture_output=True,
                          timeout=timeout, env=env)


def test_a_dead_link_under_a_warm_command_is_connection_lost_in_bounded_time(
        cli_path, sandbox, quick_alive):
    assert orch(quick_alive, "exec", "sb2-201", "--", "true").returncode == 0   # warm
    process = subprocess.Popen([*ORCH, "-i", str(quick_alive), "exec", "sb2-201", "--", "sh",
                                "-c", "echo started; exec sleep 60"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"started\n"
        sandbox.block_ssh("sb2")
        blocked = time.monotonic()
        _, stderr = process.communicate(timeout=BOUND + 30)
        elapsed = time.monotonic() - blocked
    finally:
        sandbox.unblock_ssh("sb2")
        if process.poll() is None:
            process.kill()
    text = stderr.decode()
    assert process.returncode == 255, text
    assert "broke while sh -c" in text and "answered none of 2 keepalive(s)" in text, text
    assert "Traceback" not in text and "Aborted" not in text
    assert elapsed < BOUND + SLACK, f"{elapsed:.1f} s to notice a dead link (bound {BOUND} s)"
    back = orch(quick_alive, "exec", "sb2-201", "--", "echo", "back")
    assert (back.returncode, back.stdout) == (0, b"back\n"), back.stderr


def test_the_api_drops_a_dead_connection_and_recovers(sandbox, quick_alive):
    with Fleet.from_path(str(quick_alive)) as fleet:
        ct = fleet.targets(["sb2-200"])[0]
        assert ct.run(["true"]).exit_code == 0
        # sent over a warm connection while the link is down: that connection is found dead
        # after BOUND s, one reconnect fails (connect_timeout 3 s): never the outage's length
        sandbox.block_ssh("sb2")
        try:
            started = time.monotonic()
            with pytest.raises(ConnectionProblem, match="sb2"):
                ct.run(["true"], timeout=None)
            assert time.monotonic() - started < BOUND + 3 + SLACK
        finally:
            sandbox.unblock_ssh("sb2")
        assert ct.run(["true"]).exit_code == 0
        warm = ct.host._connections[0]
        # a dead link under a running command
        blocker = threading.Timer(1.0, sandbox.block_ssh, args=("sb2",))
        started = time.monotonic()
        blocker.start()
        try:
            with pytest.raises(ConnectionLost, match="answered none of 2 keepalive"):
                ct.run(["sleep", "60"], timeout=None)
            assert time.monotonic() - started < 1 + BOUND + SLACK
        finally:
            blocker.join()
            sandbox.unblock_ssh("sb2")
        assert ct.run(["echo", "back"]).text == "back\n"
        assert warm not in ct.host._connections


def test_a_reset_warm_session_is_a_typed_error(sandbox):
    """The warm session's connection reset by the host (its port 22 answers with TCP resets):
    the next commands fail with a typed error, never paramiko's bare EOFError (which click
    prints as "Aborted!"), and work again once the host does."""
    with Fleet.from_path(str(sandbox.inventory_path), sessions=SessionPool()) as fleet:
        ct = fleet.targets(["sb2-200"])[0]
        assert ct.run(["true"]).exit_code == 0 and ct.via == "session"
        sandbox.block_ssh("sb2", "reject")
        try:
            for _ in range(3):
                with pytest.raises(ConnectionProblem, match="sb2"):
                    ct.run(["echo", "x"], timeout=30)
        finally:
            sandbox.unblock_ssh("sb2")
        assert ct.run(["echo", "back"]).text == "back\n"


def test_a_container_stopped_under_a_command_is_said_so_on_both_paths(cli_path, sandbox):
    """The direct path once exited 137 without a word, the agent said "connection broke ...
    may still be running": both now say the container stopped, exit 4."""
    sandbox.start_container("sb2", 202)
    try:
        assert orch(sandbox.inventory_path, "exec", "sb2-202", "--", "true").returncode == 0
        process = subprocess.Popen([*ORCH, "-i", str(sandbox.inventory_path), "exec", "sb2-202",
                                    "--", "sh", "-c", "echo started; exec sleep 60"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert process.stdout.readline() == b"started\n"
        sandbox.stop_container("sb2", 202)
        _, stderr = process.communicate(timeout=60)
    finally:
        sandbox.stop_container("sb2", 202)
    text = stderr.decode()
    assert process.returncode == 4, text
    assert "sb2-202 (CT 202 on host sb2) stopped while sh -c" in text and "Traceback" not in text
    assert "connection" not in text
