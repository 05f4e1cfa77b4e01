"""The contract every payload keeps with the controller: standalone stdlib files for Python
3.8+, one JSON argument, JSON lines out, a final result or error line and its exit code."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from orchestrator.payloads import INLINE_MARK, payload_source
from tests.fixtures.payloads import PAYLOADS, run_payload

NAMES = ["torch_locate", "source_search", "fx_patch", "fx_race", "probe"]
STDLIB = set(sys.stdlib_module_names)


def source(name: str) -> str:
    """What is shipped: the payload with the shared modules inlined."""
    return payload_source(name).decode()


@pytest.mark.parametrize("name", NAMES)
def test_parses_as_python_38(name):
    ast.parse(source(name), feature_version=(3, 8))


@pytest.mark.parametrize("name", NAMES)
def test_uses_no_api_newer_than_python_38(name):
    # Syntax is checked above; these are the 3.9+ library calls easy to slip in.
    text = source(name)
    for newer in ("removeprefix", "removesuffix", "ast.unparse", "functools.cache(",
                  "importlib.resources.files", "zoneinfo", "str | None", "dict[str,"):
        assert newer not in text, f"{name} uses {newer} (Python > 3.8)"


@pytest.mark.parametrize("name", NAMES)
def test_imports_only_the_standard_library_at_module_level(name):
    tree = ast.parse(source(name))
    for node in tree.body:
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots = [(node.module or "").split(".")[0]]
        else:
            continue
        assert set(roots) <= STDLIB, f"{name} imports {roots} (payloads ship alone)"


def test_only_fx_race_imports_torch():
    # fx_patch's post-apply check imports torch too, but from a string run in a
    # subprocess: no import statement of the payload itself may name torch.
    for name in NAMES:
        imports_torch = any(
            isinstance(node, ast.Import)
            and any(a.name.split(".")[0] == "torch" for a in node.names)
            or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch"
            for node in ast.walk(ast.parse(source(name))))
        assert imports_torch == (name == "fx_race"), name


@pytest.mark.parametrize("name", NAMES)
def test_shipped_script_is_self_contained(name, tmp_path):
    # Fed on stdin from an empty folder, as in a container: nothing else to import from.
    proc = subprocess.run([sys.executable, "-", "not json"], input=source(name), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert not INLINE_MARK.search(source(name))
    event = json.loads(proc.stdout.splitlines()[-1])
    assert (proc.returncode, event["event"], event["kind"]) == (1, "error", "bad-args"), proc


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("argument, complaint", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"no_such_option": 1}', "unknown option"),
])
def test_bad_arguments_are_one_error_line(name, argument, complaint):
    proc = subprocess.run([sys.executable, str(PAYLOADS / f"{name}.py"), argument],
                          capture_output=True, text=True, timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc
    event = json.loads(lines[0])
    assert (event["event"], event["kind"]) == ("error", "bad-args")
    assert complaint in event["message"]
    assert "Traceback" not in proc.stderr


def test_wrong_type_is_rejected():
    run = run_payload(sys.executable, "source_search", {"pattern": "x", "context": "3"})
    assert "must be of type int" in run.expect_error("bad-args")["message"]
    run = run_payload(sys.executable, "source_search", {"pattern": "x", "fixed": 1})
    assert "must be of type bool" in run.expect_error("bad-args")["message"]


def test_runs_fed_on_stdin_like_the_controller_does(tmp_path):
    run = run_payload(sys.executable, "torch_locate", {"package": "pytest"}, via_stdin=True,
                      cwd=str(tmp_path))
    assert run.expect_result()["import_name"] == "pytest"
