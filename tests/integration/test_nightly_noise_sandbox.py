"""`orch nightly`'s noise model for real: the sandbox DFlash playbook (the stand-in trainer on
real torch 2.13 CPU in CT 201 of sb1) run six times into one fresh store.

    four quiet nights     too little history: "insufficient data", the fixed threshold judges
    a fifth quiet night   of two runs (--repeat 2), judged against the four's measured noise:
                          never a regression; the mean of its two runs, their samples pooled
    a slowed night        (--slow-ms: about -80 %) far outside the noise: a regression at once
    acknowledged          `orch runs ack`, then the next slowed night exits 0, "acknowledged"
                          with who and why in nightly.json and the report

The machine is shared and busy, so a quiet night may come out "suspected" (exit 0); what is
promised, and checked, is that it never exits 20. Each nightly takes about 20-40 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.ground.errors import ExitCode
from tests.integration.torch_seed import remove_venv, seed_torch_venv

pytestmark = pytest.mark.sandbox

HOST, VMID, TARGET = "sb1", 201, "sb1-201"
VENV_DIR = "orch-noise-venv"
VENV = f"/root/{VENV_DIR}"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(REPO, "playbooks", "dflash-sandbox.yaml")
SMALL = ["-e", f"venv={VENV}", "-e", "steps=16", "-e", "log_every=2", "-e", "verify_trials=1",
         "-e", "degraded_below=0", "-e", "hang_after=90"]
SLOW = ["-e", "extra_args=[--slow-ms, 2500]"]


@pytest.fixture(scope="module")
def env(sandbox, tmp_path_factory):
    data = tmp_path_factory.mktemp("noise-data")
    seed_torch_venv(sandbox, HOST, VMID, dest=VENV_DIR)
    environment = {**os.environ, "ORCH_DATA_DIR": str(data)}
    environment.pop("ORCH_STORE", None)
    yield {"env": environment, "inventory": str(sandbox.inventory_path)}
    remove_venv(sandbox, HOST, VMID, dest=VENV_DIR)


def orch(env, *args):
    return subprocess.run([sys.executable, "-m", "orchestrator", "-i", env["inventory"], *args],
                          cwd=REPO, env=env["env"], capture_output=True, text=True, timeout=120)


def nightly(env, *extra):
    # 50 %: while the history is short the fixed threshold judges, and this machine is noisy.
    done = subprocess.run([sys.executable, "-m", "orchestrator", "-i", env["inventory"], "nightly",
                           PLAYBOOK, "-t", TARGET, *SMALL, "--threshold", "50%", "--json", *extra],
                          cwd=REPO, env=env["env"], capture_output=True, text=True, timeout=600)
    assert done.stdout, done.stderr[-6000:]
    return done.returncode, json.loads(done.stdout)


def test_quiet_nights_stay_quiet_a_slowed_one_is_a_regression_and_an_acknowledged_one_is_not(env):
    for night in range(4):
        code, summary = nightly(env)
        assert code == 0 and summary["verdict"] == "ok", summary
        assert summary["noise"]["status"] == "insufficient data"
        assert f"{night} earlier run(s) of this shape" in summary["noise"]["metrics"][0]["reason"]

    code, summary = nightly(env, "--repeat", "2")
    assert code == 0 and summary["status"] in ("ok", "suspected"), summary["noise"]
    assert len(summary["runs"]) == 2 and summary["run_id"] == summary["runs"][-1]
    total = next(m for m in summary["noise"]["metrics"] if m["metric"] == "total")
    assert total["window_runs"] == 4 and total["samples"] >= 6 and total["p"] is not None
    assert total["repeats"] == 2
    assert total["status"] in ("ok", "suspected") and total["noise_pct"] > 0

    code, summary = nightly(env, *SLOW)
    total = next(m for m in summary["noise"]["metrics"] if m["metric"] == "total")
    assert total["effect"] < -0.5 and total["p"] < 0.01
    if summary["status"] != "regression":
        # This machine's nights spread 10-20 % when it is busy: -90 % can land just short of
        # "far outside the noise" (z -6) for every metric. Then the next slowed night
        # confirms it. (One metric far out, the total or a drafter's, is a regression now.)
        assert code == 0 and total["status"] == "suspected", summary["noise"]
        assert "confirmed if the next night is slow too" in total["reason"]
        code, summary = nightly(env, *SLOW)
    assert code == ExitCode.REGRESSION and summary["status"] == "regression", summary["noise"]
    assert any(m["status"] == "regression" for m in summary["noise"]["metrics"])
    assert any(m.startswith(("total throughput: ", "d")) for m in summary["regressions"])
    assert "measured noise: regression" in open(summary["report_md"]).read()

    flagged = [m["metric"] for m in summary["noise"]["metrics"]
               if m["status"] in ("regression", "suspected")]
    done = orch(env, "runs", "ack", PLAYBOOK, "--reason", "slowed on purpose",
                "--by", "the sandbox test")
    assert done.returncode == 0, done.stderr
    code, summary = nightly(env, *SLOW)
    # Not re-reported: exit 0 and no throughput regression. A metric the noise model still
    # flags says "acknowledged" with who and why; one whose window now holds the slowed
    # nights may be judged ok outright (the new level on its way to being the baseline).
    assert code == 0 and not any(m.startswith(("total throughput", "d")) for m in summary["regressions"])
    statuses = {m["metric"]: m["status"] for m in summary["noise"]["metrics"]}
    assert set(statuses.values()) <= {"acknowledged", "ok"}, summary["noise"]
    for metric in summary["noise"]["metrics"]:
        if metric["status"] == "acknowledged":
            assert metric["ack"]["by"] == "the sandbox test"
            assert metric["ack"]["reason"] == "slowed on purpose"
            assert "acknowledged by the sandbox test" in open(summary["report_md"]).read()
    active = json.loads(orch(env, "runs", "acks", "--json").stdout)
    assert sorted(a["metric"] for a in active) == sorted(flagged)      # still held: not recovered
