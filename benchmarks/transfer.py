"""orch cp against the manual ways, side by side in one run: one file of -s MB pushed into
and pulled out of sb1's CT 200, -n times each, medians in MB/s.

    python benchmarks/transfer.py [-s 100] [-n 3] [--json]

  orch cp push / pull     a new `orch` process each time, sha256 checked on both sides:
                          the direct path (ORCH_AGENT=off: the process connects, imports
                          and copies) and the warm agent (the default: the copy runs in
                          the agent, its SSH connection open)
  scp + pct push / pull   the manual way: scp to the host, then `pct push` (or `pct pull`,
                          then scp back), then the copy on the host removed
  tar | ssh pct exec      `tar -cf - F | ssh HOST pct exec 200 -- tar -xf -` (and back)
  ..., then mv            the same tar into a temporary name, then `mv` over the copy: the
                          old file kept until the new one is whole, as orch keeps it

Each push is taken twice: over the copy the way before it left (orch keeps the old file
until the new one is checked and renamed over it; tar removes it first, then writes), and
"(new file)": the copy removed before, untimed, so that every way writes into free memory
alike. The two differ on a machine whose freed memory goes back to its host (a VM with
free page reporting): there, memory freed seconds ago costs a fault in the host again.

Against the sandbox (`orch sandbox up` first); the transfers share this machine's CPUs
with sshd and the container, so the figures are for comparing the ways, not for a link.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orch_sandbox as sandboxes  # noqa: E402
from orchestrator.remote.wheels import file_sha256  # noqa: E402
from timing import bytecode_as_installed  # noqa: E402

HOST, VMID, TARGET = "sb1", 200, "sb1-200"
REMOTE = "/tmp/orch-bench-transfer"
ORCH = [sys.executable, "-m", "orchestrator"]


def timed(argv_or_shell, env=None) -> float:
    started = time.monotonic()
    shell = isinstance(argv_or_shell, str)
    subprocess.run(argv_or_shell, shell=shell, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def cases(bed, local: str, back: str, agent_dir: str):
    """name -> a function returning one run's seconds."""
    env = {**os.environ, "ORCH_AGENT": "off"}
    warm = {**os.environ, "ORCH_AGENT": "require", "ORCH_AGENT_DIR": agent_dir}
    inventory = str(bed.inventory_path)
    ssh = " ".join(shlex.quote(a) for a in bed.ssh_argv(HOST))
    scp = f"scp -q -F {shlex.quote(str(bed.ssh_config))}"
    name = os.path.basename(local)
    folder = os.path.dirname(local)
    return {
        "orch cp push": lambda: timed([*ORCH, "-i", inventory, "cp", local,
                                       f"{TARGET}:{REMOTE}/{name}"], env),
        "orch cp push, warm agent": lambda: timed([*ORCH, "-i", inventory, "cp", local,
                                                   f"{TARGET}:{REMOTE}/{name}"], warm),
        "scp + pct push": lambda: timed(
            f"{scp} {shlex.quote(local)} {HOST}:/tmp/{name} && "
            f"{ssh} 'pct push {VMID} /tmp/{name} {REMOTE}/{name} && rm -f /tmp/{name}'"),
        "tar | ssh pct exec tar x": lambda: timed(
            f"tar -C {shlex.quote(folder)} -cf - {name} | "
            f"{ssh} 'pct exec {VMID} -- tar -C {REMOTE} -xf -'"),
        # tar keeping the old file until the new one is whole, as orch does (a control)
        "tar | ssh pct exec tar x, then mv": lambda: timed(
            f"tar -C {shlex.quote(folder)} -cf - {name} | {ssh} " + shlex.quote(
                f"pct exec {VMID} -- sh -c " + shlex.quote(
                    f"tar -C {REMOTE} --transform s,^,.new-, -xf - && "
                    f"mv {REMOTE}/.new-{name} {REMOTE}/{name}"))),
        "orch cp pull": lambda: timed([*ORCH, "-i", inventory, "cp", f"{TARGET}:{REMOTE}/{name}",
                                       back], env),
        "orch cp pull, warm agent": lambda: timed(
            [*ORCH, "-i", inventory, "cp", f"{TARGET}:{REMOTE}/{name}", back], warm),
        "pct pull + scp": lambda: timed(
            f"{ssh} 'pct pull {VMID} {REMOTE}/{name} /tmp/{name}' && "
            f"{scp} {HOST}:/tmp/{name} {shlex.quote(back)} && {ssh} 'rm -f /tmp/{name}'"),
        "ssh pct exec tar c | tar x": lambda: timed(
            f"{ssh} 'pct exec {VMID} -- tar -C {REMOTE} -cf - {name}' | "
            f"tar -C {shlex.quote(os.path.dirname(back))} -xf -"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-s", "--size-mb", type=int, default=100)
    parser.add_argument("-n", "--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bed = sandboxes.up()
    bytecode_as_installed()
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, "payload.bin")
        with open(local, "wb") as handle:
            for _ in range(args.size_mb):
                handle.write(os.urandom(1 << 20))
        back_dir = os.path.join(folder, "back")
        os.mkdir(back_dir)
        back = os.path.join(back_dir, "payload.bin")
        bed.pct(HOST, "exec", str(VMID), "--", "mkdir", "-p", REMOTE)
        name = os.path.basename(local)
        agent_dir = os.path.join(folder, "agent")
        ways = with_new_file_pushes(cases(bed, local, back, agent_dir))
        # the agent started and its connection warm before the first timed run
        subprocess.run([*ORCH, "-i", str(bed.inventory_path), "exec", TARGET, "--", "true"],
                       env={**os.environ, "ORCH_AGENT_DIR": agent_dir}, check=True)
        seconds: dict[str, list[float]] = {label: [] for label in ways}
        try:
            # the ways take turns, run by run: a minute of other load falls on all of them;
            # each round starts one way later, so no way always follows the same one
            labels = list(ways)
            for turn in range(args.runs):
                shift = turn % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    # no way pays for the writes the one before left, and none gains by a
                    # copy the next way removes before the kernel wrote it (orch's rename over
                    # a file starts the new one's write at once, ext4's auto_da_alloc; tar's
                    # copy waits, and the next way's removal could spare it the disk)
                    if label.endswith(NEW_FILE):
                        bed.pct(HOST, "exec", str(VMID), "--", "rm", "-f", f"{REMOTE}/{name}")
                    os.sync()
                    seconds[label].append(ways[label]())
                    if not _pushes(label) and os.path.exists(back):
                        assert file_sha256(back) == file_sha256(local), f"{label}: the copy differs"
                        os.unlink(back)
        finally:
            bed.pct(HOST, "exec", str(VMID), "--", "rm", "-rf", REMOTE)
            subprocess.run([*ORCH, "agent", "stop"], env={**os.environ, "ORCH_AGENT_DIR": agent_dir},
                           capture_output=True)
        rows = {label: {"median_s": round(statistics.median(times), 3),
                        "MB_per_s": round(args.size_mb / statistics.median(times), 1)}
                for label, times in seconds.items()}
    if args.json:
        print(json.dumps({"size_mb": args.size_mb, "runs": args.runs, "rows": rows}, indent=2))
        return
    print(f"{args.size_mb} MB, median of {args.runs} per way, taken in turns")
    print("| way | median s | MB/s | of the best manual way |\n| --- | ---: | ---: | ---: |")
    for label, row in rows.items():
        print(f"| {label} | {row['median_s']:.2f} | {row['MB_per_s']:.1f} | "
              f"{row['MB_per_s'] / best_manual(rows, label):.0%} |")


NEW_FILE = " (new file)"


def with_new_file_pushes(ways: dict) -> dict:
    """The ways, each push also as NEW_FILE (its run after the copy was removed); scp and
    `pct push` write a file on the host first, whose cost does not change with it."""
    return {**ways, **{label + NEW_FILE: run for label, run in ways.items()
                       if _pushes(label) and not label.startswith("scp")}}


def best_manual(rows: dict, label: str) -> float:
    """The fastest manual way's MB/s in the direction and regime of the row's way."""
    same = [row["MB_per_s"] for other, row in rows.items()
            if not other.startswith("orch") and _kind(other) == _kind(label)]
    return max(same)


def _pushes(label: str) -> bool:
    return "push" in label or label.startswith("tar")


def _kind(label: str) -> tuple[bool, bool]:
    return _pushes(label), label.endswith(NEW_FILE)


if __name__ == "__main__":
    main()
