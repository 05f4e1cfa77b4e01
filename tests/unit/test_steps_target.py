"""The ensure, bootstrap and collect steps on a fake host: plans, outcomes, the recorder's
calls (what a target's record learns), failures."""

from __future__ import annotations

import hashlib
import json
import os

from orchestrator.ground import paths
from tests.unit.step_fakes import payload_failure, planned, RUN_ID, harness

ENSURE = "name: t\ntargets: [dev]\nsteps:\n  - ensure: {}\n"
VERSION_ARGV = ["python3", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"]


def test_ensure_plan_and_run(tmp_path):
    plan = planned(tmp_path, ENSURE)
    assert plan == ["run: python3 -c 'import sys; print(sys.version)'"]
    h = harness(tmp_path, ENSURE)
    h.host.on_argv(VERSION_ARGV, stdout=b"3.11.2\n")
    record = h.record()
    assert record.steps[0].status == "ok"
    assert record.steps[0].message == "dev (host fakehost) is running; python 3.11.2"
    assert record.steps[0].data == {"running": True, "started": False, "python_version": "3.11.2"}


def test_ensure_fails_when_python_does_not_run(tmp_path):
    h = harness(tmp_path, ENSURE)
    record = h.record()
    assert record.steps[0].status == "failed"
    assert record.steps[0].message == "python3 does not run on dev: fake: python3: not found"


BOOTSTRAP = """\
    name: t
    targets: [dev]
    steps:
      - bootstrap: {packages: ["torch==2.13.0", "numpy<2"]}
"""


def test_bootstrap_plan(tmp_path):
    plan = planned(tmp_path, BOOTSTRAP)
    assert plan == [
        "python3 -m venv /opt/venv (unless the marker matches; without ensurepip: "
        "--without-pip, then pip from its own pushed wheel)",
        "/opt/venv/bin/python -m pip install torch==2.13.0 numpy<2",
        "/opt/venv/bin/python -m pip freeze --all"]


def test_bootstrap_up_to_date_records_the_freeze(tmp_path):
    h = harness(tmp_path, BOOTSTRAP)
    h.host.on_payload("bootstrap", {"up_to_date": True, "freeze": ["numpy==1.26.4", "torch==2.13.0"]})
    record = h.record()
    (check,) = h.host.payload_calls("bootstrap")
    assert check.payload_args["action"] == "check" and check.argv[0] == "python3"
    step = record.steps[0]
    assert step.status == "ok" and step.message.startswith("nothing to do: /opt/venv already matches")
    assert step.data["torch"] == "2.13.0"
    assert record.targets[0].pip_freeze == ["numpy==1.26.4", "torch==2.13.0"]
    assert "save_targets" in h.recorder.names()


def test_bootstrap_failures(tmp_path):
    _, step = payload_failure(tmp_path, BOOTSTRAP, "bootstrap",
                              "pip: no matching distribution for torch==2.13.0")
    assert step.message == "dev: pip: no matching distribution for torch==2.13.0"
    h = harness(tmp_path, BOOTSTRAP.replace("[dev]", "[other]"))
    record = h.record()
    assert record.steps[0].message == ("no venv for other: set venv: in the bootstrap step or "
                                       "in the inventory")
    assert h.host.calls == []


COLLECT = "name: t\ntargets: [dev]\nsteps:\n  - collect: {files: [/etc/os-release]}\n"


def test_collect_plan(tmp_path):
    plan = planned(tmp_path, COLLECT)
    dest = os.path.join(paths.run_dir(RUN_ID), "dev")
    assert plan == [
        f"into {dest}: output.log, pip-freeze.txt, nvidia-smi.txt, machine.json, summary.json, "
        "os-release"]


def test_collect_saves_the_launched_run_files(tmp_path):
    h = harness(tmp_path, COLLECT)
    h.begin("dev")
    h.recorder.note_launch("dev", {"run_dir": "/runs/r1", "pid": 7})
    h.recorder.note_monitor_result("dev", {"verdict": "ok", "total_tok_s": 18000})
    h.host.on_argv(["tail", "-c", str(64 * 1024 * 1024), "/runs/r1/output.log"], stdout=b"step=1\n")
    h.host.on_argv(["cat", "/runs/r1/exit.json"], stdout=b'{"exit_code": 0}')
    h.host.on_argv(["/opt/venv/bin/python", "-m", "pip", "freeze"], stdout=b"torch==2.13.0\n")
    h.host.on_argv(["cat", "--", "/etc/os-release"], exit_code=1, stderr=b"cat: permission denied\n")
    h.recorder.calls.clear()
    step = h.step()
    params = {"log": True, "freeze": True, "nvidia_smi": True, "summary": True,
              "files": ["/etc/os-release"], "max_log_mb": 64, "machine": False}
    outcome = step.run(h.context(), params)
    dest = os.path.join(paths.run_dir(RUN_ID), "dev")
    assert outcome.data["files"] == ["output.log", "exit.json", "pip-freeze.txt", "summary.json"]
    assert outcome.data["problems"] == ["/etc/os-release: cat: permission denied"]
    with open(os.path.join(dest, "output.log"), "rb") as handle:
        assert handle.read() == b"step=1\n"
    with open(os.path.join(dest, "summary.json")) as handle:
        summary = json.load(handle)
    assert summary["monitor"] == {"verdict": "ok", "total_tok_s": 18000}
    assert summary["launch"] == {"run_dir": "/runs/r1", "pid": 7}
    assert h.recorder.names() == ["save_targets", "note_artifacts"]
    assert h.recorder.record.artifacts_dir == paths.run_dir(RUN_ID)
    assert h.recorder.target_info("dev").pip_freeze == ["torch==2.13.0"]


MACHINE = {"gpus": [{"index": 0, "name": "NVIDIA H200", "driver": "570.124.06",
                     "memory_total_mib": 143771.0, "clock_max_sm_mhz": 1980.0,
                     "clock_max_memory_mhz": 3201.0, "power_limit_w": 700.0}],
           "driver": "570.124.06", "cuda": "12.8", "cpu_count": 64,
           "cgroup": {"version": 2, "cpu_quota_cores": 8.0, "cpuset": "0-15", "cpuset_cpus": 16,
                      "memory_limit_bytes": 68719476736}}


def collect_only_the_machine(h):
    params = {"log": False, "freeze": False, "nvidia_smi": False, "summary": False,
              "files": [], "max_log_mb": 64, "machine": True}
    return h.step().run(h.context(), params)


def test_collect_records_what_the_run_ran_on(tmp_path):
    h = harness(tmp_path, COLLECT)
    h.begin("dev")
    h.host.on_payload("machine", MACHINE)
    outcome = collect_only_the_machine(h)
    assert outcome.data["files"] == ["machine.json"] and outcome.data["problems"] == []
    assert h.recorder.target_info("dev").machine == MACHINE
    (call,) = h.host.payload_calls("machine")
    assert call.argv[0] == "python3"          # the container's own python: stdlib only
    with open(os.path.join(paths.run_dir(RUN_ID), "dev", "machine.json")) as handle:
        assert json.load(handle) == MACHINE


def test_collect_without_the_machine_facts_says_so_and_goes_on(tmp_path):
    h = harness(tmp_path, COLLECT)
    h.begin("dev")
    h.host.on_payload("machine", error="boom")
    outcome = collect_only_the_machine(h)
    assert outcome.data["problems"] and outcome.data["problems"][0].startswith("machine: ")
    assert h.recorder.target_info("dev").machine == {}


WHEELHOUSE = """\
    name: t
    targets: [dev]
    steps:
      - bootstrap: {packages: ["a==1"], wheelhouse: wheels, download: false}
"""


def test_a_wheel_of_the_same_size_but_other_content_is_pushed_again(tmp_path):
    """The container's wheel is compared by sha256, not size: a same-size file planted in
    the wheelhouse is replaced, and install gets every wheel's sha256 to check."""
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"abc")
    digest = hashlib.sha256(b"abc").hexdigest()
    for remote, pushes in (("0" * 64, 1), (digest, 0)):
        h = harness(tmp_path, WHEELHOUSE)
        h.host.on_payload("bootstrap", {"up_to_date": False, "ensurepip": True, "changed": True,
                                        "files": {"a-1-py3-none-any.whl": {"size": 3, "sha256": remote}}})
        h.host.on_argv(["sh", "-c"])
        assert h.record().steps[0].status == "changed"
        puts = [c for c in h.host.calls if c.argv[:2] == ["sh", "-c"] and "orch-put" in c.argv]
        assert len(puts) == pushes
        assert puts == [] or puts[0].argv[4] == "/var/lib/orch/wheelhouse/a-1-py3-none-any.whl"
        install = h.host.payload_calls("bootstrap")[-1].payload_args
        assert install["action"] == "install" and install["wheels"] == {"a-1-py3-none-any.whl": digest}


def test_a_plan_never_shows_an_index_urls_password(tmp_path):
    book = BOOTSTRAP.replace('numpy<2"]}', 'numpy<2"], index_url: "https://me:s3cret@pypi.example/simple"}')
    plan = planned(tmp_path, book)
    assert "s3cret" not in " ".join(plan)
    assert "--index-url https://***@pypi.example/simple" in plan[1]
