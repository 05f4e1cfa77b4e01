"""Fan-out at fleet scale: `orch inventory check` and `orch exec GROUP -- true` over 1, 2, 4,
8, 16 and 32 containers of the sandbox, whole processes as a user runs them, side by side
in one run.

Every row is a new `orch` process, timed from spawn to exit, on the direct path
(`--no-agent`: imports, one SSH handshake per host, a channel per container) and with a
warm agent (docs/guide/agent.md); the rows take turns (round robin) so that a slow moment
of the machine hits them all alike. The containers of a size are spread over the hosts
round robin (8 containers: one on each of 8 hosts; 32: four on each), as a fleet's are.
Per row: the median and p95 wall time, the growth against one container, and the CPU
time the orch process used, the warm agent's and the sandbox's (sshd, `pct exec`, the
containers' processes: its cgroup's cpuacct), medians: where the time goes. A run stops
at any exit code but 0, and at any failed target (a refused channel included).

It runs against the sandbox as it is and changes nothing there; the biggest size is what
it holds (`orch sandbox up --hosts 8 --containers 4 --stopped 0` first for 32). It writes
an inventory of its own (the sandbox's, with a group per size and no venv, so that
`inventory check` passes) in a temporary folder, removed at the end.

    python benchmarks/fanout.py [-n 9] [--sizes 1,2,4,8,16,32] [--baseline ORCH] [--json]

--baseline names another orch (an older checkout's .venv/bin/orch): its rows are measured
in the same rounds, with a warm agent of its own, for a before/after side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orch_sandbox import layout  # noqa: E402

from benchmarks.timing import agent_env, healthy_bed, orch_executable, percentile, print_table  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32)
COMMANDS = {"inventory check": lambda group: ["inventory", "check", "-t", group, "--json"],
            "exec -- true": lambda group: ["exec", "--json", group, "--", "true"]}
PATHS = {"direct": ["--no-agent"], "warm agent": []}


def ways(orch: str, env: dict, baseline: Optional[str], scratch: str) -> dict[str, tuple]:
    """Each row's way: path name -> (orch executable, its path's options, environment);
    with --baseline, the same two paths of another orch (its own warm agent), side by side."""
    table = {path: (orch, options, env) for path, options in PATHS.items()}
    if baseline:
        other = {**env, "ORCH_AGENT_DIR": os.path.join(scratch, "baseline-agent")}
        table.update({f"baseline {path}": (baseline, options, other)
                      for path, options in PATHS.items()})
    return table


def spread(inventory: dict, count: int) -> list[str]:
    """count running containers, one host after another (round robin over the hosts)."""
    by_host: dict[str, list[str]] = {}
    for name, spec in inventory["containers"].items():
        if name in inventory["groups"].get("running", []):
            by_host.setdefault(spec["host"], []).append(name)
    chosen: list[str] = []
    for depth in range(max(map(len, by_host.values()), default=0)):
        chosen += [names[depth] for names in by_host.values() if depth < len(names)]
    return chosen[:count]


def fan_inventory(inventory: dict, sizes: list[int]) -> tuple[dict, list[int]]:
    """The sandbox's inventory with a group fan-N per size it holds, and those sizes."""
    held = len(spread(inventory, 1 << 30))
    sizes = [size for size in sizes if size <= held]
    for spec in inventory["containers"].values():
        spec.pop("venv", None)   # the sandbox's containers have none: check would fail
    for size in sizes:
        inventory["groups"][f"fan-{size}"] = spread(inventory, size)
    return inventory, sizes


def sandbox_cpu_s() -> float:
    """CPU seconds used so far by everything of the sandbox (its cgroup), 0 where unreadable."""
    try:
        with open(f"/sys/fs/cgroup/cpuacct/{layout.CGROUP_ROOT}/cpuacct.usage") as usage:
            return int(usage.read()) / 1e9
    except (OSError, ValueError):
        return 0.0


def process_cpu_s(pid: Optional[int]) -> float:
    """CPU seconds (user + sys) process pid used so far (the warm agent), 0 without one."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_pid(orch: str, env: dict) -> Optional[int]:
    done = subprocess.run([orch, "agent", "status", "--json"], env=env, capture_output=True)
    try:
        return int(json.loads(done.stdout)["pid"])
    except (ValueError, KeyError, TypeError):
        return None


def run_once(argv: list[str], env: dict, agent: Optional[int]) -> dict:
    """One whole process: wall s, its own CPU s (user + sys), the warm agent's and the
    sandbox's CPU s meanwhile."""
    before, cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN), sandbox_cpu_s()
    agent_before = process_cpu_s(agent)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-800:]}")
    rows = json.loads(done.stdout)
    failed = [row for row in rows if row.get("error") or row.get("exit_code") not in (0, None)
              or row.get("ok") is False]
    if failed:
        raise SystemExit(f"{' '.join(argv)}: {len(failed)} target(s) failed: {failed[:3]}")
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "agent_cpu": process_cpu_s(agent) - agent_before,
            "sandbox_cpu": sandbox_cpu_s() - cpu_before, "targets": len(rows)}


def measure(table: dict[str, tuple], inventory_file: str, sizes: list[int],
            count: int) -> list[dict]:
    cases = [(command, path, size) for command in COMMANDS for path in table for size in sizes]
    samples: dict[tuple, list[dict]] = {case: [] for case in cases}
    agents: dict[str, Optional[int]] = {}
    for round_number in range(count + 1):   # round 0 warms up: the agents, their connections
        for case in cases:
            command, path, size = case
            orch, options, env = table[path]
            argv = [orch, *options, "-i", inventory_file, *COMMANDS[command](f"fan-{size}")]
            sample = run_once(argv, env, agents.get(path) if not options else None)
            assert sample["targets"] == size, (argv, sample)
            if round_number:
                samples[case].append(sample)
        for path, (orch, options, env) in table.items():
            if not options:
                agents[path] = agents.get(path) or agent_pid(orch, env)
    return [row_of(case, values, samples) for case, values in samples.items()]


def row_of(case: tuple, values: list[dict], samples: dict) -> dict:
    command, path, size = case
    walls = [v["wall"] * 1000 for v in values]
    one = statistics.median(v["wall"] * 1000 for v in samples[(command, path, 1)]) \
        if (command, path, 1) in samples else None
    median = statistics.median(walls)
    return {"command": command, "path": path, "containers": size,
            "median_ms": round(median, 1), "p95_ms": round(percentile(walls, 0.95), 1),
            "x_one": round(median / one, 2) if one else None,
            "cpu_ms": round(statistics.median(v["cpu"] for v in values) * 1000),
            "agent_cpu_ms": round(statistics.median(v["agent_cpu"] for v in values) * 1000),
            "sandbox_cpu_ms": round(statistics.median(v["sandbox_cpu"] for v in values) * 1000),
            "runs": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--count", type=int, default=9)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--baseline", metavar="ORCH",
                        help="another orch executable (an older checkout's) measured alongside")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bed = healthy_bed()
    orch = orch_executable()
    scratch = tempfile.mkdtemp(prefix="orch-fanout-bench-")
    env = agent_env(scratch)
    try:
        inventory, sizes = fan_inventory(yaml.safe_load(bed.inventory_path.read_text()),
                                         [int(size) for size in args.sizes.split(",")])
        inventory_file = os.path.join(scratch, "inventory.yaml")
        with open(inventory_file, "w") as out:
            yaml.safe_dump(inventory, out)
        load = os.getloadavg()
        compared = ways(orch, env, args.baseline, scratch)
        table = measure(compared, inventory_file, sizes, args.count)
    finally:
        for executable, options, environment in ways(orch, env, args.baseline, scratch).values():
            if not options:
                subprocess.run([executable, "agent", "stop"], env=environment, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    hosts = len({spec["host"] for spec in inventory["containers"].values()})
    if args.json:
        print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                          "load_average": load, "hosts": hosts, "rows": table}, indent=2))
        return 0
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average at the start "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {hosts} hosts, n={args.count} "
          "(whole processes, interleaved; medians)\n")
    print_table(["command", "path", "containers", "median ms", "p95 ms", "x one", "orch CPU ms",
                 "agent CPU ms", "sandbox CPU ms"],
                [[r["command"], r["path"], r["containers"], f"{r['median_ms']:.0f}",
                  f"{r['p95_ms']:.0f}", f"{r['x_one']:.2f}", r["cpu_ms"],
                  r["agent_cpu_ms"] if r["path"].endswith("warm agent") else "-",
                  r["sandbox_cpu_ms"]]
                 for r in table], left=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
