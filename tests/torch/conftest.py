"""Fixtures for the payload tests that need real torch (marked `torch`).

The torch venv comes from tests/support/torchenv.py: $ORCH_TEST_TORCH_VENV, else one built once
under ~/.cache/orch-test. Tests never write into it: patch tests work on a hard-link copy.
"""

from __future__ import annotations

import glob
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.torch.matrix import matrix
from tests.support.torchenv import torch_venv

UPSTREAM_FIXED = "2.14.1"


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


@pytest.fixture(scope="session")
def upstream_fixed_site(tmp_path_factory) -> Path:
    """The sources and dist-info of the torch 2.14.1 wheel (the release matrix's cache,
    scripts/torch-matrix.py), in a hard-link copy that tests may change."""
    site, _ = matrix.release_site(UPSTREAM_FIXED)
    copy = tmp_path_factory.mktemp("torch-" + UPSTREAM_FIXED) / "site"
    subprocess.run(["cp", "-al", str(site), str(copy)], check=True)
    return copy
