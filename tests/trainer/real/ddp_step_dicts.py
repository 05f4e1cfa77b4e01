"""A DDP loop started by torchrun that prints SpecForge's `specforge train` metric line,
`print(f"step {step}: {printable}", flush=True)` (printable: the metrics as floats), on
rank 0, with one all_reduce a step (gloo).

--abort-rank R --abort-at-step S: rank R prints the NCCL watchdog's timeout line (torch's own
wording) and calls os.abort() at step S, as the watchdog does after a collective timeout.
--truth FILE writes rank 0's printed (step, loss) pairs.
"""

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--abort-rank", type=int, default=-1)
    parser.add_argument("--abort-at-step", type=int, default=0)
    parser.add_argument("--truth", default="")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, labels = torch.randn(64, 16), torch.randint(0, 4, (64,))
    truth = []
    for step in range(1, args.steps + 1):
        if rank == args.abort_rank and step == args.abort_at_step:
            print(f"[rank{rank}]:[E ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
                  f"operation timeout: WorkNCCL(SeqNum={step}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                  "Timeout(ms)=600000) ran for 600010 milliseconds before timing out.", flush=True)
            os.abort()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        value = float(reduced) / dist.get_world_size()
        if rank == 0:
            printable = {"loss": value, "grad_norm": 1.0, "lr": 0.1}
            print(f"step {step}: {printable}", flush=True)
            truth.append((step, value))
        time.sleep(args.step_seconds)
    if args.truth and rank == 0:
        with open(args.truth, "w") as out:
            json.dump(truth, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
