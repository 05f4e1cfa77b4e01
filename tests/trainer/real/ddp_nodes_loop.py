"""A DDP training loop for one torchrun job over several nodes (gloo, CPU; torch only).

Started by torchrun on every node, it trains a small model under
torch.nn.parallel.DistributedDataParallel (each backward all-reduces the gradients across
every node's ranks) and logs like SpecForge's trainer, `Train - Step N [N/TOTAL?], Loss: L,
Acc: A`, which orch's monitor reads; with --line loop like a hand-written loop, `step N/TOTAL
loss=X tok/s T`, on every rank.

--pid-dir DIR: each rank writes DIR/rank<R>.pid (its global rank R, its pid), so a test can
kill one node's worker from outside. --nodes-file FILE: rank 0 writes what it learned of the
job (world size, SkyPilot's variables) for the test to check.
"""

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--log-interval", type=int, default=1)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--pid-dir", default="")
    parser.add_argument("--nodes-file", default="")
    parser.add_argument("--line", choices=("specforge", "loop"), default="specforge",
                        help="loop: a hand-written loop's `step N/TOTAL loss=X tok/s T`, every rank")
    parser.add_argument("--truth", default="", help="DIR: each rank writes rank<R>.json, (step, loss) logged")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.pid_dir:
        os.makedirs(args.pid_dir, exist_ok=True)
        with open(os.path.join(args.pid_dir, f"rank{rank}.pid"), "w") as out:
            out.write(str(os.getpid()))
    if args.nodes_file and rank == 0:
        with open(args.nodes_file, "w") as out:
            json.dump({"world_size": world, **{k: v for k, v in os.environ.items()
                                               if k.startswith("SKYPILOT_")}}, out)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(256, 32, generator=generator)
    labels = torch.randint(0, 8, (256,), generator=generator)
    print(f"rank {rank} of {world}: starting", flush=True)
    logged = []
    started = time.monotonic()
    for step in range(1, args.steps + 1):
        batch = torch.randint(0, 256, (16,), generator=generator)
        logits = model(inputs[batch])
        loss = torch.nn.functional.cross_entropy(logits, labels[batch])
        optimizer.zero_grad()
        loss.backward()                      # the gradients' all-reduce across every node
        optimizer.step()
        accuracy = (logits.argmax(-1) == labels[batch]).float().mean()
        time.sleep(args.step_seconds)
        if step % args.log_interval == 0 and args.line == "loop":
            tokens_per_s = 16 * 32 * step / (time.monotonic() - started)
            print(f"step {step}/{args.steps} loss={loss.item():.4f} tok/s {tokens_per_s:,.1f}", flush=True)
            logged.append((step, round(loss.item(), 4), round(tokens_per_s, 1)))
        elif step % args.log_interval == 0:
            print(f"Train - Step {step} [{step}/{args.steps}?], Loss: {loss.item():.4f}, "
                  f"Acc: {accuracy.item():.4f}", flush=True)
    if args.truth:
        os.makedirs(args.truth, exist_ok=True)
        with open(os.path.join(args.truth, f"rank{rank}.json"), "w") as out:
            json.dump(logged, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
