"""playbooks/specforge-dflash.yaml against SpecForge's real CLI (`specforge` 0.2.0, its
`specforge train -c CONFIG --plan`, which validates a run config and its overrides and prints
the process plan as JSON without starting anything; tests/trainer/specforgeenv.py).

- the run config the playbook renders is accepted as it is, and the plan's command is the one
  orch's torchrun launch runs (from `--module specforge.cli` on; orch adds its own log flags);
- inside that torchrun (its WORLD_SIZE) the CLI plans to run as a worker, as orch relies on;
- an override SpecForge does not know fails the playbook's check step with SpecForge's words.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.config.jinja import ENV
from orchestrator.watch.torchrun import build_argv
from tests.trainer.specforgeenv import specforge_venv

pytestmark = pytest.mark.torch
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def specforge(torch_python) -> str:
    return str(specforge_venv(torch_python) / "bin" / "python")


def playbook() -> dict:
    return yaml.safe_load((REPO / "playbooks" / "specforge-dflash.yaml").read_text())


def rendered_config(tmp_path: Path, nproc: int) -> Path:
    values = {k: v for k, v in playbook()["vars"].items() if not (isinstance(v, str) and "{{" in v)}
    values.update(output_dir=str(tmp_path / "out"), specforge_run_id="orch-test", nproc_per_node=nproc)
    template = ENV.from_string((REPO / "playbooks" / "files" / "specforge-dflash-run.yaml.j2").read_text())
    path = tmp_path / "specforge-run.yaml"
    path.write_text(template.render(**values))
    return path


def plan(python: str, config: Path, *extra: str, env=None):
    return subprocess.run([python, "-m", "specforge.cli", "train", "--config", str(config), "--plan", *extra],
                          capture_output=True, text=True, timeout=120, cwd=config.parent,
                          env={**os.environ, **(env or {})})


def launch_argv(python: str, config: Path) -> list[str]:
    """The playbook's launch step, its variables filled in, as orch's torchrun block builds it."""
    [launch] = [s["launch"] for s in playbook()["steps"] if "launch" in s]
    fill = {"{{ venv }}/bin/python": python, "{{ run_config }}": str(config)}
    command = [fill.get(part, part) for part in launch["command"] if part != "{{ overrides }}"]
    return build_argv({"nproc_per_node": 2, "master_port": 29500}, command, "/run")


def test_the_playbooks_config_is_valid_and_its_plan_is_orchs_launch(specforge, tmp_path):
    config = rendered_config(tmp_path, 2)
    done = plan(specforge, config)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    [command] = result["commands"]
    theirs = command["argv"]
    ours = launch_argv(specforge, config)
    assert theirs[:3] == ours[:3] == [specforge, "-m", "torch.distributed.run"]
    assert theirs[theirs.index("--nproc_per_node") + 1] == ours[ours.index("--nproc-per-node") + 1] == "2"
    assert theirs[theirs.index("--module"):] == ours[ours.index("--module"):]


def test_inside_orchs_torchrun_the_cli_runs_as_a_worker(specforge, tmp_path):
    config = rendered_config(tmp_path, 2)
    torchrun_env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": "29500"}
    done = plan(specforge, config, "--role", "all", env=torchrun_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["kind"] == "worker"
    wrong = plan(specforge, config, "--role", "all", env={**torchrun_env, "WORLD_SIZE": "3"})
    assert wrong.returncode != 0 and "does not match" in wrong.stderr


def test_an_unknown_override_is_refused_by_specforge(specforge, tmp_path):
    done = plan(specforge, rendered_config(tmp_path, 1), "training.bogus=1")
    assert done.returncode != 0
    assert "override path 'training.bogus' does not exist" in done.stderr
