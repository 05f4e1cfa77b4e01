"""Real torch inside sandbox containers, fast: the shared test venv (tests/support/torchenv.py) is
hard-linked into the container's private /root/venv from the machine's side.

Why this is honest: the venv is a real torch 2.13 install made by pip with Debian's python,
which the containers share (/usr is the machine's). Every later write to it (orch's patch,
its revert, pip) replaces files by rename or unlink, so the linked copies never change the
shared venv. The bootstrap step itself (pip into the container) has its own tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from tests.support.torchenv import torch_venv


def container_root(sandbox, host: str, vmid: int) -> str:
    return os.path.join(str(sandbox.paths.host_dir(host)), "lxc", str(vmid), "rootfs", "root")


def seed_torch_venv(sandbox, host: str, vmid: int, dest: str = "venv") -> str:
    """Give CT vmid of host a fresh /root/<dest> with torch; returns the path in the container."""
    target = os.path.join(container_root(sandbox, host, vmid), dest)
    if os.path.exists(target):
        shutil.rmtree(target)
    subprocess.run(["cp", "-al", torch_venv(), target], check=True)
    return f"/root/{dest}"


def remove_venv(sandbox, host: str, vmid: int, dest: str = "venv") -> None:
    shutil.rmtree(os.path.join(container_root(sandbox, host, vmid), dest), ignore_errors=True)
