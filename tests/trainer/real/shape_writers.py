"""Trainers' metric lines made the way upstream's own format strings make them (stdlib only,
so a container's python runs it). The unit tests (tests/unit/watch/test_trainer_shapes.py) read
what these functions return; `python shape_writers.py SHAPE STEPS` prints one shape's log
line by line, flushed, for a run under `orch run`. The upstream lines and the commits read
are cited at each function and in docs/design/trainer-logs.md.
"""

from __future__ import annotations

import math
import sys
import time
from datetime import datetime, timedelta

START = datetime(2026, 8, 22, 12, 0, 0)


def asctime(seconds: float) -> str:
    """Python logging's default asctime: `2026-08-22 12:00:01,250`."""
    moment = START + timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%d %H:%M:%S") + f",{moment.microsecond // 1000:03d}"


def losses(count: int) -> list[float]:
    return [round(4.0 * math.exp(-i / 25) + 0.5, 6) for i in range(count + 1)]


def nanogpt_log(max_iters: int = 40, eval_interval: int = 20, tokens_per_iter: int = 491520) -> str:
    """karpathy/nanoGPT train.py (3adf61e): `print(f"tokens per iteration will be:
    {tokens_per_iter:,}")`, every eval_interval `print(f"step {iter_num}: train loss
    {losses['train']:.4f}, val loss {losses['val']:.4f}")`, every iteration `print(f"iter
    {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")`, the
    mfu -100.00% until local_iter_num 5; iterations 0..max_iters."""
    out = [f"tokens per iteration will be: {tokens_per_iter:,}", "Initializing a new model from scratch",
           "number of parameters: 10.65M", "compiling the model... (takes a ~minute)"]
    loss = losses(max_iters)
    for it in range(max_iters + 1):
        if it % eval_interval == 0:
            out.append(f"step {it}: train loss {loss[it]:.4f}, val loss {loss[it] + 0.1:.4f}")
        mfu = -1.0 if it < 5 else 0.3512
        out.append(f"iter {it}: loss {loss[it]:.4f}, time {250.0 + it:.2f}ms, mfu {mfu * 100:.2f}%")
    return "\n".join(out) + "\n"


class Color:
    """torchtitan/tools/utils.py (b5bcd76) Color: the ANSI codes its metric line carries."""
    red, green, yellow, blue = "\033[31m", "\033[32m", "\033[33m", "\033[34m"
    magenta, cyan, reset = "\033[35m", "\033[36m", "\033[39m"
    orange, turquoise = "\033[38;2;180;60;0m", "\033[38;2;54;234;195m"


def titan_line(step: int, loss: float, tps: float, seconds: float, mfu=3.95) -> str:
    """torchtitan/components/metrics.py (b5bcd76) MetricsProcessor.log's logger.info, through
    tools/logging.py's `[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s` (the
    root logger), under torchrun `--role rank --tee 3` (run_train.sh): `[rank0]:`."""
    color = Color
    mfu_str = f"{mfu:.2f}%" if mfu is not None else "N/A"
    message = (f"{color.red}step: {step:2}  "
               f"{color.green}loss: {loss:8.5f}  "
               f"{color.orange}grad_norm: {1.2345:7.4f}  "
               f"{color.turquoise}memory: {12.3456:5.2f}GiB"
               f"({15.61:.2f}%)  "
               f"{color.blue}tps: {round(tps):,}  "
               f"{color.cyan}tflops: {1234.567:,.2f}  "
               f"{color.magenta}mfu: {mfu_str}{color.reset}")
    return f"[rank0]:[titan] {asctime(seconds)} - root - INFO - {message}"


def titan_validation(step: int, loss: float, seconds: float) -> str:
    color = Color
    message = (f"{color.yellow}validate step: {step:2}  "
               f"{color.green}loss: {loss:7.4f}  "
               f"{color.turquoise}memory: {12.3456:5.2f}GiB"
               f"({15.61:.2f}%)  "
               f"{color.blue}tps: {round(5432.1):,}{color.reset}")
    return f"[rank0]:[titan] {asctime(seconds)} - root - INFO - {message}"


def megatron_line(iteration: int, train_iters: int, loss: float, elapsed_ms: float, batch: int = 64) -> str:
    """NVIDIA/Megatron-LM megatron/training/training.py (d98e8a6) training_log's log_string,
    printed by print_rank_last (plain print), with --log-throughput."""
    log_string = f" [{(START + timedelta(seconds=iteration)).strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    log_string += ' iteration {:8d}/{:8d} |'.format(iteration, train_iters)
    log_string += ' consumed samples: {:12d} |'.format(iteration * batch)
    log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(elapsed_ms)
    log_string += f' throughput per GPU (TFLOP/s/GPU): {123.4:.1f} |'
    log_string += f' learning rate: {1.5e-4:.6E} |'
    log_string += f' global batch size: {batch:5d} |'
    for key, avg in (("lm loss", loss), ("mtp_1 loss", loss + 0.3)):
        log_string += ' {}: {:.6E} |'.format(key, avg)
    log_string += f' loss scale: {1.0:.1f} |'
    log_string += f' grad norm: {0.812:.3f} |'
    log_string += ' number of skipped iterations: {:3d} |'.format(0)
    log_string += ' number of nan iterations: {:3d} |'.format(0)
    return log_string


def deepspeed_prefix(seconds: float, where: str) -> str:
    """deepspeed/utils/logging.py (edaa722): `[%(asctime)s] [%(levelname)s]
    [%(filename)s:%(lineno)d:%(funcName)s] %(message)s`."""
    return f"[{asctime(seconds)}] [INFO] [{where}] "


def deepspeed_log(steps: int, every: int, ranks: int, batch: int = 32) -> tuple[str, list[tuple]]:
    """engine.py _report_progress: `log_dist(f"step={step}, skipped={self.skipped_steps},
    lr={lr}, mom={mom}", ranks=[0])` (`[Rank 0] ...`), at init with step 0, then every
    steps_per_print; timer.py ThroughputTimer.stop on every rank: `"epoch={}/micro_step={}/
    global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, MemAllocated={}GB,
    MaxMemAllocated={}GB"`; the loop prints its loss itself."""
    lines = [deepspeed_prefix(0, "logging.py:107:log_dist") + "[Rank 0] DeepSpeed Flops Profiler Enabled: False",
             deepspeed_prefix(0.1, "logging.py:107:log_dist") + f"[Rank 0] step=0, skipped=0, lr=[0.001], "
                                                                 f"mom=[(0.9, 0.999)]"]
    truth = []
    loss = losses(steps)
    for step in range(1, steps + 1):
        for rank in range(ranks):
            if step % every == 0:
                if rank == 0:
                    lines.append(f"[default0]:" + deepspeed_prefix(step, "logging.py:107:log_dist")
                                 + f"[Rank 0] step={step}, skipped=0, lr=[{0.001 * 0.99 ** step}], "
                                   f"mom=[(0.9, 0.999)]")
                rate = batch / (0.125 + rank * 0.001)
                lines.append(f"[default{rank}]:" + deepspeed_prefix(step, "timer.py:264:stop")
                             + "epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, "
                               "CurrSamplesPerSec={}, MemAllocated={}GB, MaxMemAllocated={}GB".format(
                                   0, step, step, 250.5, rate, 0.0, 0.0))
                if rank == 0:
                    truth.append((step, rate))
            if rank == 0:
                lines.append(f"[default0]:step {step} loss {loss[step]:.4f}")
    return "\n".join(lines) + "\n", truth


def lightning_bar(epoch: int, n: int, total: int, postfix: str, rate: float = 4.3) -> str:
    """lightning/pytorch/callbacks/progress/tqdm_progress.py (7f0c343) TQDMProgressBar:
    desc `Epoch {trainer.current_epoch}`, BAR_FORMAT `{l_bar}{bar}| {n_fmt}/{total_fmt}
    [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]`, tqdm's l_bar `{desc}:
    {percentage:3.0f}%|`, the postfix `, v_num=0, train_loss=0.123` (set_postfix)."""
    filled = int(10 * n / total)
    return (f"\rEpoch {epoch}: {100 * n / total:3.0f}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{total} "
            f"[00:0{epoch}<00:01, {rate:.2f}it/s{postfix}]")


def lightning_log(epochs: int, batches: int) -> tuple[str, list[tuple]]:
    """Each batch: _update_n (a redraw with the old postfix), then set_postfix (with the
    new); a validation bar after each epoch; `Trainer.fit` stopped at the end."""
    out = ["GPU available: False, used: False", "  | Name  | Type   | Params | Mode ",
           "Sanity Checking: |          | 0/? [00:00<?, ?it/s]"]
    truth, postfix, step = [], ", v_num=0", 0
    loss = losses(epochs * batches)
    for epoch in range(epochs):
        out.append(lightning_bar(epoch, 0, batches, postfix))
        for n in range(1, batches + 1):
            step += 1
            out.append(lightning_bar(epoch, n, batches, postfix))
            postfix = f", v_num=0, train_loss={loss[step]:.3f}"
            out.append(lightning_bar(epoch, n, batches, postfix))
            truth.append((step, round(loss[step], 3)))
        out.append(f"\n\rValidation DataLoader 0: 50%|#####     | 1/2 [00:00<00:00, 90.00it/s]"
                   f"\x1b[A")
        out.append(lightning_bar(epoch, batches, batches, postfix + ", val_loss=0.811"))
    out.append("\n`Trainer.fit` stopped: `max_epochs=3` reached.\n")
    return "".join(line if line.startswith(("\r", "\n")) else line + "\n" for line in out), truth


def torchtitan_log(steps: int) -> str:
    loss = losses(steps)
    lines = [f"[rank0]:[titan] {asctime(0)} - root - INFO - Starting job: Llama 3 debug training"]
    for step in range(1, steps + 1):
        lines.append(titan_line(step, loss[step], 12345.4 + step, step * 0.5, mfu=None if step == 1 else 3.95))
        if step % 10 == 0:
            lines.append(titan_validation(step, loss[step] + 0.2, step * 0.5 + 0.1))
    return "\n".join(lines) + "\n"


def megatron_log(steps: int) -> str:
    loss = losses(steps)
    return "".join(megatron_line(i, steps, loss[i], 850.0) + "\n" for i in range(10, steps + 1, 10))


WRITERS = {"nanogpt": lambda n: nanogpt_log(max_iters=n), "torchtitan": torchtitan_log,
           "megatron": megatron_log, "deepspeed": lambda n: deepspeed_log(n, every=5, ranks=1)[0],
           "lightning": lambda n: lightning_log(epochs=3, batches=n // 3)[0]}


def main() -> None:
    """Print SHAPE's log for STEPS steps, a piece at a time, as the trainer would (the
    arguments after STEPS are the trainer's own, e.g. Megatron's --seq-length, unread)."""
    shape, steps = sys.argv[1], int(sys.argv[2])
    for piece in WRITERS[shape](steps).splitlines(keepends=True):
        sys.stdout.write(piece)
        sys.stdout.flush()
        time.sleep(0.01)


if __name__ == "__main__":
    main()
