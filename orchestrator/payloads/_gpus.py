"""Shared by the payloads that read GPUs: the nvidia-smi queries, one set of key names.

A row is {"index", "name", "utilization_pct", "memory_used_mib", "memory_total_mib",
"power_w"}; a value the board does not report ("[N/A]", "[Not Supported]") is None.
The controller keeps these names everywhere (inventory check, the monitor's GPU series,
reports). The machine query (query_gpu_models) is what a run ran on, for the record's
environment diff: {"index", "name", "driver", "memory_total_mib", "clock_max_sm_mhz",
"clock_max_memory_mhz", "power_limit_w"}; the CUDA version the driver supports is not a
--query-gpu field, so it is read from plain nvidia-smi's header ("CUDA Version: 12.8").
"""

import os
import re

GPU_QUERY = "index,name,utilization.gpu,memory.used,memory.total,power.draw"
GPU_KEYS = ("index", "name", "utilization_pct", "memory_used_mib", "memory_total_mib", "power_w")
MODEL_QUERY = "index,name,driver_version,memory.total,clocks.max.sm,clocks.max.memory,power.limit"
MODEL_KEYS = ("index", "name", "driver", "memory_total_mib", "clock_max_sm_mhz",
              "clock_max_memory_mhz", "power_limit_w")
TEXT_KEYS = ("name", "driver")
CUDA_VERSION = re.compile(r"CUDA Version\s*:?\s*([0-9]+(?:\.[0-9]+)*)")
HEADER_CHARS = 4096        # the header holds the CUDA version; the rest is not read


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
    rows = _query(GPU_QUERY, GPU_KEYS, timeout)
    if isinstance(rows, list) and only:
        rows = [row for row in rows if row["index"] in only]
    return rows


def query_gpu_models(timeout=20):
    """What each GPU is (model, driver, memory, maximum clocks, power limit): rows of
    MODEL_KEYS, None without nvidia-smi, {"error": text} when it fails."""
    return _query(MODEL_QUERY, MODEL_KEYS, timeout)


def cuda_version(timeout=20):
    """The CUDA version the driver supports, from nvidia-smi's header; None without it."""
    if not nvidia_smi_present():
        return None
    import subprocess   # only where there is something to run (on_path)
    try:
        out = subprocess.run(["nvidia-smi"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_cuda_version(out.stdout)


def parse_cuda_version(text):
    match = CUDA_VERSION.search((text or "")[:HEADER_CHARS])
    return match.group(1) if match else None


def _query(query, keys, timeout):
    if not nvidia_smi_present():
        return None
    import subprocess   # only where there is something to run (on_path)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=" + query,
                              "--format=csv,noheader,nounits"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": str(error)}
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip()[-300:]}
    return parse_rows(out.stdout, keys)


def parse_rows(text, keys=GPU_KEYS):
    """nvidia-smi's `--format=csv,noheader,nounits` lines as rows of KEYS; a line of another
    shape (a warning, a header) is skipped."""
    rows = []
    for line in text.strip().splitlines():
        row = _gpu_row(line, keys)
        if row is not None:
            rows.append(row)
    return rows


def _gpu_row(line, keys=GPU_KEYS):
    parts = [part.strip() for part in line.split(",")]
    if len(parts) != len(keys):
        return None
    try:
        index = int(parts[0])
    except ValueError:
        return None
    row = {"index": index}
    for key, text in zip(keys[1:], parts[1:]):
        if key in TEXT_KEYS:
            row[key] = None if _not_reported(text) else text
        else:
            row[key] = _gpu_number(text)
    return row


def _not_reported(text):
    return not text or (text.startswith("[") and text.endswith("]"))


def _gpu_number(text):
    try:
        return float(text)
    except ValueError:
        return None
