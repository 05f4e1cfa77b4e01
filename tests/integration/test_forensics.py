"""Torch forensics through orch's CLI, into real containers over SSH (issue 3).

Two sandbox containers get a real torch 2.13 venv at /root/torch-venv; the CLI runs
grep-torch, patch fx-tls and verify fx-race on them exactly as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from orchestrator.targets.fleet import Fleet
from tests.integration.torch_seed import seed_torch_venv

VENV = "torch-venv"
TARGETS = [("sb1", 201), ("sb2", 201)]
pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("cli_path")]  # agent and direct


@pytest.fixture(scope="module")
def inventory(sandbox, tmp_path_factory):
    for host, vmid in TARGETS:
        seed_torch_venv(sandbox, host, vmid, VENV)
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    for host, vmid in TARGETS:
        data["containers"][f"{host}-{vmid}"]["venv"] = f"/root/{VENV}"
    data["groups"]["torch"] = [f"{host}-{vmid}" for host, vmid in TARGETS]
    data["default_target"] = "sb1-201"
    path = tmp_path_factory.mktemp("forensics") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def orch(inventory, *args, timeout=600):
    out = subprocess.run([sys.executable, "-m", "orchestrator", "-i", inventory, *args],
                         capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def orch_json(inventory, *args):
    out = orch(inventory, *args, "--json")
    return out.returncode, json.loads(out.stdout)


def grep_in_container(inventory, site_packages, pattern):
    """The manual way, inside the same container: grep -rn over torch's .py files."""
    with Fleet.from_path(inventory) as fleet:
        ct = fleet.targets(["sb1-201"])[0]
        result = ct.run(["sh", "-c", 'cd "$1" && grep -rnF --include=*.py -e "$2" torch', "sh",
                         site_packages, pattern], timeout=120)
    hits = set()
    for line in result.text.splitlines():
        path, number, text = line.split(":", 2)
        hits.add((path, int(number), text))
    return hits


@pytest.mark.parametrize("pattern", ["_is_fx_tracing_flag", "def is_fx_symbolic_tracing",
                                     "force_compile_during_fx_trace"])
def test_grep_hits_equal_grep_rn(inventory, pattern):
    code, [report] = orch_json(inventory, "grep-torch", "-F", pattern, "--max-hits", "5000")
    assert code == 0 and report["version"].startswith("2.13.0")
    ours = {(m["path"], m["line"], m["text"]) for m in report["matches"]}
    assert ours == grep_in_container(inventory, report["site_packages"], pattern)


def test_def_show_answers_the_question(inventory):
    out = orch(inventory, "grep-torch", "--def", "is_fx_symbolic_tracing", "--show")
    assert out.returncode == 0
    assert "torch/fx/_symbolic_trace.py:" in out.stdout
    assert "return _is_fx_tracing_flag and not torch.compiler.is_compiling()" in out.stdout
    code, [report] = orch_json(inventory, "grep-torch", "--def", "Tracer.trace", "--show")
    [definition] = report["matches"]
    assert definition["kind"] == "method" and "global _is_fx_tracing_flag" in definition["body"]
    code, [report] = orch_json(inventory, "grep-torch", "--def", "_is_fx_tracing_flag")
    assert [m["kind"] for m in report["matches"]] == ["assignment"]


@pytest.mark.parametrize("pattern", ["$(touch /tmp/pwned)", "`touch /tmp/pwned`", "'; touch /tmp/pwned; '",
                                     "a\nb", '"quoted"'])
def test_hostile_patterns_are_searched_never_run(inventory, pattern):
    out = orch(inventory, "grep-torch", "-F", pattern, "-t", "torch")
    assert out.returncode == 1  # no hit, no error
    with Fleet.from_path(inventory) as fleet:
        for ct in fleet.targets(["torch"]):
            assert ct.run(["test", "-e", "/tmp/pwned"]).exit_code == 1


def test_many_targets_each_reported_on_its_own(inventory):
    out = orch(inventory, "grep-torch", "-F", "_is_fx_tracing_flag", "-t", "torch", "-t", "sb2-200", "--json")
    reports = {r["target"]: r for r in json.loads(out.stdout)}
    assert reports["sb1-201"]["hits"] > 0 and reports["sb2-201"]["hits"] == reports["sb1-201"]["hits"]
    assert "error" in reports["sb2-200"]  # no venv there: its own error, the others unaffected
    assert out.returncode != 0


def test_output_is_capped_with_a_note(inventory):
    out = orch(inventory, "grep-torch", "import", "--max-hits", "5")
    assert out.stdout.count("\n") >= 5 and "output cut at 5 hits" in out.stderr


def test_patch_life_cycle_through_ssh(inventory):
    code, [status] = orch_json(inventory, "patch", "fx-tls", "status", "-t", "sb2-201")
    assert (code, status["status"]) == (1, "vulnerable")
    code, [diff] = orch_json(inventory, "patch", "fx-tls", "diff", "-t", "sb2-201")
    assert "+def _get_is_fx_tracing" in diff["diff"] or "_get_is_fx_tracing" in diff["diff"]
    code, [applied] = orch_json(inventory, "patch", "fx-tls", "apply", "-t", "sb2-201")
    assert (code, applied["status"], applied["changed"]) == (0, "patched", True)
    code, [race] = orch_json(inventory, "verify", "fx-race", "-t", "sb2-201", "--trials", "3")
    assert (code, race["cross_thread_raised"], race["same_thread_raised"]) == (0, 0, 3)
    code, [again] = orch_json(inventory, "patch", "fx-tls", "apply", "-t", "sb2-201")
    assert (code, again["changed"]) == (0, False)
    code, [reverted] = orch_json(inventory, "patch", "fx-tls", "revert", "-t", "sb2-201")
    assert code == 0 and {f["dist_record"] for f in reverted["files"]} == {"ok"}
    code, [race] = orch_json(inventory, "verify", "fx-race", "-t", "sb2-201", "--trials", "3")
    assert (code, race["cross_thread_raised"], race["same_thread_raised"]) == (1, 3, 3)
