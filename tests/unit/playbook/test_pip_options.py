"""Requirements are never pip options: the bootstrap step's `packages` (data, maybe from a
var) reach the controller's own `pip download` and the container's `pip install` after
`--`, and the step's schema refuses a requirement that starts with `-`. Against the real
pip, with a source distribution whose build backend would write a canary."""

from __future__ import annotations

import sys
import textwrap
import types

import pytest

from orchestrator.ground.errors import ConfigError
from orchestrator.playbook.loader import load_playbook
from orchestrator.playbook.steps.base import StepFailed
from orchestrator.playbook.steps.bootstrap import BootstrapStep
from tests.fixtures.evil_sdist import attack_packages, make_evil_sdist
from tests.fixtures.payloads import clean_env, run_payload


def _ctx(tmp_path):
    said = []
    run = types.SimpleNamespace(playbook=types.SimpleNamespace(directory=str(tmp_path)))
    return types.SimpleNamespace(run=run, progress=said.append, output=said.append), said


def test_the_controllers_pip_download_reads_packages_as_requirements_only(tmp_path):
    canary = tmp_path / "canary"
    make_evil_sdist(tmp_path / "sdists", canary)
    ctx, said = _ctx(tmp_path)
    params = {"packages": attack_packages(tmp_path / "sdists"), "wheelhouse": str(tmp_path / "wh"),
              "download": True, "index_url": None, "extra_index_urls": []}
    with pytest.raises(StepFailed, match="pip download .* failed"):
        BootstrapStep()._local_wheelhouse(ctx, params)
    assert not canary.exists(), "pip built the sdist: its code ran on the controller"
    assert any("Invalid requirement: '--no-binary=:all:'" in line for line in said), said


def test_the_containers_pip_install_reads_packages_as_requirements_only(tmp_path):
    canary = tmp_path / "canary"
    make_evil_sdist(tmp_path / "sdists", canary)
    venv = tmp_path / "venv"
    run = run_payload(sys.executable, "bootstrap", {
        "action": "install", "venv": str(venv), "hash": "h", "force": False,
        "packages": attack_packages(tmp_path / "sdists")[1:]}, env=clean_env(), timeout=300)
    run.expect_error()
    assert "Invalid requirement: '--no-index'" in run.final["message"]
    assert not canary.exists()


PLAYBOOK = """\
name: p
targets: [dev]
vars: {packages: ["torch==2.13.0"]}
steps:
  - bootstrap: {packages: "{{ packages }}"}
"""


@pytest.mark.parametrize("packages", [["--no-index", "x"], ["x", " --find-links=/tmp/evil"],
                                      ["-r/etc/passwd"]])
def test_a_requirement_that_is_an_option_is_refused_where_it_is_given(tmp_path, packages):
    (tmp_path / "p.yaml").write_text(PLAYBOOK)
    with pytest.raises(ConfigError, match="is an argument, never an option") as refused:
        load_playbook(str(tmp_path / "p.yaml"), {"packages": packages})
    assert "pip_args" in refused.value.hint
    literal = textwrap.dedent(f"""\
        name: p
        targets: [dev]
        steps:
          - bootstrap: {{packages: {packages!r}}}
        """)
    (tmp_path / "q.yaml").write_text(literal)
    with pytest.raises(ConfigError, match=r"q.yaml:4:\d+: each item of packages is an argument"):
        load_playbook(str(tmp_path / "q.yaml"))
