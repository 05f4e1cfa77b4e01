"""Whole-process latency of orch commands against the manual way, side by side in one run.

Every row is a new process, as a user at a shell pays it, timed from spawn to exit; the rows
take turns (round robin) so that a slow moment of the machine hits them all alike. Medians
and p95 in milliseconds.

    orch:     orch --version; orch exec CT -- true and grep-torch --def, each on the direct
              path (--no-agent: imports + SSH handshake) and with a warm agent (docs/guide/agent.md);
              the direct exec also without its early connection (docs/design/transport.md: no
              index of hosts to start it from, as on a first run)
    manual:   ssh HOST 'pct exec VMID -- true' and ... -- rg -n 'def ...' TREE, each with a new
              SSH connection and through an OpenSSH ControlMaster kept open (ControlPersist)

It runs against the sandbox as it is (`orch sandbox up` first; it never changes or restarts
it). For the search rows it gives CT 200 of sb1 a real torch 2.13 venv at
/root/cli-bench-venv (tests/integration/torch_seed.py), named in an inventory of its own,
and removes both at the end: the sandbox's own inventory and containers stay as the tests
expect them. `--exec-only` leaves the search rows (and the venv) out.

    python benchmarks/cli_latency.py [-n 25] [--exec-only] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import agent_env, healthy_bed, orch_executable  # noqa: E402
from tests.integration.torch_seed import remove_venv, seed_torch_venv  # noqa: E402

HOST, VMID, TARGET = "sb1", 200, "sb1-200"
NAME = "is_fx_symbolic_tracing"
VENV = "cli-bench-venv"
TREE = f"/root/{VENV}/lib/python3.11/site-packages/torch"


def rows(bed, orch: str, scratch: str, inventory_file: str, search: bool) -> dict[str, list[str]]:
    ssh = ["ssh", "-F", str(bed.ssh_config), HOST]
    master = ["ssh", "-F", str(bed.ssh_config), "-o", "ControlMaster=auto", "-o",
              f"ControlPath={scratch}/%C", "-o", "ControlPersist=120", HOST]
    true = shlex.join(["pct", "exec", str(VMID), "--", "true"])
    rg = shlex.join(["pct", "exec", str(VMID), "--", "rg", "-n", f"def {NAME}", TREE])
    inventory = ["-i", inventory_file]
    # a data folder that cannot exist (a file's child): no index of hosts is read or written
    no_index = ["env", f"ORCH_DATA_DIR={os.path.join(scratch, 'a-file', 'data')}"]
    table = {
        "ssh HOST 'pct exec VMID -- true' (manual)": [*ssh, true],
        "  the same through a ControlMaster (ControlPersist)": [*master, true],
        "orch exec CT -- true, direct (--no-agent)": [orch, "--no-agent", *inventory, "exec", TARGET, "--", "true"],
        "  the same without the early connection": [*no_index, orch, "--no-agent", *inventory, "exec", TARGET, "--", "true"],
        "orch exec CT -- true, warm agent": [orch, *inventory, "exec", TARGET, "--", "true"],
        "orch --version": [orch, "--version"],
    }
    if search:
        table.update({
            f"ssh HOST \"pct exec VMID -- rg -n 'def {NAME}' TREE\" (manual)": [*ssh, rg],
            "  the same search through a ControlMaster": [*master, rg],
            f"orch grep-torch --def {NAME}, direct": [orch, "--no-agent", *inventory, "grep-torch", "--def", NAME, "-t", TARGET],
            f"orch grep-torch --def {NAME}, warm agent": [orch, *inventory, "grep-torch", "--def", NAME, "-t", TARGET],
        })
    return table


def measure(commands: dict[str, list[str]], count: int, env: dict) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for round_number in range(count + 1):  # round 0 warms up: connections, agent, caches
        for name, argv in commands.items():
            started = time.perf_counter()
            done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
            elapsed = (time.perf_counter() - started) * 1000
            if done.returncode != 0:
                raise SystemExit(f"{name} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
            if round_number:
                samples[name].append(elapsed)
    return samples


def summary(samples: dict[str, list[float]]) -> list[dict]:
    table = []
    for name, values in samples.items():
        values = sorted(values)
        table.append({"way": name, "median_ms": round(statistics.median(values), 1),
                      "p95_ms": round(values[int(0.95 * (len(values) - 1))], 1), "runs": len(values)})
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--count", type=int, default=25)
    parser.add_argument("--exec-only", action="store_true", help="leave the search rows out")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bed = healthy_bed()
    orch = orch_executable()
    scratch = tempfile.mkdtemp(prefix="orch-cli-bench-")
    open(os.path.join(scratch, "a-file"), "w").close()
    env = agent_env(scratch)
    search = not args.exec_only
    try:
        inventory = yaml.safe_load(bed.inventory_path.read_text())
        if search:
            inventory["containers"][TARGET]["venv"] = seed_torch_venv(bed, HOST, VMID, VENV)
        inventory_file = os.path.join(scratch, "inventory.yaml")
        with open(inventory_file, "w") as out:
            yaml.safe_dump(inventory, out)
        table = summary(measure(rows(bed, orch, scratch, inventory_file, search), args.count, env))
    finally:
        if search:
            remove_venv(bed, HOST, VMID, VENV)
        subprocess.run([orch, "agent", "stop"], env=env, capture_output=True)
        subprocess.run(["ssh", "-F", str(bed.ssh_config), "-o", f"ControlPath={scratch}/%C",
                        "-O", "exit", HOST], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    width = max(len(row["way"]) for row in table)
    print(f"{'way':<{width}}  median ms  p95 ms   (n={args.count}, whole processes, interleaved)")
    for row in table:
        print(f"{row['way']:<{width}}  {row['median_ms']:>9.1f}  {row['p95_ms']:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
