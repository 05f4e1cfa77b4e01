"""Payload: what a run ran on - the GPUs (model, driver, CUDA, clocks) and the container's
cgroup limits (CPU quota and set, memory) - stdlib only, read-only.

Run as `PYTHON - '{"cgroup_root": "/sys/fs/cgroup"}'`; prints one JSON result line:
{"event": "result", "gpus": rows of _gpus.query_gpu_models, or null without nvidia-smi (a CPU
container: absent, not an error), or {"error": text}; "driver": the first GPU's driver or
null; "cuda": the CUDA version the driver supports, or null; "cgroup": {"version": 2, 1 or
null, "cpu_quota_cores": float or null (no quota), "cpuset": "0-3" or null, "cpuset_cpus":
count or null, "memory_limit_bytes": int or null (no limit)}; "cpu_count": os.cpu_count()}.

A Proxmox container's cores and memory are its cgroup's (lxc.cgroup2.cpu.max,
cpuset.cpus, memory.max): inside its cgroup namespace they are the root files of
/sys/fs/cgroup (v2), or cpu/, cpuset/, memory/ below it (v1). Each file is read at most
4096 bytes; a file that is missing or unreadable is a null, never a failure.
"""

import os
import sys

from _protocol import *  # orch: inlined when shipped
from _gpus import *  # orch: inlined when shipped

ARG_SPEC = {"cgroup_root": (str, "/sys/fs/cgroup")}
READ_LIMIT = 4096
NO_LIMIT_BYTES = 1 << 62     # v1 writes "no limit" as a number near 2^63


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(READ_LIMIT).strip()
    except OSError:
        return None


def cpu_quota_v2(text):
    """cpu.max "QUOTA PERIOD" (or "max PERIOD": none) -> cores."""
    parts = (text or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _ratio(parts[0], parts[1])


def cpu_quota_v1(quota, period):
    """cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us -> cores."""
    if quota is None or quota.strip().startswith("-"):
        return None
    return _ratio(quota, period)


def _ratio(quota, period):
    try:
        cores = int(quota) / int(period)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return round(cores, 3) if cores > 0 else None


def memory_limit(text):
    """memory.max ("max": none) or memory.limit_in_bytes (near 2^63: none) -> bytes."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        return None
    return value if 0 < value < NO_LIMIT_BYTES else None


def cpuset_count(text):
    """"0-3,8,10-11" -> 7; None for an empty or unreadable set."""
    count = 0
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            count += int(high or low) - int(low) + 1
        except ValueError:
            return None
    return count or None


def cgroup_limits(root):
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        cpuset = read_text(os.path.join(root, "cpuset.cpus.effective")) or \
            read_text(os.path.join(root, "cpuset.cpus"))
        return {"version": 2,
                "cpu_quota_cores": cpu_quota_v2(read_text(os.path.join(root, "cpu.max"))),
                "cpuset": cpuset or None, "cpuset_cpus": cpuset_count(cpuset),
                "memory_limit_bytes": memory_limit(read_text(os.path.join(root, "memory.max")))}
    if os.path.isdir(os.path.join(root, "memory")) or os.path.isdir(os.path.join(root, "cpu")):
        cpuset = read_text(os.path.join(root, "cpuset", "cpuset.effective_cpus")) or \
            read_text(os.path.join(root, "cpuset", "cpuset.cpus"))
        return {"version": 1,
                "cpu_quota_cores": cpu_quota_v1(read_text(os.path.join(root, "cpu", "cpu.cfs_quota_us")),
                                                read_text(os.path.join(root, "cpu", "cpu.cfs_period_us"))),
                "cpuset": cpuset or None, "cpuset_cpus": cpuset_count(cpuset),
                "memory_limit_bytes": memory_limit(
                    read_text(os.path.join(root, "memory", "memory.limit_in_bytes")))}
    return {"version": None, "cpu_quota_cores": None, "cpuset": None, "cpuset_cpus": None,
            "memory_limit_bytes": None}


def run(args):
    gpus = query_gpu_models()
    rows = gpus if isinstance(gpus, list) else []
    return {
        "gpus": gpus,
        "driver": next((row["driver"] for row in rows if row.get("driver")), None),
        "cuda": cuda_version() if rows else None,
        "cgroup": cgroup_limits(args["cgroup_root"]),
        "cpu_count": os.cpu_count(),
    }


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
