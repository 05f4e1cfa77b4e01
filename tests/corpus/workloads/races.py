"""Races on process-wide state of real libraries, each forced into the order that breaks
with events (deterministic, CPU): the explain corpus's race family
(tests/corpus/make_explain_corpus.py). The FX tracing flag's race is the stand-in trainer's
(playbooks/files/train_drafters.py --race).

    python races.py --race NAME

- node-meta: torch.fx.traceback's current_meta. B enters preserve_node_meta(), A opens
  annotate(), B leaves (rebinding current_meta to its saved copy), A leaves: KeyError 'custom'.
- trace-patcher: while thread A's torch.fx.symbolic_trace is open, FX patches
  nn.Module.__call__ process-wide; thread B calls a leaf module of its own and lands in A's
  tracer: NameError "module is not installed as a submodule".
- stance: thread A runs under torch.compiler.set_stance("fail_on_recompile") (the module
  global torch._dynamo.eval_frame._stance); thread B's first call of its own compiled
  function fails as a recompile.
- warnings-filter: thread A turns warnings into errors in warnings.catch_warnings() (the
  module globals of warnings, documented as not thread-safe); thread B's torch call warns
  and gets the warning raised as an exception.
"""

import argparse
import threading
import warnings

import torch
import torch.fx.traceback as fx_traceback

RACES = ("node-meta", "trace-patcher", "stance", "warnings-filter")
WAIT = 30


def node_meta():
    b_in, a_in, b_out = threading.Event(), threading.Event(), threading.Event()

    def preserver():
        with fx_traceback.preserve_node_meta():
            b_in.set()
            a_in.wait(WAIT)
        b_out.set()

    def annotator():
        b_in.wait(WAIT)
        with fx_traceback.annotate({"step": "a"}):
            a_in.set()
            b_out.wait(WAIT)

    return [threading.Thread(target=annotator, name="annotator"),
            threading.Thread(target=preserver, name="preserver")]


def trace_patcher():
    opened, called = threading.Event(), threading.Event()

    class Blocking(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            opened.set()
            called.wait(WAIT)           # the trace stays open while B runs
            return self.proj(x)

    def tracer():
        torch.fx.symbolic_trace(Blocking())

    def trainer():
        opened.wait(WAIT)
        try:
            head = torch.nn.Linear(4, 2)
            print(head(torch.randn(3, 4)).shape, flush=True)
        finally:
            called.set()

    return [threading.Thread(target=tracer, name="tracer"),
            threading.Thread(target=trainer, name="trainer-1")]


def stance():
    strict, done = threading.Event(), threading.Event()

    @torch.compile(backend="eager")
    def warm(x):
        return x * 2

    @torch.compile(backend="eager")
    def fresh(x):
        return torch.relu(x) + 1

    def checker():
        warm(torch.randn(4))
        with torch.compiler.set_stance("fail_on_recompile"):
            strict.set()
            done.wait(WAIT)
            warm(torch.randn(4))

    def trainer():
        strict.wait(WAIT)
        try:
            print(fresh(torch.randn(4)), flush=True)
        finally:
            done.set()

    return [threading.Thread(target=checker, name="checker"),
            threading.Thread(target=trainer, name="trainer-1")]


def warnings_filter():
    strict, done = threading.Event(), threading.Event()

    def validator():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            strict.set()
            done.wait(WAIT)

    def trainer():
        strict.wait(WAIT)
        try:
            weights = torch.randn(4, 4)
            copy = torch.tensor(weights)       # torch warns: use clone().detach()
            print(copy.shape, flush=True)
        finally:
            done.set()

    return [threading.Thread(target=validator, name="validator"),
            threading.Thread(target=trainer, name="trainer-1")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--race", choices=RACES, required=True)
    race = parser.parse_args().race
    print(f"start race={race} torch={torch.__version__}", flush=True)
    threads = {"node-meta": node_meta, "trace-patcher": trace_patcher, "stance": stance,
               "warnings-filter": warnings_filter}[race]()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
