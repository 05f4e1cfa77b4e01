"""A small DDP training loop started by torchrun that logs like SpecForge's train_dflash.py.

Every rank logs `Train - Step N [N/TOTAL?], Loss: L, Acc: A` through Python logging (the
trainer's own format); rank 0 also shows a tqdm bar `Training Epoch 0` with the same postfix
the trainer sets. The ranks train locally and average their parameters every --sync-every
steps (one all_reduce), so a rank held back shows as a rank behind the others.

Fault switches for the tests:
  --sleep-rank R --sleep-at-step S --sleep-seconds T   rank R sleeps before the step-S collective
  --kill-rank R --kill-at-step S                         rank R sends itself SIGKILL at step S
--truth DIR writes each rank's logged (step, loss, acc) to DIR/rank<R>.json, the truth a log
parser's points are checked against.
"""

import argparse
import json
import datetime
import logging
import os
import signal
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

logger = logging.getLogger("specforge.utils")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--log-interval", type=int, default=1)
    parser.add_argument("--sync-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--collective-timeout", type=float, default=600)
    parser.add_argument("--sleep-rank", type=int, default=-1)
    parser.add_argument("--sleep-at-step", type=int, default=0)
    parser.add_argument("--sleep-seconds", type=float, default=0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-at-step", type=int, default=0)
    parser.add_argument("--truth", default="")
    args = parser.parse_args()

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        level=logging.INFO)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.collective_timeout))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs = torch.randn(256, 32)
    labels = torch.randint(0, 8, (256,))
    logger.info(f"rank {rank}: Starting training from epoch 0, step 0")
    truth = []

    steps = range(1, args.steps + 1)
    bar = tqdm(steps, desc="Training Epoch 0", leave=True) if rank == 0 else steps
    for step in bar:
        last = time.time()
        batch = torch.randint(0, 256, (16,))
        logits = model(inputs[batch])
        loss = torch.nn.functional.cross_entropy(logits, labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        accuracy = (logits.argmax(-1) == labels[batch]).float().mean()
        time.sleep(args.step_seconds)
        if rank == args.kill_rank and step == args.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == args.sleep_rank and step == args.sleep_at_step:
            time.sleep(args.sleep_seconds)
        if step % args.sync_every == 0:
            for parameter in model.parameters():
                dist.all_reduce(parameter.data)
                parameter.data /= dist.get_world_size()
        if step % args.log_interval == 0:
            logger.info(f"Train - Step {step} [{step}/{args.steps}?], "
                        f"Loss: {loss.item():.4f}, Acc: {accuracy.item():.4f}")
            truth.append([step, round(loss.item(), 4), round(accuracy.item(), 4)])
            if args.truth:
                with open(os.path.join(args.truth, f"rank{rank}.json"), "w") as out:
                    json.dump(truth, out)
        if rank == 0:
            bar.set_postfix({"loss": f"{loss.item():.4f}", "acc": f"{accuracy.item():.4f}",
                             "iter_time": f"{time.time() - last:.2f}s"})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
