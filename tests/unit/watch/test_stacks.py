"""`orch stacks`: a hung run's threads from outside the process (real pystack on a real
deadlock: one thread holds a lock inside a sleeping "compile", two wait on it), and the
pystack parser alone (bounded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from orchestrator.watch import stacks
from orchestrator.forensics import stacktool
from tests.support.pystackenv import pystack_venv, pystack_wheelhouse
from tests.support.stack_texts import DEADLOCK


# One drafter dies in its "compile" after taking the lock with acquire(); the others wait
# on it forever (the H200's one-drafter-errored-others-silent run).
DIED_HOLDING = textwrap.dedent('''
    import threading, time
    compile_lock = threading.Lock()
    taken = threading.Event()

    def compile_step():
        raise RuntimeError("inductor failed in the compile")

    def first():
        compile_lock.acquire()
        taken.set()
        compile_step()

    def others():
        taken.wait(30)
        with compile_lock:
            pass

    threads = [threading.Thread(target=first, name="drafter-0")]
    threads += [threading.Thread(target=others, name=f"drafter-{n}") for n in (1, 2)]
    for t in threads: t.start()
    threads[0].join()
    print("ready", flush=True)
    for t in threads: t.join()
''')

PYSTACK_TEXT = '''Traceback for thread 11 (python) [] (most recent call last):
    (Python) File "/run/hang.py", line 16, in others
        with compile_lock:

Traceback for thread 10 (python) [] (most recent call last):
    (Python) File "/run/hang.py", line 11, in first
        compile_step()
    (Python) File "/run/hang.py", line 7, in compile_step
        time.sleep(600)
'''


def test_the_parser_reads_threads_frames_and_code():
    threads = stacks.parse_pystack(PYSTACK_TEXT)
    assert [(t.tid, t.name, [(f.line, f.function) for f in t.frames]) for t in threads] == \
        [(11, "python", [(16, "others")]), (10, "python", [(11, "first"), (7, "compile_step")])]
    assert threads[0].frames[0].code == "with compile_lock:"
    many = "".join(f"Traceback for thread {n} (x) []:\n" for n in range(stacks.MAX_THREADS + 50))
    assert len(stacks.parse_pystack(many)) == stacks.MAX_THREADS


def _thread(tid: int, name: str, *files: str) -> str:
    return (f"Traceback for thread {tid} ({name}) [] (most recent call last):\n"
            + "".join(f'    (Python) File "{f}", line 1, in f\n' for f in files) + "\n")


def test_thread_names_are_kept_only_when_they_name_the_thread():
    """Before CPython 3.14 every thread's system name is the process's ("python3"); 3.14 and
    later set it to the Thread's name, which pystack prints."""
    old = stacks.thread_names(stacks.parse_pystack(_thread(7, "python3") + _thread(8, "python3")), pid=7)
    assert [t.label for t in old] == ["thread 7 (python3)", "thread 8"]
    new = stacks.thread_names(stacks.parse_pystack(_thread(7, "python3.14") + _thread(8, "drafter-0")), pid=7)
    assert [t.label for t in new] == ["thread 7 (python3.14)", "thread 8 (drafter-0)"]


def test_a_stack_inside_torchs_compiler_is_labelled_by_its_parts():
    site = "/venv/lib/python3.11/site-packages"
    [dynamo, fx, plain, lookalike] = stacks.parse_pystack(
        _thread(1, "p", "/run/train.py", f"{site}/torch/_dynamo/eval_frame.py",
                f"{site}/torch/_inductor/compile_fx.py", f"{site}/torch/_dynamo/utils.py")
        + _thread(2, "p", f"{site}/torch/fx/_symbolic_trace.py", "/run/train.py")
        + _thread(3, "p", "/run/train.py", f"{site}/torch/nn/modules/module.py")
        + _thread(4, "p", "/run/mytorch/fx/graph.py"))
    assert dynamo.compile == ["torch._dynamo", "torch._inductor"]
    assert fx.compile == ["torch.fx"] and plain.compile == [] and lookalike.compile == []
    assert stacks.compile_words(dynamo.compile) == "inside a compile (torch._dynamo, torch._inductor)"


@pytest.fixture(scope="module")
def venv():
    return pystack_venv()


@pytest.fixture()
def hung(venv, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(DEADLOCK)
    process = subprocess.Popen([f"{venv}/bin/python", str(script)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.5)                     # the two others reach their `with`
    yield process
    process.kill()
    process.wait()


def test_a_deadlock_names_the_holder_inside_its_compile_and_the_waiters(venv, hung, tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  here: {{transport: local}}\ncontainers:\n"
                         f"  dev: {{host: here, venv: '{venv}'}}\ndefault_target: dev\n")
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", str(inventory),
                          "stacks", "--pid", str(hung.pid), "-t", "dev", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr   # 1: a thread waits
    [result] = json.loads(out.stdout)
    assert result["pid"] == hung.pid and len(result["threads"]) == 4          # main + three
    [lock] = result["locks"]
    assert lock["key"] == "hang.py:compile_lock"
    [holder] = lock["holders"]
    assert holder["where"] == "hang.py:10" and holder["inside"] == "compile_step (hang.py:7)"
    assert len(lock["waiters"]) == 2 and {w["where"] for w in lock["waiters"]} == {"hang.py:16"}
    assert "holds hang.py:compile_lock" in lock["sentence"] and "wait on hang.py:compile_lock" in lock["sentence"]


def test_a_venv_without_pystack_gets_it_from_orchs_cache_downloaded_for_its_python(hung, tmp_path):
    """No pystack in the venv nor on PATH, no --wheelhouse: orch downloads the pinned pystack
    for the target python's tags into its cache here (pip download) and carries it in."""
    inventory = tmp_path / "inventory.yaml"
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    inventory.write_text(f"hosts:\n  here: {{transport: local}}\ncontainers:\n"
                         f"  dev: {{host: here, venv: '{venv}'}}\ndefault_target: dev\n")
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", str(inventory),
                          "stacks", "--pid", str(hung.pid), "-t", "dev", "--json"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"downloading {stacktool.PIN} for cpython" in out.stderr
    [wheel] = os.listdir(tmp_path / ".cache" / "orch" / "tool-wheels")
    assert wheel.startswith("pystack-1.7.2-") and wheel[:-4] in json.loads(out.stdout)[0]["tool"]


def test_a_cached_pystack_wheel_with_other_bytes_is_never_carried(hung, tmp_path):
    """orch's cache held whatever landed there (a wheel downloaded without a hash, or put
    there later): it was pushed into the target and run there as root. Its name is one of
    pystack 1.7.2's and its bytes are not: refused before anything is pushed."""
    inventory = tmp_path / "inventory.yaml"
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    inventory.write_text(f"hosts:\n  here: {{transport: local}}\ncontainers:\n"
                         f"  dev: {{host: here, venv: '{venv}'}}\ndefault_target: dev\n")
    cache = tmp_path / ".cache" / "orch" / "tool-wheels"
    cache.mkdir(parents=True)
    good = os.path.join(pystack_wheelhouse(), os.listdir(pystack_wheelhouse())[0])
    planted = cache / os.path.basename(good)
    planted.write_bytes(open(good, "rb").read() + b"\0")      # one byte more
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", str(inventory),
                          "stacks", "--pid", str(hung.pid), "-t", "dev", "--json"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert "refused to carry" in out.stderr and "is not the one PyPI publishes for it" in out.stderr
    assert "Traceback" not in out.stderr and out.returncode == 1, out.stderr
    assert "carrying" not in out.stderr                        # nothing pushed
    assert stacktool.PINNED_SHA256[os.path.basename(good)] == stacktool.file_sha256(good)


def test_the_download_is_in_pips_hash_checking_mode():
    from orchestrator.remote.wheels import Platform
    argv = stacktool.download_argv("/cache", Platform("cpython", (3, 11), "x86_64", "glibc", (2, 36)),
                                   requirements="/tmp/r.txt")
    assert argv[-3:] == ["--require-hashes", "-r", "/tmp/r.txt"]
    lines = stacktool.hashed_requirements().split("\n")
    assert lines[0] == "pystack==1.7.2 \\" and len([l for l in lines if "--hash=sha256:" in l]) == 21
    assert stacktool.download_argv("/c", Platform("cpython", (3, 11), "x86_64", "glibc", (2, 36)))[-2:] \
        == ["--", "pystack==1.7.2"]


def test_a_thread_that_died_holding_the_lock_is_named_from_the_runs_log(venv, tmp_path, monkeypatch):
    """`orch stacks RUN`: the live stacks show two waiters and no holder; the run's log has
    the dead drafter's traceback, whose frame took the lock with acquire() and never let go."""
    from orchestrator.runs.model import RunRecord, StepResult
    from orchestrator.runs.store import RunStore

    run_dir = tmp_path / "launch"
    run_dir.mkdir()
    script = run_dir / "died.py"
    script.write_text(DIED_HOLDING)
    log = open(run_dir / "output.log", "w")
    process = subprocess.Popen([f"{venv}/bin/python", str(script)], stdout=subprocess.PIPE,
                               stderr=log, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path / "data"))
        record = RunRecord(run_id="20261202-0300-abcdef", playbook="p.yaml", playbook_sha256="", name="p")
        record.steps.append(StepResult("launch", "launch", "dev", "changed",
                                       data={"run_dir": str(run_dir), "pid": process.pid,
                                             "argv": ["python", str(script)]}))
        with RunStore() as store:
            store.begin(record)
            store.save_step(record.run_id, record.steps[0])
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(f"hosts:\n  here: {{transport: local}}\ncontainers:\n"
                             f"  dev: {{host: here, venv: '{venv}'}}\ndefault_target: dev\n")
        out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", str(inventory),
                              "stacks", "last", "--json"], capture_output=True, text=True, timeout=300)
    finally:
        process.kill()
        process.wait()
        log.close()
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    [result] = json.loads(out.stdout)
    [lock] = result["locks"]
    assert lock["key"] == "died.py:compile_lock"
    [holder] = lock["holders"]
    assert holder["thread"] == "drafter-0 (dead)" and holder["where"] == "died.py:10"
    assert holder["inside"].startswith("DIED there with RuntimeError: inductor failed")
    assert len(lock["waiters"]) == 2
    assert lock["sentence"].startswith("drafter-0 (dead) died holding died.py:compile_lock (died.py:10): "
                                       "RuntimeError: inductor failed in the compile; ")


FAKE_AGENT = textwrap.dedent('''
    import os, subprocess, sys, time
    env = dict(os.environ, TORCHELASTIC_RUN_ID="x", WORLD_SIZE="2")
    # rank 0 starts a child of its own (a DataLoader worker: the same RANK inherited)
    grandchild = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    workers = [subprocess.Popen([sys.executable, "-c", grandchild if rank == 0 else "import time; time.sleep(60)"],
                                env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank))) for rank in (1, 0)]
    print(" ".join(str(w.pid) for w in workers), flush=True)
    time.sleep(60)
''')


def test_the_rank_workers_below_a_torchrun_like_agent_are_found(tmp_path):
    """The rank_procs payload on a real process tree: two workers with torchrun's variables
    below the agent, and rank 0's own child (same RANK) left out."""
    from orchestrator.remote.container import Target
    from orchestrator.remote.local import LocalTransport
    from orchestrator.remote.payload_api import rank_processes

    agent = subprocess.Popen([sys.executable, "-c", FAKE_AGENT], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        one, zero = (int(p) for p in agent.stdout.readline().split())
        time.sleep(0.5)                              # rank 0's child started
        found = rank_processes(Target("dev", LocalTransport("here")), agent.pid)
        assert found["alive"] is True
        assert [(r["rank"], r["pid"], r["ppid"], r["local_rank"], r["world_size"]) for r in found["ranks"]] == \
            [(0, zero, agent.pid, 0, 2), (1, one, agent.pid, 1, 2)]
        plain = rank_processes(Target("dev", LocalTransport("here")), zero)
        assert plain["ranks"] == []                  # below a worker: no ranks of their own
    finally:
        os.killpg(agent.pid, 9)
        agent.wait()
    assert rank_processes(Target("dev", LocalTransport("here")), agent.pid)["alive"] is False


def test_a_process_that_is_gone_is_said_so_before_pystack_is_looked_for(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n  here: {transport: local}\ncontainers:\n  dev: {host: here}\n"
                         "default_target: dev\n")
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", str(inventory),
                          "stacks", "--pid", str(gone.pid), "-t", "dev"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"process {gone.pid} is not running" in out.stderr
