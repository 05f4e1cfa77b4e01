"""`orch explain` on the project's own FX race, for real: the stand-in trainer's race run (the
demo's first launch: three drafter threads, --race, torch 2.13 CPU) explained against the
installed torch of a local target. It must reach the seed story's conclusion: the check
that raised reads `_is_fx_tracing_flag` of torch/fx/_symbolic_trace.py, which `Tracer.trace`
rebinds under `global`, in the three drafter threads; the remedy is orch's fx-threads patch.
Then, on the same torch patched, the same log says the patch is in and the log predates it.
The node-meta race (KeyError: 'custom', forced with two threads) names current_meta.
Also through the run store: `orch explain last` finds the launch's log by itself."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.runs.model import RunRecord, StepResult
from orchestrator.runs.store import RunStore
from tests.torch.conftest import copy_venv
from tests.support.local_target import local_inventory, orch_without_agent

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "playbooks" / "files" / "train_drafters.py"
TINY = ["--batch", "2", "--seq", "64", "--d-model", "32", "--layers", "1", "--heads", "2",
        "--block-size", "16", "--vocab", "64", "--devices", "cpu", "--cpu-threads", "1",
        "--drafters", "3", "--steps", "4", "--race", "--max-seconds", "120"]
FLAG_FILE = "torch/fx/_symbolic_trace.py"


@pytest.fixture(scope="module")
def venv(real_torch_venv, tmp_path_factory):
    """A hard-link copy: the patch test writes into it, never into the shared venv."""
    return copy_venv(real_torch_venv, tmp_path_factory.mktemp("explain") / "venv")


@pytest.fixture(scope="module")
def race_log(venv, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    log = run_dir / "output.log"
    with open(log, "wb") as handle:   # one file for both streams, as the launcher writes it
        out = subprocess.run([venv.python, str(TRAINER), *TINY], stdout=handle,
                             stderr=subprocess.STDOUT, timeout=400,
                             env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(run_dir / "inductor")})
    text = log.read_text()
    assert out.returncode == 1 and "race trace=open" in text, text[-3000:]
    return log


@pytest.fixture(scope="module")
def inventory(venv, tmp_path_factory) -> str:
    return local_inventory(tmp_path_factory.mktemp("inv"), venv.root)


orch = functools.partial(orch_without_agent, timeout=600)


def _explained(out) -> dict:
    assert out.returncode == 0, out.stderr
    [result] = json.loads(out.stdout)
    return result


def check_fx_race_explained(result: dict) -> None:
    [failure] = result["failures"]
    assert failure["workers"] == ["drafter-0", "drafter-1", "drafter-2"] and failure["count"] == 3
    assert failure["message"].startswith("Detected that you are using FX to symbolically trace")
    raising = failure["frames"][-1]
    assert (raising["relpath"], raising["package"], raising["version"], raising["record"]) == \
        ("torch/_dynamo/eval_frame.py", "torch", "2.13.0+cpu", "ok")
    top = result["candidates"][0]
    assert (top["name"], top["relpath"], top["kind"], top["thread_local"]) == \
        ("_is_fx_tracing_flag", FLAG_FILE, "global", False)
    assert {w["function"] for w in top["writes"]} == {"Tracer.trace"}
    assert {w["how"] for w in top["writes"]} == {"rebinds under `global`"}
    [check] = [r for r in top["read_by"] if r["via"]]
    assert check["via"] == "is_fx_symbolic_tracing" and check["raising"]
    assert check["workers"] == ["drafter-0", "drafter-1", "drafter-2"]


def test_the_fx_race_is_explained_down_to_the_flag_and_the_patch(inventory, race_log):
    result = _explained(orch(inventory, "explain", "--log", str(race_log), "-t", "dev", "--json"))
    check_fx_race_explained(result)
    [remedy] = result["remedies"]
    assert (remedy["kind"], remedy["state"], remedy["patch_state"]) == \
        ("patch", "torch.fx._symbolic_trace._is_fx_tracing_flag", "vulnerable")
    assert remedy["commands"] == ["orch patch fx-threads apply -t dev", "orch verify fx-threads -t dev"]
    people = orch(inventory, "explain", "--log", str(race_log), "-t", "dev").stdout
    assert "_is_fx_tracing_flag in torch/fx/_symbolic_trace.py:44" in people
    assert "_is_fx_tracing_flag = True" in people                    # the writer's own line
    assert "def is_fx_symbolic_tracing()" in people                  # the check's source
    assert "drafter-0, drafter-1, drafter-2" in people
    assert "orch patch fx-threads apply -t dev" in people


def test_through_the_run_store(inventory, race_log, tmp_path, monkeypatch):
    """`orch explain last`: the launch step's run folder on the target holds the log."""
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path / "data"))
    record = RunRecord(run_id="20261202-0100-abc123", playbook="dflash-demo.yaml",
                       playbook_sha256="", name="dflash-demo")
    record.steps.append(StepResult("first launch", "launch", "dev", "changed",
                                   data={"run_dir": str(race_log.parent), "pid": 1,
                                         "argv": [str(TRAINER), "--race"]}))
    with RunStore() as store:
        store.begin(record)
        store.save_step(record.run_id, record.steps[0])
    result = _explained(orch(inventory, "explain", "last", "--json"))
    assert result["logs"][0]["source"] == f"dev:{race_log}"
    check_fx_race_explained(result)
    # the trainer's frames are read too: its folder is the launch's own (argv), not the log's say
    trainer = [f for f in result["failures"][0]["frames"] if f["file"] == str(TRAINER)]
    assert trainer and all(f["available"] and f["package"] is None for f in trainer)


# The node-meta race, forced: B enters preserve_node_meta(), A opens annotate(), B leaves
# (rebinding the module's current_meta to its saved copy, without "custom"), A leaves:
# `del current_meta["custom"]` -> KeyError: 'custom' in A.
NODE_META_RUN = """
import threading
import torch.fx.traceback as tb

b_in, a_in, b_out = threading.Event(), threading.Event(), threading.Event()

def preserver():
    with tb.preserve_node_meta():
        b_in.set()
        a_in.wait(30)
    b_out.set()

def annotator():
    b_in.wait(30)
    with tb.annotate({"step": "a"}):
        a_in.set()
        b_out.wait(30)

threads = [threading.Thread(target=annotator, name="annotator"),
           threading.Thread(target=preserver, name="preserver")]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_the_node_meta_race_names_current_meta_and_its_rebinding(inventory, venv, tmp_path):
    script = tmp_path / "node_meta.py"
    script.write_text(NODE_META_RUN)
    log = tmp_path / "output.log"
    with open(log, "wb") as handle:
        subprocess.run([venv.python, str(script)], stdout=handle, stderr=subprocess.STDOUT, timeout=120)
    assert "KeyError: 'custom'" in log.read_text()
    result = _explained(orch(inventory, "explain", "--log", str(log), "-t", "dev", "--json"))
    [failure] = result["failures"]
    assert (failure["exception"], failure["message"], failure["workers"]) == ("KeyError", "'custom'", ["annotator"])
    assert failure["frames"][-1]["qualname"] == "annotate"
    top = result["candidates"][0]
    assert (top["name"], top["relpath"], top["kind"]) == ("current_meta", "torch/fx/traceback.py", "global")
    rebinding = [w for w in top["writes"] if w["how"] == "rebinds under `global`"]
    assert {w["function"] for w in rebinding} >= {"preserve_node_meta"}
    assert any(w["function"] == "annotate" and w["how"] == "mutates in place: del item" for w in top["writes"])
    [remedy] = result["remedies"]
    assert (remedy["kind"], remedy["state"]) == ("patch", "torch.fx.traceback.current_meta")
    assert "FX node-meta state" in remedy["summary"]
    assert remedy["commands"] == ["orch patch fx-threads apply -t dev", "orch verify fx-threads -t dev"]


def test_on_the_patched_torch_the_same_log_says_the_patch_is_in(inventory, race_log):
    applied = orch(inventory, "patch", "fx-threads", "apply", "--json")
    assert applied.returncode == 0, applied.stderr
    try:
        _check_patched(inventory, race_log)
    finally:
        assert orch(inventory, "patch", "fx-threads", "revert", "--json").returncode == 0


def _check_patched(inventory, race_log):
    """The analysis reads the source that ran (orch's backups), not the patched files: the
    flag stays the first candidate, `patched since`, and its remedy says the patch is in."""
    result = _explained(orch(inventory, "explain", "--log", str(race_log), "-t", "dev", "--json"))
    notes = " ".join(result["notes"])
    assert "FX tracing flag" in notes and f"({FLAG_FILE}): thread-local on dev now (patched by orch)" in notes
    assert "this log predates that" in notes and "read as they ran (orch's backups)" in notes
    frames = {f["relpath"]: f for f in result["failures"][0]["frames"]}
    assert frames[FLAG_FILE]["record"] == "mismatch"                 # changed since install
    assert (frames[FLAG_FILE]["patched_since"], frames[FLAG_FILE]["ran"]) == ("orch", "backup")
    check_fx_race_explained(result)                                  # the same story as before the patch
    top = result["candidates"][0]
    assert top["patched_since"] and top["confidence"] == "high"
    [remedy] = result["remedies"]
    assert (remedy["state"], remedy["patch_state"]) == ("torch.fx._symbolic_trace._is_fx_tracing_flag", "patched")
    assert "thread-local now (patched): this log predates that, relaunch the run" in remedy["summary"]
    people = orch(inventory, "explain", "--log", str(race_log), "-t", "dev").stdout
    assert "high confidence, patched since)" in people and "is read as it ran (orch's backup)" in people
    assert people.index("_is_fx_tracing_flag in") < people.index("_stance in")
