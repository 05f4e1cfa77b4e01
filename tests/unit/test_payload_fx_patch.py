"""fx_patch on the stand-in torch (tests/fixtures/fake_torch): the whole life cycle, drift,
refusals and failure paths, fast. tests/torch/ runs the same against real torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.fixtures.payloads import (
    FAKE_TORCH_VERSION, dist_record_hash, env_with_path, install_fake_torch, read_dist_record,
    replace_file, run_payload, tree_hashes)

CHANGED = ["torch/_higher_order_ops/utils.py", "torch/fx/_symbolic_trace.py",
           "torch/utils/checkpoint.py"]
ST = "torch/fx/_symbolic_trace.py"


class FakeSite:
    def __init__(self, root):
        self.site = root / "site"
        install_fake_torch(self.site)
        self.env = env_with_path(self.site)
        self.record_dir = self.site / ".orch-fx-tls"

    def patch(self, action, env=None, **args):
        return run_payload(sys.executable, "fx_patch", {"action": action, "orch_version": "9.9.9",
                                                        **args}, env=env or self.env)

    def path(self, relpath):
        return self.site / relpath

    def read(self, relpath):
        return self.path(relpath).read_bytes()

    def hashes(self):
        return tree_hashes(self.site)

    def python(self, code):
        """Run code with this site's torch; returns its stdout."""
        proc = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


@pytest.fixture
def fake(tmp_path):
    return FakeSite(tmp_path)


@pytest.fixture
def patched(fake):
    fake.patch("apply").expect_result()
    return fake


def test_status_of_the_global_flag_is_vulnerable_and_lists_the_files(fake):
    result = fake.patch("status").expect_result()
    assert result["status"] == "vulnerable" and result["changed"] is False
    assert result["torch_version"] == FAKE_TORCH_VERSION
    assert [f["path"] for f in result["files"]] == CHANGED  # not notes.py: a comment only
    assert all(f["dist_record"] == "ok" for f in result["files"])
    assert result["record"] is None


def test_diff_shows_the_change_and_changes_nothing(fake):
    before = fake.hashes()
    result = fake.patch("diff").expect_result()
    diff = result["diff"]
    for line in ["+_is_fx_tracing_tls = threading.local()",
                 "-        global _is_fx_tracing_flag",
                 "+        _set_is_fx_tracing(True)",
                 "-    return _is_fx_tracing_flag",
                 "+    return _get_is_fx_tracing()",
                 "+    _old_is_tracing = torch.fx._symbolic_trace._get_is_fx_tracing()",
                 "+        torch.fx._symbolic_trace._set_is_fx_tracing(False)",
                 "+    is_fx_tracing = torch.fx._symbolic_trace._get_is_fx_tracing()",
                 "+            torch.fx._symbolic_trace._is_fx_tracing_context(is_fx_tracing),",
                 "+import threading"]:
        assert line in diff.splitlines(), line
    headers = [line for line in diff.splitlines() if line.startswith("+# orch fx-tls patch")]
    assert len(headers) == 3 and all("(orch 9.9.9)" in line for line in headers)
    assert fake.hashes() == before


def test_apply_patches_records_and_backs_up(fake):
    originals = {rel: fake.read(rel) for rel in CHANGED}
    result = fake.patch("apply").expect_result()
    assert result["status"] == "patched" and result["changed"] is True
    assert result["import_check"]["problems"] == []
    record = json.loads((fake.record_dir / "record.json").read_text())
    assert record["state"] == "applied" and record["orch_version"] == "9.9.9"
    assert record["torch_version"] == FAKE_TORCH_VERSION
    for entry in record["files"]:
        data = fake.read(entry["path"])
        assert data.startswith(b"# orch fx-tls patch (orch 9.9.9)")
        assert (fake.record_dir / entry["backup"]).read_bytes() == originals[entry["path"]]
    assert sorted(e["path"] for e in record["files"]) == CHANGED
    assert fake.read("torch/utils/notes.py").startswith(b"# Mentions")


def test_patched_module_keeps_per_thread_flags_and_the_attribute(patched):
    out = patched.python("""
import threading
import torch
from torch.fx import _symbolic_trace as st
from torch._higher_order_ops.utils import _set_compilation_env
seen = {}
def other():
    seen["other_before"] = st.is_fx_symbolic_tracing()
    st._is_fx_tracing_flag = True
    seen["other_attr"] = st._is_fx_tracing_flag
def traced():
    t = threading.Thread(target=other); t.start(); t.join()
    seen["inside"] = (st.is_fx_tracing(), st._is_fx_tracing_flag)
    with _set_compilation_env():
        seen["hop"] = st.is_fx_tracing()
    seen["after_hop"] = st.is_fx_tracing()
st.symbolic_trace(traced)
seen["after"] = st.is_fx_tracing()
print(sorted(seen.items()))
""")
    assert out.strip() == str(sorted({
        "other_before": False, "other_attr": True, "inside": (True, True), "hop": False,
        "after_hop": True, "after": False}.items()))


def test_checkpoint_recompute_sees_the_forward_threads_flag(patched):
    out = patched.python("""
import threading
from torch.fx import _symbolic_trace as st
from torch.utils.checkpoint import _checkpoint_without_reentrant_generator
seen = []
def fn():
    seen.append(st.is_fx_tracing())
with st._is_fx_tracing_context(True):
    recompute = next(_checkpoint_without_reentrant_generator(fn))
worker = threading.Thread(target=recompute)  # as an autograd worker thread would
worker.start(); worker.join()
print(seen, st.is_fx_tracing())
""")
    assert out.strip() == "[True] False"


def test_apply_twice_changes_nothing(patched):
    before = patched.hashes()
    result = patched.patch("apply").expect_result()
    assert result["changed"] is False and result["status"] == "patched"
    assert "nothing to do" in result["message"]
    assert patched.hashes() == before


def test_status_when_patched_says_when_and_by_which_version(patched):
    result = patched.patch("status").expect_result()
    assert result["status"] == "patched"
    assert result["record"]["orch_version"] == "9.9.9" and result["record"]["applied_at"]
    assert {f["state"] for f in result["files"]} == {"patched"}
    assert {f["dist_record"] for f in result["files"]} == {"mismatch"}


def test_revert_restores_the_exact_bytes_of_the_dist_record(patched):
    result = patched.patch("revert").expect_result()
    assert result["changed"] is True and result["status"] == "vulnerable"
    assert [(f["path"], f["action"], f["dist_record"]) for f in result["files"]] == \
        [(rel, "restored", "ok") for rel in CHANGED]
    record = read_dist_record(next(patched.site.glob("torch-*.dist-info")))
    for rel in CHANGED:
        assert dist_record_hash(patched.read(rel)) == record[rel]
    assert not patched.record_dir.exists()
    again = patched.patch("revert").expect_result()
    assert again["changed"] is False and "nothing to revert" in again["message"]


def test_apply_removes_stale_bytecode_and_keeps_file_modes(fake):
    cache = fake.path("torch/fx/__pycache__")
    cache.mkdir()
    stale = cache / "_symbolic_trace.cpython-311.pyc"
    stale.write_bytes(b"stale")
    unrelated = cache / "_symbolic_trace_helpers.cpython-311.pyc"
    unrelated.write_bytes(b"keep")
    os.chmod(fake.path(ST), 0o640)
    fake.patch("apply").expect_result()
    assert not stale.exists() or stale.read_bytes() != b"stale"
    assert unrelated.read_bytes() == b"keep"
    assert os.stat(fake.path(ST)).st_mode & 0o777 == 0o640


def test_reinstalled_torch_is_drift_and_revert_reconciles(patched):
    # A reinstall puts pip's files back while orch's record stays beside torch/.
    for rel in CHANGED:
        backup = patched.record_dir / "backups" / (rel + ".orig")
        replace_file(patched.path(rel), backup.read_bytes())
    status = patched.patch("status").expect_result()
    assert status["status"] == "drifted"
    assert {(f["state"], f["dist_record"]) for f in status["files"]} == {("original", "ok")}
    assert "pristine" in status["message"]
    patched.patch("apply").expect_error("refused")
    result = patched.patch("revert").expect_result()
    assert result["changed"] is False
    assert {f["action"] for f in result["files"]} == {"already-original"}
    assert patched.patch("status").expect_result()["status"] == "vulnerable"


def test_a_hand_edited_patched_file_is_left_alone_and_the_record_kept(patched):
    edited = patched.read(ST) + b"# a local debugging edit\n"
    replace_file(patched.path(ST), edited)
    status = patched.patch("status").expect_result()
    assert status["status"] == "drifted"
    states = {f["path"]: f["state"] for f in status["files"]}
    assert states[ST] == "changed" and states["torch/utils/checkpoint.py"] == "patched"
    result = patched.patch("revert").expect_result()
    actions = {f["path"]: f["action"] for f in result["files"]}
    assert actions[ST] == "left-alone" and actions["torch/utils/checkpoint.py"] == "restored"
    assert patched.read(ST) == edited
    assert (patched.record_dir / "record.json").exists() and "reinstall" in result["message"]


def test_an_interrupted_apply_is_drift_that_revert_finishes(patched):
    record_file = patched.record_dir / "record.json"
    record = json.loads(record_file.read_text())
    record["state"] = "applying"
    record_file.write_text(json.dumps(record))
    status = patched.patch("status").expect_result()
    assert status["status"] == "drifted" and "interrupted" in status["message"]
    patched.patch("revert").expect_result()
    assert patched.patch("status").expect_result()["status"] == "vulnerable"


@pytest.mark.parametrize("fail_after", [0, 1, 2])
def test_a_failure_mid_apply_leaves_every_file_as_it_was(fake, fail_after):
    before = fake.hashes()
    env = dict(fake.env, ORCH_FX_PATCH_FAIL_AFTER=str(fail_after))
    error = fake.patch("apply", env=env).expect_error("write-failed")
    assert "simulated failure" in error["message"] and "restored" in error["message"]
    assert fake.hashes() == before  # no half-patched file, no temp file, no record
    assert not fake.record_dir.exists()
    assert fake.patch("status").expect_result()["status"] == "vulnerable"


def test_a_failed_import_check_rolls_every_file_back(fake):
    # A torch that cannot import after patching (here: broken independently of the patch).
    replace_file(fake.path("torch/compiler.py"), b"raise ImportError('broken build')\n")
    before = fake.hashes()
    error = fake.patch("apply").expect_error("import-check-failed")
    assert "broken build" in error["message"]
    assert fake.hashes() == before and not fake.record_dir.exists()


def edit(text, old, new):
    assert old in text, old
    return text.replace(old, new, 1)


UNKNOWN_SHAPES = {
    "no global flag": (ST, "_is_fx_tracing_flag = False\n", "_tracing = False\n"),
    "flag starts True": (ST, "_is_fx_tracing_flag = False", "_is_fx_tracing_flag = True"),
    "no global statement": (ST, "        global _is_fx_tracing_flag\n", ""),
    "augmented write": (ST, "        _is_fx_tracing_flag = True\n",
                        "        _is_fx_tracing_flag |= True\n"),
    "two globals on a line": (ST, "global _is_fx_tracing_flag", "global _is_fx_tracing_flag, os"),
    "no restore in finally": (ST, "            _is_fx_tracing_flag = old_is_fx_tracing_flag",
                              "            pass"),
    "helpers already there": (ST, "def symbolic_trace(", "def _get_is_fx_tracing():\n"
                              "    return False\n\n\ndef symbolic_trace("),
    "snapshot import elsewhere": (
        "torch/utils/notes.py", "NOTE =",
        "from torch.fx._symbolic_trace import _is_fx_tracing_flag\nNOTE ="),
    "flag on another object": ("torch/_higher_order_ops/utils.py",
                               "torch.fx._symbolic_trace._is_fx_tracing_flag = False",
                               "torch.fx.config._is_fx_tracing_flag = False"),
    "no recompute_fn": ("torch/utils/checkpoint.py", "def recompute_fn(", "def recompute(\n"),
    "carriage returns": (ST, "import torch\n", "import torch\r\n"),
}


@pytest.mark.parametrize("case", sorted(UNKNOWN_SHAPES))
def test_an_unknown_shape_is_refused_without_touching_a_byte(fake, case):
    relpath, old, new = UNKNOWN_SHAPES[case]
    replace_file(fake.path(relpath), edit(fake.read(relpath).decode(), old, new).encode())
    before = fake.hashes()
    status = fake.patch("status").expect_result()
    assert status["status"] == "unknown" and "refus" in status["message"], status["message"]
    assert fake.patch("diff").expect_result()["diff"] == ""
    fake.patch("apply").expect_error("unknown-shape")
    assert fake.hashes() == before


def test_orch_header_without_a_record_is_unknown(patched):
    for path in (patched.record_dir / "record.json",):
        path.unlink()
    status = patched.patch("status").expect_result()
    assert status["status"] == "unknown" and "no record" in status["message"]


def test_the_upstream_thread_local_shape_is_left_alone(fake):
    upstream = fake.read(ST).decode()
    upstream = edit(upstream, "_is_fx_tracing_flag = False\n",
                    "_is_fx_tracing_tls = threading.local()\n\n\n"
                    "def _set_is_fx_tracing(value):\n    _is_fx_tracing_tls.flag = value\n\n\n"
                    "def _get_is_fx_tracing():\n"
                    "    return getattr(_is_fx_tracing_tls, 'flag', False)\n\n\n"
                    "@contextlib.contextmanager\ndef _is_fx_tracing_context(value):\n    yield\n")
    replace_file(fake.path(ST), upstream.encode())
    before = fake.hashes()
    assert fake.patch("status").expect_result()["status"] == "fixed-upstream"
    result = fake.patch("apply").expect_result()
    assert result["changed"] is False and "already" in result["message"]
    assert fake.hashes() == before


def test_a_damaged_record_is_reported_not_trusted(patched):
    (patched.record_dir / "record.json").write_text("{not json")
    patched.patch("status").expect_error("bad-record")


def test_a_damaged_backup_stops_revert(patched):
    backup = patched.record_dir / "backups" / (ST + ".orig")
    backup.write_bytes(b"garbage")
    error = patched.patch("revert").expect_error("bad-record")
    assert ST in error["message"]


def test_record_dir_can_be_chosen(fake, tmp_path):
    chosen = tmp_path / "elsewhere"
    result = fake.patch("apply", record_dir=str(chosen)).expect_result()
    assert result["record_dir"] == str(chosen) and (chosen / "record.json").exists()
    assert not fake.record_dir.exists()
    assert fake.patch("status", record_dir=str(chosen)).expect_result()["status"] == "patched"


def test_unknown_action_is_refused(fake):
    fake.patch("explode").expect_error("bad-args")
