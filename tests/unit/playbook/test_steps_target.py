"""The ensure, bootstrap and collect steps on a fake host: plans, outcomes, the recorder's
calls (what a target's record learns), failures."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from orchestrator.ground import paths
from tests.support.step_fakes import payload_failure, planned, RUN_ID, harness

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
    """The files come through orch cp's stream (the fake runs the real send_frames under a
    folder standing in for the container's /): the log's last max_log_mb only."""
    root = tmp_path / "ct"
    (root / "runs" / "r1").mkdir(parents=True)
    log = b"".join(b"step=%d\n" % i for i in range(200_000))
    (root / "runs" / "r1" / "output.log").write_bytes(log)
    (root / "runs" / "r1" / "exit.json").write_bytes(b'{"exit_code": 0}')
    h = harness(tmp_path, COLLECT)
    h.begin("dev")
    h.recorder.note_launch("dev", {"run_dir": "/runs/r1", "pid": 7})
    h.recorder.note_monitor_result("dev", {"verdict": "ok", "total_tok_s": 18000})
    h.host.on_cp(root)
    h.host.on_argv(["/opt/venv/bin/python", "-m", "pip", "freeze"], stdout=b"torch==2.13.0\n")
    h.recorder.calls.clear()
    step = h.step()
    params = {"log": True, "freeze": True, "nvidia_smi": True, "summary": True,
              "files": ["/etc/os-release-missing"], "max_log_mb": 1, "machine": False}
    outcome = step.run(h.context(), params)
    dest = os.path.join(paths.run_dir(RUN_ID), "dev")
    assert outcome.data["files"] == ["output.log", "exit.json", "pip-freeze.txt", "summary.json"]
    [problem] = outcome.data["problems"]
    assert problem.startswith("/etc/os-release-missing: ") and "No such file" in problem, problem
    with open(os.path.join(dest, "output.log"), "rb") as handle:
        assert handle.read() == log[-(1 << 20):]
    assert [json.loads(c.argv[-1]).get("last_bytes") for c in h.host.cp_calls("send")][:1] == [1 << 20]
    with open(os.path.join(dest, "summary.json")) as handle:
        summary = json.load(handle)
    assert summary["monitor"] == {"verdict": "ok", "total_tok_s": 18000}
    assert summary["launch"] == {"run_dir": "/runs/r1", "pid": 7}
    assert h.recorder.names() == ["save_targets", "note_artifacts"]
    assert h.recorder.record.artifacts_dir == paths.run_dir(RUN_ID)
    assert h.recorder.target_info("dev").pip_freeze == ["torch==2.13.0"]


def test_a_collected_file_whose_bytes_changed_on_the_way_is_a_problem_not_a_file(tmp_path):
    """The log's bytes are changed in transit, not the container's sha256 list: caught here,
    before the file gets its name; the step says it and keeps going."""
    root = tmp_path / "ct"
    (root / "runs" / "r1").mkdir(parents=True)
    (root / "runs" / "r1" / "output.log").write_bytes(b"loss=1.25\n" * 100)
    h = harness(tmp_path, COLLECT)
    h.begin("dev")
    h.recorder.note_launch("dev", {"run_dir": "/runs/r1", "pid": 7})
    h.host.on_cp(root, corrupt=lambda stream: stream.replace(b"loss=1.25", b"loss=0.25", 1))
    params = {"log": True, "freeze": False, "nvidia_smi": False, "summary": False,
              "files": [], "max_log_mb": 64, "machine": False}
    outcome = h.step().run(h.context(), params)
    dest = os.path.join(paths.run_dir(RUN_ID), "dev")
    [problem] = outcome.data["problems"]
    assert problem.startswith("log: ") and "sha256" in problem, problem
    assert "output.log" not in outcome.data["files"]
    assert not os.path.exists(os.path.join(dest, "output.log"))
    assert [n for n in os.listdir(dest) if n.startswith(".orch-cp-")] == []


def test_a_link_lost_under_collect_ends_the_step_as_before(tmp_path):
    """A copy that failed is a problem to report; a lost link is not one of those."""
    from orchestrator.ground.errors import ConnectionLost
    from orchestrator.payloads import compact_source
    from tests.support.step_fakes import Reply
    h = harness(tmp_path, COLLECT)
    h.begin("dev")
    h.recorder.note_launch("dev", {"run_dir": "/runs/r1", "pid": 7})
    h.host.on(lambda argv, stdin: compact_source("cp") in argv,
              Reply(error=ConnectionLost("the connection to host fakehost broke")))
    params = {"log": True, "freeze": False, "nvidia_smi": False, "summary": False,
              "files": [], "max_log_mb": 64, "machine": False}
    with pytest.raises(ConnectionLost):
        h.step().run(h.context(), params)


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
    root = tmp_path / "ct"   # the container's / (the wheelhouse in it)
    (root / "var" / "lib" / "orch" / "wheelhouse").mkdir(parents=True)
    for remote, pushes in (("0" * 64, 1), (digest, 0)):
        h = harness(tmp_path, WHEELHOUSE)
        h.host.on_payload("bootstrap", {"up_to_date": False, "ensurepip": True, "changed": True,
                                        "files": {"a-1-py3-none-any.whl": {"size": 3, "sha256": remote}}})
        h.host.on_cp(root)
        assert h.record().steps[0].status == "changed"
        puts = h.host.cp_calls("receive")
        assert len(puts) == pushes
        assert puts == [] or json.loads(puts[0].argv[-1])["path"] == \
            "/var/lib/orch/wheelhouse/a-1-py3-none-any.whl"
        assert (root / "var/lib/orch/wheelhouse/a-1-py3-none-any.whl").read_bytes() == b"abc"
        install = h.host.payload_calls("bootstrap")[-1].payload_args
        assert install["action"] == "install" and install["wheels"] == {"a-1-py3-none-any.whl": digest}


def test_a_plan_never_shows_an_index_urls_password(tmp_path):
    book = BOOTSTRAP.replace('numpy<2"]}', 'numpy<2"], index_url: "https://me:s3cret@pypi.example/simple"}')
    plan = planned(tmp_path, book)
    assert "s3cret" not in " ".join(plan)
    assert "--index-url https://***@pypi.example/simple" in plan[1]
