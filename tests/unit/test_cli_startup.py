"""orch starts quickly: `--version`, `--help` and every `CMD --help` import no SSH, no jinja2,
no playbook or monitor code, and the thin client that hands commands to the agent imports
neither click nor paramiko (docs/agent.md). Measured with sys.modules in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from orchestrator import cli
from orchestrator.agent.client import is_fast_command

# Never for start-up or help: these are what made every command cost 0.3-0.6 s.
HEAVY = ("paramiko", "invoke", "fabric", "jinja2", "proxmoxer", "requests", "yaml", "mcp",
         "orchestrator.fleet", "orchestrator.remote.ssh", "orchestrator.proxmox",
         "orchestrator.monitor", "orchestrator.playbook", "orchestrator.engine",
         "orchestrator.attach", "orchestrator.nightly", "orchestrator.steps", "orchestrator.agentd")
# Everything outside the standard library `orch --version` and `orch --help` may import.
STARTUP_THIRD_PARTY = {"__main__", "click", "rich", "pygments", "markdown_it", "mdurl", "orchestrator",
                       "_distutils_hack"}

PROBE = """
import json, sys
sys.argv = ["orch", *json.loads(sys.argv[1])]
try:
    from orchestrator.main import main
    main()
except SystemExit:
    pass
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


def modules_after(*args: str, env: dict | None = None) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(args))],
                         capture_output=True, text=True, timeout=60, env=env)
    line = next(line for line in out.stderr.splitlines() if line.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def third_party(modules: set[str]) -> set[str]:
    tops = {m.split(".")[0] for m in modules}
    return {t for t in tops if t not in sys.stdlib_module_names and not t.startswith("__editable__")}


@pytest.mark.parametrize("args", [["--version"], ["--help"], []])
def test_version_and_help_import_only_click_and_rich(args):
    modules = modules_after(*args)
    assert heavy(modules) == []
    assert third_party(modules) <= STARTUP_THIRD_PARTY, third_party(modules) - STARTUP_THIRD_PARTY


def _every_command_path():
    paths = []
    for name in cli.LAZY_COMMANDS:
        command = cli.load_command(name)
        if command is None:
            continue
        paths.append([name])
        if isinstance(command, click.Group):
            paths.extend([name, sub] for sub in command.commands)
    return paths


@pytest.mark.parametrize("path", _every_command_path(), ids=" ".join)
def test_every_command_help_imports_nothing_heavy(path):
    assert heavy(modules_after(*path, "--help")) == []


def test_the_thin_client_imports_neither_click_nor_paramiko():
    probe = ("import sys; from orchestrator import main; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('click', 'paramiko', 'rich', 'yaml', 'typing')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_help_table_says_what_each_command_says():
    """`orch --help` is written from cli.LAZY_COMMANDS: it must match the commands' help."""
    for name, (_, _, first_paragraph) in cli.LAZY_COMMANDS.items():
        command = cli.load_command(name)
        if command is None:
            continue
        stand_in = click.Command(name, help=first_paragraph)
        assert stand_in.get_short_help_str(1000) == command.get_short_help_str(1000), name


def test_help_lists_every_command_without_loading_it():
    listing = subprocess.run([sys.executable, "-m", "orchestrator", "--help"], capture_output=True,
                             text=True, timeout=60).stdout
    listed = [line.split()[0] for line in listing.split("Commands:\n")[1].splitlines()]
    expected = sorted(n for n in cli.LAZY_COMMANDS if cli.load_command(n) is not None)
    assert listed == expected


@pytest.mark.parametrize("args, fast", [
    (["exec", "ct", "--", "true"], True),
    (["-i", "inv.yaml", "exec", "ct", "true"], True),
    (["--inventory=inv.yaml", "grep-torch", "x"], True),
    (["-iinv.yaml", "grep-pkg", "triton", "x"], True),
    (["inventory", "check"], True),
    (["ct", "list"], True),
    (["ct", "status", "x"], True),
    (["ct", "start", "x"], False),
    (["patch", "fx-tls", "status"], True),
    (["patch", "fx-tls", "-t", "apply", "diff"], True),
    (["patch", "fx-tls", "apply"], False),
    (["patch", "fx-tls", "--target", "diff", "revert"], False),
    (["verify", "fx-race"], True),
    (["--no-agent", "exec", "ct", "true"], False),
    (["--trust-new-host-keys", "exec", "ct", "true"], False),
    (["--help"], False),
    (["run", "playbook.yaml"], False),
    (["nightly", "playbook.yaml"], False),
    ([], False),
])
def test_which_commands_go_to_the_agent(args, fast):
    assert is_fast_command(args) is fast
