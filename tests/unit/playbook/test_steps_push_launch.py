"""The push and launch steps on a fake host: plans, what reaches the target, the recorder's
calls, failures."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from orchestrator.ground.errors import ConfigError
from orchestrator.remote.payload_api import REMOTE_ROOT
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.playbook.steps.base import StepFailed
from tests.support.step_fakes import payload_failure, planned, RUN_ID, Reply, harness

PUSH = """\
    name: t
    targets: [dev]
    vars: {greeting: world}
    steps:
      - push: {src: "{{ file }}", dest: /srv/app/hello.txt, mode: "0755", template: true}
"""


def _puts(host) -> list:
    return host.cp_calls("receive")


def _container(tmp_path):
    """A local folder standing in for the container's /, with /srv/app in it."""
    root = tmp_path / "ct"
    (root / "srv" / "app").mkdir(parents=True)
    return root


def test_push_plan(tmp_path):
    plan = planned(tmp_path, PUSH, extra_vars={"file": "hello.j2"},
                   files={"hello.j2": "hello {{ greeting }}\n"})
    assert plan == ["put rendered hello.j2 -> /srv/app/hello.txt (mode 755)"]


def test_push_renders_and_writes_a_changed_file(tmp_path):
    h = harness(tmp_path, PUSH, extra_vars={"file": "hello.j2"},
                files={"hello.j2": "hello {{ greeting }} on {{ target.name }}\n"})
    root = _container(tmp_path)
    h.host.on(lambda argv, stdin: "orch-sha" in argv, Reply(stdout=b""))
    h.host.on_argv(["mkdir", "-p", "/srv/app"])
    h.host.on_cp(root)
    record = h.record()
    (put,) = _puts(h.host)
    assert json.loads(put.argv[-1])["path"] == "/srv/app/hello.txt"
    written = root / "srv" / "app" / "hello.txt"
    assert written.read_bytes() == b"hello world on dev\n"
    assert oct(written.stat().st_mode & 0o777) == "0o755"
    assert record.steps[0].status == "changed"
    assert record.steps[0].data["changed"] == ["/srv/app/hello.txt"]


def test_push_leaves_an_identical_file_alone(tmp_path):
    h = harness(tmp_path, PUSH, extra_vars={"file": "hello.j2"}, files={"hello.j2": "hi\n"})
    digest = hashlib.sha256(b"hi\n").hexdigest()
    h.host.on(lambda argv, stdin: "orch-sha" in argv,
              Reply(stdout=f"{digest}  /srv/app/hello.txt\n755\n".encode()))
    record = h.record()
    assert _puts(h.host) == []
    assert (record.steps[0].status, record.steps[0].message) == ("ok", "1 file(s) already up to date")


def test_push_writes_a_file_again_when_only_its_mode_differs(tmp_path):
    h = harness(tmp_path, PUSH, extra_vars={"file": "hello.j2"}, files={"hello.j2": "hi\n"})
    digest = hashlib.sha256(b"hi\n").hexdigest()
    h.host.on(lambda argv, stdin: "orch-sha" in argv,
              Reply(stdout=f"{digest}  /srv/app/hello.txt\n644\n".encode()))
    h.host.on_argv(["mkdir", "-p", "/srv/app"])
    root = _container(tmp_path)
    (root / "srv" / "app" / "hello.txt").write_bytes(b"hi\n")
    h.host.on_cp(root)
    record = h.record()
    (put,) = _puts(h.host)
    assert json.loads(put.argv[-1])["path"] == "/srv/app/hello.txt"
    assert oct((root / "srv" / "app" / "hello.txt").stat().st_mode & 0o777) == "0o755"
    assert record.steps[0].message == "1 file(s) written"


def test_a_push_whose_bytes_changed_on_the_way_fails_and_keeps_the_old_file(tmp_path):
    """The stream's file data is changed in transit (a byte flipped) but not the sender's
    sha256 list: the container's end catches it before the rename."""
    h = harness(tmp_path, PUSH, extra_vars={"file": "hello.j2"}, files={"hello.j2": "hi there\n"})
    h.host.on(lambda argv, stdin: "orch-sha" in argv, Reply(stdout=b""))
    h.host.on_argv(["mkdir", "-p", "/srv/app"])
    root = _container(tmp_path)
    (root / "srv" / "app" / "hello.txt").write_bytes(b"old\n")
    h.host.on_cp(root, corrupt=lambda stream: stream.replace(b"hi there\n", b"hi thera\n"))
    record = h.record()
    assert len(_puts(h.host)) == 1
    assert record.steps[0].status == "failed"
    assert "sha256" in record.steps[0].message, record.steps[0].message
    assert (root / "srv" / "app" / "hello.txt").read_bytes() == b"old\n"
    assert os.listdir(root / "srv" / "app") == ["hello.txt"]   # no staged copy left


def test_put_never_writes_through_a_link_planted_beside_the_destination(tmp_path):
    """The real put script (local sh): the old fixed temporary name DEST.orch-part, planted
    as a link to a victim file, is left alone; the file lands at DEST with its mode."""
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    dest = tmp_path / "app.conf"
    (tmp_path / "app.conf.orch-part").symlink_to(victim)
    Target("dev", LocalTransport("here")).put(str(dest), b"new\n", mode=0o640)
    assert victim.read_text() == "root's file\n"
    assert dest.read_bytes() == b"new\n" and oct(dest.stat().st_mode & 0o777) == "0o640"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.conf", "app.conf.orch-part", "victim"]


def test_push_template_error_and_missing_rendered_src_fail_the_step(tmp_path):
    h = harness(tmp_path, PUSH, extra_vars={"file": "bad.j2"}, files={"bad.j2": "{{ nope }}"})
    record = h.record()
    assert record.steps[0].status == "failed"
    assert record.steps[0].message.startswith(f"{tmp_path}/bad.j2")
    assert "template error: 'nope' is undefined" in record.steps[0].message
    h = harness(tmp_path, PUSH, extra_vars={"file": "missing.j2"})
    record = h.record()
    assert record.steps[0].message.startswith("push: missing.j2 not found (looked in ")


@pytest.mark.parametrize("src", ["{secret}", "../id_ed25519", "inside/../../id_ed25519", "link.txt"])
def test_a_src_from_a_variable_stays_inside_the_playbooks_folder(tmp_path, src):
    """An MCP client's (or -e) trainer_file once pushed any file of the controller into the
    container, where read_file returned it."""
    project, secret = tmp_path / "project", tmp_path / "id_ed25519"
    (project / "inside").mkdir(parents=True)
    secret.write_text("PRIVATE KEY\n")
    (project / "link.txt").symlink_to(secret)
    h = harness(project, PUSH.replace("template: true", "template: false"),
                extra_vars={"file": src.format(secret=secret)})
    root = _container(tmp_path)
    h.host.on(lambda argv, stdin: "orch-sha" in argv, Reply(stdout=b""))
    h.host.on_argv(["mkdir", "-p", "/srv/app"])
    h.host.on_cp(root)
    record = h.record()
    assert not (root / "srv" / "app" / "hello.txt").exists() and _puts(h.host) == []
    assert record.steps[0].status == "failed"
    assert "comes from a variable and leads out of the playbook's folder" in record.steps[0].message


def test_a_src_the_playbook_writes_itself_may_be_anywhere(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "shared.txt"
    project.mkdir()
    elsewhere.write_text("shared\n")
    root = _container(tmp_path)
    for playbook in (PUSH.replace('"{{ file }}"', f'"{elsewhere}"'),            # in the step
                     PUSH.replace("{greeting: world}", f"{{greeting: world, file: '{elsewhere}'}}")):
        h = harness(project, playbook)
        h.host.on(lambda argv, stdin: "orch-sha" in argv, Reply(stdout=b""))
        h.host.on_argv(["mkdir", "-p", "/srv/app"])
        h.host.on_cp(root)
        assert h.record().steps[0].status == "changed"
        assert (root / "srv" / "app" / "hello.txt").read_text() == "shared\n"


def test_push_literal_src_missing_is_a_load_error_at_its_line(tmp_path):
    with pytest.raises(ConfigError) as error:
        harness(tmp_path, "name: t\nsteps:\n  - push: {src: gone.txt, dest: /x}\n")
    assert str(error.value).startswith(f"{tmp_path}/playbook.yaml:3:17: push: gone.txt not found")


LAUNCH = """\
    name: t
    targets: [dev]
    vars: {steps: 200}
    steps:
      - name: drafters
        launch:
          command: [python, train.py, "{{ steps }}"]
          env: {HF_TOKEN: s3cret, MODE: fast}
"""


def test_launch_plan_hides_secrets(tmp_path):
    plan = planned(tmp_path, LAUNCH)
    assert plan == [
        f"detached in {REMOTE_ROOT}/{RUN_ID}/drafters (setsid; log output.log, pid.json, "
        "exit.json), venv /opt/venv",
        "HF_HOME=/data/hf CUDA_VISIBLE_DEVICES=0,1 HF_TOKEN=*** MODE=fast python train.py 200"]


def test_launch_notes_the_launch_and_keeps_secrets_off_argv(tmp_path):
    h = harness(tmp_path, LAUNCH)
    run_dir = f"{REMOTE_ROOT}/{RUN_ID}/drafters"
    h.host.on_payload("launcher", {"run_dir": run_dir, "pid": 4242, "log": f"{run_dir}/output.log",
                                   "started_at": 1700000000.0})
    record = h.record()
    (call,) = h.host.payload_calls("launcher")
    assert "s3cret" not in " ".join(call.argv) and b"s3cret" in call.stdin
    assert call.argv == ["python3", "-"]
    assert [c[0] for c in h.recorder.calls[:2]] == ["note_launch_starting", "note_launch"]
    launch = record.launch["targets"]["dev"]
    assert (launch["pid"], launch["run_dir"], launch["cuda_visible_devices"]) == (4242, run_dir, "0,1")
    assert launch["argv"] == ["python", "train.py", "200"]
    assert record.steps[0].message == f"pid 4242 in {run_dir} (CUDA_VISIBLE_DEVICES=0,1)"
    assert h.recorder.launch_info("dev")["env_keys"] == ["CUDA_VISIBLE_DEVICES", "HF_HOME",
                                                         "HF_TOKEN", "MODE"]


def test_launch_failure_is_recorded_as_starting_only(tmp_path):
    h, step = payload_failure(tmp_path, LAUNCH, "launcher",
                              "cannot create /var/tmp/orch/runs: read-only file system")
    assert step.message == "dev: cannot create /var/tmp/orch/runs: read-only file system"
    assert "note_launch_starting" in h.recorder.names() and "note_launch" not in h.recorder.names()
    assert h.recorder.record.launch["targets"] == {}


def test_launch_empty_command_fails_in_plan_and_run(tmp_path):
    h = harness(tmp_path, "name: t\ntargets: [dev]\nsteps:\n  - launch: {command: []}\n")
    params = {"command": [], "env": {}, "cwd": None, "gpus": None, "venv": None,
              "run_dir": None, "torchrun": None}
    with pytest.raises(StepFailed, match="launch: the command is empty"):
        h.step().plan(h.context(), params)
