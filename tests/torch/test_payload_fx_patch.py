"""fx_patch and fx_race against real torch 2.13 (in hard-link copies of the torch venv) and
the sources of the upstream-fixed 2.14.1 wheel."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from tests.fixtures.payloads import (
    clean_env, dist_record_hash, read_dist_record, replace_file, run_payload, tree_hashes)

pytestmark = pytest.mark.torch

ST = "torch/fx/_symbolic_trace.py"
# What torch 2.13's tree turns out to need (the patcher finds these itself).
CHANGED_IN_2_13 = ["torch/_higher_order_ops/utils.py", ST, "torch/utils/checkpoint.py"]
RACE_TRIALS = 3


def fx_patch(venv, action, **env):
    return run_payload(venv.python, "fx_patch", {"action": action, "orch_version": "0.1.0-test"},
                       env=clean_env(**env))


def fx_race(venv):
    run = run_payload(venv.python, "fx_race", {"trials": RACE_TRIALS, "timeout": 60},
                      env=clean_env(), timeout=600)
    result = run.expect_result()
    assert len(run.of("trial")) == RACE_TRIALS
    return result


def torch_sources(venv):
    return tree_hashes(venv.site_packages / "torch", suffix=".py")


def dist_record(venv):
    (dist_info,) = venv.site_packages.glob("torch-*.dist-info")
    return read_dist_record(dist_info)


def assert_pristine(venv, relpaths):
    record = dist_record(venv)
    for relpath in relpaths:
        data = (venv.site_packages / relpath).read_bytes()
        assert dist_record_hash(data) == record[relpath], relpath


def test_life_cycle_status_apply_verify_revert_verify(venv_copy):
    status = fx_patch(venv_copy, "status").expect_result()
    assert status["status"] == "vulnerable" and status["torch_version"].startswith("2.13.0")
    assert [f["path"] for f in status["files"]] == CHANGED_IN_2_13

    before = torch_sources(venv_copy)
    diff = fx_patch(venv_copy, "diff").expect_result()["diff"]
    assert "+_is_fx_tracing_tls = threading.local()" in diff.splitlines()
    assert torch_sources(venv_copy) == before

    applied = fx_patch(venv_copy, "apply").expect_result()
    assert applied["changed"] is True and applied["import_check"]["problems"] == []
    status = fx_patch(venv_copy, "status").expect_result()
    assert status["status"] == "patched" and status["record"]["orch_version"] == "0.1.0-test"

    race = fx_race(venv_copy)
    assert (race["cross_thread_raised"], race["same_thread_raised"], race["verdict"]) == \
        (0, RACE_TRIALS, "fixed")

    patched = torch_sources(venv_copy)
    again = fx_patch(venv_copy, "apply").expect_result()
    assert again["changed"] is False and torch_sources(venv_copy) == patched

    reverted = fx_patch(venv_copy, "revert").expect_result()
    assert {(f["action"], f["dist_record"]) for f in reverted["files"]} == {("restored", "ok")}
    assert_pristine(venv_copy, CHANGED_IN_2_13)
    assert torch_sources(venv_copy) == before
    assert reverted["status"] == "vulnerable"

    race = fx_race(venv_copy)
    assert (race["cross_thread_raised"], race["same_thread_raised"], race["verdict"]) == \
        (RACE_TRIALS, RACE_TRIALS, "vulnerable")


@pytest.fixture(scope="module")
def patched_venv(module_venv_copy):
    fx_patch(module_venv_copy, "apply").expect_result()
    return module_venv_copy


def run_in(venv, code):
    proc = subprocess.run([venv.python, "-c", textwrap.dedent(code)], env=clean_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_patched_torch_keeps_dynamo_hops_checkpoint_and_make_fx_working(patched_venv):
    last = run_in(patched_venv, """
        import threading
        import torch
        import torch._dynamo.trace_rules as rules
        from torch.fx import _symbolic_trace as st
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.utils.checkpoint import checkpoint

        # Dynamo constant-folds both functions: a fullgraph compile has no graph break.
        def branchy(x):
            if st.is_fx_symbolic_tracing() or st.is_fx_tracing():
                return x + 100
            return x - 1
        compiled = torch.compile(branchy, backend="eager", fullgraph=True)
        assert compiled(torch.zeros(2)).tolist() == [-1.0, -1.0]
        assert rules.lookup(st.is_fx_symbolic_tracing) is not None
        assert rules.lookup(st.is_fx_tracing) is not None

        # torch.cond in eager goes through _set_compilation_env (rewritten to the helpers).
        out = torch.cond(torch.tensor(True), lambda x: x + 1, lambda x: x - 1, (torch.ones(1),))
        assert out.tolist() == [2.0] and st._get_is_fx_tracing() is False

        # make_fx traces through Tracer.trace; the flag is back to False afterwards.
        graph = make_fx(lambda x: x * 2)(torch.ones(2))
        assert "mul" in graph.code and st.is_fx_tracing() is False

        # Non-reentrant checkpoint: forward, recompute in backward.
        x = torch.ones(3, requires_grad=True)
        checkpoint(lambda t: (t * t).sum(), x, use_reentrant=False).backward()
        assert x.grad.tolist() == [2.0, 2.0, 2.0]

        # The attribute still reads and writes, per thread.
        seen = []
        st._is_fx_tracing_flag = True
        worker = threading.Thread(target=lambda: seen.append(st._is_fx_tracing_flag))
        worker.start(); worker.join()
        assert seen == [False] and st._is_fx_tracing_flag is True
        st._is_fx_tracing_flag = False

        # nested_tensor_from_jagged still refuses inside symbolic_trace (same thread).
        class UsesJagged(torch.nn.Module):
            def forward(self, x):
                values, offsets = torch.ones(4, 2), torch.tensor([0, 2, 4])
                return torch.nested.nested_tensor_from_jagged(values, offsets)
        try:
            torch.fx.symbolic_trace(UsesJagged())
        except RuntimeError as exc:
            assert "does not support tracing with fx.symbolic_trace" in str(exc)
        else:
            raise AssertionError("nested_tensor_from_jagged did not see the flag")
        print("ok")
    """)
    assert last == "ok"


def test_patched_files_match_upstream_helper_use(patched_venv):
    utils = (patched_venv.site_packages / "torch/_higher_order_ops/utils.py").read_text()
    assert "torch.fx._symbolic_trace._get_is_fx_tracing()" in utils
    assert "torch.fx._symbolic_trace._set_is_fx_tracing(False)" in utils
    assert "_is_fx_tracing_flag" not in utils.split("\n", 1)[1]  # past the header comment


def test_reinstalled_files_are_drift(venv_copy, real_torch_venv):
    fx_patch(venv_copy, "apply").expect_result()
    # What `pip install --force-reinstall` does to these files: pip's bytes come back,
    # orch's record (beside torch/) stays.
    for relpath in CHANGED_IN_2_13:
        replace_file(venv_copy.site_packages / relpath,
                     (real_torch_venv.site_packages / relpath).read_bytes())
    status = fx_patch(venv_copy, "status").expect_result()
    assert status["status"] == "drifted"
    assert {(f["state"], f["dist_record"]) for f in status["files"]} == {("original", "ok")}
    fx_patch(venv_copy, "apply").expect_error("refused")
    reverted = fx_patch(venv_copy, "revert").expect_result()
    assert reverted["changed"] is False and reverted["status"] == "vulnerable"
    assert fx_patch(venv_copy, "apply").expect_result()["status"] == "patched"


def test_an_unknown_shape_is_refused_without_touching_any_byte(venv_copy):
    path = venv_copy.site_packages / ST
    text = path.read_text()
    # A release that saved the flag with a context manager instead: not a shape we know.
    edited = text.replace("        global _is_fx_tracing_flag\n", "", 1)
    assert edited != text
    replace_file(path, edited.encode())
    before = torch_sources(venv_copy)
    status = fx_patch(venv_copy, "status").expect_result()
    assert status["status"] == "unknown" and "Tracer.trace" in status["message"]
    fx_patch(venv_copy, "apply").expect_error("unknown-shape")
    assert torch_sources(venv_copy) == before
    assert not (venv_copy.site_packages / ".orch-fx-tls").exists()


def test_a_failure_mid_apply_leaves_nothing_half_patched(venv_copy):
    before = torch_sources(venv_copy)
    error = fx_patch(venv_copy, "apply", ORCH_FX_PATCH_FAIL_AFTER="1").expect_error("write-failed")
    assert "restored" in error["message"]
    assert torch_sources(venv_copy) == before
    assert not list((venv_copy.site_packages / "torch").rglob("*.orch-tmp"))
    assert not (venv_copy.site_packages / ".orch-fx-tls").exists()
    assert_pristine(venv_copy, CHANGED_IN_2_13)


def test_a_torch_that_fails_the_import_check_is_rolled_back(venv_copy):
    replace_file(venv_copy.site_packages / "torch/export/unflatten.py",
                 b"raise ImportError('simulated broken module')\n")
    before = torch_sources(venv_copy)
    error = fx_patch(venv_copy, "apply").expect_error("import-check-failed")
    assert "simulated broken module" in error["message"]
    assert torch_sources(venv_copy) == before
    assert_pristine(venv_copy, CHANGED_IN_2_13)


def test_upstream_fixed_2_14_1_is_recognised_and_left_alone(upstream_fixed_site, real_torch_venv):
    before = tree_hashes(upstream_fixed_site)
    env = clean_env(PYTHONPATH=str(upstream_fixed_site))
    for action in ("status", "diff", "apply", "revert"):
        result = run_payload(real_torch_venv.python, "fx_patch", {"action": action},
                             env=env).expect_result()
        assert result["status"] == "fixed-upstream" and result["changed"] is False, action
        assert result["torch_version"] == "2.14.1+cu130"  # torch.__version__ of the wheel
    assert "already keeps the FX tracing flag thread-local upstream" in result["message"]
    assert tree_hashes(upstream_fixed_site) == before
    # What upstream changed, for the record: both other users moved to the helpers.
    for relpath in ("torch/_higher_order_ops/utils.py", "torch/utils/checkpoint.py"):
        text = (upstream_fixed_site / relpath).read_text()
        assert "_get_is_fx_tracing()" in text and "_is_fx_tracing_flag" not in text


def test_the_shared_torch_venv_was_never_written(real_torch_venv):
    assert_pristine(real_torch_venv, CHANGED_IN_2_13)
    assert not (real_torch_venv.site_packages / ".orch-fx-tls").exists()


# --- fx-threads: every FX state threads share ------------------------------------------------

TB = "torch/fx/traceback.py"
# Beyond fx-tls's files: the node-meta state's module and every user the patcher finds.
NODE_META_USERS_2_13 = ["torch/_functorch/_aot_autograd/graph_capture_wrappers.py",
                        "torch/_higher_order_ops/flex_attention.py",
                        "torch/fx/experimental/proxy_tensor.py", TB, "torch/utils/checkpoint.py"]
CHANGED_BY_FX_THREADS_2_13 = sorted(set(CHANGED_IN_2_13) | set(NODE_META_USERS_2_13))


def fx_threads(venv, action, **env):
    return run_payload(venv.python, "fx_patch", {"action": action, "patch_set": "fx-threads",
                                                 "orch_version": "0.1.0-test"},
                       env=clean_env(**env))


def race_states(venv):
    run = run_payload(venv.python, "fx_race", {"trials": RACE_TRIALS, "timeout": 60,
                                               "states": ["fx-tracing-flag", "node-meta", "trace-patching"]},
                      env=clean_env(), timeout=600)
    result = run.expect_result()
    return result, {row["state"]: row for row in result["states"]}


def rows(result):
    return {row["state"]: row["status"] for row in result["states"]}


def test_fx_threads_life_cycle_on_real_torch_2_13(venv_copy):
    status = fx_threads(venv_copy, "status").expect_result()
    assert status["status"] == "vulnerable"
    assert rows(status) == {"fx-tracing-flag": "vulnerable", "node-meta": "vulnerable",
                            "trace-patching": "vulnerable"}
    node_meta = next(r for r in status["states"] if r["state"] == "node-meta")
    assert node_meta["where"] == TB + ":42" and "current_meta" in node_meta["why"]
    assert [f["path"] for f in status["files"]] == CHANGED_BY_FX_THREADS_2_13

    # Unpatched: every forced interleaving fails, n/n; the same-thread controls hold.
    result, race = race_states(venv_copy)
    assert (race["node-meta"]["raised"], race["node-meta"]["leaked"],
            race["node-meta"]["control_held"], race["node-meta"]["verdict"]) == \
        (RACE_TRIALS, RACE_TRIALS, RACE_TRIALS, "vulnerable")
    assert race["fx-tracing-flag"]["verdict"] == "vulnerable"
    assert (race["trace-patching"]["raised"], race["trace-patching"]["control_held"]) == \
        (RACE_TRIALS, RACE_TRIALS)

    before = torch_sources(venv_copy)
    applied = fx_threads(venv_copy, "apply").expect_result()
    assert applied["changed"] is True and applied["import_check"]["problems"] == []
    assert set(rows(applied).values()) == {"patched"}
    patched = torch_sources(venv_copy)
    again = fx_threads(venv_copy, "apply").expect_result()
    assert again["changed"] is False and torch_sources(venv_copy) == patched

    # Patched: 0/n, controls still hold.
    result, race = race_states(venv_copy)
    assert (race["node-meta"]["raised"], race["node-meta"]["leaked"],
            race["node-meta"]["control_held"], race["node-meta"]["verdict"]) == \
        (0, 0, RACE_TRIALS, "fixed")
    assert (race["fx-tracing-flag"]["raised"], race["fx-tracing-flag"]["control_held"]) == \
        (0, RACE_TRIALS)
    assert (race["trace-patching"]["raised"], race["trace-patching"]["control_held"]) == \
        (0, RACE_TRIALS)
    assert result["overall_verdict"] == "fixed"

    # fx-tls sees its flag patched, and says nothing is left outside it.
    assert fx_patch(venv_copy, "status").expect_result()["status"] == "patched"

    reverted = fx_threads(venv_copy, "revert").expect_result()
    assert {(f["action"], f["dist_record"]) for f in reverted["files"]} == {("restored", "ok")}
    assert_pristine(venv_copy, CHANGED_BY_FX_THREADS_2_13)
    assert torch_sources(venv_copy) == before
    assert not (venv_copy.site_packages / ".orch-fx-tls").exists()


def test_fx_tls_status_names_the_state_it_leaves_shared(venv_copy):
    applied = fx_patch(venv_copy, "apply").expect_result()
    assert applied["status"] == "patched"
    assert rows(applied) == {"fx-tracing-flag": "patched", "node-meta": "vulnerable",
                             "trace-patching": "vulnerable"}
    assert "orch patch fx-threads apply" in applied["message"]
    status = fx_patch(venv_copy, "status").expect_result()
    assert status["status"] == "patched" and "FX node-meta state (torch/fx/traceback.py:42)" \
        in status["message"]


def test_fx_threads_over_an_fx_tls_patch_adds_the_rest_and_revert_undoes_both(venv_copy):
    before = torch_sources(venv_copy)
    fx_patch(venv_copy, "apply").expect_result()
    backup = venv_copy.site_packages / ".orch-fx-tls/backups/torch/utils/checkpoint.py.orig"
    flag_only_backup = backup.read_bytes()
    status = fx_threads(venv_copy, "status").expect_result()
    assert status["status"] == "vulnerable"
    assert rows(status) == {"fx-tracing-flag": "patched", "node-meta": "vulnerable",
                            "trace-patching": "vulnerable"}
    diff = fx_threads(venv_copy, "diff").expect_result()["diff"]
    assert "+_orch_node_meta_tls = threading.local()" in diff.splitlines()
    applied = fx_threads(venv_copy, "apply").expect_result()
    assert set(rows(applied).values()) == {"patched"}
    # checkpoint.py holds both patches now and keeps ONE backup: its pristine bytes.
    assert backup.read_bytes() == flag_only_backup
    text = (venv_copy.site_packages / "torch/utils/checkpoint.py").read_text()
    assert "_is_fx_tracing_context(is_fx_tracing)" in text
    assert "fx_traceback._orch_tls_get_current_meta()" in text
    _, race = race_states(venv_copy)
    assert race["node-meta"]["verdict"] == "fixed"
    fx_patch(venv_copy, "revert").expect_result()   # the old command undoes all of it
    assert torch_sources(venv_copy) == before
    assert_pristine(venv_copy, CHANGED_BY_FX_THREADS_2_13)


def test_an_fx_tls_record_of_schema_1_still_reverts(venv_copy):
    """A record as orch's first fx-tls wrote it (no patch_set, no states)."""
    import json
    before = torch_sources(venv_copy)
    fx_patch(venv_copy, "apply").expect_result()
    path = venv_copy.site_packages / ".orch-fx-tls/record.json"
    record = json.loads(path.read_text())
    for key in ("patch_set", "states"):
        record.pop(key)
    record["schema"] = 1
    replace_file(path, json.dumps(record).encode())
    assert rows(fx_threads(venv_copy, "status").expect_result())["fx-tracing-flag"] == "patched"
    fx_threads(venv_copy, "revert").expect_result()
    assert torch_sources(venv_copy) == before


def test_upstream_2_14_1_flag_upstream_node_meta_vulnerable_and_apply_patches_it(
        upstream_fixed_site, real_torch_venv):
    env = clean_env(PYTHONPATH=str(upstream_fixed_site), ORCH_FX_PATCH_SOURCE_TREE="1")
    args = {"patch_set": "fx-threads", "orch_version": "0.1.0-test"}
    before = tree_hashes(upstream_fixed_site)
    status = run_payload(real_torch_venv.python, "fx_patch", dict(args, action="status"),
                         env=env).expect_result()
    assert status["status"] == "vulnerable" and status["torch_version"] == "2.14.1+cu130"
    assert rows(status) == {"fx-tracing-flag": "upstream", "node-meta": "vulnerable",
                            "trace-patching": "vulnerable"}
    flag = next(r for r in status["states"] if r["state"] == "fx-tracing-flag")
    assert flag["where"].startswith("torch/fx/_symbolic_trace.py:")
    applied = run_payload(real_torch_venv.python, "fx_patch", dict(args, action="apply"),
                          env=env).expect_result()
    assert rows(applied) == {"fx-tracing-flag": "upstream", "node-meta": "patched",
                             "trace-patching": "patched"}
    assert "NOT import-checked" in applied["message"]
    patched_st = (upstream_fixed_site / ST).read_text()
    assert "_orch_thread_guard(new_fn" in patched_st and "_is_fx_tracing_tls" in patched_st
    assert "def _get_is_fx_tracing" in patched_st   # upstream's flag helpers are left alone
    run_payload(real_torch_venv.python, "fx_patch", dict(args, action="revert"),
                env=env).expect_result()
    assert tree_hashes(upstream_fixed_site) == before


TRAINER_TINY = ["--batch", "2", "--seq", "64", "--d-model", "32", "--layers", "1", "--heads",
                "2", "--block-size", "16", "--vocab", "64", "--devices", "cpu",
                "--cpu-threads", "1"]


def test_the_stand_in_trainer_trains_its_drafters_side_by_side_on_fx_threads(venv_copy,
                                                                            tmp_path):
    """Three drafters compiling flex_attention side by side (create_block_mask, hence
    annotate(), every step) while a symbolic trace is held open (--race)."""
    from pathlib import Path
    trainer = Path(__file__).resolve().parents[2] / "playbooks" / "files" / "train_drafters.py"
    fx_threads(venv_copy, "apply").expect_result()
    env = clean_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), PYTHONUNBUFFERED="1")
    proc = subprocess.run([venv_copy.python, str(trainer), *TRAINER_TINY, "--drafters", "3",
                           "--steps", "4", "--race", "--max-seconds", "200"],
                          env=env, capture_output=True, text=True, timeout=300)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("summary ")]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert summary and "status=ok" in summary[-1] and "ok=3" in summary[-1], summary
    assert "KeyError" not in proc.stderr and "Traceback" not in proc.stderr
