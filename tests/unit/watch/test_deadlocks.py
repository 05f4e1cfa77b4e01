"""The wait graph's cycles on real deadlocks, stacks taken as `orch stacks` takes them
(pystack --locals from outside the process, each frame's source read by the explain_frames
payload with the process's python):

- one RLock imported under another name in a second module (a function-level
  `from locks_a import big_lock as guard`, the way torch/_inductor/compile_fx.py takes
  torch/_dynamo/convert_frame.py's compile_lock), taken in opposite orders by two threads;
- a lock held across a Thread.join of a thread that wants the lock;

and the shape of issue 39's H200 stacks (torch 2.11, three drafters on one GPU): a drafter
holding compile_lock inside the autograd engine, autograd's device thread pt_autograd_0
waiting for the same lock under compile_fx.py's name, a context manager on the `with` line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from orchestrator.remote import payload_api
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.watch import stacks
from tests.support.pystackenv import pystack_venv
from tests.support.fake_torch import fake_torch, issue_stacks

LOCKS_A = textwrap.dedent('''
    import threading
    big_lock = threading.RLock()
''')
# the same lock under another name, imported inside the function that takes it, and a
# context manager of the run's own on the same `with` line
WORKER_B = textwrap.dedent('''
    import contextlib, threading
    small_lock = threading.Lock()

    @contextlib.contextmanager
    def quiet():
        yield

    def second_half(ready, other_ready):
        from locks_a import big_lock as guard
        with small_lock, quiet():
            ready.set()
            other_ready.wait(30)
            with guard:
                pass
''')
ALIASED = textwrap.dedent('''
    import sys, threading, time
    import locks_a
    import worker_b as wb

    a_ready, b_ready = threading.Event(), threading.Event()

    def first_half():
        with locks_a.big_lock:
            a_ready.set()
            b_ready.wait(30)
            with wb.small_lock:
                pass

    def report(name):            # one write: two threads' lines never interleave
        sys.stdout.write("%s %d\\n" % (name, threading.get_native_id()))
        sys.stdout.flush()

    one = threading.Thread(target=lambda: (report("one"), first_half()), name="one")
    two = threading.Thread(target=lambda: (report("two"), wb.second_half(b_ready, a_ready)), name="two")
    one.start(); two.start()
    a_ready.wait(30); b_ready.wait(30)
    time.sleep(1.0)                    # both reach their inner `with` (a loaded machine is slow)
    print("ready", flush=True)
    one.join()
''')
JOINED = textwrap.dedent('''
    import threading, time
    state_lock = threading.Lock()

    def helper():
        print("helper", threading.get_native_id(), flush=True)
        with state_lock:
            pass

    def boss():
        print("boss", threading.get_native_id(), flush=True)
        with state_lock:
            worker = threading.Thread(target=helper, name="helper")
            worker.start()
            worker.join()

    t = threading.Thread(target=boss, name="boss")
    t.start()
    time.sleep(1.0)                    # helper reaches its `with`
    print("ready", flush=True)
    t.join()
''')


@pytest.fixture(scope="module")
def venv():
    return pystack_venv()


def _hung(venv, folder, files: dict) -> tuple[subprocess.Popen, dict]:
    for name, text in files.items():
        (folder / name).write_text(text)
    process = subprocess.Popen([f"{venv}/bin/python", str(folder / "main.py")], cwd=folder,
                               stdout=subprocess.PIPE, text=True)
    tids = {}
    for line in process.stdout:
        if line.strip() == "ready":
            break
        name, tid = line.split()
        tids[name] = int(tid)
    return process, tids


def _orch_stacks(venv, tmp_path, pid: int, *extra: str) -> subprocess.CompletedProcess:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  here: {{transport: local}}\ncontainers:\n"
                         f"  dev: {{host: here, venv: '{venv}'}}\ndefault_target: dev\n")
    return subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", str(inventory),
                           "stacks", "--pid", str(pid), "-t", "dev", *extra],
                          capture_output=True, text=True, timeout=300)


def test_one_lock_imported_under_another_name_closes_the_cycle(venv, tmp_path):
    """Thread one holds locks_a.big_lock and waits for small_lock; thread two holds
    small_lock and waits for big_lock, spelled `guard` (a function-level import). By
    spelling there are two locks nobody holds; by identity, a cycle."""
    process, tids = _hung(venv, tmp_path, {"locks_a.py": LOCKS_A, "worker_b.py": WORKER_B,
                                           "main.py": ALIASED})
    try:
        out = _orch_stacks(venv, tmp_path, process.pid, "--json")
        text = _orch_stacks(venv, tmp_path, process.pid)
    finally:
        process.kill()
        process.wait()
    assert out.returncode == 1 and out.stdout.startswith("["), out.stderr
    [result] = json.loads(out.stdout)
    keys = {lock["key"]: lock for lock in result["locks"]}
    assert set(keys) == {"locks_a.py:big_lock", "worker_b.py:small_lock"}    # quiet() is none
    big = keys["locks_a.py:big_lock"]
    assert big["kind"] == "RLock" and [w["where"] for w in big["waiters"]] == ["worker_b.py:14"]
    assert [h["where"] for h in big["holders"]] == ["main.py:9"]
    [cycle] = result["cycles"]
    one, two = f"thread {tids['one']}", f"thread {tids['two']}"
    assert {w["thread"] for w in cycle["waits"]} == {one, two}
    assert cycle["line"] in (f"DEADLOCK: {one} -> {two} -> {one}", f"DEADLOCK: {two} -> {one} -> {two}")
    assert f"{one} holds big_lock (main.py:9), waits for small_lock (main.py:12)" in cycle["words"]
    assert f"{two} holds small_lock (worker_b.py:11), waits for big_lock (worker_b.py:14)" in cycle["words"]
    assert text.returncode == 1 and text.stdout.startswith("DEADLOCK: "), text.stdout[:400]
    assert "quiet()" not in text.stdout.split("\n\n")[0]


def test_a_lock_held_across_a_join_of_a_thread_that_wants_it(venv, tmp_path):
    """boss holds state_lock and joins helper; helper waits for state_lock. The join's
    Thread object (pystack --locals) names the thread it waits for."""
    process, tids = _hung(venv, tmp_path, {"main.py": JOINED})
    try:
        out = _orch_stacks(venv, tmp_path, process.pid, "--json")
    finally:
        process.kill()
        process.wait()
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    [result] = json.loads(out.stdout)
    boss, helper = f"thread {tids['boss']}", f"thread {tids['helper']}"
    [cycle] = result["cycles"]
    assert [(w["thread"], w["how"], w["waits_for"]) for w in cycle["waits"]] in (
        [(boss, "join", helper), (helper, "lock", boss)], [(helper, "lock", boss), (boss, "join", helper)])
    assert f"{boss} holds state_lock (main.py:12), waits in Thread.join for {helper} (main.py:15)" \
        in cycle["words"]
    # the main thread's join of boss is a wait too, outside the cycle
    main = f"thread {process.pid}"
    assert any(w["thread"].startswith(main) and w["waits_for"] == boss for w in result["waits"])
    assert cycle["remedy"] is None               # orch knows no remedy for the run's own lock


def test_the_h200_shape_is_one_cycle_through_the_autograd_device_thread(tmp_path):
    root = fake_torch(tmp_path / "site")
    threads = stacks.thread_names(stacks.parse_pystack(issue_stacks(root)), pid=4100)
    facts = payload_api.explain_frames(Target("dev", LocalTransport("here")), stacks.stack_frames(threads),
                                       roots=[root], context=0)
    locks, waits, found = stacks.analyse(threads, facts)
    [lock] = locks                                  # one lock: both spellings are compile_lock
    assert lock.key == "torch/_dynamo/convert_frame.py:compile_lock" and lock.kind == "RLock"
    assert sorted(w["where"] for w in lock.waiters) == ["compile_fx.py:2418", "convert_frame.py:2314"]
    assert [h["where"] for h in lock.holders] == ["convert_frame.py:2314"]
    assert "_disable_current_modes" not in json.dumps([vars(lock) for lock in locks])
    [cycle] = found
    a, device = "thread 4101", "thread 4107 (pt_autograd_0)"
    assert stacks.cycle_line(cycle) in (f"DEADLOCK: {a} -> {device} -> {a}",
                                        f"DEADLOCK: {device} -> {a} -> {device}")
    words = stacks.cycle_words(cycle)
    assert (f"{a} holds compile_lock (convert_frame.py:2314), waits in the autograd engine for "
            f"pt_autograd_0 (graph.py:869)") in words
    assert f"{device} waits for compile_lock (compile_fx.py:2418)" in words
    fix = stacks.remedy(cycle)
    assert "torch.autograd.set_multithreading_enabled(False)" in fix["lines"][1]
    # thread B waits for A too, outside the cycle
    assert any(w.thread == "thread 4102" and w.waits_for == a for w in waits)


def test_a_context_manager_on_the_with_line_is_no_lock(tmp_path):
    """The payload's verdict per `with` item: compile_lock is the RLock made at
    convert_frame.py:205 under both names; `_disable_current_modes()` is a call's result."""
    root = fake_torch(tmp_path / "site")
    frames = [{"file": f"{root}/torch/_dynamo/convert_frame.py", "line": 2314, "function": "__call__",
               "innermost": True},
              {"file": f"{root}/torch/_inductor/compile_fx.py", "line": 2418,
               "function": "fw_compiler_freezing", "innermost": True}]
    facts = payload_api.explain_frames(Target("dev", LocalTransport("here")), frames, roots=[root], context=0)
    convert, inductor = (f["with"] for f in facts["frames"])
    assert [(b["expr"], (b["lock"] or {}).get("id")) for b in convert] == [
        ("compile_lock", "torch/_dynamo/convert_frame.py:compile_lock"), ("_disable_current_modes()", None)]
    assert convert[1]["not_lock"].startswith("a call's result")
    assert inductor[0]["lock"] == convert[0]["lock"] == {
        "id": "torch/_dynamo/convert_frame.py:compile_lock", "name": "compile_lock", "kind": "RLock",
        "defined": "torch/_dynamo/convert_frame.py:205"}


def test_a_cycle_needs_the_device_thread_and_an_rlock_reentered_is_no_wait():
    """On CPU (no pt_autograd_N thread) a thread in the engine waits for nobody; a thread
    entering an RLock it already holds takes it again; a plain Lock entered twice is a cycle
    of one."""
    text = ('Traceback for thread 1 (p) [] (most recent call last):\n'
            '    (Python) File "/run/a.py", line 3, in f\n        x\n'
            '    (Python) File "/run/a.py", line 9, in g\n        with lock:\n'
            '    (Python) File "/v/torch/autograd/graph.py", line 869, in _engine_run_backward\n        x\n')
    threads = stacks.parse_pystack(text)
    assert stacks.native_waits(threads) == []
    facts = {"frames": [{"file": "/run/a.py", "line": 3, "with": [
        {"expr": "lock", "line": 2, "entering": False, "lock": {"id": "a.py:lock", "name": "lock", "kind": "RLock"}}]},
        {"file": "/run/a.py", "line": 9, "with": [
            {"expr": "lock", "line": 9, "entering": True, "lock": {"id": "a.py:lock", "name": "lock", "kind": "RLock"}}]}]}
    threads[0].frames.pop()                          # standing on the inner `with` now
    assert stacks.analyse(threads, facts) == ([], [], [])
    for frame in facts["frames"]:
        frame["with"][0]["lock"]["kind"] = "Lock"
    locks, waits, [cycle] = stacks.analyse(threads, facts)
    assert stacks.cycle_line(cycle) == "DEADLOCK: thread 1 (p) -> thread 1 (p)"


def test_strongly_connected_parts_and_their_cycles():
    def wait(a, b):
        return stacks.Wait(a, b, "lock", f"waits for {b}")
    waits = [wait("a", "b"), wait("b", "c"), wait("c", "a"), wait("d", "a"), wait("e", "f")]
    parts = {frozenset(p) for p in stacks.strongly_connected(
        {n: [w for w in waits if w.thread == n] for n in "abcdef"})}
    assert frozenset("abc") in parts and frozenset("d") in parts and len(parts) == 4
    [cycle] = stacks.cycles(waits)
    assert stacks.cycle_line(cycle) == "DEADLOCK: a -> b -> c -> a"
    long = [wait(str(n), str(n + 1)) for n in range(3000)] + [wait("3000", "0")]
    [big] = stacks.cycles(long)                     # iterative: no recursion limit
    assert len(big) == 3001
