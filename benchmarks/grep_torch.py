"""Searching the installed torch of containers for `def is_fx_symbolic_tracing`: orch
against the manual way and against ripgrep run directly on the same tree, orch's two
engines (ripgrep in the container, or the stdlib engine where it has none), then 8
containers at once against one. Medians of repeated runs, side by side in one run.

It stands up its own sandbox (prefix "bg", 2 hosts x 4 containers, in a temporary state
directory) and gives every container a real torch 2.13 venv, then takes it down.

    sudo .venv/bin/python benchmarks/grep_torch.py [-n 15] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import print_table, samples_ms, summary  # noqa: E402
import orch_sandbox as sandboxes  # noqa: E402
from orchestrator.remote import payload_api  # noqa: E402
from orchestrator.targets.fleet import Fleet, each_concurrently  # noqa: E402
from tests.integration.torch_seed import container_root, seed_torch_venv  # noqa: E402

PATTERN = "def is_fx_symbolic_tracing"
SITE = "lib/python3.11/site-packages"


def median_ms(call, count: int) -> tuple[float, float]:
    row = summary(samples_ms(call, count))
    return row["median_ms"], row["p95_ms"]


def search(target, engine="auto", expected="rg"):
    result = payload_api.search(target, PATTERN, fixed=True, engine=engine)
    assert result["matches"], f"no hit in {target.name}"
    assert result["engine"] == expected, result["engine"]
    return result


@contextlib.contextmanager
def sandbox_state():
    """A temporary state directory for the benchmark's own sandbox, removed however the
    benchmark ends (it used to stay behind in /tmp after every run)."""
    state = tempfile.mkdtemp(prefix="orch-bench-")
    try:
        yield state
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--count", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with sandbox_state() as state:
        bed = sandboxes.up(hosts_count=2, containers_count=4, stopped=0, prefix="bg", state_dir=state)
        try:
            if not sandboxes.status(state_dir=state).get("healthy"):
                raise SystemExit("the benchmark's sandbox did not come up healthy; see `orch sandbox status`")
            rows = run(bed, args.count)
        finally:
            sandboxes.down(state_dir=state)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(["way", "median ms", "p95 ms", "ratio"],
                    [[row["way"], f"{row['median_ms']:.0f}", f"{row['p95_ms']:.0f}", row["ratio"]]
                     for row in rows], left=1)
        print(f"\n{args.count} runs each, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores")
    return 0


def run(bed, count: int) -> list[dict]:
    containers = [(host, vmid) for host in bed.host_names for vmid in (200, 201, 202, 203)]
    for host, vmid in containers:
        seed_torch_venv(bed, host, vmid)
    tree = os.path.join(container_root(bed, "bg1", 200), "venv", SITE, "torch")
    manual = ["ssh", "-F", str(bed.ssh_config), "bg1",
              shlex.join(["pct", "exec", "200", "--", "grep", "-rn", PATTERN, f"/root/venv/{SITE}/torch"])]
    with Fleet.from_path(str(bed.inventory_path)) as fleet:
        one = fleet.targets(["bg1-200"])[0]
        eight = fleet.targets([f"{h}-{v}" for h, v in containers])
        timings = {
            "manual: ssh + pct exec + grep -rn (new ssh each time)":
                median_ms(lambda: subprocess.run(manual, check=True, capture_output=True), count),
            "rg run directly on the same tree (no remote at all)":
                median_ms(lambda: subprocess.run(["rg", "-n", "-F", PATTERN, tree], check=True,
                                                 capture_output=True), count),
            "one orch command round trip (`true`)": median_ms(lambda: one.run(["true"]), count),
            "orch grep-torch, 1 container (API)": median_ms(lambda: search(one), count),
            "orch grep-torch, 1 container, stdlib engine (a container without rg)":
                median_ms(lambda: search(one, "python", "python"), count),
            "orch grep-torch, 8 containers at once (API)":
                median_ms(lambda: _all_ok(each_concurrently(eight, search)), count),
        }
    names = list(timings)
    manual_ms, rg_ms, trip_ms, one_ms, stdlib_ms, eight_ms = (timings[n][0] for n in names)
    ratios = [f"{manual_ms / one_ms:.1f}x slower than orch", "",
              "", f"{one_ms / (rg_ms + trip_ms):.2f}x (rg + round trip)",
              f"{stdlib_ms / one_ms:.2f}x (ripgrep engine); manual is "
              f"{manual_ms / stdlib_ms:.1f}x slower",
              f"{eight_ms / one_ms:.2f}x (1 container)"]
    return [{"way": n, "median_ms": timings[n][0], "p95_ms": timings[n][1], "ratio": r}
            for n, r in zip(names, ratios)]


def _all_ok(results):
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise errors[0]
    return results


if __name__ == "__main__":
    sys.exit(main())
