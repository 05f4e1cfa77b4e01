"""A venv with pystack (the tool `orch stacks` runs in a target), shared by the tests that need
it: built once under ~/.cache/orch-test/pystack-venv with Debian's /usr/bin/python3, like
tests/torchenv.py's torch venv (and usable inside the sandbox's containers the same way)."""

from __future__ import annotations

import fcntl
import os
import subprocess

from tests.torchenv import BASE_PYTHON, CACHE

PYSTACK_PIN = "pystack==1.7.2"


def pystack_venv() -> str:
    path = os.path.join(CACHE, "pystack-venv")
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, ".pystack-venv.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.access(os.path.join(path, "bin", "pystack"), os.X_OK):
            subprocess.run([BASE_PYTHON, "-m", "venv", path], check=True)
            subprocess.run([os.path.join(path, "bin", "pip"), "install", "-q",
                            "--disable-pip-version-check", PYSTACK_PIN], check=True)
    return path
