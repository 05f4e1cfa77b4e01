"""orch's folders in a container cannot be turned against root (payloads/_statedir.py, and
the launcher and bootstrap payloads that use it): a symlink, a folder of another account or
one writable by others is refused before root writes, runs or signals anything through it.
The real payloads run on this machine (local transport); the cases that need a second
account run when the tests run as root (chown to nobody)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.ground.errors import PayloadError
from orchestrator.remote.payload_api import bootstrap, launcher, stop_run
from orchestrator.payloads import _statedir
from orchestrator.payloads._statedir import UnsafePath, open_new, secure_dir
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another account")


def here() -> Target:
    return Target("dev", LocalTransport("here"))


# ------------------------------------------------------------------ the folder checks
def test_made_folders_are_private_and_checked(tmp_path):
    made = secure_dir(str(tmp_path / "a" / "b"), private=True)
    assert made == str(tmp_path / "a" / "b")
    assert oct(os.stat(made).st_mode & 0o777) == "0o700"
    assert oct(os.stat(tmp_path / "a").st_mode & 0o777) == "0o755"   # on the way: as mkdir -p
    assert secure_dir(str(tmp_path / "missing"), create=False) is None


def test_a_symlink_anywhere_in_the_path_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePath, match=r"link is a symlink"):
        secure_dir(str(tmp_path / "link" / "runs"))
    assert not (tmp_path / "real" / "runs").exists()


def test_a_folder_writable_by_others_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafePath, match="writable by other accounts"):
        secure_dir(str(shared / "runs"))
    shared.chmod(0o1777)   # like /tmp: fine on the way, as long as what is inside is ours
    assert secure_dir(str(shared / "runs"))
    with pytest.raises(UnsafePath, match="writable by other accounts"):
        secure_dir(str(shared))   # but never as the folder orch writes into


@as_root
def test_a_folder_another_account_made_first_is_refused(tmp_path):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    planted = sticky / "orch"
    planted.mkdir()
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match="belongs to uid 65534"):
        secure_dir(str(planted / "runs"))
    assert not (planted / "runs").exists()


def test_state_dir_of_an_earlier_orch_is_made_private(tmp_path, monkeypatch):
    old = tmp_path / "lib-orch"
    old.mkdir(mode=0o755)
    monkeypatch.setattr(_statedir, "STATE_DIR", str(old))
    assert _statedir.payload_folder(str(old / "runs" / "r1"), create=False) is None
    assert _statedir.payload_folder(str(old / "wheelhouse"), create=True) == str(old / "wheelhouse")
    assert oct(os.stat(old).st_mode & 0o777) == "0o700"
    assert oct(os.stat(old / "wheelhouse").st_mode & 0o777) == "0o700"


def test_temporary_files_have_unguessable_names_and_never_follow_a_link(tmp_path):
    fd1, one = open_new(str(tmp_path), "pid.json")
    fd2, two = open_new(str(tmp_path), "pid.json")
    os.close(fd1), os.close(fd2)
    assert one != two and os.path.basename(one).startswith(".pid.json.")
    assert oct(os.stat(one).st_mode & 0o777) == "0o600"


# ------------------------------------------------------------------ the launcher
@as_root
def test_the_launcher_refuses_a_run_folder_another_account_owns(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chown(run_dir, NOBODY, NOBODY)
    with pytest.raises(PayloadError, match="unsafe run folder: .*belongs to uid 65534") as found:
        launcher(here(), "start", str(run_dir), argv=["true"])
    assert found.value.kind == "unsafe-path"
    assert os.listdir(run_dir) == []


@as_root
def test_stop_never_signals_what_a_planted_pid_json_names(tmp_path):
    """Another account writes pid.json naming a root process (pid and start time copied from
    /proc): stop refuses the folder and the process lives on."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        ticks = int(open(f"/proc/{victim.pid}/stat").read().rsplit(")", 1)[1].split()[19])
        (run_dir / "pid.json").write_text(json.dumps({"pid": victim.pid, "start_ticks": ticks}))
        os.chown(run_dir, NOBODY, NOBODY)
        with pytest.raises(PayloadError, match="unsafe run folder"):
            stop_run(here(), str(run_dir), grace=1)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_stop_signals_only_the_process_carrying_the_runs_marker(tmp_path):
    """A pid.json whose pid and start time name another process (a recycled pid, a copied
    file) does not make that process the run's: without the marker it is not signalled."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    try:
        run_dir = tmp_path / "run"
        started = launcher(here(), "start", str(run_dir), argv=["sleep", "30"])
        ticks = int(open(f"/proc/{victim.pid}/stat").read().rsplit(")", 1)[1].split()[19])
        real = json.loads((run_dir / "pid.json").read_text())
        assert real["marker"] and started["pid"] == real["pid"]
        (run_dir / "pid.json").write_text(json.dumps({**real, "pid": victim.pid,
                                                      "start_ticks": ticks}))
        answer = stop_run(here(), str(run_dir), grace=1)
        assert answer["already"] is True and victim.poll() is None
        (run_dir / "pid.json").write_text(json.dumps(real))
        assert stop_run(here(), str(run_dir), grace=5)["sent"] == "SIGTERM"
    finally:
        victim.kill()
        victim.wait()


def test_a_run_of_an_earlier_orch_without_a_marker_can_still_be_stopped(tmp_path):
    """pid.json written before the marker existed: its start time is what names the run."""
    run_dir = tmp_path / "run"
    launcher(here(), "start", str(run_dir), argv=["sleep", "30"])
    old = json.loads((run_dir / "pid.json").read_text())
    del old["marker"]
    (run_dir / "pid.json").write_text(json.dumps(old))
    assert launcher(here(), "status", str(run_dir))["state"] == "running"
    assert stop_run(here(), str(run_dir), grace=5)["sent"] == "SIGTERM"


def test_a_run_folder_through_a_symlink_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PayloadError, match="runs is a symlink"):
        launcher(here(), "start", str(tmp_path / "runs" / "r1"), argv=["true"])
    assert os.listdir(tmp_path / "elsewhere") == []


# ------------------------------------------------------------------ the wheelhouse
def test_the_wheelhouse_list_gives_the_sha256_of_same_size_files(tmp_path):
    house = tmp_path / "wheelhouse"
    found = bootstrap(here(), "list", dir=str(house), sizes={"a.whl": 3})["files"]
    assert found == {} and oct(os.stat(house).st_mode & 0o777) == "0o700"
    (house / "a.whl").write_bytes(b"abc")
    (house / "b.whl").write_bytes(b"defg")
    found = bootstrap(here(), "list", dir=str(house), sizes={"a.whl": 3, "b.whl": 9})["files"]
    assert found == {"a.whl": {"size": 3, "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a3"
                                                    "96177a9cb410ff61f20015ad"},
                     "b.whl": {"size": 4}}


def test_a_symlinked_wheelhouse_is_refused(tmp_path):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "wheelhouse").symlink_to(tmp_path / "theirs")
    with pytest.raises(PayloadError, match="unsafe wheelhouse: .*wheelhouse is a symlink"):
        bootstrap(here(), "list", dir=str(tmp_path / "wheelhouse"))


def test_a_wheel_changed_after_the_push_is_not_installed(tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir(mode=0o700)
    (house / "evil-1.0-py3-none-any.whl").write_bytes(b"not what orch pushed")
    with pytest.raises(PayloadError, match="is not the wheel orch pushed") as found:
        bootstrap(here(), "install", python=sys.executable, venv=str(tmp_path / "venv"),
                  hash="h", packages=["evil"], find_links=str(house), no_index=True,
                  wheels={"evil-1.0-py3-none-any.whl": "0" * 64})
    assert found.value.kind == "bad-wheel"


def test_pips_own_wheel_runs_only_with_the_sha256_orch_pushed(tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir(mode=0o700)
    wheel = house / "pip-99-py3-none-any.whl"
    wheel.write_bytes(b"planted")
    with pytest.raises(PayloadError, match="is not the wheel orch pushed") as found:
        bootstrap(here(), "install", python=sys.executable, venv=str(tmp_path / "venv"),
                  hash="h", packages=["x"], pip_wheel=str(wheel), pip_wheel_sha256="0" * 64)
    assert found.value.kind == "bad-wheel" and not (tmp_path / "venv").exists()
