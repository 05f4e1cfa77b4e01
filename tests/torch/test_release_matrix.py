"""The release matrix (scripts/torch-matrix.py) as tests: fx_patch on the sources of every
torch release from 2.1 to 2.14.1, got from the registry's real wheels (only their .py
members and dist-info, cached under ~/.cache/orch-test/torch-sources).

Each vulnerable release: status says vulnerable, diff and apply (source-only: such a tree
has no compiled parts to import) rewrite every reader and writer, every changed file
compiles, no module-global read or write of the flag is left in the patched tree, status
says patched, a second apply changes nothing, revert gives back every byte of the wheel's
RECORD. 2.14.x: fixed-upstream, nothing changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.fixtures.payloads import clean_env, run_payload
from tests.torch.matrix import matrix

# Which files each release needs (what the issue found by hand; the patcher finds them).
OTHER_USER = {"2.1.2": [], "2.2.2": ["torch/_higher_order_ops/cond.py"]}
CHECKPOINT = "torch/utils/checkpoint.py"


@pytest.fixture(scope="module", params=list(matrix.RELEASES))
def release(request):
    site, _fetched = matrix.release_site(request.param)
    return request.param, site


def test_release(release):
    version, site = release
    out = matrix.check_release(version, site, sys.executable)
    if matrix.RELEASES[version] == "fixed-upstream":
        assert (out["status"], out["files"]) == ("fixed-upstream", [])
        return
    assert out["status"] == "vulnerable" and out["torch_version"].startswith(version)
    others = OTHER_USER.get(version, ["torch/_higher_order_ops/utils.py"])
    assert out["files"] == sorted(others + [matrix.SYMBOLIC_TRACE, CHECKPOINT])


# fx-threads: which users of the node-meta state each release has beyond fx-tls's files
# (found by hand in the sources; the patcher finds them itself).
NODE_META_USERS = {
    "2.1.2": ["torch/fx/experimental/proxy_tensor.py"],
    "2.5.1": ["torch/_functorch/_aot_autograd/traced_function_transforms.py",
              "torch/fx/experimental/proxy_tensor.py"],
    "2.9.1": ["torch/_functorch/_aot_autograd/graph_capture_wrappers.py",
              "torch/fx/experimental/proxy_tensor.py"],
    "2.13.0": ["torch/_functorch/_aot_autograd/graph_capture_wrappers.py",
               "torch/_higher_order_ops/flex_attention.py",
               "torch/fx/experimental/proxy_tensor.py"],
}


def test_fx_threads_release(release):
    """Every release: one row per state (the flag upstream from 2.14 on, node-meta and the
    trace-time patching process-wide everywhere), apply leaves no module-global use of a
    patched name and guards both _Patcher methods, revert gives back the wheel."""
    version, site = release
    out = matrix.check_threads(version, site, sys.executable)
    assert out["states"] == matrix.expected_states(version)
    assert out["where"]["node-meta"].startswith("torch/fx/traceback.py:")
    assert "torch/fx/traceback.py" in out["files"]
    if version in NODE_META_USERS:
        assert set(NODE_META_USERS[version]) <= set(out["files"])
    # The trace-time patching lives in _symbolic_trace.py in every release (with the
    # module-global CURRENT_PATCHER from 2.5 on); on 2.14 upstream's flag helpers stay.
    assert matrix.SYMBOLIC_TRACE in out["files"]
    assert out["where"]["trace-patching"].startswith(matrix.SYMBOLIC_TRACE + ":")


def test_the_source_tree_switch_is_refused_on_a_real_install(tmp_path):
    """ORCH_FX_PATCH_SOURCE_TREE=1 skips the import check only where there is nothing to
    import: a tree with torch's compiled extension refuses it before writing anything."""
    site, _ = matrix.release_site("2.8.0")
    copy = tmp_path / "site"
    subprocess.run(["cp", "-al", str(site), str(copy)], check=True)
    (copy / "torch" / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    before = matrix.tree_digest(copy)
    env = clean_env(PYTHONPATH=str(copy), ORCH_FX_PATCH_SOURCE_TREE="1")
    error = run_payload(sys.executable, "fx_patch", {"action": "apply"}, env=env) \
        .expect_error("refused")
    assert "only for a source tree without compiled parts" in error["message"]
    assert matrix.tree_digest(copy) == before


def test_the_source_tree_apply_says_it_did_not_import(tmp_path):
    site, _ = matrix.release_site("2.4.1")
    copy = tmp_path / "site"
    subprocess.run(["cp", "-al", str(site), str(copy)], check=True)
    env = clean_env(PYTHONPATH=str(copy), ORCH_FX_PATCH_SOURCE_TREE="1")
    applied = run_payload(sys.executable, "fx_patch", {"action": "apply"}, env=env).expect_result()
    assert "NOT import-checked" in applied["message"] and applied["import_check"]["skipped"]


def test_an_unknown_shape_of_an_old_release_is_refused_without_touching_a_file(tmp_path):
    """2.1's Tracer.trace with the flag saved some other way: not a shape orch knows."""
    site, _ = matrix.release_site("2.1.2")
    copy = tmp_path / "site"
    subprocess.run(["cp", "-al", str(site), str(copy)], check=True)
    path = copy / matrix.SYMBOLIC_TRACE
    text = path.read_text()
    edited = text.replace("        _is_fx_tracing_flag = True\n", "        _is_fx_tracing_flag = 1\n")
    assert edited != text
    os.unlink(path)  # a hard link to the cache: replace, never write through
    path.write_text(edited)
    before = matrix.tree_digest(copy)
    env = clean_env(PYTHONPATH=str(copy), ORCH_FX_PATCH_SOURCE_TREE="1")
    status = run_payload(sys.executable, "fx_patch", {"action": "status"}, env=env).expect_result()
    assert status["status"] == "unknown" and "Tracer.trace" in status["message"]
    run_payload(sys.executable, "fx_patch", {"action": "apply"}, env=env) \
        .expect_error("unknown-shape")
    assert matrix.tree_digest(copy) == before
    assert not (copy / ".orch-fx-tls").exists()
    shutil.rmtree(copy)


@pytest.mark.parametrize("version", ["2.1.2", "2.2.2", "2.13.0"])
def test_the_leftover_scan_finds_every_global_use_in_an_unpatched_tree(version):
    """The matrix's AST scan is what says "no global use left": on the pristine sources it
    must find the module-level flag, the `global` in Tracer.trace and the readers."""
    site, _ = matrix.release_site(version)
    found = []
    for path in sorted((site / "torch").rglob("*.py")):
        source = path.read_bytes()
        if matrix.FLAG.encode() in source:
            found += matrix.global_flag_uses(str(path.relative_to(site)), source)
    assert any(": global _is_fx_tracing_flag" in f for f in found)
    assert any(f.startswith(matrix.SYMBOLIC_TRACE) and ": the name" in f for f in found)
    if version != "2.1.2":  # 2.1 has no other reader
        assert any(": attribute ._is_fx_tracing_flag" in f and "_higher_order_ops/" in f
                   for f in found)
