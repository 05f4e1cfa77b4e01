"""The runtime proof on old torch releases: the registry's real CUDA wheels of torch 2.8.0,
2.4.1 and 2.1.2 (before is_fx_symbolic_tracing existed; Dynamo's guard reads is_fx_tracing())
in sandbox containers, through orch's CLI over SSH exactly as a user runs it:

    status (vulnerable) -> apply -> verify fx-race (0/n, control n/n)
    -> revert (bytes equal the wheel's RECORD) -> verify fx-race (n/n)

and the same for fx-threads, one row per shared state (verify fx-threads).

The venvs (tests/torch/releases.py, ~/.cache/orch-test) are hard-linked into the
containers; every write orch makes replaces files by rename, so the cache never changes
(the last test checks it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fixtures.payloads import dist_record_hash, read_dist_record
from tests.integration.conftest import sandbox  # noqa: F401  (the session's sandbox)
from tests.integration.torch_seed import container_root
from tests.torch.releases import RUNTIME_RELEASES, release_venv

pytestmark = [pytest.mark.torch, pytest.mark.sandbox, pytest.mark.old_torch]
TRIALS = 3
CONTAINERS = [("sb1", 200), ("sb2", 200)]  # each release has its own venv path and record
ST, CHECKPOINT = "torch/fx/_symbolic_trace.py", "torch/utils/checkpoint.py"
# The other reader of the flag, by release (the patcher finds it itself).
OTHER_READER = {"2.1.2": [], "2.2.2": ["torch/_higher_order_ops/cond.py"]}
# Before 2.4 the "eager" backend returns the graph module itself, so the compiled function
# goes through FX's process-wide patched torch.nn.Module.__call__: once the flag no longer
# leaks, the cross-thread call fails with FX's other leak instead (docs/design/torch-releases.md),
# which the flag patch does not claim to fix.
OTHER_FX_LEAK = {"2.1.2", "2.2.2", "2.3.1"}


def changed_files(version: str) -> list:
    return sorted(OTHER_READER.get(version, ["torch/_higher_order_ops/utils.py"])
                  + [ST, CHECKPOINT])


def venv_name(version: str) -> str:
    return "torch-venv-" + version


@pytest.fixture(scope="module", params=RUNTIME_RELEASES)
def release(request, sandbox, tmp_path_factory):  # noqa: F811
    """(version, inventory path, the venv's site-packages on the machine's side)."""
    version = request.param
    host, vmid = CONTAINERS[RUNTIME_RELEASES.index(version) % len(CONTAINERS)]
    source = release_venv(version)
    target = os.path.join(container_root(sandbox, host, vmid), venv_name(version))
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["cp", "-al", source, target], check=True)
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    name = f"{host}-{vmid}"
    data["containers"][name]["venv"] = f"/root/{venv_name(version)}"
    data["default_target"] = name
    path = tmp_path_factory.mktemp("old-torch") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    (site,) = Path(target).glob("lib/python3*/site-packages")
    yield version, str(path), site
    shutil.rmtree(target, ignore_errors=True)


def orch_json(inventory, *args, timeout=900):
    out = subprocess.run([sys.executable, "-m", "orchestrator", "-i", inventory, *args, "--json"],
                         capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in out.stderr, out.stderr
    [report] = json.loads(out.stdout)
    return out.returncode, report


def record_hashes(site: Path) -> dict:
    """{relative path: "sha256=..."} from the RECORD of torch's dist-info in site."""
    (dist_info,) = site.glob("torch-*.dist-info")
    return read_dist_record(dist_info)


def test_life_cycle_on_an_old_release(release):
    version, inventory, site = release
    code, status = orch_json(inventory, "patch", "fx-tls", "status")
    assert (code, status["status"]) == (1, "vulnerable"), status["message"]
    assert [f["path"] for f in status["files"]] == changed_files(version)
    assert all(f["dist_record"] == "ok" for f in status["files"])

    code, race = orch_json(inventory, "verify", "fx-race", "--trials", str(TRIALS))
    assert (race["verdict"], race["cross_thread_raised"], race["same_thread_raised"]) == \
        ("vulnerable", TRIALS, TRIALS)
    # One version string in both commands: torch.__version__ ("2.8.0+cu128").
    assert race["torch_version"] == status["torch_version"]
    assert status["torch_version"].startswith(version + "+")

    code, applied = orch_json(inventory, "patch", "fx-tls", "apply")
    assert (code, applied["status"], applied["changed"]) == (0, "patched", True)
    assert applied["import_check"]["problems"] == [] and "skipped" not in applied["import_check"]

    code, race = orch_json(inventory, "verify", "fx-race", "--trials", str(TRIALS))
    if version in OTHER_FX_LEAK:
        # The flag's error is gone in every trial; what is left is the other leak, named.
        assert (code, race["verdict"], race["cross_thread_raised"], race["same_thread_raised"],
                race["cross_thread_other_fx_leak"]) == (1, "inconclusive", 0, TRIALS, TRIALS)
        assert all("torch.nn.Module.__call__" in p for p in race["problems"])
    else:
        assert (code, race["verdict"], race["cross_thread_raised"], race["same_thread_raised"],
                race["cross_thread_other_fx_leak"]) == (0, "fixed", 0, TRIALS, 0)

    reverted = reapply_then_revert(inventory, site, "fx-tls", changed_files(version))
    assert reverted["status"] == "vulnerable"

    code, race = orch_json(inventory, "verify", "fx-race", "--trials", str(TRIALS))
    assert (race["verdict"], race["cross_thread_raised"], race["same_thread_raised"]) == \
        ("vulnerable", TRIALS, TRIALS)


def reapply_then_revert(inventory, site, patch: str, changed: list[str]) -> dict:
    """`orch patch PATCH apply` once more changes nothing; `revert` then restores every changed
    file to the hash its dist-info RECORD lists, read from the machine's side (the bytes on
    disk). Returns revert's report."""
    code, again = orch_json(inventory, "patch", patch, "apply")
    assert (code, again["changed"]) == (0, False)
    code, reverted = orch_json(inventory, "patch", patch, "revert")
    assert code == 0 and {(f["action"], f["dist_record"]) for f in reverted["files"]} == \
        {("restored", "ok")}
    record = record_hashes(site)
    for relpath in changed:
        assert dist_record_hash((site / relpath).read_bytes()) == record[relpath], relpath
    return reverted


def race_rows(report):
    return {row["state"]: (row["raised"], row["control_held"], row["verdict"])
            for row in report["states"]}


def test_fx_threads_life_cycle_on_an_old_release(release):
    """Every shared state on an old release: 2.1 to 2.3's "other leak" is the trace-time
    patching, so with fx-threads their flag verdict is conclusive too."""
    version, inventory, site = release
    code, status = orch_json(inventory, "patch", "fx-threads", "status")
    assert code == 1 and status["status"] == "vulnerable", status["message"]
    assert {r["state"]: r["status"] for r in status["states"]} == {
        "fx-tracing-flag": "vulnerable", "node-meta": "vulnerable", "trace-patching": "vulnerable"}
    changed = [f["path"] for f in status["files"]]
    assert {ST, "torch/fx/traceback.py"} <= set(changed)
    code, race = orch_json(inventory, "verify", "fx-threads", "--trials", str(TRIALS))
    assert code == 1 and set(race_rows(race).values()) == {(TRIALS, TRIALS, "vulnerable")}

    code, applied = orch_json(inventory, "patch", "fx-threads", "apply")
    assert (code, applied["status"], applied["changed"]) == (0, "patched", True)
    assert applied["import_check"]["problems"] == [] and "skipped" not in applied["import_check"]
    code, race = orch_json(inventory, "verify", "fx-threads", "--trials", str(TRIALS))
    assert (code, race["overall_verdict"]) == (0, "fixed"), race
    assert set(race_rows(race).values()) == {(0, TRIALS, "fixed")}
    assert race["cross_thread_other_fx_leak"] == 0
    reapply_then_revert(inventory, site, "fx-threads", changed)
    code, race = orch_json(inventory, "verify", "fx-threads", "--trials", str(TRIALS))
    assert code == 1 and set(race_rows(race).values()) == {(TRIALS, TRIALS, "vulnerable")}


def test_the_cached_release_venvs_were_never_written(release):
    version = release[0]
    (site,) = Path(release_venv(version)).glob("lib/python3*/site-packages")
    record = record_hashes(site)
    for relpath in changed_files(version):
        assert dist_record_hash((site / relpath).read_bytes()) == record[relpath], relpath
    assert not (site / ".orch-fx-tls").exists()
