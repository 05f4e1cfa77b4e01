"""Run with the torch venv's python: checks the trainer's attention against dense SDPA.

Prints one JSON object. Kept out of pytest's collection (no test_ prefix) because it
needs torch, which the project's own venv does not have.

usage: python attention_check.py PATH/TO/train_drafters.py
"""

import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
import train_drafters as td  # noqa: E402

torch.set_num_threads(1)  # as the TINY run's drafters: inductor keys its cache on it
# the shapes of the tests' TINY run, so the compiled kernel comes from the warm cache
B, H, S, BLOCK, N, DH = 2, 2, 64, 16, 2, 16
Q_LEN, KV_LEN = N * BLOCK, S + N * BLOCK

gen = torch.Generator().manual_seed(0)
anchors = td.sample_anchors(gen, B, S, N, BLOCK, "cpu")
mask_mod = td.dflash_mask_mod(anchors, S, BLOCK)
dense = td.dense_mask(mask_mod, B, Q_LEN, KV_LEN, "cpu")


def reference_allowed(b, q, kv):
    """The DFlash rule, spelled out with Python ints."""
    anchor = int(anchors[b, q // BLOCK])
    if kv < S:
        return kv < anchor
    return (kv - S) // BLOCK == q // BLOCK


mask_ok = all(
    bool(dense[b, 0, q, kv]) == reference_allowed(b, q, kv)
    for b in range(B) for q in range(Q_LEN) for kv in range(KV_LEN)
)

# q, k, v laid out as the drafter layer makes them (head-split views of its projections)
layer = td.DrafterLayer(H * DH, H)
q_proj = torch.randn(B, Q_LEN, H * DH, generator=gen, requires_grad=True)
kv_proj = torch.randn(B, KV_LEN, 2 * H * DH, generator=gen, requires_grad=True)
q = layer._split_heads(q_proj)
k, v = (layer._split_heads(t) for t in kv_proj.chunk(2, dim=-1))
grad_out = torch.randn(B, H, Q_LEN, DH, generator=gen)
ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)

block_mask = td.create_block_mask(mask_mod, B, None, Q_LEN, KV_LEN, "cpu")
step_mask = td.StepMask(block_mask=block_mask, mask_mod=mask_mod)
report = {"mask_ok": mask_ok}
for name, compiled in (("compiled", True), ("eager", False)):
    td._FLEX_FN = None  # rebuild the singleton for each mode
    out = td.masked_attention(q, k, v, step_mask, td.get_flex_attention(compiled))
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    report[name] = {
        "out_err": (out - ref).abs().max().item(),
        "grad_err": max((a - b).abs().max().item() for a, b in zip(grads, ref_grads)),
    }
print(json.dumps(report))
