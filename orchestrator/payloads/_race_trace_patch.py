"""The trace-time patching race of torch/fx/_symbolic_trace.py, reproduced deterministically,
and its same-thread control. Used by the fx_race payload (inlined when shipped).

Cross-thread trial: thread A runs ``torch.fx.symbolic_trace`` on a module whose forward
sets an event and blocks (A's patches of nn.Module.__call__/__getattr__ stay in place);
thread B calls a plain eager ``nn.Linear``. Upstream the patch is process-wide, so B's call
goes through A's tracer and fails ``NameError: module is not installed as a submodule``.

Same-thread control: a module with a submodule traced in one thread still records the
submodule as a ``call_module`` node (the patch still acts in the tracing thread).
"""

import time

from _race_node_meta import *  # orch: inlined when shipped

TRACE_PATCH_ERROR = "module is not installed as a submodule"


def trace_patch_cross_thread_trial(torch, timeout):
    """(raised, problem) of one forced interleaving: B builds and calls a Linear while A's
    trace-time patches are in place."""
    def judge(exc):
        if isinstance(exc, NameError):
            raised = TRACE_PATCH_ERROR in str(exc)
            return {"raised": raised} if raised else {"raised": False, "problem": "unexpected NameError: %s" % exc}
        return {"problem": "unexpected %s: %s" % (type(exc).__name__, exc)}
    return while_tracing(torch, timeout, lambda: torch.nn.Linear(2, 2)(torch.ones(1, 2)), judge,
                         names=("trace-patch-A", "trace-patch-B"))


def trace_patch_same_thread_control(torch):
    """(held, problem): the tracing thread still sees its patched Module.__call__."""
    class WithChild(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.child = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.child(x)

    try:
        graph = torch.fx.symbolic_trace(WithChild()).graph
    except Exception as exc:
        return False, "same-thread control: unexpected %s: %s" % (type(exc).__name__, exc)
    if not any(n.op == "call_module" and n.target == "child" for n in graph.nodes):
        return False, "same-thread control: the trace did not record the submodule call"
    return True, None


def trace_patch_race(torch, trials, timeout, on_trial):
    """The state's row for fx_race's result."""
    raised = held = 0
    problems = []
    for index in range(1, trials + 1):
        started = time.monotonic()
        control, control_problem = trace_patch_same_thread_control(torch)
        cross, cross_problem = trace_patch_cross_thread_trial(torch, timeout)
        problem = "; ".join(p for p in (control_problem, cross_problem) if p) or None
        raised += bool(cross)
        held += bool(control)
        if problem:
            problems.append("trial %d: %s" % (index, problem))
        on_trial(state="trace-patching", index=index, trials=trials, cross_thread_raised=cross,
                 same_thread_held=control, seconds=round(time.monotonic() - started, 3),
                 problem=problem)
    return {"state": "trace-patching", "trials": trials, "raised": raised,
            "control_held": held, "verdict": state_verdict(raised, held, trials, problems),
            "problems": problems}
