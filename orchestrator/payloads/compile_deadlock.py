"""Reproduce the compile deadlock of threads on one GPU, and check its remedy.

Shipped into a container and run with the target venv's python; the payload itself is
standard library only, the two runs it starts import torch (docs/design/deadlocks.md).

DRAFTERS threads each `torch.compile(flex_attention)` and run forward + backward on ONE
CUDA device with a cold inductor cache (a fresh TORCHINDUCTOR_CACHE_DIR per run):

- unchanged: a thread holding torch._dynamo's compile_lock waits in the autograd engine
  for its CUDA device thread (pt_autograd_0), which compiles another thread's backward and
  waits for compile_lock: the run never ends; it is stopped after `hang_seconds`;
- remedied: each thread first calls torch.autograd.set_multithreading_enabled(False)
  (thread-local), so its backward runs on the thread itself: the run finishes.

On CPU backward always runs on the calling thread: there is no device thread and no
cycle, so the check needs a GPU and says so ("needs-gpu") without running anything.

Args::

    {"drafters": 3, "steps": 3, "hang_seconds": 90, "remedy_seconds": 240}

Output: one {"event": "trial", "mode": "unchanged"|"remedied", "outcome": "hung"|"done"|
"failed", "seconds": s, "errors": {...}} per run, then the result::

    {"event": "result", "torch_version": "2.11.0+cu130", "cuda": true,
     "verdict": "reproduced" | "not-reproduced" | "remedy-failed" | "needs-gpu",
     "unchanged": {...}, "remedied": {...}, "why": "..."}
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from _protocol import *  # orch: inlined when shipped

ARG_SPEC = {"drafters": (int, 3), "steps": (int, 3), "hang_seconds": (int, 90),
            "remedy_seconds": (int, 240)}

# What each run executes, with the target's python: `python -c CHILD MODE DRAFTERS STEPS`.
CHILD = r'''
import json, os, sys, threading, time, traceback
import torch
mode, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "check":
    print(json.dumps({"torch_version": torch.__version__, "cuda": torch.cuda.is_available()}))
    sys.exit(0)
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
barrier = threading.Barrier(n)
seconds, errors = {}, {}

def drafter(index):
    started = time.monotonic()
    try:
        if mode == "remedied":
            torch.autograd.set_multithreading_enabled(False)   # thread-local
        compiled = torch.compile(flex_attention)
        barrier.wait(120)
        for _ in range(steps):
            q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 1, 256, 256, device="cuda")
            compiled(q, k, v, block_mask=mask).sum().backward()
        torch.cuda.synchronize()
    except Exception as exc:
        errors[index] = "%s: %s" % (type(exc).__name__, str(exc)[:300])
    seconds[index] = round(time.monotonic() - started, 1)

threads = [threading.Thread(target=drafter, args=(i,), daemon=True) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"seconds": seconds, "errors": errors}), flush=True)
os._exit(0)
'''


def child(mode, args, timeout):
    """One run in a session of its own (killed whole when it outlives TIMEOUT), with a cold
    inductor cache: {"outcome", "seconds", ...}."""
    cache = tempfile.mkdtemp(prefix="orch-compile-deadlock-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(args["drafters"]), str(args["steps"])],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return {"outcome": "hung", "seconds": round(time.monotonic() - started, 1)}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    seconds = round(time.monotonic() - started, 1)
    lines = [line for line in out.decode("utf-8", "replace").splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        return {"outcome": "failed", "seconds": seconds, "exit_code": process.returncode, "stderr": tail}
    found = json.loads(lines[-1])
    return dict(found, outcome="failed" if found.get("errors") else "done", seconds=seconds)


def run(args):
    if args["drafters"] < 2 or args["steps"] < 1:
        fail("drafters must be 2 or more (one thread has nobody to deadlock with), steps 1 or more",
             kind="usage")
    facts = child("check", args, 300)
    if facts.get("outcome") != "done":
        fail("this python cannot import torch: %s" % " ".join(facts.get("stderr") or []), kind="no-torch")
    base = {"torch_version": facts.get("torch_version"), "cuda": bool(facts.get("cuda")),
            "drafters": args["drafters"], "steps": args["steps"]}
    if not facts.get("cuda"):
        return dict(base, verdict="needs-gpu",
                    why="no CUDA device here: on CPU the autograd engine runs backward on the calling "
                        "thread (there is no device thread pt_autograd_N), so the cycle cannot form; "
                        "run this on a target with a GPU")
    unchanged = child("unchanged", args, args["hang_seconds"])
    emit("trial", mode="unchanged", **unchanged)
    remedied = child("remedied", args, args["remedy_seconds"])
    emit("trial", mode="remedied", **remedied)
    if remedied["outcome"] != "done":
        verdict = "remedy-failed"
    else:
        verdict = "reproduced" if unchanged["outcome"] == "hung" else "not-reproduced"
    return dict(base, verdict=verdict, unchanged=unchanged, remedied=remedied)


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
