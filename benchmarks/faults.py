"""Time to a clear error under faults: a dead link under a warm `orch exec`, a command sent
during an outage, a frozen (SIGSTOPped) agent, and `orch agent stop` with a command running.

Every row is a new `orch` process timed from the moment of the fault (or from its spawn when
the fault came first) to its exit, with its exit code; medians and max of -n runs, seconds.
The link is cut with the sandbox's fault injection (nftables drops sb2's port 22, in sb2's
own namespace) and restored in a `finally`: the sandbox is shared.

    python benchmarks/faults.py [-n 3] [--json]

It runs against the sandbox (`orch sandbox up` first), with an inventory of its own beside
the sandbox's: sb2 with the default dead-link settings (5 s x 3) and a quick one (1 s x 2).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orch_sandbox as sandboxes  # noqa: E402
from orchestrator.agent.client import ACCEPT_WAIT_S, USER_TIMEOUT_GRACE_S  # noqa: E402
from tests.support.agents import agent_pids, stop_agents  # noqa: E402

HOST, TARGET = "sb2", "sb2-201"
ORCH = [sys.executable, "-m", "orchestrator"]


def inventories(bed, folder: str) -> dict[str, str]:
    """name -> inventory file: the default dead-link bound (5 s x 3) and a quick one."""
    data = yaml.safe_load(bed.inventory_path.read_text())
    made = {}
    for name, alive in (("default 5 s x 3", {}), ("1 s x 2", {"alive_interval": 1,
                                                                  "alive_count_max": 2})):
        copy = json.loads(json.dumps(data))
        copy["hosts"][HOST].update(alive, connect_timeout=3)
        path = os.path.join(folder, f"inventory-{len(made)}.yaml")
        with open(path, "w") as handle:
            yaml.safe_dump(copy, handle)
        made[name] = path
    return made


def orch(env, inventory, *args, **kwargs):
    return subprocess.Popen([*ORCH, "-i", inventory, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)


def warm_up(env, inventory) -> None:
    """One quick command first, so the fault meets a connection (and agent) already made."""
    subprocess.run([*ORCH, "-i", inventory, "exec", TARGET, "--", "true"], env=env, check=True,
                   capture_output=True)


def exit_while_ssh_is_blocked(bed, start) -> tuple[float, int]:
    """Seconds from blocking SSH to the host until the process start() gives exits, and its
    exit code; SSH is unblocked again however it ends."""
    bed.block_ssh(HOST)
    try:
        started = time.monotonic()
        process = start()
        process.communicate(timeout=180)
        return time.monotonic() - started, process.returncode
    finally:
        bed.unblock_ssh(HOST)


def dead_link_under_a_command(bed, env, inventory) -> tuple[float, int]:
    warm_up(env, inventory)
    process = orch(env, inventory, "exec", TARGET, "--", "sh", "-c", "echo started; exec sleep 120")
    process.stdout.readline()
    return exit_while_ssh_is_blocked(bed, lambda: process)


def command_during_an_outage(bed, env, inventory) -> tuple[float, int]:
    warm_up(env, inventory)
    return exit_while_ssh_is_blocked(bed, lambda: orch(env, inventory, "exec", TARGET, "--", "true"))


def frozen_agent_quick_command(bed, env, inventory) -> tuple[float, int]:
    warm_up(env, inventory)
    (pid,) = agent_pids(env["ORCH_AGENT_DIR"])
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        done = subprocess.run([*ORCH, "-i", inventory, "exec", TARGET, "--", "true"],
                              env={**env, "ORCH_AGENT": "on"}, capture_output=True, timeout=180)
        return time.monotonic() - started, done.returncode
    finally:
        os.kill(pid, signal.SIGCONT)


def frozen_agent_after_accepting(bed, env, inventory) -> tuple[float, int]:
    """From the spawn of `exec --timeout 2` (the agent frozen 1 s later) to its exit."""
    with open(os.devnull, "w") as null:   # the frozen agent holds the client's fds
        started = time.monotonic()
        process = subprocess.Popen([*ORCH, "-i", inventory, "exec", "--timeout", "2", TARGET,
                                    "--", "sleep", "60"], env=env, stdout=null, stderr=null)
        time.sleep(1.0)
        (pid,) = agent_pids(env["ORCH_AGENT_DIR"])
        os.kill(pid, signal.SIGSTOP)
        try:
            process.wait(timeout=180)
            return time.monotonic() - started, process.returncode
        finally:
            os.kill(pid, signal.SIGCONT)


def quick_command_while_stopping(bed, env, inventory) -> tuple[float, int]:
    long = orch(env, inventory, "exec", TARGET, "--", "sh", "-c", "echo started; exec sleep 5")
    long.stdout.readline()
    subprocess.run([*ORCH, "agent", "stop"], env=env, capture_output=True, check=True)
    started = time.monotonic()
    done = subprocess.run([*ORCH, "-i", inventory, "exec", TARGET, "--", "true"],
                          env={**env, "ORCH_AGENT": "on"}, capture_output=True, timeout=180)
    elapsed = time.monotonic() - started
    long.communicate(timeout=60)
    return elapsed, done.returncode


def measure(bed, files: dict[str, str], runs: int) -> dict[str, dict]:
    quick, default = files["1 s x 2"], files["default 5 s x 3"]
    cases = [
        ("dead link under a warm orch exec, agent, 5 s x 3", dead_link_under_a_command, default, "require"),
        ("dead link under orch exec, direct, 5 s x 3", dead_link_under_a_command, default, "off"),
        ("dead link under a warm orch exec, agent, 1 s x 2", dead_link_under_a_command, quick, "require"),
        ("command sent during an outage, agent, 1 s x 2, connect_timeout 3", command_during_an_outage,
         quick, "require"),
        (f"quick command, agent SIGSTOPped (falls back after {ACCEPT_WAIT_S:g} s)",
         frozen_agent_quick_command, quick, "require"),
        (f"exec --timeout 2, agent SIGSTOPped after accepting (+{USER_TIMEOUT_GRACE_S:g} s grace)",
         frozen_agent_after_accepting, quick, "require"),
        ("quick command while `orch agent stop` waits for a running one",
         quick_command_while_stopping, quick, "require"),
    ]
    table = {}
    for name, case, inventory, mode in cases:
        seconds, codes = [], []
        for _ in range(runs):
            folder = tempfile.mkdtemp(prefix="orch-fault-bench-agent-")
            env = {**os.environ, "ORCH_AGENT": mode, "ORCH_AGENT_DIR": folder}
            try:
                elapsed, code = case(bed, env, inventory)
            finally:
                stop_agents(folder)
            seconds.append(elapsed)
            codes.append(code)
        table[name] = {"median_s": round(statistics.median(seconds), 2),
                       "max_s": round(max(seconds), 2), "exit_codes": sorted(set(codes)),
                       "n": runs}
        print(f"{name}: {table[name]}", file=sys.stderr)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=3, help="runs of each row (default 3)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    bed = sandboxes.up()
    with tempfile.TemporaryDirectory(prefix="orch-fault-bench-") as folder:
        table = measure(bed, inventories(bed, folder), args.n)
    if args.json:
        print(json.dumps(table, indent=2))
        return
    width = max(map(len, table))
    print(f"{'case':<{width}}  median s  max s  exit")
    for name, row in table.items():
        print(f"{name:<{width}}  {row['median_s']:>8.2f}  {row['max_s']:>5.2f}  "
              f"{','.join(map(str, row['exit_codes']))}")


if __name__ == "__main__":
    main()
