"""The CLI on the local transport: exit codes pass through, errors are sentences."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from tests.support.cli import inventory, orch  # noqa: F401 (fixtures among them)


def test_exec_passes_argv_and_exit_code(inventory):
    out = orch("-i", inventory, "exec", "dev", "--", sys.executable, "-c",
               "import sys, json; print(json.dumps(sys.argv[1:])); sys.exit(42)", "$(id)", "a'b", "")
    assert out.returncode == 42
    assert json.loads(out.stdout) == ["$(id)", "a'b", ""]


def test_exec_forwards_piped_stdin(inventory):
    assert orch("-i", inventory, "exec", "dev", "--", "cat", stdin="piped\n").stdout == "piped\n"


def test_exec_on_a_group_prefixes_lines_and_json(inventory):
    out = orch("-i", inventory, "exec", "--json", "both", "--", "echo", "hi")
    rows = json.loads(out.stdout)
    assert [(r["target"], r["stdout"], r["exit_code"]) for r in rows] == [("dev", "hi\n", 0), ("dev2", "hi\n", 0)]


def test_bad_inventory_exits_2_with_position(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  x: {adress: 1}\n")
    out = orch("-i", str(bad), "exec", "x", "--", "true")
    assert out.returncode == 2
    assert f"{bad}:2:7: unknown key 'adress'" in out.stderr
    assert "Traceback" not in out.stderr


def test_inventory_check_reports_missing_venv(inventory):
    out = orch("-i", inventory, "inventory", "check", "--json")
    rows = {r["target"]: r for r in json.loads(out.stdout)}
    assert out.returncode == 1
    assert rows["dev"]["venv"]["present"] is False and rows["dev2"]["ok"] is True
    assert rows["dev2"]["python_version"].count(".") == 2


UNREACHABLE = """\
    hosts:
      here: {transport: local}
      gone: {address: 127.0.0.1, port: 1, user: root}
    containers:
      dev: {host: here, venv: /nonexistent/venv}
      dev2: {host: here}
      far-away-container: {host: gone, vmid: 1234}
    """


def orch_80(tmp_path, *args):
    """orch as in an 80-column terminal's pipe (rich reads COLUMNS), on UNREACHABLE."""
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(UNREACHABLE))
    return subprocess.run([sys.executable, "-m", "orchestrator", "-i", str(path), *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})


def test_ct_list_says_a_hosts_error_below_the_table(tmp_path):
    out = orch_80(tmp_path, "ct", "list", "gone")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert [cell.strip() for cell in lines[2].split("│")] == ["gone", "", "", "", "error", ""]
    assert lines[3].startswith("gone: cannot reach host gone at 127.0.0.1:1")
    assert lines[4].startswith("  hint: ") and len(lines) == 5


def test_inventory_check_fits_80_columns_with_the_problems_below(tmp_path):
    out = orch_80(tmp_path, "inventory", "check")
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    header, rows, below = lines[0], lines[2:5], lines[5:]
    assert header.split() == ["TARGET", "┃", "HOST", "┃", "CT", "┃", "OK", "┃", "PYTHON", "┃",
                              "VENV", "┃", "GPUS"]
    cells = [[cell.strip() for cell in row.split("│")] for row in rows]
    assert [c[:4] + c[5:] for c in cells] == [["dev", "here", "-", "NO", "missing", "-"],
                                              ["dev2", "here", "-", "yes", "-", "-"],
                                              ["far-away-container", "gone", "1234", "NO", "-", "-"]]
    assert all(len(line) <= 80 for line in lines[:5]), lines   # one line a row: nothing wraps
    assert below[0] == "dev: venv /nonexistent/venv missing"
    assert below[1].startswith("far-away-container: cannot reach host gone at 127.0.0.1:1")
    assert below[2].startswith("  hint: ")


def test_every_command_has_help_with_an_example():
    from orchestrator.cli.app import main
    import click

    def walk(command, path):
        yield path, command
        if isinstance(command, click.Group):  # orch's own commands load when asked for
            for name in command.list_commands(None):
                yield from walk(command.get_command(None, name), path + [name])

    commands = list(walk(main, ["orch"]))
    assert len(commands) > 30
    for path, command in commands:
        assert "Example" in (command.help or ""), f"{' '.join(path)} --help has no example"


@pytest.mark.parametrize("command", [["grep-torch", "foo"], ["patch", "fx-tls", "status"],
                                     ["verify", "fx-race"]])
def test_a_payload_error_names_the_target_once(tmp_path, command):
    inventory = tmp_path / "inv.yaml"        # the controller's python: no torch there
    inventory.write_text("hosts:\n  here: {transport: local}\ncontainers:\n  notorch: {host: here}\n"
                         "default_target: notorch\n")
    out = orch("-i", str(inventory), *command)
    assert out.returncode != 0
    assert "orch: error: notorch: " in out.stderr and "notorch: notorch:" not in out.stderr, out.stderr


def test_exec_on_a_group_keeps_a_last_line_without_newline(inventory):
    out = orch("-i", inventory, "exec", "both", "--", "sh", "-c", "printf 'a\\nlast'; printf 'e' >&2")
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["[dev2] a", "[dev2] last", "[dev] a", "[dev] last"]
    assert sorted(out.stderr.splitlines()) == ["[dev2] e", "[dev] e"]


def test_exec_help_says_which_errors_keep_their_exit_code():
    text = orch("exec", "--help").stdout
    assert "255" in text and " ".join(text.split()).count("is not running (4)") == 1


def test_a_ctrl_c_just_after_a_revert_completed_says_so(tmp_path, monkeypatch):
    """A Ctrl-C that lands after the revert finished, while its outcome is printed, once
    reached Python's default handler: "interrupted" (exit 130) for a revert that completed."""
    import os
    import signal as signals
    import time
    from click.testing import CliRunner
    from orchestrator.remote import payload_api
    from orchestrator.cli.app import main
    from orchestrator.cli.commands import torch

    inventory = tmp_path / "inv.yaml"
    inventory.write_text("hosts:\n  here: {transport: local}\ncontainers:\n  dev: {host: here}\n"
                         "default_target: dev\n")
    monkeypatch.setattr(payload_api, "fx_patch", lambda target, action, patch_set="fx-tls": {
        "status": "vulnerable", "torch_version": "2.13.0", "message": "restored the original"})
    printed = []

    def print_then_ctrl_c(target, action, outcome):
        printed.append(outcome["message"])
        os.kill(os.getpid(), signals.SIGINT)   # the user's Ctrl-C, at this very moment
        time.sleep(0.05)                       # Python runs the handler here
    monkeypatch.setattr(torch, "_print_patch", print_then_ctrl_c)
    result = CliRunner().invoke(main, ["-i", str(inventory), "patch", "fx-tls", "revert"])
    assert printed == ["restored the original"]
    assert result.exit_code == 130
    assert "interrupted, after the revert finished on dev" in result.output, result.output
