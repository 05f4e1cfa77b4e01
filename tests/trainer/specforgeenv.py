"""A venv with SpecForge's own package (`specforge` 0.2.0 from the registry) beside the shared
torch 2.13 CPU venv, built once under ~/.cache/orch-test/specforge-venv.

SpecForge pins torch 2.11 and sglang; its CLI's config loading and `--plan` need neither, so
it goes in with --no-deps, plus pydantic and PyYAML. A .pth file puts the torch venv's
site-packages on its path (the shared venv itself is not touched).
"""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

PIN = "specforge==0.2.0"
EXTRAS = ["pydantic>=2", "pyyaml"]
CACHE = Path.home() / ".cache" / "orch-test"
READY = ".orch-ready"


def _site(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()


def specforge_venv(torch_python: Path) -> Path:
    venv = CACHE / "specforge-venv"
    marker = venv / READY
    if marker.exists() and marker.read_text() == PIN:
        return venv
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "specforge-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and marker.read_text() == PIN:
            return venv
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", str(venv)], check=True)
        python = venv / "bin" / "python"
        Path(_site(python), "orch-test-torch.pth").write_text(_site(torch_python) + "\n")
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--no-deps", PIN], check=True, timeout=600)
        subprocess.run([*pip, *EXTRAS], check=True, timeout=600)
        marker.write_text(PIN)
    return venv
