"""A tiny real torch loop that logs through SpecForge's tracker seam with
`tracking.report_to: tensorboard` (SpecForge a6b6b023: specforge/training/tracking.py
TrackerLogger and training_metric_names, specforge/tracker.py TensorboardTracker,
specforge/training/controller.py's perf/ keys, specforge/training/assembly.py _logger):

- the trainer's metrics get a `train/` prefix (eval ones keep `eval/`);
- the console logger prints them as `step N: {...}` (--print; else the run prints nothing
  orch can read);
- TensorboardTracker writes every int/float with torch.utils.tensorboard's SummaryWriter
  into OUTPUT_DIR/runs, at the optimizer step.

--truth FILE writes what was logged, [[step, {tag: value}], ...], the truth orch's points are
checked against.
"""

import argparse
import json
import os
import time

import torch
from torch.utils.tensorboard import SummaryWriter


def training_metric_names(metrics):
    return {key if key.startswith(("train/", "eval/")) else f"train/{key}": value
            for key, value in metrics.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--truth", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--log-interval", type=int, default=3)
    parser.add_argument("--eval-interval", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--print", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    writer = SummaryWriter(log_dir=os.path.join(args.output_dir, "runs"))
    logged = []

    def log(metrics, step):
        values = training_metric_names(metrics)
        if args.print:
            print(f"step {step}: {values}", flush=True)
        for key, value in values.items():
            if isinstance(value, (int, float)):
                writer.add_scalar(key, value, global_step=step)
        logged.append([step, values])

    started, samples = time.perf_counter(), 0
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 8)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        optimizer.step()
        samples += args.batch
        if step % args.log_interval == 0:
            elapsed = max(time.perf_counter() - started, 1e-9)
            log({"loss": float(loss), "grad_norm": float(grad_norm), "lr": 0.05,
                 "perf/global_samples_per_second": samples / elapsed}, step)
            started, samples = time.perf_counter(), 0
        if step % args.eval_interval == 0:
            log({"eval/avg_loss": float(loss) * 1.1}, step)
    writer.close()
    with open(args.truth, "w") as out:
        json.dump(logged, out)


if __name__ == "__main__":
    main()
