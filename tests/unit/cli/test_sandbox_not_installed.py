"""`orch sandbox ...` without the sandbox distribution (a plain `pip install .`): every
subcommand says what the sandbox is and how to get it, exits 2, and shows no traceback;
`orch --help` still lists the group. (tests/packaging/test_wheel_install.py proves the same
with the built wheel in a fresh venv.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from orchestrator.cli.app import main
from orchestrator.cli.commands.sandbox import SANDBOX_NOT_INSTALLED_EXIT

SUBCOMMANDS = [["up"], ["up", "--hosts", "1", "--json"], ["down"], ["down", "--purge"],
               ["status"], ["status", "--json"], ["build-root"]]


@pytest.fixture
def no_sandbox(monkeypatch):
    # None in sys.modules makes `import orch_sandbox` raise ModuleNotFoundError, as when it
    # is not installed; the package's submodules go too, so none is found half-imported.
    for name in [name for name in sys.modules if name.split(".")[0] == "orch_sandbox"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "orch_sandbox", None)


@pytest.mark.parametrize("argv", SUBCOMMANDS, ids=" ".join)
def test_every_sandbox_command_says_how_to_get_it(no_sandbox, argv):
    result = CliRunner().invoke(main, ["sandbox", *argv])
    assert result.exit_code == SANDBOX_NOT_INSTALLED_EXIT == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    text = " ".join(result.stderr.split())
    assert text.startswith("error: the sandbox is not installed.")
    assert "pip install -e . -e ./sandbox" in text and "LXC" in text
    assert result.stdout == ""


def test_help_still_lists_the_sandbox_without_it(no_sandbox):
    listing = CliRunner().invoke(main, ["--help"])
    assert listing.exit_code == 0 and "sandbox" in listing.output
    group = CliRunner().invoke(main, ["sandbox", "--help"])
    assert group.exit_code == 0 and "pip install -e . -e ./sandbox" in " ".join(group.output.split())
    command = CliRunner().invoke(main, ["sandbox", "up", "--help"])
    assert command.exit_code == 0 and "--real-root" in command.output


def test_orch_does_not_import_the_sandbox_until_a_sandbox_command_runs():
    # A fresh interpreter: this session's other tests may have imported orch_sandbox already.
    code = ("import sys\n"
            "from orchestrator.cli.app import main\n"
            "main(['--help'], standalone_mode=False)\n"
            "print('orch_sandbox' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"
