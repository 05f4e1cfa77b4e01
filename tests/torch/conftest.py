"""Fixtures for the payload tests that need real torch (marked `torch`).

The torch venv comes from tests/torchenv.py: $ORCH_TEST_TORCH_VENV, else one built once
under ~/.cache/orch-test. Tests never write into it: patch tests work on a hard-link copy.
"""

from __future__ import annotations

import glob
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.torchenv import CACHE, torch_venv

UPSTREAM_FIXED_PIN = "torch==2.14.1"
# The files of the 2.14.1 wheel the patcher reads: no torch source is kept in the repo.
UPSTREAM_FIXED_FILES = ("torch/fx/_symbolic_trace.py", "torch/_higher_order_ops/utils.py",
                        "torch/utils/checkpoint.py")


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def site_packages(self) -> Path:
        (found,) = glob.glob(str(self.root / "lib" / "python3*" / "site-packages"))
        return Path(found)


def copy_venv(source: Venv, destination: Path) -> Venv:
    """A hard-link copy: a second of work instead of 900 MB. Safe only because whatever
    writes into the copy replaces files by rename (fx_patch, Python's bytecode cache,
    tests' replace_file) and so never writes through a link into the original."""
    subprocess.run(["cp", "-al", str(source.root), str(destination)], check=True)
    return Venv(destination)


@pytest.fixture(scope="session")
def real_torch_venv() -> Venv:
    return Venv(Path(torch_venv()))


@pytest.fixture
def venv_copy(real_torch_venv, tmp_path) -> Venv:
    return copy_venv(real_torch_venv, tmp_path / "venv")


@pytest.fixture(scope="module")
def module_venv_copy(real_torch_venv, tmp_path_factory) -> Venv:
    return copy_venv(real_torch_venv, tmp_path_factory.mktemp("module-venv") / "venv")


def download_upstream_fixed_wheel(pip_python: str) -> Path:
    wheels = Path(CACHE) / "wheels"
    cached = sorted(wheels.glob("torch-2.14.1-*.whl"))
    if cached:
        return cached[0]
    wheels.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([pip_python, "-m", "pip", "download", "--no-deps", "-q",
                           "--disable-pip-version-check", "-d", str(wheels), UPSTREAM_FIXED_PIN],
                          capture_output=True, text=True, timeout=900)
    cached = sorted(wheels.glob("torch-2.14.1-*.whl"))
    if proc.returncode != 0 or not cached:
        pytest.skip(f"cannot get the {UPSTREAM_FIXED_PIN} wheel: {proc.stderr.strip()[-300:]}")
    return cached[0]


@pytest.fixture(scope="session")
def upstream_fixed_site(real_torch_venv, tmp_path_factory) -> Path:
    """A site-packages holding only the files of torch 2.14.1 the patcher reads, plus its
    dist-info, extracted from the wheel at test time."""
    wheel = download_upstream_fixed_wheel(real_torch_venv.python)
    site = tmp_path_factory.mktemp("torch-2.14.1") / "site"
    with zipfile.ZipFile(wheel) as archive:
        dist_info = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")
                     or n.endswith(".dist-info/RECORD")]
        for name in list(UPSTREAM_FIXED_FILES) + dist_info:
            archive.extract(name, site)
    # An empty __init__ of our own makes torch a regular package, so this partial tree
    # wins over any torch installed further down sys.path (a namespace package would not).
    (site / "torch" / "__init__.py").write_text("")
    return site

