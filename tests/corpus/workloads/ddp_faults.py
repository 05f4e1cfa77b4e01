"""A DDP training loop (gloo, CPU) started by torchrun, with one fault switched on: the
multi-rank cases of the explain corpus (tests/corpus/make_explain_corpus.py).

Each rank trains a small model under DistributedDataParallel (every backward all-reduces
the gradients, so a rank that stops leaves the others waiting in a collective) and prints
`Train - Step N [N/TOTAL?], Loss: L` lines.

  --fault raise       rank --fault-rank raises RuntimeError at step --fault-step
  --fault keyerror    ... looks up a missing key of its config dict (KeyError)
  --fault kill        ... sends itself SIGKILL (what the host's OOM killer does)
  --fault hang        ... sleeps --hang-seconds before its next step (the others time out)
  --fault none        trains to the end
  --record            main() under torch.distributed.elastic's @record: the failing rank
                      writes its traceback to torchrun's error file
"""

import argparse
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=20, help="the process group's collective timeout")
    parser.add_argument("--fault", choices=("none", "raise", "keyerror", "kill", "hang"), default="none")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=30)
    parser.add_argument("--hang-seconds", type=float, default=3600)
    parser.add_argument("--record", action="store_true")
    return parser.parse_args()


def inject(args, rank: int, step: int, config: dict) -> None:
    if rank != args.fault_rank or step != args.fault_step:
        return
    if args.fault == "raise":
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")
    if args.fault == "keyerror":
        config["scheduler"]["warmup_steps"]
    if args.fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if args.fault == "hang":
        time.sleep(args.hang_seconds)


def train(args) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    config = {"optimizer": {"lr": 0.05}}
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["optimizer"]["lr"])
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(256, 32, generator=generator)
    labels = torch.randint(0, 8, (256,), generator=generator)
    print(f"rank {rank} of {world}: starting", flush=True)
    for step in range(1, args.steps + 1):
        inject(args, rank, step, config)
        batch = torch.randint(0, 256, (16,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()                  # the gradients' all-reduce across the ranks
        optimizer.step()
        time.sleep(args.step_seconds)
        print(f"Train - Step {step} [{step}/{args.steps}?], Loss: {loss.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    args = parse_args()
    (record(train) if args.record else train)(args)


if __name__ == "__main__":
    main()
