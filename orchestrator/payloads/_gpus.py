"""Shared by the payloads that read GPUs: one nvidia-smi query, one set of key names.

A row is {"index", "name", "utilization_pct", "memory_used_mib", "memory_total_mib",
"power_w"}; a value the board does not report ("[N/A]", "[Not Supported]") is None.
The controller keeps these names everywhere (inventory check, the monitor's GPU series,
reports).
"""

import os

GPU_QUERY = "index,name,utilization.gpu,memory.used,memory.total,power.draw"
GPU_KEYS = ("index", "name", "utilization_pct", "memory_used_mib", "memory_total_mib", "power_w")


def on_path(name):
    """Whether an executable `name` is on PATH, as shutil.which says, without importing
    shutil (nor subprocess until a program is run): the two are a third of the CPU time of
    inventory check's probe in a container without GPUs, paid once per container of a fan-out."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or os.curdir, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return True
    return False


def nvidia_smi_present():
    return on_path("nvidia-smi")


def query_gpus(only=(), timeout=20):
    """The GPUs as nvidia-smi sees them (only these indexes when `only` is given): a list of
    rows; None when the container has no nvidia-smi; {"error": text} when it fails."""
    if not nvidia_smi_present():
        return None
    import subprocess   # only where there is something to run (on_path)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=" + GPU_QUERY,
                              "--format=csv,noheader,nounits"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": str(error)}
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip()[-300:]}
    rows = []
    for line in out.stdout.strip().splitlines():
        row = _gpu_row(line)
        if row is not None and (not only or row["index"] in only):
            rows.append(row)
    return rows


def _gpu_row(line):
    parts = [part.strip() for part in line.split(",")]
    if len(parts) != len(GPU_KEYS):
        return None
    try:
        index = int(parts[0])
    except ValueError:
        return None
    row = {"index": index, "name": parts[1]}
    for key, text in zip(GPU_KEYS[2:], parts[2:]):
        row[key] = _gpu_number(text)
    return row


def _gpu_number(text):
    try:
        return float(text)
    except ValueError:
        return None
