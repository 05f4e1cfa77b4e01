"""One venv with real torch (the 2.13.0 CPU wheel) shared by every test that needs it.

$ORCH_TEST_TORCH_VENV names an existing one; otherwise it is built once under
~/.cache/orch-test/torch-venv with Debian's /usr/bin/python3, so the same venv also works
inside the sandbox's containers, which share the machine's /usr.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess

TORCH_PIN = "torch==2.13.0"
CACHE = os.path.expanduser("~/.cache/orch-test")
BASE_PYTHON = "/usr/bin/python3"


# present only while the venv is built: a folder holding it is an interrupted build
BUILDING_MARKER = ".orch-test-building"


def torch_venv() -> str:
    explicit = os.environ.get("ORCH_TEST_TORCH_VENV")
    if explicit:
        return explicit
    path = os.path.join(CACHE, "torch-venv")
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, ".torch-venv.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several pytest processes may ask at once
        if not _has_torch(path):
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
            open(os.path.join(path, BUILDING_MARKER), "w").close()   # first: see above
            subprocess.run([BASE_PYTHON, "-m", "venv", path], check=True)
            subprocess.run([os.path.join(path, "bin", "pip"), "install", "-q",
                            "--disable-pip-version-check", TORCH_PIN], check=True)
            os.unlink(os.path.join(path, BUILDING_MARKER))
    return path


def _has_torch(path: str) -> bool:
    python = os.path.join(path, "bin", "python")
    if os.path.exists(os.path.join(path, BUILDING_MARKER)) or not os.path.exists(python):
        return False
    found = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('torch') is not None)"],
                           capture_output=True, text=True)
    return found.stdout.strip() == "True"
