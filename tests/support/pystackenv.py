"""pystack for the tests that need it, built once under ~/.cache/orch-test like
tests/support/torchenv.py's torch venv (and usable inside the sandbox's containers the same way):

- pystack_venv(): a venv with the pystack orch pins, made with Debian's /usr/bin/python3;
- pystack_wheelhouse(): a folder with that pystack's wheel for /usr/bin/python3, what
  `orch stacks --wheelhouse` carries into a container without it;
- foreign_wheelhouse(): a real pystack wheel for another machine (aarch64), which fits no
  python here: the refusal's case.
"""

from __future__ import annotations

import fcntl
import glob
import os
import subprocess

from orchestrator.forensics.stacktool import PIN
from tests.support.torchenv import BASE_PYTHON, CACHE

PYSTACK_PIN = PIN
FOREIGN = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
           "--platform", "manylinux_2_17_aarch64", "pystack==1.4.1"]


def pystack_venv() -> str:
    path = os.path.join(CACHE, "pystack-venv")
    with _locked("pystack-venv"):
        if not os.access(os.path.join(path, "bin", "pystack"), os.X_OK):
            subprocess.run([BASE_PYTHON, "-m", "venv", path], check=True)
            subprocess.run([os.path.join(path, "bin", "pip"), "install", "-q",
                            "--disable-pip-version-check", PYSTACK_PIN], check=True)
    return path


def pystack_wheelhouse() -> str:
    return _downloaded("pystack-wheels", [PYSTACK_PIN])


def foreign_wheelhouse() -> str:
    return _downloaded("pystack-wheels-aarch64", FOREIGN)


def _downloaded(name: str, args: list[str]) -> str:
    """pip download with the pystack venv's pip (Debian's python3 itself has none): the
    default tags are that python's, /usr/bin/python3's."""
    pip = os.path.join(pystack_venv(), "bin", "pip")
    path = os.path.join(CACHE, name)
    with _locked(name):
        if not glob.glob(os.path.join(path, "pystack-*.whl")):
            os.makedirs(path, exist_ok=True)
            subprocess.run([pip, "download", "-q", "--disable-pip-version-check", "--no-deps",
                            "--only-binary=:all:", "-d", path, *args], check=True)
    return path


class _locked:
    def __init__(self, name: str):
        os.makedirs(CACHE, exist_ok=True)
        self.path = os.path.join(CACHE, f".{name}.lock")

    def __enter__(self):
        self.handle = open(self.path, "w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)   # several pytest processes may ask at once

    def __exit__(self, *exc):
        self.handle.close()
