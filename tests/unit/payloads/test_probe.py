"""inventory check's probe, run as orch ships it (one file on stdin): its answers, and that a
container without GPUs, venv or rg pays no import it does not need (a fan-out pays the
probe once per container: docs/benchmarks/speed.md, "Fan-out over a fleet")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from orchestrator.payloads import payload_source

SKIPPED = ("platform", "shutil", "subprocess")


def probe(args: dict, path: str) -> tuple[dict, set]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-", json.dumps(args)],
                          input=payload_source("probe"), capture_output=True, timeout=60,
                          env={"PATH": path})
    assert done.returncode == 0, done.stderr.decode()[-800:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.decode().splitlines()
                if line.startswith("import time:")}
    return json.loads(done.stdout.decode().strip().splitlines()[-1]), imported


def test_a_bare_container_is_probed_without_platform_shutil_or_subprocess(tmp_path):
    result, imported = probe({"venv": None}, str(tmp_path))
    assert result["python_version"] == "%d.%d.%d" % sys.version_info[:3]
    assert result["hostname"] == os.uname().nodename
    assert (result["gpus"], result["ripgrep"], result["venv"]) == (None, False, None)
    assert imported.isdisjoint(SKIPPED), sorted(imported & set(SKIPPED))


def test_gpus_rg_and_a_venv_are_still_found(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 3, 1024, 143771, 75.5'\n")
    (tmp_path / "rg").write_text("#!/bin/sh\n")
    (tmp_path / "not-executable").write_text("")
    for program in (smi, tmp_path / "rg"):
        program.chmod(0o755)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    result, _ = probe({"venv": str(venv)}, f"{tmp_path}:/usr/bin:/bin")
    assert result["ripgrep"] is True
    assert [(g["index"], g["name"], g["memory_total_mib"]) for g in result["gpus"]] == [
        (0, "NVIDIA H200", 143771)]
    assert result["venv"] == {"path": str(venv), "present": True,
                              "python_version": "%d.%d.%d" % sys.version_info[:3]}
