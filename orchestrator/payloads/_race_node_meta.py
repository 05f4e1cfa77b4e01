"""The node-meta race of torch/fx/traceback.py, reproduced deterministically, and its
same-thread control. Used by the fx_race payload (inlined when shipped, like _protocol.py).

Cross-thread trial, in a forced order (events, each wait bounded):
B enters ``preserve_node_meta()``; A opens ``annotate({...})``; B reads the node meta it
would copy into its graph nodes, then leaves (upstream: that REBINDS the module's
``current_meta`` to B's saved copy, which has no "custom"); A leaves ``annotate``
(upstream: ``del current_meta["custom"]`` -> ``KeyError: 'custom'``). "raised" is A's
KeyError; "leaked" is B seeing A's annotation. Thread-local state: neither.

Same-thread control: nested ``preserve_node_meta()`` and ``annotate()`` in one thread must
keep upstream semantics: each exit restores exactly what its entry saw.

Releases without ``annotate()`` (2.1 to 2.9) share the same state: there the trial is
the leak of ``preserve_node_meta()``'s flag (B inside, A outside asks
``has_preserved_node_meta()``: upstream True, so A's nodes would copy B's meta), and the
control nests ``preserve_node_meta()`` alone ("trial": "flag-leak" in the row).
"""

import threading
import time

from _race_pair import *  # orch: inlined when shipped

NODE_META_ANNOTATION = {"orch_race": "thread-A"}


def node_meta_available(torch):
    """None, or why this torch has no node-meta race to reproduce."""
    if not hasattr(torch.fx.traceback, "preserve_node_meta"):
        return "this torch's torch.fx.traceback has no preserve_node_meta"
    return None


def has_annotate(torch):
    """annotate() came later than preserve_node_meta(); without it the trial shows the
    shared state as the leak of preserve_node_meta()'s flag into another thread."""
    return hasattr(torch.fx.traceback, "annotate")


def node_meta_flag_leak_trial(torch, timeout):
    """(raised, leaked, problem) where there is no annotate(): B enters
    preserve_node_meta(); A, which never entered it, asks has_preserved_node_meta()
    (upstream: True, so A's graph nodes would copy B's meta). "raised" is that leak."""
    tb = torch.fx.traceback
    b_in, a_done = threading.Event(), threading.Event()
    outcome = {}

    def thread_b():
        try:
            with tb.preserve_node_meta():
                b_in.set()
                a_done.wait(timeout)
        except Exception as exc:
            outcome["problem"] = "thread B: unexpected %s: %s" % (type(exc).__name__, exc)
        finally:
            b_in.set()

    def thread_a():
        try:
            if not b_in.wait(timeout):
                outcome["problem"] = "thread B never entered preserve_node_meta()"
                return
            outcome["leaked"] = bool(tb.has_preserved_node_meta())
        finally:
            a_done.set()

    if not run_pair(thread_b, thread_a, timeout):
        return None, None, "a thread was still running after %.0fs" % (3 * timeout)
    return outcome.get("leaked"), outcome.get("leaked"), outcome.get("problem")


def node_meta_cross_thread_trial(torch, timeout):
    """(raised, leaked, problem) of one forced interleaving."""
    tb = torch.fx.traceback
    b_in, a_open, b_out = threading.Event(), threading.Event(), threading.Event()
    outcome = {}

    def thread_b():
        try:
            with tb.preserve_node_meta():
                b_in.set()
                if not a_open.wait(timeout):
                    outcome["problem"] = "thread A never opened annotate()"
                    return
                outcome["leaked"] = "custom" in tb.current_meta
        except Exception as exc:
            outcome["problem"] = "thread B: unexpected %s: %s" % (type(exc).__name__, exc)
        finally:
            b_out.set()

    def thread_a():
        try:
            if not b_in.wait(timeout):
                outcome["problem"] = "thread B never entered preserve_node_meta()"
                return
            with tb.annotate(dict(NODE_META_ANNOTATION)):
                a_open.set()
                b_out.wait(timeout)
            outcome["raised"] = False
        except KeyError as exc:
            outcome["raised"] = exc.args == ("custom",)
            if not outcome["raised"]:
                outcome["problem"] = "thread A: unexpected KeyError %s" % exc
        except Exception as exc:
            outcome["problem"] = "thread A: unexpected %s: %s" % (type(exc).__name__, exc)
        finally:
            a_open.set()

    if not run_pair(thread_b, thread_a, timeout):
        return None, None, "a thread was still running after %.0fs" % (3 * timeout)
    clean_up_after_trial(tb)
    return outcome.get("raised"), outcome.get("leaked"), outcome.get("problem")


def clean_up_after_trial(tb):
    """Unpatched, the interleaving leaves this thread's view changed too; start the next
    trial from upstream's initial state."""
    meta = tb.current_meta
    if isinstance(meta, dict):
        meta.pop("custom", None)


def node_meta_same_thread_control(torch):
    """(held, problem): nesting in one thread restores what each entry saw."""
    tb = torch.fx.traceback
    seen = []

    def custom():
        return dict(tb.current_meta.get("custom", {}))

    if not has_annotate(torch):
        return flag_only_control(tb)
    try:
        with tb.preserve_node_meta():
            with tb.annotate({"outer": 1}):
                seen.append(custom() == {"outer": 1})
                with tb.preserve_node_meta():
                    with tb.annotate({"inner": 2}):
                        seen.append(custom() == {"outer": 1, "inner": 2})
                        seen.append(tb.has_preserved_node_meta())
                    seen.append(custom() == {"outer": 1})
                # (upstream's inner exit rebinds to a shallow copy whose "custom" dict the
                # inner annotate() updated in place: only "outer" is certain to be there)
                seen.append(custom().get("outer") == 1 and tb.has_preserved_node_meta())
            seen.append("custom" not in tb.current_meta)
        seen.append(not tb.has_preserved_node_meta())
    except Exception as exc:
        return False, "same-thread control: unexpected %s: %s" % (type(exc).__name__, exc)
    if not all(seen):
        return False, "same-thread control: nested preserve_node_meta()/annotate() did not " \
            "restore what they saved (checks %s)" % seen
    return True, None


def flag_only_control(tb):
    """Nested preserve_node_meta() in one thread: on while inside, off after."""
    seen = []
    try:
        with tb.preserve_node_meta():
            seen.append(tb.has_preserved_node_meta())
            with tb.preserve_node_meta():
                seen.append(tb.has_preserved_node_meta())
            seen.append(tb.has_preserved_node_meta())
        seen.append(not tb.has_preserved_node_meta())
    except Exception as exc:
        return False, "same-thread control: unexpected %s: %s" % (type(exc).__name__, exc)
    if not all(seen):
        return False, "same-thread control: nested preserve_node_meta() did not restore " \
            "its flag (checks %s)" % seen
    return True, None


def node_meta_race(torch, trials, timeout, on_trial):
    """The state's row for fx_race's result."""
    reason = node_meta_available(torch)
    if reason:
        return {"state": "node-meta", "trials": 0, "raised": 0, "leaked": 0,
                "control_held": 0, "verdict": "not-applicable", "problems": [reason]}
    raised = leaked = held = 0
    problems = []
    for index in range(1, trials + 1):
        started = time.monotonic()
        control, control_problem = node_meta_same_thread_control(torch)
        trial = node_meta_cross_thread_trial if has_annotate(torch) else node_meta_flag_leak_trial
        cross, leak, cross_problem = trial(torch, timeout)
        problem = "; ".join(p for p in (control_problem, cross_problem) if p) or None
        raised += bool(cross)
        leaked += bool(leak)
        held += bool(control)
        if problem:
            problems.append("trial %d: %s" % (index, problem))
        on_trial(state="node-meta", index=index, trials=trials, cross_thread_raised=cross,
                 leaked=leak, same_thread_held=control,
                 seconds=round(time.monotonic() - started, 3), problem=problem)
    return {"state": "node-meta", "trials": trials, "raised": raised, "leaked": leaked,
            "control_held": held, "trial": "annotate" if has_annotate(torch) else "flag-leak",
            "verdict": state_verdict(raised, held, trials, problems, leaked),
            "problems": problems}


def state_verdict(raised, held, trials, problems, leaked=0):
    if held == 0:
        return "control-failed"
    if problems or held != trials:
        return "inconclusive"
    if raised == trials:
        return "vulnerable"
    return "fixed" if raised == 0 and leaked == 0 else "inconclusive"
