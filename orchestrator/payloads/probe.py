"""Payload: what a container offers (python, venv, GPUs, ripgrep, torch) — stdlib only.

Run as `PYTHON - '{"venv": "/root/venv"}'`; prints one JSON result line.
"""

import json
import os
import platform
import shutil
import subprocess
import sys


def gpus():
    """GPUs as nvidia-smi sees them; None when there is no nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,utilization.gpu,memory.used",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": str(error)}
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip()[-300:]}
    rows = []
    for line in out.stdout.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 5:
            rows.append({"index": int(parts[0]), "name": parts[1], "memory_mib": _num(parts[2]),
                         "utilization_pct": _num(parts[3]), "memory_used_mib": _num(parts[4])})
    return rows


def _num(text):
    try:
        return float(text)
    except ValueError:
        return None


def venv_info(venv):
    if not venv:
        return None
    venv = os.path.expanduser(venv)
    python = os.path.join(venv, "bin", "python")
    info = {"path": venv, "present": os.path.isfile(python) and os.access(python, os.X_OK)}
    if info["present"]:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                             capture_output=True, text=True, timeout=60)
        info["python_version"] = out.stdout.strip() or None
    return info


def main():
    args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    result = {
        "event": "result",
        "hostname": platform.node(),
        "python": sys.executable,
        "python_version": platform.python_version(),
        "venv": venv_info(args.get("venv")),
        "gpus": gpus(),
        "ripgrep": shutil.which("rg") is not None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # report, never a traceback the controller cannot read
        print(json.dumps({"event": "error", "message": "probe failed: %s" % error}), flush=True)
        sys.exit(1)
