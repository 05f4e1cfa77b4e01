"""The payloads on every CPython 3.8-3.13 at hand: a container runs them with its own python.

Interpreters: `python3.X` on PATH, pyenv's versions, or the paths in $ORCH_TEST_PYTHONS
(os.pathsep-separated). A fresh Debian 12 machine has only 3.11, which the rest of the
suite uses; the real-root sandbox test runs them in a Debian 12 root's own 3.11.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import shutil
import subprocess
import sys

import pytest

from orchestrator.payloads import compact_source, payload_source
from tests.fixtures.payloads import (FAKE_TORCH_VERSION, PAYLOADS, env_with_path,
                                     install_fake_torch, run_payload)

MINORS = range(8, 14)
FRAME = struct.Struct(">cII")   # payloads/exec_server.py's frame header
SHIPPED = sorted(p.stem for p in PAYLOADS.glob("*.py") if not p.stem.startswith("_"))


def interpreter_version(python: str) -> tuple[int, int] | None:
    try:
        done = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    words = done.stdout.split()
    return (int(words[0]), int(words[1])) if done.returncode == 0 and len(words) == 2 else None


def find_pythons() -> dict[str, str]:
    candidates = [p for p in os.environ.get("ORCH_TEST_PYTHONS", "").split(os.pathsep) if p]
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in MINORS]
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(glob.glob(os.path.join(pyenv, "versions", "3.*", "bin", "python3")))
    found = {}
    for python in filter(None, candidates):
        version = interpreter_version(python)
        if version and version[0] == 3 and version[1] in MINORS:
            found.setdefault(f"3.{version[1]}", python)
    return dict(sorted(found.items(), key=lambda item: int(item[0].split(".")[1])))


PYTHONS = find_pythons()
pytestmark = pytest.mark.skipif(not PYTHONS, reason="no CPython 3.8-3.13 found")


@pytest.fixture(params=list(PYTHONS) or ["none"])
def python(request):
    return PYTHONS[request.param]


def test_every_shipped_payload_compiles(python):
    for name in SHIPPED:
        done = subprocess.run([python, "-c", "import sys; compile(sys.stdin.read(), sys.argv[1], "
                               "'exec')", name], input=payload_source(name), capture_output=True)
        assert done.returncode == 0, f"{name}: {done.stderr.decode()}"


def test_probe_bootstrap_search_and_patch_run(python, tmp_path):
    version = interpreter_version(python)
    probe = run_payload(python, "probe", {"venv": None}, via_stdin=True).expect_result()
    assert probe["python_version"].startswith("%d.%d." % version)
    listed = run_payload(python, "bootstrap", {"action": "list", "dir": str(tmp_path)},
                         via_stdin=True).expect_result()
    assert listed["files"] == {}

    site = tmp_path / "site"
    install_fake_torch(site)
    env = env_with_path(site)
    located = run_payload(python, "torch_locate", {"package": "torch"}, env=env,
                          via_stdin=True).expect_result()
    assert located["version"] == FAKE_TORCH_VERSION
    found = run_payload(python, "source_search", {"package": "torch", "engine": "python",
                                                  "pattern": "_is_fx_tracing_flag",
                                                  "fixed": True}, env=env, via_stdin=True)
    assert found.expect_result()["hits"] > 0 and found.final["engine"] == "python"
    defs = run_payload(python, "source_search", {"package": "torch", "mode": "def",
                                                 "pattern": "is_fx_symbolic_tracing"},
                       env=env, via_stdin=True)
    assert defs.expect_result()["hits"] == 1
    for action, status in (("apply", "patched"), ("revert", "vulnerable")):
        done = run_payload(python, "fx_patch", {"action": action, "orch_version": "9.9.9"},
                           env=env, via_stdin=True).expect_result()
        assert done["status"] == status, done


def test_the_probe_in_a_fork_of_the_reaper_and_of_the_exec_server(python):
    """payloads/_inproc.py on every version: the reaper's --in-python, the exec server's
    in_python request with its script; the same answer as the probe's own interpreter."""
    args = json.dumps({"venv": None})
    own = run_payload(python, "probe", {"venv": None}, via_stdin=True).expect_result()
    reaped = subprocess.run([python, "-I", "-S", "-c", compact_source("reaper"), "--in-python",
                             "--limit=0", "python3", "-", args], input=payload_source("probe"),
                            capture_output=True, timeout=60)
    assert reaped.returncode == 0, reaped.stderr.decode()
    assert json.loads(reaped.stdout) == own

    server = subprocess.Popen([python, "-I", "-S", "-c", compact_source("exec_server")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        request = {"argv": ["python3", "-", args], "env": {}, "in_python": True,
                   "script": payload_source("probe").decode()}
        for kind, body in ((b"r", json.dumps(request).encode()), (b"c", b"")):
            server.stdin.write(FRAME.pack(kind, 1, len(body)) + body)
        server.stdin.flush()
        frames = {}
        while b"x" not in frames:
            kind, _, length = FRAME.unpack(server.stdout.read(FRAME.size))
            frames[kind] = frames.get(kind, b"") + server.stdout.read(length)
    finally:
        server.stdin.close()
        server.wait(30)
    assert json.loads(frames[b"x"]) == {"code": 0} and b"n" not in frames
    assert json.loads(frames[b"o"]) == own


def test_bootstrap_with_no_packages_makes_just_the_venv(tmp_path):
    """`packages: []` once failed with pip's "You must give at least one requirement"."""
    venv = tmp_path / "venv"
    done = run_payload(sys.executable, "bootstrap", {"action": "install", "venv": str(venv),
                                                     "hash": "h0", "packages": []},
                       via_stdin=True).expect_result()
    assert done["changed"] and "no packages asked: the venv only" in done["did"]
    assert (venv / "bin" / "python").exists()
    again = run_payload(sys.executable, "bootstrap", {"action": "install", "venv": str(venv),
                                                      "hash": "h0", "packages": []},
                        via_stdin=True).expect_result()
    assert again["changed"] is False
