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


def orch_text(inventory, *args, env=None):
    import os
    out = subprocess.run([sys.executable, "-m", "orchestrator", "-i", inventory, *args],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, **(env or {})))
    assert "Traceback" not in out.stderr, out.stderr
    return out


def test_fx_threads_status_apply_verify_revert_locally(inventory, venv_copy):
    status = orch_text(inventory, "patch", "fx-threads", "status")
    assert status.returncode == 1, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    assert any("FX tracing flag: VULNERABLE  torch/fx/_symbolic_trace.py:44" in l for l in lines)
    assert any("FX node-meta state: VULNERABLE  torch/fx/traceback.py:42" in l for l in lines)
    assert any("FX trace-time patching: VULNERABLE  torch/fx/_symbolic_trace.py:1218" in l
               for l in lines)
    applied = orch_text(inventory, "patch", "fx-threads", "apply")
    assert applied.returncode == 0 and "FX node-meta state: patched by orch" in applied.stdout
    race = orch_text(inventory, "verify", "fx-threads", "--trials", "2")
    assert race.returncode == 0, race.stdout + race.stderr
    [flag] = [l for l in race.stdout.splitlines() if ": FX tracing flag:" in l]
    [node] = [l for l in race.stdout.splitlines() if ": FX node-meta state:" in l]
    assert "cross-thread raised 0/2, same-thread control raised 2/2 -> fixed" in flag
    assert "KeyError 'custom' 0/2, annotation leaked 0/2, same-thread control held 2/2 -> " \
        "fixed" in node
    [patching] = [l for l in race.stdout.splitlines() if ": FX trace-time patching:" in l]
    assert "module call failed 0/2, same-thread control held 2/2 -> fixed" in patching
    code, [reverted] = orch(inventory, "patch", "fx-threads", "revert")
    assert code == 0 and reverted["status"] == "vulnerable"
    race = orch_text(inventory, "verify", "fx-threads", "--trials", "2")
    assert race.returncode == 1 and "KeyError 'custom' 2/2" in race.stdout


def test_a_busy_torch_tree_exits_21_with_a_sentence(inventory, venv_copy):
    import fcntl
    import os
    fd = os.open(venv_copy.site_packages / "torch", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)    # an apply in progress elsewhere
        out = orch_text(inventory, "patch", "fx-threads", "status",
                        env={"ORCH_FX_PATCH_LOCK_WAIT": "0.5"})
    finally:
        os.close(fd)
    assert out.returncode == 21, out.stdout + out.stderr
    assert "another orch patch action is changing torch" in out.stderr
