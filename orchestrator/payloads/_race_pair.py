"""The two-thread harness every FX reproducer runs on (inlined where a payload needs it).

`run_pair` starts two daemon threads and bounds them together; `while_tracing` is the forced
interleaving the flag and the trace-time patching reproducers share: thread A traces a module
whose forward() blocks, so A's tracing state stays in place while thread B runs its call.
"""

import threading
import time


def run_pair(first, second, timeout, names=("node-meta-B", "node-meta-A")):
    """Start both threads (daemons), wait for them within one bound of 3 x timeout; False
    on a hang. Every reproducer's two threads run through here."""
    threads = [threading.Thread(target=first, daemon=True, name=names[0]),
               threading.Thread(target=second, daemon=True, name=names[1])]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 3 * timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)


def while_tracing(torch, timeout, call, judge, names, hang_note=""):
    """(raised, problem) of one interleaving: B runs CALL() while A traces. JUDGE(exc) says
    what an exception of B's means, as {"raised": ..., "problem": ...} (either may be left
    out); B returning means nothing was raised."""
    entered, release = threading.Event(), threading.Event()
    outcome = {}

    class BlocksWhileTracing(torch.nn.Module):
        def forward(self, x):
            entered.set()
            release.wait(timeout)  # A's tracing state stays in place meanwhile
            return x

    def tracer():
        try:
            torch.fx.symbolic_trace(BlocksWhileTracing())
        except Exception as exc:
            outcome["tracer_error"] = "%s: %s" % (type(exc).__name__, exc)

    def caller():
        try:
            if not entered.wait(timeout):
                outcome["problem"] = "the tracing thread never reached forward()"
                return
            call()
            outcome["raised"] = False
        except Exception as exc:
            outcome.update(judge(exc))
        finally:
            release.set()

    finished = run_pair(tracer, caller, timeout, names=names)
    release.set()
    if not finished:
        return None, "a thread was still running after %.0fs%s" % (3 * timeout, hang_note)
    if "tracer_error" in outcome:
        return outcome.get("raised"), "the tracing thread failed: " + outcome["tracer_error"]
    return outcome.get("raised"), outcome.get("problem")
