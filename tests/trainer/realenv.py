"""Venvs with real training libraries on top of the shared torch 2.13.0 venv, each built once
under ~/.cache/orch-test/: trainers-venv (transformers, accelerate, tqdm), lightning-venv
(Lightning 2.6.6) and tensorboard-venv (tensorboard, for torch.utils.tensorboard's
SummaryWriter).

They do not install torch again (900 MB): a .pth file puts the torch venv's site-packages on
their path, so pip sees torch as installed and adds only what is missing from the
registry. transformers is pinned to the release these log formats were read from.
"""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

PINS = ["transformers==5.24.0", "accelerate==1.15.0", "tqdm==4.70.1"]
TENSORBOARD_PINS = ["tensorboard==2.21.0"]
LIGHTNING_PINS = ["lightning==2.6.6", "tqdm==4.70.1"]
CACHE = Path.home() / ".cache" / "orch-test"
READY = ".orch-ready"


def trainers_venv(torch_python: Path) -> Path:
    return layered_venv("trainers-venv", PINS, torch_python)


def lightning_venv(torch_python: Path) -> Path:
    return layered_venv("lightning-venv", LIGHTNING_PINS, torch_python)


def tensorboard_venv(torch_python: Path) -> Path:
    return layered_venv("tensorboard-venv", TENSORBOARD_PINS, torch_python)


def layered_venv(name: str, pins: list[str], torch_python: Path) -> Path:
    venv = CACHE / name
    marker = venv / READY
    if marker.exists() and marker.read_text() == " ".join(pins):
        return venv
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # parallel sessions must not build it twice at once
        if marker.exists() and marker.read_text() == " ".join(pins):
            return venv
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", str(venv)], check=True)
        torch_site = subprocess.run(
            [str(torch_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True).stdout.strip()
        own_site = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True).stdout.strip()
        Path(own_site, "orch-test-torch.pth").write_text(torch_site + "\n")
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", *pins], check=True, timeout=1800)
        marker.write_text(" ".join(pins))
    return venv
