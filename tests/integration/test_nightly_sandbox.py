"""`orch nightly` for real: the sandbox DFlash playbook (real sshd, real LXC, real torch 2.13
CPU in the container, the stand-in trainer), recorded in the run store and compared.

    two runs recorded and compared          a planted slowdown (--slow-ms) is a regression
    a torch reinstall is patch drift        two nightlies at once: exactly one runs
    kill -9 mid-run leaves a readable store the real run's report in headless chromium

Everything here runs on CT 201 of host sb1 in its own venv (/root/orch-nightly-venv, a
hard-linked copy of the shared test torch venv: tests/integration/torch_seed.py), so the
torch reinstall touches no other test's torch. The tests share one data directory and run
in file order: the first run is pinned as the baseline the later ones are compared with.
Each nightly trains 3 drafters for 16 steps (about 20-40 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.ground.errors import ExitCode
from orchestrator.runs.store import RunStore
from tests.integration.nightly_target import HOST, PLAYBOOK, REPO, TARGET, VMID, small_run
from tests.integration.torch_seed import remove_venv, seed_torch_venv

pytestmark = pytest.mark.sandbox

VENV_DIR = "orch-nightly-venv"
VENV = f"/root/{VENV_DIR}"
SMALL = small_run(VENV, steps=16)
# Run-to-run noise on a shared 2-core machine is large: only a big drop counts here.
THRESHOLD = "50%"
SLOW = ["-e", "extra_args=[--slow-ms, 2500]"]      # 0.5 s steps become 3 s: about -80 %


@pytest.fixture(scope="module")
def env(sandbox, tmp_path_factory):
    data = tmp_path_factory.mktemp("nightly-data")
    seed_torch_venv(sandbox, HOST, VMID, dest=VENV_DIR)
    notify = data / "notified"
    notify.mkdir()
    environment = {**os.environ, "ORCH_DATA_DIR": str(data)}
    environment.pop("ORCH_STORE", None)
    yield {"env": environment, "data": str(data), "inventory": str(sandbox.inventory_path),
           "notify": str(notify)}
    remove_venv(sandbox, HOST, VMID, dest=VENV_DIR)


def orch(env, *args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "-i", env["inventory"], *args],
                          cwd=REPO, env=env["env"], capture_output=True, text=True, timeout=timeout)


def nightly_argv(env, *extra) -> list[str]:
    # The notifier: a command (argv, no shell) that saves the JSON summary it gets on stdin.
    notifier = [sys.executable, "-c", "import sys, os, time; "
                "open(os.path.join(sys.argv[1], str(time.time_ns()) + '.json'), 'w')"
                ".write(sys.stdin.read())", env["notify"]]
    return [sys.executable, "-m", "orchestrator", "-i", env["inventory"], "nightly", PLAYBOOK,
            "-t", TARGET, *SMALL, "--threshold", THRESHOLD, "--json",
            "--notify-command", shlex.join(notifier), *extra]


def nightly(env, *extra, timeout=600):
    done = subprocess.run(nightly_argv(env, *extra), cwd=REPO, env=env["env"],
                          capture_output=True, text=True, timeout=timeout)
    try:
        summary = json.loads(done.stdout)
    except ValueError:
        summary = None
    return done.returncode, summary, done.stderr


def store(env) -> RunStore:
    return RunStore(os.path.join(env["data"], "runs.sqlite"))


def notifications(env) -> list[dict]:
    return [json.load(open(os.path.join(env["notify"], name)))
            for name in sorted(os.listdir(env["notify"]))]


def test_two_runs_recorded_and_compared(env):
    started = time.monotonic()
    code, first, err = nightly(env)
    assert code == 0, err[-6000:]
    assert first["status"] == "ok" and first["baseline"] is None
    code, second, err = nightly(env)
    assert code == 0, err[-6000:]
    assert second["baseline"] == first["run_id"]
    print(f"two nightlies: {time.monotonic() - started:.0f} s")

    with store(env) as s:
        runs = s.list()
        assert [r.run_id for r in runs] == [second["run_id"], first["run_id"]]
        for run in (s.get(first["run_id"]), s.get(second["run_id"])):
            assert run.verdict == "ok" and run.playbook == PLAYBOOK and len(run.playbook_sha256) == 64
            assert {m.drafter for m in run.metrics} == {0, 1, 2}
            assert max(m.step for m in run.metrics) == 16
            info = run.targets[0]
            assert info.torch_version.startswith("2.13.0") and info.fx_tls_state == "patched"
            assert any(line.startswith("torch==2.13.0") for line in info.pip_freeze)
            assert run.vars["venv"] == VENV and run.vars["steps"] == 16
            assert {s.kind for s in run.steps} >= {"bootstrap", "patch", "launch", "monitor", "collect"}
            assert os.path.exists(os.path.join(run.artifacts_dir, "report.html"))
    pin = orch(env, "runs", "pin", first["run_id"])
    assert pin.returncode == 0, pin.stderr

    compared = orch(env, "runs", "compare", first["run_id"], second["run_id"], "--json",
                    "--threshold", THRESHOLD)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    data = json.loads(compared.stdout)
    assert set(data["throughput"]["per_drafter"]) == {"d0", "d1", "d2"}
    total = data["throughput"]["total"]
    assert total["base"] > 0 and total["new"] > 0
    info = data["targets"][TARGET]
    assert info["torch"]["base"] == info["torch"]["new"]
    assert info["packages"] == {"added": {}, "removed": {}, "changed": {}}
    assert [n["status"] for n in notifications(env)] == ["ok", "ok"]


def test_planted_slowdown_is_flagged_as_a_regression(env):
    code, summary, err = nightly(env, *SLOW)
    assert code == ExitCode.REGRESSION, err[-6000:]
    assert summary["verdict"] == "ok" and summary["status"] == "regression"
    with store(env) as s:
        assert summary["baseline"] == s.pinned(PLAYBOOK)
    assert any(m.startswith("total throughput fell") for m in summary["regressions"])
    assert summary["throughput_change"] < -0.5
    assert notifications(env)[-1]["status"] == "regression"
    md = open(summary["report_md"]).read()
    assert "### Regressions" in md and "total throughput fell" in md


def test_torch_reinstall_is_flagged_as_patch_drift(env, tmp_path):
    # What a user's `pip install --force-reinstall torch` does: torch's files come back
    # pristine (unpatched), whatever orch's record says.
    # (python -m pip: the seeded venv's bin/pip names the controller's venv in its #! line)
    reinstall = orch(env, "exec", TARGET, "--", f"{VENV}/bin/python", "-m", "pip", "install", "-q",
                     "--disable-pip-version-check", "--force-reinstall", "--no-deps", "--no-index",
                     "--find-links", "/var/lib/orch/wheelhouse", "torch==2.13.0", timeout=900)
    assert reinstall.returncode == 0, reinstall.stdout + reinstall.stderr

    code, summary, err = nightly(env)
    # Either the playbook re-applied the patch (run ok, exit 20: a regression against the
    # baseline) or it stopped at the drift (the run's own code, 10, wins): both report it.
    assert code in (ExitCode.REGRESSION, ExitCode.RUN_FAILED), err[-6000:]
    assert any("FX patch drifted" in m for m in summary["regressions"]), summary["regressions"]
    if code == ExitCode.REGRESSION:
        assert summary["verdict"] == "ok" and summary["fx_tls"] == {TARGET: "patched"}
    with store(env) as s:
        record = s.get(summary["run_id"])
    states = [st.data.get("state") for st in record.steps if st.kind == "patch" and st.data]
    assert states[0] == "drifted", states
    md = open(summary["report_md"]).read()
    assert "FX patch drifted" in md

    # What the user does next (the message says so): revert to reconcile, apply again.
    reconcile = tmp_path / "reconcile.yaml"
    # (the bootstrap step, a no-op here, is what points the later steps at the venv)
    reconcile.write_text(f"extends: {PLAYBOOK}\nname: reconcile\nsteps:\n"
                         "  - bootstrap: {venv: '{{ venv }}', packages: '{{ packages }}',"
                         " wheelhouse: '{{ wheelhouse }}'}\n"
                         "  - patch: {action: revert}\n  - patch: {action: apply, require: [patched]}\n")
    done = orch(env, "run", str(reconcile), "-t", TARGET, "-e", f"venv={VENV}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_two_nightlies_at_once_exactly_one_runs(env):
    with store(env) as s:
        before = len(s.list())
    procs = [subprocess.Popen(nightly_argv(env), cwd=REPO, env=env["env"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        results.append((proc.returncode, out, err))
    codes = sorted(code for code, _, _ in results)
    assert ExitCode.LOCKED in codes and codes.count(ExitCode.LOCKED) == 1, results
    winner = next(r for r in results if r[0] != ExitCode.LOCKED)
    assert winner[0] in (ExitCode.OK, ExitCode.REGRESSION), winner[2][-4000:]
    loser = next(r for r in results if r[0] == ExitCode.LOCKED)
    assert "another orch nightly of" in loser[2] and "this one exits without running" in loser[2]
    with store(env) as s:
        assert len(s.list()) == before + 1


def test_kill_9_during_a_run_leaves_a_readable_store(env):
    with store(env) as s:
        before = {r.run_id for r in s.list()}
    proc = subprocess.Popen(nightly_argv(env, "-e", "steps=400"), cwd=REPO, env=env["env"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_id = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:          # until metric points are being written
            with store(env) as s:
                new = [r for r in s.list() if r.run_id not in before]
                if new and s.metric_count(new[0].run_id) >= 6:
                    run_id = new[0].run_id
                    break
            time.sleep(0.3)
        assert run_id, "the run never got to writing metrics"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        with store(env) as s:
            assert s.integrity_check() == "ok"
            record = s.get(run_id)
            assert record.verdict == "running" and record.metrics and record.launch["targets"]
        shown = orch(env, "runs", "show", run_id, "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["verdict"] == "running"
        # The kernel dropped the dead holder's lock: the next nightly can take it.
        lock_env = dict(os.environ, ORCH_DATA_DIR=env["data"])
        probe = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.nightly.rerun "
                                "import NightlyLock; NightlyLock(sys.argv[1]).acquire()", PLAYBOOK],
                               env=lock_env, capture_output=True, text=True)
        assert probe.returncode == 0, probe.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        if run_id:   # the training went on in the container: stop it
            orch(env, "stop", run_id, "--grace", "2")


def test_the_real_runs_report_renders_in_chromium(env, tmp_path):
    from tests.integration.test_report_chromium import run_chromium
    with store(env) as s:
        record = next(r for r in s.list() if r.verdict == "ok")
    html = os.path.join(record.artifacts_dir, "report.html")
    done = run_chromium(tmp_path, "--dump-dom", f"file://{html}")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    # the run's two charts (3 drafters each) and, from the second night of its shape on, the
    # playbook's nights: the total's chart and the workers' (1 + 3 lines)
    history = dom.count('class="chart chart-history')
    assert history in (0, 2) and dom.count("<svg") == 2 + history
    assert dom.count("<polyline") == 6 + (4 if history else 0)
    assert 'data-verdict="ok"' in dom and "2.13.0+cpu" in dom and TARGET in dom
