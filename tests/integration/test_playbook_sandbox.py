"""The DFlash playbook against the sandbox (real sshd, real LXC, real torch 2.13 CPU in the
container, the stand-in trainer): the race diagnosed, the patch fixing it, a hang stopped,
a link dropped for 10 s while monitoring, a killed controller and `orch attach`, and an
idempotent bootstrap.

Costs on 2 cores: torch goes into the container's venv once per session (about 25 s; its
wheels are pushed from the controller's wheelhouse); the inductor cache in the container
is shared by every run, so only the first compile is cold.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.ground import paths
from orchestrator.remote import payload_api
from orchestrator.targets.fleet import Fleet
from orchestrator.remote.payload_api import launcher
from orchestrator.runs.store import RunStore
from tests.support.processes import sigkilled_after

TARGET = "sb2-201"
HOST = "sb2"
VENV = "/root/orch-playbook-venv"   # not the containers' /root/venv: other tests own that
PLAYBOOK = "playbooks/dflash-sandbox.yaml"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORCH = [sys.executable, "-c", "from orchestrator.cli.app import main; main()"]


def orch(sandbox, *args, timeout=600, check_code=None):
    """`orch -i SANDBOX_INVENTORY ...` as a user runs it; returns (exit code, output)."""
    done = subprocess.run([*ORCH, "-i", str(sandbox.inventory_path), *args], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check_code is not None:
        assert done.returncode == check_code, done.stdout[-6000:]
    return done.returncode, done.stdout


def run_playbook(sandbox, *extra, timeout=600, check_code=None):
    args = ["run", PLAYBOOK, "-t", TARGET, "-e", f"venv={VENV}", *extra]
    return orch(sandbox, *args, timeout=timeout, check_code=check_code)


@pytest.fixture(scope="session")
def target(sandbox):
    fleet = Fleet.from_path(str(sandbox.inventory_path))
    chosen = fleet.targets([TARGET])[0]
    chosen.venv = VENV
    yield chosen
    fleet.close()


@pytest.fixture(scope="session")
def torch_in_container(sandbox, target, tmp_path_factory):
    """torch 2.13 (CPU) in the container's venv, through the playbook's own bootstrap step."""
    book = tmp_path_factory.mktemp("pb") / "bootstrap.yaml"
    book.write_text(f"extends: {REPO}/playbooks/dflash-sandbox.yaml\nname: bootstrap-only\n"
                    "steps:\n  - ensure: {}\n  - bootstrap:\n      venv: '{{ venv }}'\n"
                    "      packages: '{{ packages }}'\n      wheelhouse: '{{ wheelhouse }}'\n")
    orch(sandbox, "run", str(book), "-t", TARGET, "-e", f"venv={VENV}", check_code=0, timeout=900)
    return target


def last_record():
    with RunStore() as store:
        return store.get("last")


def shown_log_lines(output: str) -> list[str]:
    prefix = f"{TARGET} | "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def container_log(target, record) -> list[str]:
    run_dir = record.launch["targets"][TARGET]["run_dir"]
    return target.get(f"{run_dir}/output.log").decode("utf-8", "replace").splitlines()


def test_bootstrap_twice_the_second_does_nothing(sandbox, tmp_path):
    venv = f"/root/orch-bootstrap-{os.getpid()}"
    book = tmp_path / "small.yaml"
    book.write_text(f"extends: {REPO}/playbooks/dflash-sandbox.yaml\nname: small-bootstrap\n"
                    "steps:\n  - bootstrap:\n      venv: " + venv + "\n      packages: [mpmath==1.3.0]\n"
                    "      wheelhouse: '{{ wheelhouse }}'\n")
    try:
        code, first = orch(sandbox, "run", str(book), "-t", TARGET, check_code=0)
        assert f": changed created the venv {venv} with " in first  # what it did, in words
        assert "installed mpmath==1.3.0 from the pushed wheelhouse" in first
        assert "Successfully installed mpmath-1.3.0" in first  # pip's output streamed
        code, second = orch(sandbox, "run", str(book), "-t", TARGET, check_code=0)
        assert ": ok nothing to do: " + venv + " already matches" in second
        assert "Successfully installed" not in second
        record = last_record()
        assert any(line.startswith("mpmath==1.3.0") for line in record.targets[0].pip_freeze)
    finally:
        orch(sandbox, "exec", TARGET, "--", "rm", "-rf", venv)


def test_a_bootstrap_is_summarised_and_its_whole_output_kept(sandbox, tmp_path):
    """pip -vv and a chatty shell step print hundreds of lines: the console shows a few, the
    run's folder has them all; with -v the console shows them all as well."""
    venv = f"/root/orch-summary-{os.getpid()}"
    book = tmp_path / "noisy.yaml"
    book.write_text(
        f"extends: {REPO}/playbooks/dflash-sandbox.yaml\nname: noisy\nsteps:\n"
        f"  - bootstrap:\n      venv: {venv}\n      packages: [sympy==1.14.0, mpmath==1.3.0]\n"
        "      wheelhouse: '{{ wheelhouse }}'\n      pip_args: [-vv]\n"
        "  - shell: [sh, -c, 'for i in $(seq 300); do echo build line $i; done']\n")
    again = tmp_path / "again.yaml"
    again.write_text(book.read_text().replace("[-vv]", "[-vv, --force-reinstall]"))
    try:
        _, shown = orch(sandbox, "run", str(book), "-t", TARGET, check_code=0)
        record = last_record()
        folder = os.path.join(os.environ["ORCH_DATA_DIR"], "runs", record.run_id, "steps")
        logs = {}
        for name in (f"1-bootstrap-{TARGET}.log", f"2-shell-{TARGET}.log"):
            with open(os.path.join(folder, name)) as handle:
                logs[name] = handle.read().splitlines()
            assert f"output: {len(logs[name])} lines in {folder}/{name}" in shown, shown
        pip_log = logs[f"1-bootstrap-{TARGET}.log"]
        assert len(pip_log) > 50 and any(line.startswith("Successfully installed ") for line in pip_log)
        assert logs[f"2-shell-{TARGET}.log"] == [f"build line {n}" for n in range(1, 301)]
        assert len(shown.splitlines()) < 20, shown          # the console: a handful of lines
        assert f"{TARGET}: pip: installing 2 packages" in shown
        assert "Successfully installed" not in shown and "build line" not in shown
        _, verbose = orch(sandbox, "run", str(again), "-t", TARGET, "-v", check_code=0)
        streamed = [line.split(" | ", 1)[1] for line in verbose.splitlines()
                    if line.startswith(f"  {TARGET} | ")]
        assert any(line.startswith("Successfully installed ") for line in streamed)
        assert [line for line in streamed if line.startswith("build line")] == \
            [f"build line {n}" for n in range(1, 301)]
    finally:
        orch(sandbox, "exec", TARGET, "--", "rm", "-rf", venv)


def test_race_is_diagnosed_then_the_patch_makes_it_train(sandbox, torch_in_container):
    target = torch_in_container
    payload_api.fx_patch(target, "revert")  # start from the pristine torch
    code, output = run_playbook(sandbox, "-e", "race=true", "-e", "patch=false")
    assert code == 10, output[-6000:]
    assert "verdict: fx-race (exit 10)" in output
    assert "torch 2.13.0+cpu on sb2-201 is vulnerable" in output
    assert f"`orch -i {sandbox.inventory_path} patch fx-threads apply -t {TARGET}`" in output
    record = last_record()
    assert record.verdict == "fx-race" and record.targets[0].fx_tls_state == "vulnerable"
    race = next(f for f in record.findings if f.signature == "fx-race")
    assert "patch fx-threads apply -t sb2-201" in race.remediation

    code, output = run_playbook(sandbox, "-e", "race=true", check_code=0)
    assert "verdict: ok (exit 0)" in output
    record = last_record()
    assert record.verdict == "ok" and record.summary["drafters_ok"] == 3
    assert record.targets[0].fx_tls_state == "patched"
    assert {m.drafter for m in record.metrics} == {0, 1, 2}
    assert shown_log_lines(output) == container_log(target, record)


def test_a_hang_is_detected_and_the_process_stopped(sandbox, torch_in_container):
    hang_after = 30  # above the first (compiling) step, which counts as silence too
    code, output = run_playbook(sandbox, "-e", "extra_args=[--fail-drafter, 1]",
                                "-e", f"hang_after={hang_after}")
    assert code == 11, output[-6000:]
    assert "verdict: hang (exit 11)" in output
    record = last_record()
    hang = next(f for f in record.findings if f.signature == "hang")
    silent = int(re.search(r"no new step line for (\d+) s", hang.message).group(1))
    assert hang_after <= silent <= hang_after + 3
    assert "drafter 1 had raised" in hang.message
    status = launcher(torch_in_container, "status", record.launch["targets"][TARGET]["run_dir"])
    assert status["state"] == "exited" and status["signal"] in (15, 9)
    # the stacks were taken while it hung, before the stop: the two drafters wait on the
    # lock the dead one left locked, and the finding says so
    monitor = next(s for s in record.steps if s.kind == "monitor")
    taken = monitor.data["hang_stacks"]
    assert "error" not in taken, taken
    [process] = taken["results"]
    launched = next(s for s in record.steps if s.kind == "launch").data["pid"]
    assert process["pid"] == launched and len(process["threads"]) >= 3
    [lock] = process["locks"]
    assert lock["key"].endswith("train_drafters.py:f.leaked_lock") and len(lock["waiters"]) == 2
    [holder] = lock["holders"]                 # the dead drafter, from the run's log
    assert holder["died"].startswith("RuntimeError: drafter 1 failed at step 1")
    assert process["cycles"] == []             # a dead holder waits for nobody: no cycle
    assert "The stacks: " in hang.message and "died holding" in hang.message
    saved = json.loads(open(os.path.join(paths.run_dir(record.run_id), TARGET, "stacks.json")).read())
    assert saved["results"][0]["pid"] == process["pid"]
    code, explained = orch(sandbox, "explain", record.run_id)
    assert "the stacks orch took when it called the run hung" in explained, explained[-4000:]
    assert "died holding" in explained


def test_link_down_while_monitoring_loses_and_repeats_nothing(sandbox, torch_in_container):
    controller = subprocess.Popen(
        [*ORCH, "-i", str(sandbox.inventory_path), "run", PLAYBOOK, "-t", TARGET, "-e", f"venv={VENV}",
         "-e", "steps=150", "-e", "log_every=5", "-e", "hang_after=90"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        for line in controller.stdout:
            lines.append(line.rstrip("\n"))
            if re.match(rf"{TARGET} \| drafter=\d step=10 ", line):
                break
        sandbox.link_down(HOST)
        time.sleep(10)
        sandbox.link_up(HOST)
        # Keep reading through the same buffered pipe: communicate(timeout=...) reads the raw
        # descriptor and would drop the lines the loop above had already buffered.
        watchdog = threading.Timer(400, controller.kill)
        watchdog.start()
        try:
            lines += [line.rstrip("\n") for line in controller.stdout]
            controller.wait()
        finally:
            watchdog.cancel()
    finally:
        if controller.poll() is None:
            controller.kill()
        sandbox.link_up(HOST)
    output = "\n".join(lines)
    assert controller.returncode == 0, output[-6000:]
    assert "lost the monitor's connection" in output and "reconnected after" in output
    record = last_record()
    assert record.summary["monitor"][TARGET]["reconnects"] >= 1
    assert shown_log_lines(output) == container_log(torch_in_container, record)


def test_killed_controller_then_attach(sandbox, torch_in_container):
    controller = subprocess.Popen(
        [*ORCH, "-i", str(sandbox.inventory_path), "run", PLAYBOOK, "-t", TARGET, "-e", f"venv={VENV}",
         "-e", "steps=200", "-e", "log_every=10"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with sigkilled_after(controller):
        for line in controller.stdout:
            if line.startswith(f"{TARGET} | start drafters="):
                break
    record = last_record()
    assert record.verdict == "running"
    run_dir = record.launch["targets"][TARGET]["run_dir"]
    assert launcher(torch_in_container, "status", run_dir)["state"] == "running"  # training goes on
    code, output = orch(sandbox, "attach", record.run_id, check_code=0)
    assert "verdict: ok (exit 0)" in output
    final = last_record()
    assert final.run_id == record.run_id and final.verdict == "ok" and final.ended_at
    assert shown_log_lines(output) == container_log(torch_in_container, final)
    assert final.steps[-1].kind == "collect"


def test_a_stopped_container_is_reported_with_its_fix(sandbox, tmp_path):
    book = tmp_path / "ensure.yaml"
    book.write_text("name: ensure-only\nsteps:\n  - ensure: {}\n")
    code, output = orch(sandbox, "run", str(book), "-t", "sb2-202")
    assert code == 10, output
    assert "is stopped" in output and "orch ct start sb2-202" in output
