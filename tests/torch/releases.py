"""Venvs with old torch releases for the runtime proof of the fx-tls patch.

Each is built once under ~/.cache/orch-test/torch-venv-<version> with Debian's
/usr/bin/python3 (so it also runs inside the sandbox's containers, which share the
machine's /usr), from the registry's CUDA wheel: it imports on a CPU-only machine.
`python -m tests.torch.releases 2.8.0 2.4.1` builds them ahead of a test run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time

from tests.support.torchenv import BASE_PYTHON, CACHE

# The old releases the runtime tests install: the last one before is_fx_symbolic_tracing()
# appeared (2.8), one from the middle of the 2.3-2.8 shape (2.4), and the oldest with the
# flag (2.1: no other reader, a backslash-continued `with` in checkpoint's recompute).
# ORCH_TEST_OLD_TORCH="2.8.0 2.2.2 ..." runs others (2.2.2 and 2.3.1 behave as 2.1.2 does).
RUNTIME_RELEASES = tuple(os.environ.get("ORCH_TEST_OLD_TORCH", "2.8.0 2.4.1 2.1.2").split())
DONE = ".orch-test-complete"


def release_venv(version: str) -> str:
    """The venv with torch==version, built on first use (several minutes, ~4 GB)."""
    path = os.path.join(CACHE, f"torch-venv-{version}")
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, f".torch-venv-{version}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(path, DONE)):
            shutil.rmtree(path, ignore_errors=True)  # a build that was interrupted
            started = time.monotonic()
            subprocess.run([BASE_PYTHON, "-m", "venv", path], check=True)
            subprocess.run([os.path.join(path, "bin", "pip"), "install", "-q",
                            "--disable-pip-version-check", f"torch=={version}"], check=True)
            subprocess.run([os.path.join(path, "bin", "python"), "-c", "import torch"],
                           check=True)
            with open(os.path.join(path, DONE), "w") as f:
                f.write(f"built in {time.monotonic() - started:.0f} s\n")
    return path


if __name__ == "__main__":
    for wanted in sys.argv[1:] or RUNTIME_RELEASES:
        print(wanted, release_venv(wanted), flush=True)
