"""Payload: what a container offers (python, venv, GPUs, ripgrep) — stdlib only.

Run as `PYTHON - '{"venv": "/root/venv"}'`; prints one JSON result line:
{"event": "result", "hostname", "python", "python_version", "venv": {"path", "present",
"python_version"} or null, "gpus": rows of _gpus.query_gpus (null without nvidia-smi,
{"error": ...} when it fails), "ripgrep", "cuda_visible_devices"}.
"""

import os
import platform
import shutil
import subprocess
import sys

from _protocol import *  # orch: inlined when shipped
from _gpus import *  # orch: inlined when shipped

ARG_SPEC = {"venv": (str, None)}


def venv_info(venv):
    if not venv:
        return None
    venv = os.path.expanduser(venv)
    python = os.path.join(venv, "bin", "python")
    info = {"path": venv, "present": os.path.isfile(python) and os.access(python, os.X_OK)}
    if info["present"]:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=60)
        info["python_version"] = out.stdout.strip() or None
    return info


def run(args):
    return {
        "hostname": platform.node(),
        "python": sys.executable,
        "python_version": platform.python_version(),
        "venv": venv_info(args["venv"]),
        "gpus": query_gpus(),
        "ripgrep": shutil.which("rg") is not None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
