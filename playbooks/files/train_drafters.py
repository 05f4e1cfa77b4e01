#!/usr/bin/env python3
"""Stand-in for the DFlash three-drafter training run: N drafter threads, one process.

Each thread trains a tiny DFlash-style block-diffusion drafter on synthetic tokens:
an embedding, a few transformer layers and an LM head. Per step it samples anchor
positions; the draft input of each block is the real token at the anchor followed by
MASK tokens; keys/values are ``[context (S) | draft blocks]`` and attention goes through
a process-wide ``torch.compile(flex_attention)`` singleton (as transformers does) with
the DFlash block mask::

    Q_LEN  = n_anchors * block          KV_LEN = S + n_anchors * block
    allowed = (kv < S and kv < anchor(q_block))          # context before the anchor
           or (kv >= S and q_block == (kv - S) // block)  # the query's own draft block
    (and only inside Q_LEN x KV_LEN)

The compiled kernel is built lazily, on each thread's first forward, which is what
exposes the FX tracing-flag race of torch < 2.14 when several threads compile at once
(on CUDA it happens by itself: one H200, torch 2.11, 1-2 of 3 drafters raised; on CPU
use --race).

CPU note: torch refuses flex_attention backward on CPU, so on CPU the compiled flex
kernel computes the forward value and the backward recomputes the same masked attention
densely with SDPA (a custom autograd Function). On CUDA flex does both.

Only torch is needed. Sizes that behave like the real run:
  CPU (the defaults):  python train_drafters.py --devices cpu --steps 50
      batch 2, seq 256, d_model 128, 2 layers; ~12 K tok/s for 3 drafters on 2 idle cores
  one H200, bf16:      python train_drafters.py --devices cuda:0,cuda:0,cuda:0 \
                           --batch 8 --seq 2048 --d-model 512 --layers 4 --heads 8
      ~1.1-1.2 M tok/s for 3 drafters (--serialize-compile, torch 2.11); ~0.13 M uncompiled

Switches for demos and tests
  --uncompiled         flex_attention eager (unfused, one call at a time): the degraded mode.
  --compile-backend B  torch.compile backend (inductor; aot_eager where no C++ compiler is).
  --slow-ms N          sleep N ms per step per drafter: plants a throughput regression.
  --race               hold a make_fx trace open in a helper thread while the drafters make
                       their first compiled call: the FX race error, deterministic, on CPU.
  --fail-drafter K     drafter K raises at step 1 while holding a lock the others need at
                       step 2: "one errored, the others deadlocked" (a hang for the monitor).
  --serialize-compile  mitigation: each drafter's first (compiling) step under one lock.
  --compile-per-thread each drafter its own torch.compile(flex_attention) instead of the
                       process-wide singleton: every thread compiles its own graphs (on
                       one GPU without --backward-in-thread: the compile deadlock)
  --backward-in-thread remedy: each drafter runs its backward on its own thread
                       (torch.autograd.set_multithreading_enabled(False), thread-local),
                       not on autograd's CUDA device thread: drafters compiling on one GPU
                       then never deadlock on torch's compile_lock (issue 39's cycle:
                       a drafter holds compile_lock and waits for the device thread, which
                       compiles another drafter's backward and waits for compile_lock).
  --max-seconds S      watchdog: past S seconds, print the timeout summary and exit 3.

Log lines (stdout, one per event, flushed at once; key=value, machine-readable)
  start drafters=3 devices=cpu,cpu,cpu torch=2.13.0+cpu pid=123 dtype=float32 ...
  drafter=0 compiled seconds=12.34       first step done, compile included
                                         ("uncompiled seconds=" with --uncompiled)
  drafter=0 step=20 loss=3.2100 tok_s=1234
                                         step 1, then every --log-every steps; tok_s is
                                         that drafter's rate since its previous step line
                                         (step 1 includes the compile); tokens = batch*seq
  drafter=0 ERROR RuntimeError: <first line of the message>
                                         the traceback follows on stderr
  drafter=0 done steps=50 loss=2.1000 tok_s=5321
                                         tok_s: steps 2..N (compile excluded)
  race trace=open | race trace=closed    only with --race
  summary status=ok|failed|timeout drafters=3 ok=3 failed=0 total_tok_s=16000 stalled=0 seconds=20.1
                                         total_tok_s: sum of the drafters' done tok_s
                                         (for a timeout: of their rates so far)

Exit codes
  0  every drafter finished its steps
  1  at least one drafter raised (and the others ended)
  2  bad arguments (argparse convention)
  3  watchdog: the run exceeded --max-seconds (threads stuck in a compile cannot be
     joined, so the process ends with os._exit after printing the summary)
  A signal (SIGTERM from a monitor, SIGKILL) ends it at once: no summary line.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_ARGS = 2  # what argparse's parser.error() exits with
EXIT_TIMEOUT = 3

# --------------------------------------------------------------------------- logging

_LOG_LOCK = threading.Lock()


def log(line: str) -> None:
    """One event per line, written whole: print() from several threads can interleave
    the text and its newline, which would break a line-oriented monitor."""
    with _LOG_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def log_error(drafter: int, exc: BaseException) -> None:
    first_line = (str(exc).splitlines() or [""])[0]
    with _LOG_LOCK:
        sys.stdout.write(f"drafter={drafter} ERROR {type(exc).__name__}: {first_line}\n")
        sys.stdout.flush()
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        sys.stderr.flush()


# ------------------------------------------------------- the flex_attention singleton

_FLEX_LOCK = threading.Lock()
_FLEX_FN = None
_EAGER_FLEX_LOCK = threading.Lock()


def get_flex_attention(compiled: bool, backend: str = "inductor"):
    """Process-wide flex_attention, built once (transformers keeps the same singleton).

    torch.compile only wraps here; the real compile happens on the first call in each
    thread, and that first call is where the FX tracing-flag race bites (in Dynamo, before
    any backend runs: the race is the same with every backend)."""
    global _FLEX_FN
    with _FLEX_LOCK:
        if _FLEX_FN is None:
            _FLEX_FN = (torch.compile(flex_attention, dynamic=False, backend=backend)
                        if compiled else _eager_flex)
        return _FLEX_FN


def _eager_flex(*args, **kwargs):
    """Uncompiled flex_attention, one call at a time.

    With grad (CUDA) eager flex traces its forward/backward graphs with make_fx on every
    call, and FX keeps tracing state in process globals (CURRENT_PATCHER, the tracing
    flag): two threads at once fail with "CURRENT_PATCHER is None in finally block"
    (seen on an H200, torch 2.11). The degraded mode is slow anyway; it must not crash."""
    with _EAGER_FLEX_LOCK:
        return flex_attention(*args, **kwargs)


# ------------------------------------------------------------------------ the mask


def dflash_mask_mod(anchors: torch.Tensor, ctx_len: int, block: int):
    """mask_mod for one step; ``anchors`` is (B, n_anchors) of context positions.

    Written with plain tensor ops so that the same function serves flex (scalar indices,
    via create_block_mask) and the dense CPU backward (broadcast index grids)."""
    n_anchors = anchors.shape[1]
    q_len = n_anchors * block
    kv_len = ctx_len + n_anchors * block

    def mask_mod(b, h, q_idx, kv_idx):
        q_block = q_idx // block
        # flex may evaluate padded rows past Q_LEN: clamp before indexing
        anchor = anchors[b, q_block.clamp(max=n_anchors - 1)]
        is_context = kv_idx < ctx_len
        see_context = is_context & (kv_idx < anchor)
        see_own_block = ~is_context & (q_block == (kv_idx - ctx_len) // block)
        in_bounds = (q_idx < q_len) & (kv_idx < kv_len)
        return (see_context | see_own_block) & in_bounds

    return mask_mod


def dense_mask(mask_mod, batch: int, q_len: int, kv_len: int, device) -> torch.Tensor:
    """(B, 1, Q_LEN, KV_LEN) bool mask from the same mask_mod, by broadcasting."""
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    q = torch.arange(q_len, device=device).view(1, 1, q_len, 1)
    kv = torch.arange(kv_len, device=device).view(1, 1, 1, kv_len)
    return mask_mod(b, h, q, kv)


# ------------------------------------------------------------------ the attention


class _FlexForwardDenseBackward(torch.autograd.Function):
    """Forward value from the (compiled) flex kernel, gradient from dense SDPA.

    Needed on CPU only, where flex_attention refuses inputs that require grad. The
    backward recomputes attention with the same mask (like activation checkpointing),
    so nothing but q, k, v is kept between forward and backward."""

    @staticmethod
    def forward(ctx, q, k, v, flex_fn, block_mask, mask_mod):
        ctx.save_for_backward(q, k, v)
        ctx.mask_mod = mask_mod
        # detach: flex checks requires_grad on its inputs, and inside a custom
        # Function's forward the inputs still carry it
        return flex_fn(q.detach(), k.detach(), v.detach(), block_mask=block_mask)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        mask = dense_mask(ctx.mask_mod, q.shape[0], q.shape[2], k.shape[2], q.device)
        with torch.enable_grad():
            q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
            out = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask)
        grad_q, grad_k, grad_v = torch.autograd.grad(out, (q_, k_, v_), grad_out)
        return grad_q, grad_k, grad_v, None, None, None


@dataclass
class StepMask:
    """Everything attention needs about this step's mask."""

    block_mask: object
    mask_mod: object


def masked_attention(q, k, v, mask: StepMask, flex_fn) -> torch.Tensor:
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if q.device.type == "cpu" and needs_grad:
        return _FlexForwardDenseBackward.apply(q, k, v, flex_fn, mask.block_mask, mask.mask_mod)
    return flex_fn(q, k, v, block_mask=mask.block_mask)


# ---------------------------------------------------------------------- the model


class DrafterLayer(nn.Module):
    """Pre-norm transformer layer whose keys/values span [context | draft blocks]."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm_attn = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.kv = nn.Linear(d_model, 2 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.norm_mlp = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, h, context, mask: StepMask, flex_fn):
        x = self.norm_attn(h)
        q = self._split_heads(self.q(x))
        k, v = self.kv(torch.cat([context, x], dim=1)).chunk(2, dim=-1)
        attn = masked_attention(q, self._split_heads(k), self._split_heads(v), mask, flex_fn)
        h = h + self.out(attn.transpose(1, 2).flatten(2))
        return h + self.mlp(self.norm_mlp(h))


class Drafter(nn.Module):
    """Tiny DFlash-style drafter. The real one reads the target model's hidden states as
    context; here a projection of the token embeddings stands in for them."""

    def __init__(self, vocab: int, seq: int, d_model: int, layers: int, heads: int, block: int):
        super().__init__()
        self.block = block
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        # where in its block a draft token sits: the real drafter gets that from RoPE
        self.block_offset = nn.Embedding(block, d_model)
        self.context_proj = nn.Linear(d_model, d_model, bias=False)
        self.layers = nn.ModuleList(DrafterLayer(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens, draft_ids, draft_pos, mask: StepMask, flex_fn):
        ctx_pos = torch.arange(tokens.shape[1], device=tokens.device)
        context = self.context_proj(self.embed(tokens) + self.pos(ctx_pos))
        offsets = torch.arange(draft_ids.shape[1], device=draft_ids.device) % self.block
        h = self.embed(draft_ids) + self.pos(draft_pos) + self.block_offset(offsets)
        for layer in self.layers:
            h = layer(h, context, mask, flex_fn)
        return self.lm_head(self.norm(h))


def init_params(model: nn.Module, gen: torch.Generator) -> None:
    """Seeded from the thread's own generator: the global RNG is shared by all threads,
    so initialising from it would make each drafter depend on thread timing."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()


# ----------------------------------------------------------------------- the data


def successor_orbits(seed: int, vocab: int, seq: int, device) -> torch.Tensor:
    """(vocab, seq) table: row v is the walk v, succ(v), succ(succ(v)), ... for a fixed
    random permutation succ. Sequences drawn from it are learnable (the loss visibly
    falls within a few dozen steps) and cost one gather per batch."""
    succ = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    orbits = torch.empty(vocab, seq, dtype=torch.long)
    orbits[:, 0] = torch.arange(vocab)
    for i in range(1, seq):
        orbits[:, i] = succ[orbits[:, i - 1]]
    return orbits.to(device)


def synthetic_tokens(gen, orbits: torch.Tensor, batch: int) -> torch.Tensor:
    """A batch of walks from random start tokens."""
    start = torch.randint(0, orbits.shape[0], (batch,), generator=gen, device=orbits.device)
    return orbits[start]


def sample_anchors(gen, batch: int, seq: int, n_anchors: int, block: int, device):
    """Anchor positions, sorted, each leaving a whole block of labels inside the sequence."""
    anchors = torch.randint(1, seq - block + 1, (batch, n_anchors), generator=gen, device=device)
    return anchors.sort(dim=1).values


def draft_inputs(tokens, anchors, block: int, mask_id: int):
    """Draft ids (anchor token then MASKs), their positions, and the labels per block."""
    batch, n_anchors = anchors.shape
    offsets = torch.arange(block, device=tokens.device)
    positions = (anchors.unsqueeze(-1) + offsets).view(batch, n_anchors * block)
    labels = tokens.gather(1, positions)
    draft_ids = torch.full_like(labels, mask_id).view(batch, n_anchors, block)
    draft_ids[:, :, 0] = tokens.gather(1, anchors)
    return draft_ids.view(batch, -1), positions, labels


def block_loss(logits, labels, block: int) -> torch.Tensor:
    """Cross-entropy on the MASK positions; the anchor token itself is given."""
    vocab = logits.shape[-1]
    logits = logits.view(logits.shape[0], -1, block, vocab)[:, :, 1:]
    labels = labels.view(labels.shape[0], -1, block)[:, :, 1:]
    return F.cross_entropy(logits.float().reshape(-1, vocab), labels.reshape(-1))


# ------------------------------------------------------------------- fault injection


class RaceHelper:
    """Holds a make_fx trace open in a helper thread (the FX flag stays True meanwhile)
    until every drafter has made its first compiled call.

    make_fx rather than symbolic_trace: while a trace is open, FX also patches
    nn.Module.__call__ process-wide, and make_fx's tracer passes foreign modules straight
    through, where symbolic_trace would fail them with "not installed as a submodule".
    So with a thread-local flag (patched torch) the drafters train despite the open
    trace; unpatched, their first compiled call raises the FX error."""

    def __init__(self, n_drafters: int, hold_seconds: float):
        self._pending = n_drafters
        self._lock = threading.Lock()
        self._hold_seconds = hold_seconds
        self.opened = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None

    def start(self, timeout: float = 120.0) -> None:
        self._thread = threading.Thread(target=self._run, name="race-helper", daemon=True)
        self._thread.start()
        if not self.opened.wait(timeout) and self.error is None:
            raise RuntimeError("--race: the helper thread did not open its FX trace")
        if self.error is not None:
            raise RuntimeError(f"--race: the helper thread failed: {self.error!r}")

    def _run(self) -> None:
        from torch.fx.experimental.proxy_tensor import make_fx

        def held(x):
            self.opened.set()
            log("race trace=open")
            self.release.wait(self._hold_seconds)
            return x + 1

        try:
            make_fx(held)(torch.zeros(1))
        except BaseException as exc:  # report it; never kill the process from here
            self.error = exc
            self.opened.set()
        log("race trace=closed")

    def join(self, timeout: float) -> bool:
        """True once the helper thread has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def first_call_done(self) -> None:
        """Each drafter reports once, after its first compiled call returned or raised."""
        with self._lock:
            self._pending -= 1
            if self._pending <= 0:
                self.release.set()


class Faults:
    """The switches that make a drafter misbehave, shared by all drafter threads."""

    def __init__(self, args, race: RaceHelper | None):
        self.fail_drafter = args.fail_drafter
        self.slow_s = args.slow_ms / 1000.0
        self.race = race
        self.serialize_first_step = args.serialize_compile
        self.first_step_lock = threading.Lock()
        # Held by the failing drafter from its start and never released: the others
        # block on it at step 2, like threads waiting on a compile lock whose holder died.
        self.leaked_lock = threading.Lock()


# ---------------------------------------------------------------------- a drafter


@dataclass
class DrafterState:
    """What one drafter thread reports to the main thread (written only by that thread)."""

    status: str = "running"  # running | ok | failed
    steps: int = 0
    loss: float = float("nan")
    first_step_s: float = 0.0
    steady_tokens: int = 0  # tokens of steps 2..N: the compile is not throughput
    steady_start: float = 0.0
    steady_end: float = 0.0  # 0 while running

    def tok_s(self) -> float:
        end = self.steady_end or time.monotonic()
        elapsed = end - self.steady_start
        return self.steady_tokens / elapsed if self.steady_tokens and elapsed > 0 else 0.0


class DrafterRun:
    """One drafter: model, optimizer, data stream and the training loop."""

    def __init__(self, index: int, device: str, args, faults: Faults):
        self.index = index
        self.args = args
        self.faults = faults
        self.state = DrafterState()
        self.device = torch.device(device)
        self.vocab = args.vocab
        self.mask_id = args.vocab  # one extra embedding row, never a label
        self.tokens_per_step = args.batch * args.seq
        self.autocast_dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
        self._first_call_reported = False

    # -- setup ---------------------------------------------------------------

    def _setup(self) -> None:
        a = self.args
        if self.device.type == "cpu":
            # OpenMP thread counts are per thread: setting it in main is not enough
            torch.set_num_threads(a.cpu_threads)
        else:
            torch.cuda.set_device(self.device)
        seed = a.seed * 1000 + self.index
        init_gen = torch.Generator().manual_seed(seed)
        model = Drafter(self.vocab + 1, a.seq, a.d_model, a.layers, a.heads, a.block_size)
        init_params(model, init_gen)
        self.model = model.to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=a.lr)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        # same language for every drafter (like one dataset), own sampling per drafter
        self.orbits = successor_orbits(a.seed, self.vocab, a.seq, self.device)
        if a.compile_per_thread and not a.uncompiled:
            # each drafter its own torch.compile wrapper: each thread then compiles its own
            # graphs, where the shared one lets the later drafters reuse the first's
            self.flex_fn = torch.compile(flex_attention, dynamic=False, backend=a.compile_backend)
        else:
            self.flex_fn = get_flex_attention(compiled=not a.uncompiled, backend=a.compile_backend)

    # -- one step ------------------------------------------------------------

    def _step(self) -> torch.Tensor:
        a = self.args
        tokens = synthetic_tokens(self.gen, self.orbits, a.batch)
        anchors = sample_anchors(self.gen, a.batch, a.seq, a.anchors, a.block_size, self.device)
        draft_ids, positions, labels = draft_inputs(tokens, anchors, a.block_size, self.mask_id)
        mask_mod = dflash_mask_mod(anchors, a.seq, a.block_size)
        q_len = a.anchors * a.block_size
        block_mask = create_block_mask(mask_mod, a.batch, None, q_len, a.seq + q_len, self.device)
        mask = StepMask(block_mask=block_mask, mask_mod=mask_mod)

        with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            logits = self.model(tokens, draft_ids, positions, mask, self.flex_fn)
        loss = block_loss(logits, labels, a.block_size)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss

    def _first_step(self) -> torch.Tensor:
        """The step that compiles flex_attention in this thread."""
        try:
            if self.faults.serialize_first_step:
                with self.faults.first_step_lock:
                    return self._step()
            return self._step()
        finally:
            self._report_first_call()

    def _report_first_call(self) -> None:
        """Tell the race helper (once) that this thread is past its first compiled call."""
        if self.faults.race is not None and not self._first_call_reported:
            self._first_call_reported = True
            self.faults.race.first_call_done()

    # -- the loop ------------------------------------------------------------

    def run(self) -> None:
        st = self.state
        f = self.faults
        try:
            if self.args.backward_in_thread:
                # thread-local: this drafter's backward runs here, never on pt_autograd_N
                torch.autograd.set_multithreading_enabled(False)
            if f.fail_drafter == self.index:
                f.leaked_lock.acquire()
            self._setup()
            self._train()
            st.status = "ok"
        except BaseException as exc:  # a drafter's error ends its thread, not the run
            st.status = "failed"
            log_error(self.index, exc)
        finally:
            st.steady_end = st.steady_end or time.monotonic()  # freeze its rate
            self._report_first_call()  # failed before its first call: do not hold the trace

    def _train(self) -> None:
        a, st, f = self.args, self.state, self.faults
        t0 = time.monotonic()
        loss = self._first_step()
        st.loss = loss.item()  # .item() also waits for the device: honest timings
        st.first_step_s = time.monotonic() - t0
        st.steps = 1
        kind = "uncompiled" if a.uncompiled else "compiled"
        log(f"drafter={self.index} {kind} seconds={st.first_step_s:.2f}")
        log(f"drafter={self.index} step=1 loss={st.loss:.4f} "
            f"tok_s={self.tokens_per_step / st.first_step_s:.0f}")
        if f.fail_drafter == self.index:
            raise RuntimeError(f"drafter {self.index} failed at step 1 (--fail-drafter)")

        st.steady_start = interval_start = time.monotonic()
        interval_steps = 0
        for step in range(2, a.steps + 1):
            if f.fail_drafter is not None:
                with f.leaked_lock:  # blocks forever once the failing drafter holds it
                    pass
            if f.slow_s:
                time.sleep(f.slow_s)
            loss = self._step()
            interval_steps += 1
            st.steady_tokens += self.tokens_per_step
            if step % a.log_every == 0 or step == a.steps:
                st.loss = loss.item()
                now = time.monotonic()
                tok_s = interval_steps * self.tokens_per_step / (now - interval_start)
                if step % a.log_every == 0:
                    log(f"drafter={self.index} step={step} loss={st.loss:.4f} tok_s={tok_s:.0f}")
                interval_start, interval_steps = now, 0
            st.steps = step
        st.steady_end = time.monotonic()
        log(f"drafter={self.index} done steps={st.steps} loss={st.loss:.4f} tok_s={st.tok_s():.0f}")


# --------------------------------------------------------------------------- the CLI


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="DFlash-style multi-drafter stand-in trainer (N threads, one process).",
        epilog="Exit codes: 0 ok, 1 a drafter failed, 2 bad arguments, 3 watchdog timeout.",
    )
    p.add_argument("--drafters", type=positive_int, default=3, help="drafter threads (default 3)")
    p.add_argument("--devices", default=None,
                   help="comma list, one per drafter or one for all: 'cpu', 'cuda:0,cuda:1,cuda:2' "
                        "(default: the visible CUDA devices round-robin, else cpu)")
    p.add_argument("--steps", type=positive_int, default=50)
    p.add_argument("--batch", type=positive_int, default=2)
    p.add_argument("--seq", type=positive_int, default=256, help="context length S")
    p.add_argument("--d-model", type=positive_int, default=128)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--block-size", type=positive_int, default=16)
    p.add_argument("--anchors", type=positive_int, default=None,
                   help="draft blocks per sequence (default: seq / block_size / 2)")
    p.add_argument("--vocab", type=positive_int, default=512)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="bfloat16 = autocast; default bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--log-every", type=positive_int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-seconds", type=non_negative_float, default=0.0,
                   help="watchdog for the whole run; 0 = none")
    p.add_argument("--cpu-threads", type=positive_int, default=None,
                   help="torch threads per CPU drafter (default: cores / CPU drafters, >= 1)")
    p.add_argument("--uncompiled", action="store_true",
                   help="flex_attention eager, unfused: the degraded mode")
    p.add_argument("--compile-backend", choices=("inductor", "aot_eager", "eager"),
                   default="inductor",
                   help="torch.compile backend of flex_attention (default inductor; on CPU "
                        "inductor needs a C++ compiler and the Python headers, which a bare "
                        "container lacks: aot_eager needs neither)")
    p.add_argument("--slow-ms", type=non_negative_float, default=0.0,
                   help="sleep this many ms per step per drafter")
    p.add_argument("--race", action="store_true",
                   help="hold an FX trace open in a helper thread during the first compiled calls")
    p.add_argument("--fail-drafter", type=int, default=None, metavar="K",
                   help="drafter K raises at step 1; the others then block forever")
    p.add_argument("--serialize-compile", action="store_true",
                   help="run each drafter's first (compiling) step under one lock")
    p.add_argument("--compile-per-thread", action="store_true",
                   help="each drafter its own torch.compile(flex_attention), not the process-wide "
                        "one: the layout in which drafters compiling on one GPU deadlock")
    p.add_argument("--backward-in-thread", action="store_true",
                   help="run each drafter's backward on its own thread, not on autograd's device "
                        "thread (set_multithreading_enabled(False)): no compile-lock deadlock on one GPU")
    return p


def resolve_devices(spec: str | None, n: int) -> list[str]:
    """One device per drafter; raises ValueError on anything unusable."""
    if spec is None:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [f"cuda:{i % count}" for i in range(n)] if count else ["cpu"] * n
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if len(names) == 1:
        names = names * n
    if len(names) != n:
        raise ValueError(f"--devices lists {len(names)} devices for {n} drafters")
    for name in names:
        dev = torch.device(name)  # ValueError/RuntimeError on garbage
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"{name}: CUDA is not available in this torch/host")
            if (dev.index or 0) >= torch.cuda.device_count():
                raise ValueError(f"{name}: only {torch.cuda.device_count()} CUDA devices visible")
        elif dev.type != "cpu":
            raise ValueError(f"{name}: only cpu and cuda devices are supported")
    return [str(torch.device(name)) for name in names]


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.devices = resolve_devices(args.devices, args.drafters)
    except (ValueError, RuntimeError) as exc:
        parser.error(f"--devices: {exc}")
    if args.dtype is None:
        args.dtype = "bfloat16" if args.devices[0].startswith("cuda") else "float32"
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if args.seq <= args.block_size:
        parser.error(f"--seq {args.seq} must exceed --block-size {args.block_size}")
    if args.anchors is None:
        args.anchors = max(1, args.seq // args.block_size // 2)
    if args.fail_drafter is not None and not 0 <= args.fail_drafter < args.drafters:
        parser.error(f"--fail-drafter {args.fail_drafter} is not in 0..{args.drafters - 1}")
    if args.race and args.uncompiled:
        parser.error("--race needs the compiled path (drop --uncompiled)")
    if args.cpu_threads is None:
        cpu_drafters = sum(d == "cpu" for d in args.devices) or 1
        args.cpu_threads = max(1, (os.cpu_count() or 1) // cpu_drafters)
    return args


# -------------------------------------------------------------------------- the run


def summarize(status: str, runs: list[DrafterRun], started: float) -> None:
    states = [r.state for r in runs]
    ok = sum(s.status == "ok" for s in states)
    failed = sum(s.status == "failed" for s in states)
    stalled = sum(s.status == "running" for s in states)
    total = sum(s.tok_s() for s in states)
    log(f"summary status={status} drafters={len(states)} ok={ok} failed={failed} "
        f"total_tok_s={total:.0f} stalled={stalled} seconds={time.monotonic() - started:.1f}")


def hard_exit(code: int) -> None:
    """Leave even if threads are stuck inside a compile (they cannot be joined)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.max_seconds if args.max_seconds else math.inf
    torch.set_num_threads(args.cpu_threads)
    log(f"start drafters={args.drafters} devices={','.join(args.devices)} "
        f"torch={torch.__version__} pid={os.getpid()} dtype={args.dtype} batch={args.batch} "
        f"seq={args.seq} d_model={args.d_model} layers={args.layers} heads={args.heads} "
        f"block={args.block_size} anchors={args.anchors} steps={args.steps} "
        f"compiled={int(not args.uncompiled)} race={int(args.race)} "
        f"backward_in_thread={int(args.backward_in_thread)} "
        f"compile_per_thread={int(args.compile_per_thread)} "
        f"cpu_threads={args.cpu_threads}")

    race = None
    if args.race:
        hold = args.max_seconds or 600.0
        race = RaceHelper(args.drafters, hold_seconds=hold)
        race.start()
    faults = Faults(args, race)
    runs = [DrafterRun(i, dev, args, faults) for i, dev in enumerate(args.devices)]
    # daemon: a thread stuck in a compile or a lock must not keep the process alive
    threads = [threading.Thread(target=r.run, name=f"drafter-{r.index}", daemon=True)
               for r in runs]
    for t in threads:
        t.start()

    while any(t.is_alive() for t in threads):
        if time.monotonic() >= deadline:
            summarize("timeout", runs, started)
            hard_exit(EXIT_TIMEOUT)
        for t in threads:
            t.join(timeout=0.2)

    failed = any(r.state.status != "ok" for r in runs)
    # The helper closes its trace once the drafters are past their first call; wait for
    # it, since a daemon thread still inside torch at interpreter exit can abort the
    # process ("terminate called without an active exception").
    grace = max(1.0, min(30.0, deadline - time.monotonic()))
    helper_done = race is None or race.join(timeout=grace)
    summarize("failed" if failed else "ok", runs, started)
    code = EXIT_FAILED if failed else EXIT_OK
    if not helper_done:
        hard_exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
