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


def test_ctrl_c_during_apply_lets_it_finish_and_says_so(inventory, venv_copy):
    """The apply goes on in the target whatever the controller does: Ctrl-C must not say
    "interrupted" and leave it completing behind the user's back."""
    import signal
    import time
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", "-i", inventory, "patch",
                                "fx-tls", "apply", "--json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)               # past start-up: the payload is rewriting and import-checking
    assert process.poll() is None, "the apply ended before Ctrl-C; the test proves nothing"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 130, err
    assert "letting the apply in progress finish" in err
    assert "interrupted, after the apply finished on dev" in err
    assert "Traceback" not in err
    [applied] = json.loads(out)
    assert applied["status"] == "patched"
    code, [status] = orch(inventory, "patch", "fx-tls", "status")
    assert (code, status["status"]) == (0, "patched")   # what the output said is what is there
