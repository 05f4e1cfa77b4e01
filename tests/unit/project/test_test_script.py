"""scripts/test.sh, the README's test command, run with stand-ins for what it starts.

The stand-ins are a no-op setup and sandbox and a python whose pytest exits with a chosen
status: what is tested is the script's own control flow, which CI's verdict rests on.
"""

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

FAKE_PYTHON = """#!/bin/sh
# -c CODE PROGRAM ARGS...: the script's usual_signals wrapper; run PROGRAM ARGS
if [ "$1" = -c ]; then shift 2; exec "$@"; fi
if [ "$1 $2" = "-m tests.prefetch" ]; then echo "prefetch: torch ready in 0 s: /cache"; exit 0; fi
if [ "$1 $2" = "-m pytest" ]; then echo "pytest $*"; exit "$FAKE_PYTEST_STATUS"; fi
echo "unexpected: $*" >&2; exit 99
"""


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    _executable(tmp_path / "scripts" / "setup.sh", "#!/bin/sh\nexit 0\n")
    _executable(tmp_path / ".venv" / "bin" / "orch", "#!/bin/sh\nexit 0\n")
    _executable(tmp_path / ".venv" / "bin" / "python", FAKE_PYTHON)
    return tmp_path


def _run(checkout: Path, pytest_status: int, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FAKE_PYTEST_STATUS=str(pytest_status), TMPDIR=str(checkout))
    return subprocess.run(["bash", str(checkout / "scripts" / "test.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("status", [0, 1])
def test_the_whole_suite_exits_with_pytests_status_after_the_prefetch_has_ended(checkout, status):
    done = _run(checkout, status, "-q")
    assert done.returncode == status, done.stdout + done.stderr
    assert "prefetch: torch ready" in done.stdout
    assert "the suite took" in done.stdout and f"(pytest exit code {status})" in done.stdout
    assert re.search(r"the CPUs were busy \d+ % of that time", done.stdout)


def test_a_chosen_test_path_is_one_session_with_no_prefetch(checkout):
    done = _run(checkout, 0, "tests/unit")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("pytest -m pytest") == 1 and "prefetch:" not in done.stdout
