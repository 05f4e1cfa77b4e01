"""Peak memory of `orch exec ... > file` against the manual way (`ssh HOST pct exec ...`),
for large outputs: orch streams, so its peak RSS must not grow with the output.

    python benchmarks/exec_stream_memory.py                 # against the sandbox
    python benchmarks/exec_stream_memory.py --sizes 50 200 --runs 3 --json

Each run writes SIZE MB from the container's /dev/zero to a file through each client and
reads the client's peak RSS from wait4(2) (ru_maxrss). Prints the median per size.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

from orchestrator.config.inventory import load_inventory


def peak_rss_mb(argv: list[str], out_path: str) -> tuple[float, float, int]:
    """Run argv with stdout into out_path; (peak RSS MB, seconds, bytes written)."""
    started = time.perf_counter()
    with open(out_path, "wb") as sink, open(os.devnull, "rb") as nothing:
        pid = os.fork()
        if pid == 0:
            os.dup2(nothing.fileno(), 0)
            os.dup2(sink.fileno(), 1)
            os.execvp(argv[0], argv)
        _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{shlex.join(argv)} failed with {os.waitstatus_to_exitcode(status)}")
    return usage.ru_maxrss / 1024, seconds, os.path.getsize(out_path)


def clients(inventory_path: str, target: str, ssh_config: str, size_mb: int) -> dict:
    inventory = load_inventory(inventory_path)
    spec = inventory.containers[target]
    remote = ["head", "-c", str(size_mb * 1024 * 1024), "/dev/zero"]
    return {
        # in-process: the memory of orch streaming the output itself, not of the thin client
        # that hands the command to the warm agent (docs/guide/agent.md)
        "orch exec": [sys.executable, "-m", "orchestrator", "--no-agent", "-i", inventory_path,
                      "exec", target, "--", *remote],
        "ssh + pct exec (manual)": ["ssh", "-F", ssh_config, spec.host,
                                    shlex.join(["pct", "exec", str(spec.vmid), "--", *remote])],
    }


def main() -> None:
    sandbox_dir = os.environ.get("ORCH_SANDBOX_DIR", "/var/lib/orch-sandbox")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", default=os.path.join(sandbox_dir, "inventory.yaml"))
    parser.add_argument("--ssh-config", default=os.path.join(sandbox_dir, "ssh_config"))
    parser.add_argument("--target", default="sb1-200")
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 200], metavar="MB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as scratch:
        out_path = os.path.join(scratch, "out.bin")
        for size in args.sizes:
            for name, argv in clients(args.inventory, args.target, args.ssh_config, size).items():
                samples = [peak_rss_mb(argv, out_path) for _ in range(args.runs)]
                assert all(written == size * 1024 * 1024 for _, _, written in samples), name
                rows.append({"size_mb": size, "client": name,
                             "peak_rss_mb": round(statistics.median(s[0] for s in samples), 1),
                             "seconds": round(statistics.median(s[1] for s in samples), 2)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'output':>8}  {'client':<26} {'peak RSS (MB)':>14} {'time (s)':>9}   (median of {args.runs})")
    for row in rows:
        print(f"{row['size_mb']:>5} MB  {row['client']:<26} {row['peak_rss_mb']:>14} {row['seconds']:>9}")


if __name__ == "__main__":
    main()
