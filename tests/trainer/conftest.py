"""Fixtures for the stand-in trainer tests: a python with real torch, one shared inductor
cache for the session, and a runner that parses the trainer's key=value log lines.

The torch venv comes from ORCH_TEST_TORCH_VENV, or is built once (and reused) by
tests/support/torchenv.py, the builder every test that needs torch shares.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.torchenv import torch_venv

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "playbooks" / "files" / "train_drafters.py"

STEP_RE = re.compile(r"^drafter=(\d+) step=(\d+) loss=(\S+) tok_s=(\d+)$")


# ------------------------------------------------------------------ the torch venv


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def torch_python() -> Path:
    env = os.environ.get("ORCH_TEST_TORCH_VENV")
    venv = Path(env) if env else Path(torch_venv())   # the one builder, under its one lock
    python = _venv_python(venv)
    if not python.exists():
        pytest.fail(f"ORCH_TEST_TORCH_VENV={venv}: no {python}")
    return python


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory) -> Path:
    """One inductor cache for the whole session: a cold compile costs ~13 s, a warm one
    ~2.5 s. Private to this session, so no run ever sees a foreign cache."""
    return tmp_path_factory.mktemp("inductor-cache")


# ----------------------------------------------------------------------- the runner


@dataclass
class TrainerResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()

    def starting(self, prefix: str) -> list[str]:
        return [line for line in self.lines if line.startswith(prefix)]

    def fields(self, line: str) -> dict[str, str]:
        return dict(part.split("=", 1) for part in line.split() if "=" in part)

    def summary(self) -> dict[str, str]:
        found = self.starting("summary ")
        assert len(found) == 1, f"want one summary line:\n{self.describe()}"
        return self.fields(found[0])

    def steps(self) -> dict[int, list[int]]:
        """drafter -> the step numbers of its step lines, in order."""
        out: dict[int, list[int]] = {}
        for line in self.lines:
            m = STEP_RE.match(line)
            if m:
                out.setdefault(int(m.group(1)), []).append(int(m.group(2)))
        return out

    def describe(self) -> str:
        tail = "\n".join(self.stderr.splitlines()[-40:])
        return (f"argv: {' '.join(self.argv)}\nrc={self.returncode} in {self.seconds:.1f}s\n"
                f"--- stdout\n{self.stdout}--- stderr (tail)\n{tail}")


@pytest.fixture(scope="session")
def run_trainer(torch_python, inductor_cache):
    def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
            script: Path = TRAINER) -> TrainerResult:
        argv = [str(torch_python), str(script), *args]
        full_env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache),
                    "PYTHONUNBUFFERED": "1", **(env or {})}
        start = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=full_env, cwd=REPO)
        result = TrainerResult(argv, proc.returncode, proc.stdout, proc.stderr,
                               time.monotonic() - start)
        sys.stdout.write(f"[trainer] {' '.join(args)} -> rc={result.returncode} "
                         f"in {result.seconds:.1f}s\n")
        return result

    return run
