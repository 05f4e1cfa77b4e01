"""fx_patch on the stand-in torch (tests/fixtures/fake_torch): the whole life cycle, drift,
refusals and failure paths, fast. tests/torch/ runs the same against real torch."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


from tests.fixtures.payloads import (
    FAKE_TORCH_VERSION, PAYLOADS, dist_record_hash, env_with_path, install_fake_torch, read_dist_record,
    replace_file, run_payload, tree_hashes)
from tests.support.fx_patch import FX_PATCH

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
    assert len(headers) == 3 and all("(orch 9.9.9, patch set fx-tls)" in line for line in headers)
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
        assert data.startswith(b"# orch fx-tls patch (orch 9.9.9, patch set fx-tls)")
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


# --- adding a with item: every legal layout (property test) -----------------------------------


NEW_ITEM = "torch.fx._symbolic_trace._is_fx_tracing_context(is_fx_tracing)"
EXPRESSIONS = ["a", "f(x)", "m.cm(y, z=1)", "g(\n        1,\n        2,\n    )", "(k)", "((k2))",
               "h(\n  'a, b):'  # a comment inside the call\n)"]
COMMENT = "  # note: (, ) and : in a comment\n"


@st.composite
def with_statements(draw):
    """A `with` statement in one of the layouts Python accepts: items separated by commas
    with spaces, backslash continuations or (in the parenthesised form) new lines and
    comments; redundant parentheses; `as` targets; a trailing comma; a body on the same
    line or indented."""
    count = draw(st.integers(1, 3))
    items = []
    for index in range(count):
        item = draw(st.sampled_from(EXPRESSIONS))
        if draw(st.booleans()):
            item += " as " + draw(st.sampled_from(["t%d" % index, "(u%d, v%d)" % (index, index)]))
        items.append(item)
    if draw(st.booleans()):  # the parenthesised form (Python 3.9+)
        separators = [draw(st.sampled_from([", ", ",\n    ", "," + COMMENT + "    ",
                                            " ,  \\\n  "])) for _ in items[1:]]
        opening = draw(st.sampled_from(["(", "(\n    ", "(" + COMMENT + "    ", "( \\\n "]))
        closing = draw(st.sampled_from(["", ",", ",\n", "\n", "," + COMMENT]))
        header = "with " + opening + interleave(items, separators) + closing + ")"
    else:
        separators = [draw(st.sampled_from([", ", ",\\\n    ", ", \\\n         ", " ,\\\n"]))
                      for _ in items[1:]]
        lead = draw(st.sampled_from(["", "\\\n    "]))
        header = "with " + lead + interleave(items, separators)
    space = draw(st.sampled_from(["", " ", " \\\n  "]))
    body = draw(st.sampled_from([": pass\n", ":\n    fn()\n", ":" + COMMENT + "    fn()\n"]))
    return header + space + body


def interleave(items, separators):
    return items[0] + "".join(sep + item for sep, item in zip(separators, items[1:]))


@settings(max_examples=400, deadline=None)
@given(with_statements(), st.sampled_from(["", "x = 1\n"]), st.booleans())
def test_a_with_item_is_added_in_every_legal_layout(statement, before, nested):
    if nested:  # inside a function, indented, like checkpoint's recompute_fn
        statement = "def recompute_fn():\n" + "".join(
            "    " + line if line.strip() else line for line in statement.splitlines(True))
    source = before + statement + "y = 2\n"
    original = ast.parse(source)  # the generator makes only legal statements
    src = FX_PATCH.Source("example.py", source.encode())
    with_node = next(n for n in ast.walk(src.tree) if isinstance(n, ast.With))
    offset, text = FX_PATCH.with_item_insertion(src, with_node, NEW_ITEM.encode())
    FX_PATCH.add_with_item(src, with_node, NEW_ITEM.encode())
    edited = src.edited()
    compile(edited, "example.py", "exec", dont_inherit=True)
    expected = original
    next(n for n in ast.walk(expected) if isinstance(n, ast.With)).items.append(
        ast.parse("with %s: pass" % NEW_ITEM).body[0].items[0])
    assert ast.dump(ast.parse(edited)) == ast.dump(expected), edited.decode()
    # Only an insertion of the item with its comma: every original byte is kept.
    assert edited == source.encode()[:offset] + text + source.encode()[offset:]
    assert text.strip(b", \n") in (NEW_ITEM.encode(), NEW_ITEM.encode() + b",")


def test_the_2_1_checkpoint_layout_a_backslash_continued_with(tmp_path):
    """torch 2.1-2.3's recompute_fn continues its `with` with a backslash; a line break
    added without one would not compile."""
    source = (b"def recompute_fn():\n"
              b"    with device_autocast_ctx, torch.cpu.amp.autocast(**kw), \\\n"
              b"         recompute_context:\n"
              b"        fn(*args, **kwargs)\n")
    src = FX_PATCH.Source("torch/utils/checkpoint.py", source)
    FX_PATCH.add_with_item(src, src.tree.body[0].body[0], NEW_ITEM.encode())
    assert src.edited() == source.replace(
        b"recompute_context:", b"recompute_context, " + NEW_ITEM.encode() + b":")


# --- kill -9 during apply: the next action removes orch's temp files ------------------------


def temp_files(site):
    return sorted(str(p.relative_to(site)) for p in site.rglob("*.orch-tmp"))


@pytest.mark.parametrize("killed_at", ["_symbolic_trace.py", "utils.py.orig", "record.json"])
@pytest.mark.parametrize("next_action", ["status", "diff", "apply", "revert"])
def test_a_kill_9_during_apply_leaves_temp_files_only_apply_and_revert_remove(fake, killed_at,
                                                                             next_action):
    before = fake.hashes()
    env = dict(fake.env, ORCH_FX_PATCH_KILL_BEFORE_RENAME=killed_at)
    run = fake.patch("apply", env=env)
    assert run.returncode == -9 and not run.events  # killed: no result, no error line
    left = temp_files(fake.site)
    assert left and all(p.split("/")[-1].startswith(".") for p in left)
    backups = sorted(str(p.relative_to(fake.record_dir)) for p in
                     (fake.record_dir / "backups").rglob("*.orig"))
    # A file that is not orch's, named like one but outside the pattern, stays.
    foreign = fake.path("torch/fx/.notes.orch-tmp")
    foreign.write_bytes(b"not orch's")
    run = fake.patch(next_action)
    if next_action == "apply" and killed_at == "_symbolic_trace.py":
        # Killed mid-write: the record says "applying", so apply refuses (revert finishes
        # it), and still cleans up.
        assert "an apply was interrupted" in run.expect_error("refused")["message"]
        assert temp_files(fake.site) == ["torch/fx/.notes.orch-tmp"]
    elif next_action in ("status", "diff"):
        # Read-only: it says what is left and deletes nothing, not even a temp file.
        result = run.expect_result()
        assert result["removed_temp_files"] == [] and result["leftover_temp_files"] == left
        assert sorted(temp_files(fake.site)) == sorted(left + ["torch/fx/.notes.orch-tmp"])
        if killed_at != "_symbolic_trace.py":  # killed before the record was saved
            assert result["orphan_backups"] == backups
    else:
        result = run.expect_result()
        assert result["removed_temp_files"] == left
        assert temp_files(fake.site) == ["torch/fx/.notes.orch-tmp"]
        if killed_at != "_symbolic_trace.py" and next_action == "revert":
            # A backup without a record is reported, never deleted by orch.
            assert result["orphan_backups"] == backups
    # The tree itself ends as the action leaves it: status and revert reconcile to the
    # pristine files, apply completes the patch.
    fake.patch("revert").expect_result()
    foreign.unlink()
    for path in fake.site.rglob("*.orch-tmp"):
        path.unlink()
    assert {k: v for k, v in fake.hashes().items() if not k.startswith(".orch-fx-tls/")} == \
        {k: v for k, v in before.items() if not k.startswith(".orch-fx-tls/")}


def test_a_backup_without_a_record_that_differs_is_never_overwritten(fake):
    stray = fake.record_dir / "backups" / "torch/fx/_symbolic_trace.py.orig"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"someone's copy\n")
    before = fake.hashes()
    assert "exists without a record" in fake.patch("apply").expect_error("refused")["message"]
    assert fake.hashes() == before


LOCK_ENV = {"ORCH_FX_PATCH_LOCK_WAIT": "0.5"}


def hold_lock(fake, mode):
    import fcntl
    fd = os.open(fake.path("torch"), os.O_RDONLY)
    fcntl.flock(fd, mode)
    return fd


def test_readers_share_the_lock_and_a_writer_waits_for_them(fake):
    import fcntl
    fd = hold_lock(fake, fcntl.LOCK_SH)  # another status in progress
    try:
        env = dict(fake.env, **LOCK_ENV)
        assert fake.patch("status", env=env).expect_result()["status"] == "vulnerable"
        assert fake.patch("diff", env=env).expect_result()["diff"]
        error = fake.patch("apply", env=env).expect_error("busy")
        assert "another orch patch action is using torch" in error["message"]
    finally:
        os.close(fd)
    assert fake.patch("apply").expect_result()["status"] == "patched"


def test_a_reader_during_a_change_is_busy_not_vulnerable(fake):
    import fcntl
    fd = hold_lock(fake, fcntl.LOCK_EX)  # an apply in progress
    try:
        error = fake.patch("status", env=dict(fake.env, **LOCK_ENV)).expect_error("busy")
        assert "another orch patch action is changing torch" in error["message"]
    finally:
        os.close(fd)
    assert fake.patch("status").expect_result()["status"] == "vulnerable"


def test_four_concurrent_status_calls_all_answer(fake):
    argv = [sys.executable, str(PAYLOADS / "fx_patch.py"), json.dumps({"action": "status"})]
    procs = [subprocess.Popen(argv, env=fake.env, stdout=subprocess.PIPE) for _ in range(4)]
    outs = [json.loads(p.communicate(timeout=120)[0].splitlines()[-1]) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4
    assert [o["status"] for o in outs] == ["vulnerable"] * 4


# --- what status says about each file, and which version -------------------------------------


def test_status_and_diff_say_why_each_file_changes(fake):
    files = {f["path"]: f["why"] for f in fake.patch("status").expect_result()["files"]}
    assert "backport of torch 2.14's recompute handling" in files["torch/utils/checkpoint.py"]
    assert "never names the flag" in files["torch/utils/checkpoint.py"]
    assert "rewritten to the helpers" in files["torch/_higher_order_ops/utils.py"]
    diff = fake.patch("diff").expect_result()["diff"]
    assert "# torch/utils/checkpoint.py: never names the flag" in diff


def test_the_version_is_torch_dunder_version_from_version_py(fake):
    # As in a CUDA wheel from the registry: METADATA says 2.8.0, torch.__version__ is
    # 2.8.0+cu128; verify fx-race imports torch and reports the latter, so status does too.
    replace_file(fake.path("torch/version.py"),
                 b"from typing import Optional\n\n__all__ = ['__version__']\n"
                 b"__version__ = '2.8.0+cu128'\ncuda: Optional[str] = '12.8'\n")
    assert fake.patch("status").expect_result()["torch_version"] == "2.8.0+cu128"
    assert fake.python("import torch.version; print(torch.version.__version__)").strip() \
        == "2.8.0+cu128"


WRITER_AMONG_READERS = r"""
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
os.environ["ORCH_FX_PATCH_LOCK_WAIT"] = "3"
from _fx_files import TreeBusy, lock_torch_tree
site, stop = sys.argv[2], threading.Event()

def reader(delay):
    time.sleep(delay)
    while not stop.is_set():        # status calls that keep arriving, each overlapping the next
        fd = lock_torch_tree(site, exclusive=False)
        time.sleep(0.3)
        os.close(fd)

threads = [threading.Thread(target=reader, args=(d,), daemon=True) for d in (0, 0.15)]
for t in threads:
    t.start()
time.sleep(0.5)
started = time.monotonic()
try:
    fd = lock_torch_tree(site, exclusive=True)
    print("writer got the tree after %.2f s" % (time.monotonic() - started))
    os.close(fd)
except TreeBusy:
    print("writer starved")
stop.set()
"""


def test_readers_that_keep_coming_cannot_starve_a_writer(fake):
    """Two status calls always overlapping: a shared lock is never free, so an apply that
    waits for the exclusive one alone waited its 3 s and gave up (busy)."""
    out = subprocess.run([sys.executable, "-c", WRITER_AMONG_READERS, str(PAYLOADS),
                          str(fake.site)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("writer got the tree after"), out.stdout
    assert float(out.stdout.split()[-2]) < 1.0
