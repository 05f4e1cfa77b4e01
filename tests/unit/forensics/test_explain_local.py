"""`orch explain` on a shared-state bug orch has never seen, for real: a small pure-Python
library (written here) keeps a module-level cache that two threads mutate; a real run of
two threads dies in it; `orch explain --log` on a local target (its venv has the library,
installed with a dist-info RECORD) names the cache, its writers and the generic remedies.
Also: frames without Python source, and a file changed since install."""

from __future__ import annotations

import base64
import hashlib
import functools
import json
import shutil
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.local_target import local_inventory, orch_without_agent

LIBRARY = textwrap.dedent('''
    """cachelib: one process-wide cache (deliberately not thread-safe)."""
    import threading

    _CACHE = {}
    _SEEN = threading.local()      # already per thread


    class Registry:
        active = None


    def begin(name):
        _CACHE["owner"] = name
        Registry.active = name


    def end(name):
        owner = _CACHE.pop("owner")
        if owner != name:
            raise RuntimeError("the cache holds another thread's entry: %r" % owner)
        return owner
''')
EXTRA = "def unused():\n    return 1\n"

# Two threads, forced into the order that breaks: a begins, b begins (overwrites), a ends
# (finds b's entry: RuntimeError), b ends (the entry is gone: KeyError).
RUN = textwrap.dedent('''
    import threading
    import cachelib

    a_began, b_began, a_ended = threading.Event(), threading.Event(), threading.Event()

    def worker_a():
        cachelib.begin("a"); a_began.set(); b_began.wait(10)
        try:
            cachelib.end("a")
        finally:
            a_ended.set()

    def worker_b():
        a_began.wait(10); cachelib.begin("b"); b_began.set(); a_ended.wait(10)
        threads[0].join(10)   # a's traceback printed whole first: two unprefixed writers'
        cachelib.end("b")     # lines, interleaved, cannot be told apart

    threads = [threading.Thread(target=worker_a, name="worker-a"),
               threading.Thread(target=worker_b, name="worker-b")]
    for t in threads: t.start()
    for t in threads: t.join()
''')


def _hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A real venv (no pip: a second) with cachelib installed as a wheel would: a dist-info
    with METADATA and RECORD. extra.py's recorded hash is not its content (changed since)."""
    root = tmp_path_factory.mktemp("explain") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python3*/site-packages"))
    package = site / "cachelib"
    package.mkdir()
    (package / "__init__.py").write_text(LIBRARY)
    (package / "extra.py").write_text(EXTRA)
    info = site / "cachelib-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cachelib\nVersion: 1.0\n\n")
    (info / "top_level.txt").write_text("cachelib\n")
    (info / "RECORD").write_text(
        f"cachelib/__init__.py,sha256={_hash(LIBRARY.encode())},{len(LIBRARY)}\n"
        f"cachelib/extra.py,sha256={_hash(b'something else')},14\n"
        "cachelib-1.0.dist-info/RECORD,,\n")
    return root


@pytest.fixture(scope="module")
def crash_log(venv, tmp_path_factory) -> Path:
    """The real run's output: both threads' tracebacks on stderr."""
    folder = tmp_path_factory.mktemp("run")
    script = folder / "run_two.py"
    script.write_text(RUN)
    out = subprocess.run([str(venv / "bin" / "python"), str(script)], capture_output=True,
                         text=True, timeout=60)
    assert "Exception in thread worker-a" in out.stderr and "KeyError" in out.stderr, out.stderr
    log = folder / "output.log"
    log.write_text(out.stdout + out.stderr)
    return log


@pytest.fixture(scope="module")
def inventory(venv, tmp_path_factory) -> str:
    return local_inventory(tmp_path_factory.mktemp("inv"), venv)


orch = functools.partial(orch_without_agent, timeout=300)


def test_an_unknown_shared_cache_is_named_with_its_writers_and_generic_remedies(inventory, crash_log):
    out = orch(inventory, "explain", "--log", str(crash_log), "-t", "dev", "--json")
    assert out.returncode == 0, out.stderr
    [result] = json.loads(out.stdout)
    failures = {f["exception"]: f for f in result["failures"]}
    assert failures["RuntimeError"]["workers"] == ["worker-a"]
    assert failures["KeyError"]["workers"] == ["worker-b"]
    raising = failures["KeyError"]["frames"][-1]
    assert (raising["relpath"], raising["qualname"]) == ("cachelib/__init__.py", "end")
    assert (raising["package"], raising["version"], raising["record"]) == ("cachelib", "1.0", "ok")
    assert any(">" not in l["text"] and "_CACHE.pop" in l["text"] for l in raising["source"])
    top = result["candidates"][0]
    assert (top["module"], top["name"], top["kind"], top["thread_local"]) == \
        ("cachelib", "_CACHE", "container", False)
    assert top["defined"] == "cachelib/__init__.py:5"
    assert {(w["function"], w["how"]) for w in top["writes"]} == \
        {("begin", "mutates in place: item assignment"), ("end", "mutates in place: .pop()")}
    assert any("2 workers fail" in e and "worker-a" in e and "worker-b" in e for e in top["evidence"])
    assert all(c["score"] < top["score"] for c in result["candidates"][1:])
    names = {c["name"]: c for c in result["candidates"]}
    assert names["Registry.active"]["kind"] == "class attribute"
    assert names["_SEEN"]["thread_local"] and names["_SEEN"]["score"] < top["score"]
    [remedy] = result["remedies"]
    assert remedy["kind"] == "generic" and remedy["state"] == "cachelib._CACHE"
    options = " ".join(remedy["options"])
    assert "threading.local()" in options and "lock" in options and "configuration" in options
    assert "worker_a" in options or "worker_b" in options      # the run's own entry point


def test_the_people_output_shows_the_source_and_the_state(inventory, crash_log):
    out = orch(inventory, "explain", "--log", str(crash_log), "-t", "dev")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "KeyError: 'owner'" in text and "worker-b" in text
    assert "cachelib/__init__.py:19 in end" in text and 'owner = _CACHE.pop("owner")' in text
    assert "_CACHE in cachelib/__init__.py:5" in text
    assert "orch has no patch for cachelib._CACHE" in text


def test_frames_without_python_source_degrade_per_frame(inventory, crash_log, tmp_path):
    cpp = ("Traceback (most recent call last):\n"
           '  File "<frozen importlib._bootstrap>", line 1176, in _find_and_load\n'
           '  File "/opt/pytorch/torch/csrc/Module.cpp", line 42, in THPModule_init\n'
           '  File "/nowhere/gone.py", line 3, in lost\n'
           '  File "/elsewhere/lib/python3.9/site-packages/cachelib/extra.py", line 2, in unused\n'
           "    return 1\n"
           "RuntimeError: from C++\n")
    log = tmp_path / "cpp.log"
    log.write_text(cpp)
    out = orch(inventory, "explain", "--log", str(log), "-t", "dev", "--json")
    assert out.returncode == 0, out.stderr
    frames = json.loads(out.stdout)[0]["failures"][0]["frames"]
    assert [f["available"] for f in frames] == [False, False, False, True]
    assert "no Python source file" in frames[0]["reason"]
    assert "not a Python source file" in frames[1]["reason"]
    assert "not in this python's installed packages" in frames[2]["reason"]
    # a path from another machine, matched by its part after site-packages/; changed since install
    assert (frames[3]["relpath"], frames[3]["record"]) == ("cachelib/extra.py", "mismatch")
    people = orch(inventory, "explain", "--log", str(log), "-t", "dev").stdout
    assert people.count("source not available") == 3 and "CHANGED since install" in people


def test_a_log_without_a_traceback_exits_1(inventory, tmp_path):
    log = tmp_path / "fine.log"
    log.write_text("drafter=0 step=1 loss=2.0\n")
    out = orch(inventory, "explain", "--log", str(log), "-t", "dev", "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout)[0]["notes"] == ["no Python traceback in the log(s)"]


def test_an_unreadable_log_is_a_clear_error(inventory, tmp_path):
    out = orch(inventory, "explain", "--log", str(tmp_path / "missing.log"), "-t", "dev")
    assert out.returncode != 0 and "cannot read the log" in out.stderr


def test_the_mcp_tool_explains_a_recorded_run_read_only(venv, crash_log, inventory, tmp_path):
    """explain_run through the MCP server in-process: a read-only tool (listed without any
    allowance), under the policy (this local entry is a host itself: refused until allowed)."""
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'orch[mcp]')")
    import anyio
    from mcp import Client

    from orchestrator.mcp.audit import AuditLog
    from orchestrator.mcp.policy import READ_TOOLS, build_policy
    from orchestrator.mcp.server import build_server
    from orchestrator.mcp.tools import Tools
    from orchestrator.runs.model import RunRecord
    from orchestrator.runs.store import RunStore
    from orchestrator.targets.fleet import Fleet

    assert "explain_run" in READ_TOOLS
    fleet = Fleet.from_path(inventory)
    store = RunStore(str(tmp_path / "runs.sqlite"))
    store.begin(RunRecord(run_id="20261202-0100-abcdef", playbook="p.yaml", playbook_sha256="",
                          name="p", launch={"targets": {"dev": {"run_dir": str(crash_log.parent)}}}))
    tools = Tools(fleet, store)

    def ask(hosts):
        server = build_server(tools, build_policy((), (), inventory=fleet.inventory, hosts=hosts),
                              AuditLog(store, "s1"))

        async def scenario():
            async with Client(server) as client:
                result = await client.call_tool("explain_run", {"run_id": "last"})
                return result.is_error, result.content[0].text, result.structured_content
        return anyio.run(scenario)
    try:
        refused, text, _ = ask(())
        assert refused and "MCP tools act in containers only" in text
        failed, text, data = ask(["here"])
        assert not failed, text
        [explained] = data["explanations"]
        assert explained["candidates"][0]["name"] == "_CACHE"
        assert explained["remedies"][0]["kind"] == "generic"
        assert {w for f in explained["failures"] for w in f["workers"]} == {"worker-a", "worker-b"}
    finally:
        tools.close()
        store.close()


def test_a_torchrun_runs_rank_logs_and_error_file_name_their_ranks(inventory, crash_log, tmp_path,
                                                                    monkeypatch):
    """`orch explain last` on a run under torchrun: each rank's own stderr.log (no prefix: the
    folder says whose it is) and a rank's error file (@record's py_callstack)."""
    from orchestrator.runs.model import RunRecord, StepResult
    from orchestrator.runs.store import RunStore

    one = crash_log.read_text().split("Exception in thread worker-b:")[1]   # b's KeyError
    run_dir = tmp_path / "launch"
    for rank in (0, 1):
        folder = run_dir / "ranks" / "abc" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(one)
    (run_dir / "ranks" / "abc" / "attempt_0" / "1" / "error.json").write_text(json.dumps(
        {"message": {"message": "KeyError: 'owner'", "extraInfo": {"py_callstack": one}}}))
    (run_dir / "output.log").write_text("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")
    data = tmp_path / "data"
    record = RunRecord(run_id="20261202-0200-abcdef", playbook="p.yaml", playbook_sha256="", name="p")
    record.steps.append(StepResult("launch", "launch", "dev", "changed",
                                   data={"run_dir": str(run_dir), "ranks": 2}))
    monkeypatch.setenv("ORCH_DATA_DIR", str(data))
    with RunStore() as store:
        store.begin(record)
        store.save_step(record.run_id, record.steps[0])
    out = orch(inventory, "explain", "last", "--json")
    assert out.returncode == 0, out.stderr
    [result] = json.loads(out.stdout)
    assert len(result["logs"]) == 4          # output.log, two stderr.log, the error file
    [failure] = result["failures"]
    assert failure["exception"] == "KeyError" and failure["workers"] == ["rank 0", "rank 1"]
    assert failure["count"] == 3             # rank 1 twice: its log and its error file
    # ranks are processes, each failing in its main thread: no shared-state claim, the
    # frame that raised with its locals instead
    assert result["lead"]["exception"] == "KeyError" and result["candidates"] == []
    shared = result["shared_state"]
    assert not shared["concurrent"] and "processes of their own" in shared["why"]
    assert shared["raising"]["function"] == "end" and shared["raising"]["locals"] == ["name", "owner"]


PATCHED = LIBRARY.replace('_CACHE = {}\n', '# patched: one cache per thread\n_TLS = threading.local()\n'
                          '_CACHE = _TLS.__dict__\n')


@pytest.fixture
def patched_venv(venv, tmp_path) -> Path:
    """A copy of the venv whose cachelib orch's fx patch record says it changed: the file now,
    the record beside site-packages (sha256 before and after, when) and the backup of what
    ran before."""
    copy = tmp_path / "venv"
    shutil.copytree(venv, copy, symlinks=True)
    site = next(copy.glob("lib/python3*/site-packages"))
    (site / "cachelib" / "__init__.py").write_text(PATCHED)
    backup = site / ".orch-fx-tls" / "backups" / "cachelib" / "__init__.py.orig"
    backup.parent.mkdir(parents=True)
    backup.write_text(LIBRARY)
    (site / ".orch-fx-tls" / "record.json").write_text(json.dumps({
        "applied_at": "2026-12-03T12:00:00+00:00", "files": [{
            "path": "cachelib/__init__.py", "sha256_before": hashlib.sha256(LIBRARY.encode()).hexdigest(),
            "sha256_after": hashlib.sha256(PATCHED.encode()).hexdigest()}]}))
    return copy


def _explained_on(patched_venv, crash_log, **options):
    from orchestrator.targets.fleet import Fleet
    from orchestrator.forensics import explain

    path = patched_venv.parent / "inventory.yaml"
    path.write_text(f"hosts:\n  here: {{transport: local}}\ncontainers:\n"
                    f"  dev: {{host: here, venv: '{patched_venv}'}}\ndefault_target: dev\n")
    with Fleet.from_path(str(path)) as fleet:
        [target] = fleet.targets(["dev"])
        return explain.explain(target, [explain.read_log_file(str(crash_log))], **options)


def test_a_file_orchs_patch_changed_since_the_run_is_read_as_it_ran(patched_venv, crash_log):
    """By the run's time against the patch record's, else by the log's own code lines: the
    backup, `patched since`; a run after the patch reads the file as it is."""
    applied = datetime.fromisoformat("2026-12-03T12:00:00+00:00").timestamp()
    for when in (applied - 60, None):
        result = _explained_on(patched_venv, crash_log, ran_at=when)
        raising = next(f for f in result.failures if f.exception == "KeyError").frames[-1]
        assert (raising.record, raising.patched_since, raising.ran) == ("mismatch", "orch", "backup"), when
        assert raising.code_matches is True and 'owner = _CACHE.pop("owner")' in raising.code
        top = result.candidates[0]
        assert (top.name, top.kind, top.patched_since, top.confidence) == ("_CACHE", "container", True, "high")
        assert any("read as they ran (orch's backups)" in n for n in result.notes)
    after = _explained_on(patched_venv, crash_log, ran_at=applied + 60)
    raising = next(f for f in after.failures if f.exception == "KeyError").frames[-1]
    assert (raising.ran, raising.code_matches) == ("file", False)     # the log's line 19 is not the file's now
    assert not any(c.name == "_CACHE" and c.patched_since for c in after.candidates)
