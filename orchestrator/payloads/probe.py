"""Payload: what a container offers (python, venv, GPUs, ripgrep) — stdlib only.

Run as `PYTHON - '{"venv": "/root/venv"}'`; prints one JSON result line:
{"event": "result", "hostname", "python", "python_version", "venv": {"path", "present",
"python_version"} or null, "gpus": rows of _gpus.query_gpus (null without nvidia-smi,
{"error": ...} when it fails), "ripgrep", "cuda_visible_devices"}.
"""

import os
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
        import subprocess   # only with a venv to ask: see _gpus.on_path
        out = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=60)
        info["python_version"] = out.stdout.strip() or None
    return info


def run(args):
    return {
        "hostname": os.uname().nodename,          # platform's answers, without platform
        "python": sys.executable,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "venv": venv_info(args["venv"]),
        "gpus": query_gpus(),
        "ripgrep": on_path("rg"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
