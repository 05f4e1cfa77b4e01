"""Per-command latency into a container: orch's API against the manual way, side by side.

The manual way is what a user types today: a new `ssh HOST "pct exec VMID -- CMD"` process
for every command. orch keeps one SSH connection per host (a channel per command) and can
keep a command session open in the container (one channel for many commands).

    pip install -e '.[bench]'                        # Fabric, for its row (orch does not use it)
    python benchmarks/exec_latency.py                # against the sandbox (orch sandbox up)
    python benchmarks/exec_latency.py -n 100 --target sb1-200 --json

Prints medians and p95 in milliseconds and the ratio to the manual way.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import paramiko  # noqa: E402

try:
    from fabric import Connection  # noqa: E402  (the `bench` extra: only for Fabric's row)
except ModuleNotFoundError:
    Connection = None

from benchmarks.timing import opened_target, print_table, samples_ms, summary, target_parser  # noqa: E402
from orchestrator.remote.session import ExecSession  # noqa: E402

COMMANDS = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}


def manual_call(ssh_config: str, host: str, vmid: int, argv: list[str]):
    remote = shlex.join(["pct", "exec", str(vmid), "--", *argv])
    command = ["ssh", "-F", ssh_config, host, remote]
    return lambda: subprocess.run(command, check=True, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL)


def fabric_connection(settings):
    """Fabric, as a user would reach for it, but with host keys checked (its default
    accepts unknown keys) and TCP_NODELAY left as Fabric sets it (it does not)."""
    connection = Connection(settings.address, user=settings.user, port=settings.port,
                            connect_kwargs={"key_filename": settings.identity})
    connection.client.load_host_keys(settings.known_hosts)
    connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return connection


def main() -> int:
    parser = target_parser(__doc__)
    parser.add_argument("--ssh-config", default=os.path.join(
        os.environ.get("ORCH_SANDBOX_DIR", "/var/lib/orch-sandbox"), "ssh_config"))
    parser.add_argument("-n", "--count", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with opened_target(args) as (fleet, target):
        session = ExecSession(target)
        fabric = None
        if Connection is None:
            print("Fabric is not installed (pip install -e '.[bench]'): its rows are left out",
                  file=sys.stderr)
        else:
            fabric = fabric_connection(fleet.ssh_settings(fleet.inventory.hosts[target.host.name]))
        rows = []
        for label, argv in COMMANDS.items():
            ways = {
                "manual: new ssh + pct exec per command": manual_call(
                    args.ssh_config, target.host.name, target.vmid, argv),
                "Fabric: one Connection, c.run per command": lambda a=argv: fabric.run(
                    shlex.join(target.wrap(a)), hide=True, in_stream=False),
                "orch: one connection, channel per command": lambda a=argv: target.run(a, check=True),
                "orch: persistent session in the container": lambda a=argv: session.run(a, check=True),
            }
            if fabric is None:
                del ways["Fabric: one Connection, c.run per command"]
            results = {way: summary(samples_ms(call, args.count)) for way, call in ways.items()}
            manual = next(iter(results.values()))["median_ms"]
            for way, result in results.items():
                rows.append({"command": label, "way": way, **result,
                             "speedup": manual / result["median_ms"]})
        session.close()
        if fabric is not None:
            fabric.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print_table(["command", "way", "median ms", "p95 ms", "x faster than manual"],
                [[f"`{row['command']}`", row["way"], f"{row['median_ms']:.1f}", f"{row['p95_ms']:.1f}",
                  f"{row['speedup']:.1f}"] for row in rows], left=2)
    print(f"\n{args.count} sequential commands each, target {args.target}, "
          f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
