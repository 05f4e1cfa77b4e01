#!/usr/bin/env python3
"""What the fx-threads patch must not change on a GPU, and what it must fix: run with the
torch venv's python (scripts/gpu-fx-threads-check.sh runs it before and after apply).

1. Node meta of a compiled forward+backward (aot_autograd, custom backend that keeps the
   graphs): how many nodes carry `stack_trace`, `seq_nr` and an `annotate()` tag. The
   backward of a CUDA graph may run on an autograd device thread; with thread-local node
   meta those counts must stay what they were unpatched (same-thread semantics kept).
2. DRAFTERS threads (default 3) compiling flex_attention fwd+bwd side by side on one GPU,
   each step inside `annotate()` as torch's flex_attention does: errors per thread
   (KeyError 'custom' is the node-meta race; the flag's RuntimeError the old race).

--backward-in-thread: each drafter thread first calls
torch.autograd.set_multithreading_enabled(False) (thread-local), so its backward runs on the
thread itself, not on autograd's CUDA device thread: the remedy for issue 39's deadlock
(a thread holding torch._dynamo's compile_lock waits in the autograd engine for
pt_autograd_0, which compiles another thread's backward and waits for compile_lock).

Prints one JSON object. Usage: PYTHON scripts/gpu_fx_threads_probe.py [--device cuda]
"""

import argparse
import os
import json
import threading
import time
import traceback


def graph_meta(torch, device):
    import torch.fx.traceback as fx_traceback
    from torch._dynamo.backends.common import aot_autograd
    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return gm.forward
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    layer = torch.nn.Linear(64, 64, device=device)

    def step(x):
        with fx_traceback.annotate({"orch_probe": 1}):
            y = layer(x).relu()
        return (y * y).sum()

    torch._dynamo.reset()
    x = torch.randn(8, 64, device=device, requires_grad=True)
    torch.compile(step, backend=backend)(x).backward()
    counts = {}
    for name, gm in graphs.items():
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        counts[name] = {"nodes": len(nodes),
                        "stack_trace": sum(bool(n.meta.get("stack_trace")) for n in nodes),
                        "seq_nr": sum("seq_nr" in n.meta for n in nodes),
                        "annotated": sum("orch_probe" in (n.meta.get("custom") or {})
                                         for n in nodes)}
    return counts


def drafters(torch, device, threads, steps, seconds_allowed, backward_in_thread=False):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    errors, seconds = {}, {}
    start = threading.Barrier(threads)

    def drafter(index):
        started = time.monotonic()
        try:
            if backward_in_thread:
                # thread-local: this thread's backward runs here, not on pt_autograd_N
                torch.autograd.set_multithreading_enabled(False)
            compiled = torch.compile(flex_attention)
            start.wait(120)
            for _ in range(steps):
                q, k, v = (torch.randn(1, 4, 256, 64, device=device, dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 1, 256, 256,
                                         device=device)
                compiled(q, k, v, block_mask=mask).sum().backward()
        except Exception as exc:
            errors[index] = "%s: %s | %s" % (type(exc).__name__, exc,
                                            traceback.format_exc().splitlines()[-3].strip())
        seconds[index] = round(time.monotonic() - started, 1)

    workers = [threading.Thread(target=drafter, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    # One deadline for all of them: unpatched, a drafter can deadlock in its first compile
    # (seen on one shared H200), and a probe that waits for it never reports.
    deadline = time.monotonic() + seconds_allowed
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, w in enumerate(workers) if w.is_alive()]
    return {"threads": threads, "errors": errors, "hung": hung, "seconds": seconds,
            "backward_in_thread": backward_in_thread}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--drafters", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=200,
                        help="how long the drafters may take in all; a drafter still running then is reported hung")
    parser.add_argument("--backward-in-thread", action="store_true",
                        help="each thread calls torch.autograd.set_multithreading_enabled(False) first "
                             "(the remedy for the compile_lock / autograd device thread deadlock)")
    parser.add_argument("--no-graph-meta", action="store_true",
                        help="skip the node-meta part (its compile warms the cache the drafters must find cold)")
    parser.add_argument("--ready-file", default=None,
                        help="write this file once the drafters have started (for a stacks taker)")
    args = parser.parse_args()
    import torch
    import torch.fx.traceback as fx_traceback
    out = {"torch": torch.__version__, "device": args.device,
           "node_meta_module": type(fx_traceback).__name__}
    if not args.no_graph_meta:
        try:
            out["graph_meta"] = graph_meta(torch, args.device)
        except Exception as exc:
            out["graph_meta_error"] = "%s: %s" % (type(exc).__name__, exc)
    if args.ready_file:
        with open(args.ready_file, "w") as handle:
            handle.write(str(os.getpid()))
    started = time.monotonic()
    out["drafters"] = drafters(torch, args.device, args.drafters, args.steps, args.seconds,
                               args.backward_in_thread)
    out["drafters"]["wall_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(out), flush=True)
    os._exit(0)  # a hung drafter thread must not keep the process alive


if __name__ == "__main__":
    main()
