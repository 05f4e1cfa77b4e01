"""Every payload speaks one protocol and reads GPUs one way: the JSON lines of _protocol.py
(emit, fail, run_main), and the nvidia-smi query of _gpus.py with its one set of key names,
which the controller keeps (runs/gpu.py, inventory check, reports)."""

from __future__ import annotations

import ast
import os
import stat
import sys

import pytest

from orchestrator.payloads import payload_source
from orchestrator.runs import gpu
from tests.fixtures.payloads import PAYLOADS, run_payload

SHARED_NAMES = {"emit", "fail", "parse_args", "run_main", "PayloadError", "query_gpus"}
# Not event streams, so not on _protocol: remote/session.py's request/response command server,
# the wrapper whose output is the wrapped command's own (remote/container.py), and orch
# forward's relay, whose stdin and stdout are a TCP connection's bytes (remote/forward.py).
TRANSPORT_HELPERS = {"exec_server", "reaper", "forward"}
PROTOCOL_LINE = "from _protocol import *  # orch: inlined when shipped"
GPUS_LINE = "from _gpus import *  # orch: inlined when shipped"
EVENT_PAYLOADS = sorted(p.stem for p in PAYLOADS.glob("*.py")
                        if not p.stem.startswith("_") and p.stem not in TRANSPORT_HELPERS)


def code_strings(tree: ast.AST) -> list[str]:
    """The string constants of a module that are code, not docstrings."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_payloads_are_all_there():
    assert {"bootstrap", "fx_patch", "fx_race", "launcher", "probe", "source_read",
            "source_search", "torch_locate"} <= set(EVENT_PAYLOADS)


@pytest.mark.parametrize("name", EVENT_PAYLOADS)
def test_every_payload_uses_the_shared_protocol(name):
    text = (PAYLOADS / f"{name}.py").read_text()
    tree = ast.parse(text)
    assert PROTOCOL_LINE in text.splitlines(), f"{name} does not import _protocol"
    own = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert not own & SHARED_NAMES, f"{name} defines its own {sorted(own & SHARED_NAMES)}"
    for node in ast.walk(tree):  # every line out goes through emit
        if isinstance(node, ast.Call):
            called = ast.unparse(node.func)
            assert called not in ("print", "sys.stdout.write"), f"{name}:{node.lineno}: {called}"


@pytest.mark.parametrize("name", EVENT_PAYLOADS)
def test_gpus_are_read_only_through_the_shared_query(name):
    text = (PAYLOADS / f"{name}.py").read_text()
    tree = ast.parse(text)
    assert not [s for s in code_strings(tree) if "nvidia-smi" in s or "query-gpu" in s], \
        f"{name} runs nvidia-smi itself"
    reads_gpus = any(isinstance(node, ast.Name) and node.id in ("query_gpus", "query_gpu_models",
                                                                "cuda_version", "nvidia_smi_present")
                     for node in ast.walk(tree))
    assert reads_gpus == (GPUS_LINE in text.splitlines()), name


def test_the_payloads_that_read_gpus_are_the_probe_the_launcher_the_preflight_and_the_machine():
    readers = [name for name in EVENT_PAYLOADS if GPUS_LINE in (PAYLOADS / f"{name}.py").read_text()]
    assert readers == ["launcher", "machine", "preflight", "probe"]


FAKE_SMI = """#!/bin/sh
case "$*" in *--query-gpu=index,name,utilization.gpu,memory.used,memory.total,power.draw*) ;;
  *) echo "unexpected query: $*" >&2; exit 2;; esac
echo "0, NVIDIA H200, 37, 1200, 143771, 301.25"
echo "1, NVIDIA H200, [N/A], 3, 143771, [Not Supported]"
"""


@pytest.fixture()
def fake_smi(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_the_probe_reports_gpus_with_the_shared_key_names(fake_smi, tmp_path):
    probe = run_payload(sys.executable, "probe", {"venv": None}, env=fake_smi, via_stdin=True,
                        cwd=str(tmp_path)).expect_result()
    assert probe["gpus"] == [
        {"index": 0, "name": "NVIDIA H200", "utilization_pct": 37.0, "memory_used_mib": 1200.0,
         "memory_total_mib": 143771.0, "power_w": 301.25},
        {"index": 1, "name": "NVIDIA H200", "utilization_pct": None, "memory_used_mib": 3.0,
         "memory_total_mib": 143771.0, "power_w": None}]
    # the controller's series keeps these very names (all but the board's name)
    assert set(gpu.SAMPLE_KEYS) == set(probe["gpus"][0]) - {"name"}
    assert gpu.gpu_row(probe["gpus"][0]) == {k: v for k, v in probe["gpus"][0].items() if k != "name"}


def test_the_probe_without_nvidia_smi_says_none(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}    # no nvidia-smi anywhere
    assert run_payload(sys.executable, "probe", {"venv": None}, env=env,
                       via_stdin=True).expect_result()["gpus"] is None


def test_a_failing_nvidia_smi_is_an_error_entry_not_a_crash(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    gpus = run_payload(sys.executable, "probe", {"venv": None}, env=env, via_stdin=True).expect_result()["gpus"]
    assert gpus == {"error": "NVIDIA-SMI has failed because it could not communicate"}


def test_shared_modules_are_inlined_once_each():
    shipped = payload_source("launcher").decode()
    assert shipped.count("# --- _protocol.py, inlined by orch ---") == 1
    assert shipped.count("# --- _gpus.py, inlined by orch ---") == 1


def test_the_controllers_ast_parses_hold_one_lock(monkeypatch):
    """ast is not thread-safe before CPython fixes #106905: two nodes' steps compacting a
    payload at once failed with "AST constructor recursion depth mismatch"."""
    import ast
    from orchestrator import payloads
    from orchestrator.watch.logformats import literal_dict
    held = []
    real_parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **k: held.append(payloads.AST_LOCK.locked())
                        or real_parse(*a, **k))
    payloads.compact_source.cache_clear()
    try:
        payloads.compact_source("probe")
    finally:
        payloads.compact_source.cache_clear()
    assert literal_dict("{'loss': 2.5}") == {"loss": 2.5}
    assert held and all(held), held
