"""`orch run` end to end on this machine (local transport), with a fake trainer that prints
the DFlash log format: verdicts and exit codes, the record, dry runs, step options,
a killed controller and `orch attach`, `orch stop`. No torch needed (see tests/integration
for the real trainer in the sandbox)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from orchestrator.cli.app import main
from orchestrator.runs.store import RunStore

FAKE_TRAINER = r'''
import sys, time
mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
rate = 900 if mode == "slow" else 6000
def log(text):
    sys.stdout.write(text + "\n"); sys.stdout.flush()
log("start drafters=3 devices=cpu,cpu,cpu torch=2.13.0+cpu pid=1 steps=%d" % steps)
if mode == "race":
    for d in range(3):
        log("drafter=%d ERROR RuntimeError: Detected that you are using FX to symbolically trace "
            "a dynamo-optimized function. This is not supported at the moment." % d)
    log("summary status=failed drafters=3 ok=0 failed=3 total_tok_s=0 stalled=0 seconds=1")
    sys.exit(1)
for d in range(3):
    log("drafter=%d step=1 loss=6.0 tok_s=100" % d)
if mode == "hang":
    log("drafter=1 ERROR RuntimeError: drafter 1 failed at step 1 (--fail-drafter)")
    time.sleep(600)
if mode == "crash":
    sys.stderr.write("Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\n"
                     "ValueError: the config is wrong\n"); sys.exit(2)
for step in range(2, steps + 1):
    time.sleep(pause)
    for d in range(3):
        log("drafter=%d step=%d loss=%.4f tok_s=%d" % (d, step, 6.0 - step / 10, rate))
for d in range(3):
    log("drafter=%d done steps=%d loss=5.0 tok_s=%d" % (d, steps, rate))
log("summary status=ok drafters=3 ok=3 failed=0 total_tok_s=%d stalled=0 seconds=1" % (3 * rate))
'''

PLAYBOOK = """\
name: fake
targets: [dev]
vars:
  mode: ok
  steps: 6
  pause: 0.02
  hang_after: 30
steps:
  - name: the container runs
    ensure: {{}}
  - name: the trainer
    push: {{src: fake_trainer.py, dest: "{{{{ remote_dir }}}}/fake_trainer.py"}}
  - name: drafters
    launch:
      command: [{python}, "{{{{ remote_dir }}}}/fake_trainer.py", "{{{{ mode }}}}", "{{{{ steps }}}}", "{{{{ pause }}}}"]
  - name: watch
    monitor: {{hang_after: "{{{{ hang_after }}}}", degraded_below: 3000, expect_drafters: 3, grace: 2,
               stall_after: 5}}
  - name: files
    collect: {{freeze: false}}
    always: true
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "fake_trainer.py").write_text(FAKE_TRAINER)
    (tmp_path / "fake.yaml").write_text(PLAYBOOK.format(python=json.dumps(sys.executable)))
    (tmp_path / "inv.yaml").write_text(textwrap.dedent("""\
        hosts:
          here: {transport: local}
          gone: {address: 127.0.0.1, port: 1, connect_timeout: 2}
        containers:
          dev: {host: here}
          far: {host: gone, vmid: 200}
        default_target: dev
        """))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def orch(*args, input=None):
    result = CliRunner().invoke(main, ["-i", "inv.yaml", *args], input=input, catch_exceptions=False)
    return result


def test_ok_run_is_recorded_and_collected(project):
    result = orch("run", "fake.yaml")
    assert result.exit_code == 0, result.output
    assert "verdict: ok (exit 0)" in result.output
    assert "dev | drafter=2 done steps=6" in result.output  # every log line shown (no tty)
    with RunStore() as store:
        record = store.get("last")
    assert record.verdict == "ok" and record.exit_code == 0
    assert [s.kind for s in record.steps] == ["ensure", "push", "launch", "monitor", "collect"]
    assert len(record.metrics) == 18 and {m.drafter for m in record.metrics} == {0, 1, 2}
    assert record.summary["total_tok_s"] == 18000
    assert record.launch["targets"]["dev"]["run_dir"].endswith(f"{record.run_id}/drafters")
    assert record.launch["targets"]["dev"]["monitor"]["hang_after"] == 30
    folder = os.path.join(record.artifacts_dir, "dev")
    assert {"cmd.json", "exit.json", "output.log", "stream.log", "summary.json"} <= set(os.listdir(folder))
    with open(os.path.join(folder, "output.log"), "rb") as a, open(os.path.join(folder, "stream.log"), "rb") as b:
        assert a.read() == b.read()
    summary = json.load(open(os.path.join(folder, "summary.json")))
    assert summary["monitor"]["verdict"] == "ok"


def test_json_output(project):
    result = CliRunner().invoke(main, ["-i", "inv.yaml", "run", "fake.yaml", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)  # progress went to stderr
    assert data["verdict"] == "ok" and data["exit_code"] == 0 and data["metric_points"] == 18
    assert data["run_id"] and data["steps"][-1]["kind"] == "collect"


@pytest.mark.parametrize("mode,verdict,code", [
    ("race", "fx-race", 10), ("slow", "degraded", 12), ("crash", "traceback", 10)])
def test_failure_verdicts_and_exit_codes(project, mode, verdict, code):
    result = orch("run", "fake.yaml", "-e", f"mode={mode}")
    assert result.exit_code == code, result.output
    assert f"verdict: {verdict} (exit {code})" in result.output
    if mode == "race":
        assert "orch -i inv.yaml patch fx-threads apply -t dev" in result.output
        assert "torch 2.13.0+cpu on dev" in result.output
    if mode == "crash":
        assert "ValueError: the config is wrong" in result.output
    with RunStore() as store:
        record = store.get("last")
    assert record.verdict == verdict
    assert record.steps[-1].kind == "collect" and record.steps[-1].status == "changed"  # always: true


def test_hang_is_detected_and_stopped(project):
    began = time.monotonic()
    result = orch("run", "fake.yaml", "-e", "mode=hang", "-e", "hang_after=3")
    elapsed = time.monotonic() - began
    assert result.exit_code == 11, result.output
    assert "verdict: hang (exit 11)" in result.output
    assert "drafter 1 had raised" in result.output
    assert elapsed < 3 + 20  # hang_after, then SIGTERM and the collect step
    with RunStore() as store:
        record = store.get("last")
    run_dir = record.launch["targets"]["dev"]["run_dir"]
    exit_info = json.load(open(os.path.join(run_dir, "exit.json")))
    assert exit_info["signal"] in (15, 9)  # stopped: SIGTERM, or SIGKILL after the grace


def test_dry_run_touches_nothing(project):
    result = orch("run", "fake.yaml", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "fake_trainer.py ok 6 0.02" in result.output
    assert "dry run: nothing was run, nothing recorded" in result.output
    run_id = result.output.split(" run ", 1)[1].split()[0]
    assert not os.path.exists(f"/var/tmp/orch/runs/{run_id}")
    with RunStore() as store:
        assert store.list() == []


def test_unknown_target_and_runtime_template_errors_exit_2(project):
    result = orch("run", "fake.yaml", "-t", "nope")
    assert result.exit_code == 2 and "unknown target 'nope'" in result.output
    (project / "late.yaml").write_text(
        "name: late\ntargets: [dev]\nsteps:\n  - shell: ['true']\n    register: r\n"
        "  - shell: [echo, '{{ r.nothing }}']\n")
    result = orch("run", "late.yaml")
    assert result.exit_code == 2, result.output
    assert "late.yaml:6:19: in template" in result.output


def test_unreachable_target_exits_13(project):
    result = orch("run", "fake.yaml", "-t", "far")
    assert result.exit_code == 13, result.output
    assert "verdict: unreachable" in result.output


def test_step_options(project):
    (project / "options.yaml").write_text(textwrap.dedent(f"""\
        name: options
        targets: [dev]
        vars: {{greeting: hello}}
        steps:
          - name: flaky
            shell: [{json.dumps(sys.executable)}, -c, "import os, sys; p = '{project}/count';
              n = int(open(p).read()) if os.path.exists(p) else 0; open(p, 'w').write(str(n + 1));
              sys.exit(0 if n >= 2 else 1)"]
            retries: 2
            retry_delay: 0.1
            register: flaky
          - name: skipped
            shell: ['false']
            when: flaky.rc != 0
          - name: fails but goes on
            shell: [sh, -c, "echo {{{{ greeting }}}}; exit 4"]
            continue_on_error: true
            register: four
          - name: sees it
            shell: [echo, "rc={{{{ four.rc }}}} failed={{{{ four.failed }}}}"]
          - name: hard failure
            shell: ['false']
          - name: not reached
            shell: [echo, never]
          - name: cleanup
            shell: [echo, cleanup]
            always: true
        """))
    result = orch("run", "options.yaml")
    assert result.exit_code == 10, result.output
    assert "rc=4 failed=True" in result.output
    assert "never" not in result.output.replace("not reached", "")
    assert "dev | cleanup" in result.output or "cleanup" in result.output
    with RunStore() as store:
        record = store.get("last")
    statuses = [(s.name, s.status) for s in record.steps]
    assert statuses == [("flaky", "changed"), ("skipped", "skipped"), ("fails but goes on", "failed"),
                        ("sees it", "changed"), ("hard failure", "failed"), ("not reached", "skipped"),
                        ("cleanup", "changed")]
    assert open(project / "count").read() == "3"


def _orch_process(*args, **kwargs):
    env = dict(os.environ)
    return subprocess.Popen([sys.executable, "-c", "from orchestrator.cli.app import main; main()",
                             "-i", "inv.yaml", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, **kwargs)


def _wait_for_launch(timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with RunStore() as store:
                record = store.get("last")
            if record.launch.get("targets", {}).get("dev", {}).get("run_dir"):
                return record
        except Exception:  # noqa: BLE001 - the store may not exist yet
            pass
        time.sleep(0.2)
    raise AssertionError("no launch recorded")


def test_killed_controller_then_attach(project):
    controller = _orch_process("run", "fake.yaml", "-e", "steps=40", "-e", "pause=0.1")
    record = _wait_for_launch()
    time.sleep(1.0)
    controller.send_signal(signal.SIGKILL)
    controller.wait()
    with RunStore() as store:
        assert store.get(record.run_id).verdict == "running"
    run_dir = record.launch["targets"]["dev"]["run_dir"]
    result = orch("attach", record.run_id[:15])
    assert result.exit_code == 0, result.output
    assert "verdict: ok (exit 0)" in result.output
    with RunStore() as store:
        final = store.get(record.run_id)
    assert final.verdict == "ok" and final.exit_code == 0 and final.ended_at
    shown = [line[len("dev | "):] for line in result.output.splitlines() if line.startswith("dev | ")]
    assert shown == open(os.path.join(run_dir, "output.log")).read().splitlines()
    assert any(s.name.startswith("attach: ") for s in final.steps)
    assert final.steps[-1].kind == "collect"  # the playbook's collect ran after the attach
    assert len({(m.drafter, m.step) for m in final.metrics}) == len(final.metrics) == 120


def test_stop_a_run_nobody_watches(project):
    controller = _orch_process("run", "fake.yaml", "-e", "steps=400", "-e", "pause=0.2")
    record = _wait_for_launch()
    controller.send_signal(signal.SIGKILL)
    controller.wait()
    result = orch("stop", "last", "--grace", "2")
    assert result.exit_code == 0, result.output
    assert "stopped with SIGTERM" in result.output
    with RunStore() as store:
        final = store.get(record.run_id)
    assert final.verdict == "killed" and final.exit_code == 10
    result = orch("stop", "last")
    assert "not running" in result.output


def test_the_playbook_venv_is_the_one_every_step_uses(project):
    (project / "venv.yaml").write_text(textwrap.dedent("""\
        name: venv
        targets: [dev]
        vars:
          venv: /opt/from-the-playbook
        steps:
          - name: flag
            grep: {pattern: _is_fx_tracing_flag, fixed: true}
          - name: state
            patch: {action: status}
        """))
    result = orch("run", "venv.yaml", "--dry-run")
    assert result.output.count("/opt/from-the-playbook/bin/python") == 2, result.output
    result = orch("run", "venv.yaml", "--dry-run", "-e", "venv=/opt/from-the-command-line")
    assert result.output.count("/opt/from-the-command-line/bin/python") == 2, result.output


def _wait_for_record(timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with RunStore() as store:
                return store.get("last")
        except Exception:  # noqa: BLE001 - the store may not exist yet
            time.sleep(0.1)
    raise AssertionError("no run recorded")


def _killed_before_the_launch():
    """A controller killed with SIGKILL while a step before the launch runs."""
    controller = _orch_process("run", "slow-start.yaml")
    record = _wait_for_record()
    time.sleep(0.5)
    controller.send_signal(signal.SIGKILL)
    controller.wait()
    return record


@pytest.fixture
def slow_start(project):
    (project / "slow-start.yaml").write_text(
        "name: slow-start\ntargets: [dev]\nsteps:\n  - shell: [sleep, '30']\n")
    return project


@pytest.mark.parametrize("settle", [["attach", "last"], ["stop", "last"], ["runs", "abandon", "last"]])
def test_a_controller_killed_before_the_launch_is_shown_and_settled(slow_start, settle):
    """Such a record once stayed "running" for ever, and attach and stop refused it."""
    record = _killed_before_the_launch()
    listed = orch("runs", "list")
    assert "running (controller gone)" in listed.output
    assert f"orch runs abandon {record.run_id}" in listed.output
    assert json.loads(orch("runs", "list", "--json").output)[0]["controller_state"] == "gone"
    shown = orch("runs", "show", "last")
    assert f"controller pid {record.launch['controller']['pid']} on " in shown.output
    assert "is gone" in shown.output
    result = orch(*settle)
    assert result.exit_code == (10 if settle[0] == "attach" else 0), result.output
    with RunStore() as store:
        final = store.get(record.run_id)
    assert (final.verdict, final.exit_code) == ("abandoned", 10) and final.ended_at
    assert final.findings[-1].signature == "abandoned"
    assert "before it launched anything" in final.findings[-1].message or settle[0] == "runs"
    assert "controller gone" not in orch("runs", "list").output


def test_a_controller_killed_after_the_launch_is_shown_gone_until_attach(project):
    controller = _orch_process("run", "fake.yaml", "-e", "steps=400", "-e", "pause=0.2")
    record = _wait_for_launch()
    controller.send_signal(signal.SIGKILL)
    controller.wait()
    listed = orch("runs", "list")
    assert "running (controller gone)" in listed.output
    assert f"orch attach {record.run_id}" in listed.output
    assert "is gone" in orch("runs", "show", record.run_id).output
    assert orch("stop", "last", "--grace", "1").exit_code == 0   # settles it: killed
    assert "controller gone" not in orch("runs", "list").output


def test_a_live_controller_is_not_gone_and_its_run_cannot_be_abandoned(slow_start):
    controller = _orch_process("run", "slow-start.yaml")
    try:
        record = _wait_for_record()
        assert "controller gone" not in orch("runs", "list").output
        assert json.loads(orch("runs", "list", "--json").output)[0]["controller_state"] == "alive"
        refused = orch("runs", "abandon", "last")
        assert refused.exit_code == 1 and "is running" in refused.output
        refused = orch("attach", "last")
        assert refused.exit_code == 1 and "launched nothing yet" in refused.output
    finally:
        controller.kill()
        controller.wait()
    with RunStore() as store:
        assert store.get(record.run_id).verdict == "running"


def test_a_reused_pid_is_not_the_controller(project):
    """A record whose controller pid now belongs to a process started later: gone."""
    from orchestrator.runs.controller import GONE, controller_state
    from orchestrator.runs.model import RunRecord
    import socket
    record = RunRecord(run_id="r", playbook="p", playbook_sha256="", name="n",
                       launch={"controller": {"pid": os.getpid(), "host": socket.gethostname(),
                                              "started": time.time() - 3600}})
    assert controller_state(record) != GONE          # this very process
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        record.launch["controller"]["pid"] = sleeper.pid
        assert controller_state(record) == GONE       # started long after the record
        record.launch["controller"]["started"] = time.time()
        assert controller_state(record) == "alive"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert controller_state(record) == GONE
