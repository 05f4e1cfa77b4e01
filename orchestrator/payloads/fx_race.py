"""Reproduce the cross-thread FX tracing race, deterministically: is this torch affected?

Shipped alone into a container and run with the target venv's python. Unlike the other
payloads it imports torch: it runs the reproducer of docs/design/torch-releases.md (CPU is enough).

Each trial:

- cross-thread: thread A runs ``torch.fx.symbolic_trace`` on a module whose forward sets
  event ``entered`` and blocks on event ``release`` (so A's tracing flag stays set);
  thread B waits for ``entered``, calls a freshly ``torch.compile``d function (backend
  "eager"), records whether it raised "Detected that you are using FX to symbolically
  trace a dynamo-optimized function", and sets ``release``.
- same-thread control: a compiled function called inside ``symbolic_trace`` in ONE thread
  must raise that error on every torch; if it does not, the guard itself is off (a
  Dynamo config knob, or a patch that switched it off) and the cross-thread numbers say
  nothing.

Every wait is bounded by ``timeout``; threads are daemons, so a stuck compile cannot keep
the process alive.

Protocol
--------
Invocation: ``PYTHON - ARGS_JSON`` with this file on stdin, or ``PYTHON fx_race.py
ARGS_JSON``; unknown keys are an error::

    {"trials": 10, "timeout": 120}      # defaults; timeout in seconds, per wait

Output: JSON lines. One progress line per trial::

    {"event": "trial", "index": 1, "trials": 10, "cross_thread_raised": true,
     "same_thread_raised": true, "seconds": 1.8, "problem": null}

``problem`` is a sentence when the trial could not be judged (a hang, an unexpected
exception). The last line is the result (exit code 0)::

    {"event": "result", "torch_version": "2.13.0+cpu", "cross_thread_raised": k,
     "trials": n, "same_thread_raised": k2, "same_thread_trials": n2,
     "cross_thread_other_fx_leak": k3,
     "verdict": "vulnerable" | "fixed" | "inconclusive" | "guard-disabled",
     "problems": ["..."], "seconds": 12.3}

``cross_thread_other_fx_leak`` counts cross-thread calls that did not hit the flag's error
but failed with FX's other process-wide leak (its patched ``torch.nn.Module.__call__``:
"NameError: module is not installed as a submodule"), which the thread-local flag does not
fix; torch 2.1's compiled functions hit it (docs/design/torch-releases.md). Such trials are
problems, so the verdict is "inconclusive", and the problem says which leak it was.

- "vulnerable": every cross-thread call raised (the flag leaks between threads);
- "fixed": none did, and the same-thread control raised every time;
- "guard-disabled": the same-thread control never raised;
- "inconclusive": anything else (mixed results, hangs, unexpected errors).

On failure (bad args, torch not importable) the last line is an error event (exit code 1)
with kind "bad-args", "no-torch" or "internal".
"""

import os
import sys
import time

from _protocol import *  # orch: inlined when shipped
from _race_node_meta import *  # orch: inlined when shipped
from _race_trace_patch import *  # orch: inlined when shipped


ARG_SPEC = {"trials": (int, 10), "timeout": (float, 120.0),
            "states": (list, ["fx-tracing-flag"])}
STATES = ("fx-tracing-flag", "node-meta", "trace-patching")
NESTED_TRACE_ERROR = "Detected that you are using FX to symbolically trace"
# What FX's process-wide patch of torch.nn.Module.__call__ raises in another thread while a
# trace runs (not the flag: the thread-local patch does not cover it). In torch 2.1 the
# compiled function's own graph module goes through that patched __call__.
OTHER_FX_LEAK_ERROR = "module is not installed as a submodule"
OTHER_FX_LEAK_NOTE = ("the FX tracing flag did not leak, but FX's process-wide patch of "
                      "torch.nn.Module.__call__ did (NameError: %s): a limit of the flag "
                      "patch, see docs/design/torch-releases.md" % OTHER_FX_LEAK_ERROR)


def import_torch():
    try:
        # Imported here, not at the top: a broken torch install is this payload's finding.
        import torch
        import torch.fx
    except Exception as exc:  # a broken install raises anything, not only ImportError
        raise PayloadError("cannot import torch with %s: %s: %s"
                           % (sys.executable, type(exc).__name__, exc), "no-torch") from exc
    return torch


def fresh_compiled_function(torch):
    """A new function object each time, so Dynamo cannot reuse an earlier compile."""
    def double_plus_one(x):
        return x * 2 + 1
    return torch.compile(double_plus_one, backend="eager")


def is_nested_trace_error(exc):
    return isinstance(exc, RuntimeError) and NESTED_TRACE_ERROR in str(exc)


def same_thread_control(torch):
    """(raised, problem): a compiled call inside symbolic_trace in this very thread."""
    compiled = fresh_compiled_function(torch)

    class CallsCompiled(torch.nn.Module):
        def forward(self, x):
            return compiled(torch.ones(2))

    try:
        torch.fx.symbolic_trace(CallsCompiled())
    except Exception as exc:
        if is_nested_trace_error(exc):
            return True, None
        return False, "same-thread control: unexpected %s: %s" % (type(exc).__name__, exc)
    return False, None


def cross_thread_trial(torch, timeout):
    """(raised, problem): thread B calls a compiled function while thread A traces (A's
    tracing flag stays set meanwhile)."""
    def judge(exc):
        if is_nested_trace_error(exc):
            return {"raised": True}
        if isinstance(exc, NameError) and OTHER_FX_LEAK_ERROR in str(exc):
            return {"raised": False, "problem": OTHER_FX_LEAK_NOTE}
        return {"problem": "unexpected %s: %s" % (type(exc).__name__, exc)}
    return while_tracing(torch, timeout, lambda: fresh_compiled_function(torch)(torch.ones(2)), judge,
                         names=("fx-race-tracer", "fx-race-caller"), hang_note=" (hung compile?)")


def verdict(cross_raised, same_raised, trials, problems):
    if same_raised == 0:
        return "guard-disabled"
    if problems or same_raised != trials:
        return "inconclusive"
    if cross_raised == trials:
        return "vulnerable"
    return "fixed" if cross_raised == 0 else "inconclusive"


def flag_race(torch, trials, timeout):
    """The FX tracing flag's trials: (flat result fields, the state's row)."""
    cross_raised = same_raised = other_leak = 0
    problems = []
    for index in range(1, trials + 1):
        trial_started = time.monotonic()
        torch._dynamo.reset()  # each trial compiles from scratch, as a fresh drafter would
        same, same_problem = same_thread_control(torch)
        cross, cross_problem = cross_thread_trial(torch, timeout)
        problem = "; ".join(p for p in (same_problem, cross_problem) if p) or None
        same_raised += bool(same)
        cross_raised += bool(cross)
        other_leak += cross_problem == OTHER_FX_LEAK_NOTE
        if problem:
            problems.append("trial %d: %s" % (index, problem))
        emit("trial", index=index, trials=trials, cross_thread_raised=cross,
             same_thread_raised=same, seconds=round(time.monotonic() - trial_started, 3),
             problem=problem)
    flat = {
        "cross_thread_raised": cross_raised,
        "trials": trials,
        "same_thread_raised": same_raised,
        "same_thread_trials": trials,
        "cross_thread_other_fx_leak": other_leak,
        "verdict": verdict(cross_raised, same_raised, trials, problems),
        "problems": problems,
    }
    row = {"state": "fx-tracing-flag", "trials": trials, "raised": cross_raised,
           "control_held": same_raised, "verdict": flat["verdict"], "problems": problems}
    return flat, row


def overall_verdict(rows):
    verdicts = [r["verdict"] for r in rows if r["verdict"] != "not-applicable"]
    for worst in ("vulnerable", "guard-disabled", "control-failed", "inconclusive"):
        if worst in verdicts:
            return worst
    return "fixed" if verdicts else "inconclusive"


def run(args):
    trials, timeout, states = args["trials"], float(args["timeout"]), args["states"]
    if not 1 <= trials <= 1000:
        raise PayloadError("trials must be between 1 and 1000", "bad-args")
    if not 0 < timeout <= 3600:
        raise PayloadError("timeout must be between 0 and 3600 seconds", "bad-args")
    unknown = [s for s in states if s not in STATES]
    if unknown or not states:
        raise PayloadError("states must be some of %s" % ", ".join(STATES), "bad-args")
    torch = import_torch()
    started = time.monotonic()
    out, rows = {"torch_version": torch.__version__}, []
    if "fx-tracing-flag" in states:
        flat, row = flag_race(torch, trials, timeout)
        out.update(flat)
        rows.append(row)
    if "node-meta" in states:
        rows.append(node_meta_race(torch, trials, timeout,
                                   lambda **fields: emit("trial", **fields)))
    if "trace-patching" in states:
        rows.append(trace_patch_race(torch, trials, timeout,
                                     lambda **fields: emit("trial", **fields)))
    out["states"] = rows
    if "fx-tracing-flag" not in states:
        out["verdict"] = overall_verdict(rows)
        out["problems"] = [p for r in rows for p in r["problems"]]
    out["overall_verdict"] = overall_verdict(rows)
    out["seconds"] = round(time.monotonic() - started, 3)
    return out


def main():
    code = run_main(sys.argv, ARG_SPEC, run)
    sys.stdout.flush()
    # A hung compile thread must not keep the process alive past the result line.
    os._exit(code)


if __name__ == "__main__":
    main()
