"""orch and the sandbox list their packages by hand in their pyproject.toml (orch maps
templates/ into its package): a new subpackage left off a list would be missing from every
installed wheel. The sandbox is a distribution of its own (sandbox/), never part of orch's."""

from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[3]

# (the folder holding pyproject.toml, the import package it ships)
DISTRIBUTIONS = [(ROOT, "orchestrator"), (ROOT / "sandbox", "orch_sandbox")]


def listed_packages(project: Path) -> set[str]:
    return set(tomllib.loads((project / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


@pytest.mark.parametrize("project, package", DISTRIBUTIONS, ids=["orch", "orch-sandbox"])
def test_every_subpackage_is_listed_in_pyproject(project, package):
    on_disk = {".".join(init.parent.relative_to(project).parts)
               for init in (project / package).rglob("__init__.py")}
    assert on_disk, f"no package {package} under {project}"
    assert on_disk - listed_packages(project) == set(), \
        f"add these to [tool.setuptools] packages in {project / 'pyproject.toml'}"


def test_orch_lists_no_sandbox_package():
    assert {name for name in listed_packages(ROOT) if "sandbox" in name} == set()
