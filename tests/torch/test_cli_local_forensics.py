"""The forensics commands on the local transport (a `transport: local` host, no SSH)."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch


@pytest.fixture()
def inventory(venv_copy, tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  here: {{transport: local}}\ncontainers:\n"
                    f"  dev: {{host: here, venv: '{venv_copy.root}'}}\ndefault_target: dev\n")
    return str(path)


def orch(inventory, *args):
    out = subprocess.run([sys.executable, "-m", "orchestrator", "-i", inventory, *args, "--json"],
                         capture_output=True, text=True, timeout=600)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


def test_grep_patch_verify_locally(inventory, venv_copy):
    code, [found] = orch(inventory, "grep-torch", "--def", "is_fx_symbolic_tracing", "--show")
    assert code == 0 and found["site_packages"] == str(venv_copy.site_packages)
    assert "_is_fx_tracing_flag" in found["matches"][0]["body"]
    code, [applied] = orch(inventory, "patch", "fx-tls", "apply")
    assert (code, applied["status"]) == (0, "patched")
    code, [race] = orch(inventory, "verify", "fx-race", "--trials", "2")
    assert (code, race["verdict"]) == (0, "fixed")
    code, [reverted] = orch(inventory, "patch", "fx-tls", "revert")
    assert code == 0 and reverted["status"] == "vulnerable"
