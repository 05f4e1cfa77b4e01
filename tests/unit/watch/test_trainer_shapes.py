"""The training loops people run, as `format: auto` reads them: nanoGPT, torchtitan,
Megatron-LM, DeepSpeed, Lightning's progress bar and hand-written loops.

Each writer below makes its lines the way upstream's own format string does (the line is
cited; the commits read are in docs/design/trainer-logs.md), with the logger prefixes,
torchrun's `[rankN]:` / `[defaultN]:` and the colours they come with. The run's true
numbers are kept beside, and what orch reads is compared with them.
"""

from __future__ import annotations

import pytest

from orchestrator.watch.logformats import LogParser, make_format, parse_text
from tests.trainer.real.shape_writers import (deepspeed_log, lightning_log, losses, megatron_line,
                                              nanogpt_log, torchtitan_log)

def stored(points):
    return [p for p in points if not p.progress]


def read(text: str, **options):
    fmt = make_format("auto", **options)
    return fmt, stored(parse_text(text, fmt))


# ------------------------------------------------------------------------- nanoGPT
def test_nanogpt_iterations_and_evals():
    fmt, points = read(nanogpt_log())
    assert fmt.describe() == "auto: nanogpt"
    last = points[-1]
    assert (last.step, last.loss) == (40, round(losses(40)[40], 4))
    assert last.tok_s == pytest.approx(491520 / 0.290, rel=1e-4) and last.derived
    assert last.metrics == {"time_ms": 290.0, "mfu_pct": 35.12}
    assert "mfu_pct" not in points[1].metrics                  # -100.00% is nanoGPT's "not yet"
    evals = [p for p in points if "val_loss" in p.metrics]
    assert [(p.step, p.loss) for p in evals] == [(0, None), (20, None), (40, None)]
    assert [p.step for p in points if "val_loss" not in p.metrics] == list(range(41))


# ----------------------------------------------------------------------- torchtitan
def test_torchtitan_metric_line_in_colour_behind_its_logger_and_torchrun():
    loss = losses(30)
    fmt, points = read(torchtitan_log(30))
    assert fmt.describe() == "auto: torchtitan"
    train = [p for p in points if p.loss is not None]
    assert [p.step for p in train] == list(range(1, 31))
    last = train[-1]
    assert (last.step, last.loss, last.tok_s) == (30, round(loss[30], 5), 12375)
    assert last.rate_from == "torchtitan's tps (tokens/s per device)" and not last.derived
    assert last.metrics == {"grad_norm": 1.2345, "memory_gib": 12.35, "tflops": 1234.57, "mfu_pct": 3.95}
    assert "mfu_pct" not in train[0].metrics                        # `mfu: N/A`
    validation = [p for p in points if "validation_loss" in p.metrics]
    assert [(p.step, p.tok_s, p.metrics["validation_loss"]) for p in validation][-1] == (30, None,
                                                                                          round(loss[30] + 0.2, 4))
    assert last.at is not None


# ------------------------------------------------------------------------ Megatron
def test_megatron_training_log_with_samples_per_second_and_seq_length():
    loss = losses(100)
    text = "".join(megatron_line(i, 100, loss[i], 850.0) + "\n" for i in range(10, 101, 10))
    fmt, points = read(text)
    assert fmt.describe() == "auto: megatron"
    last = points[-1]
    assert (last.step, last.total) == (100, 100)
    assert last.loss == pytest.approx(loss[100], rel=1e-6)
    assert last.metrics["samples_per_second"] == pytest.approx(64 / 0.85, rel=1e-4)
    assert last.metrics["mtp_1_loss"] == pytest.approx(loss[100] + 0.3, rel=1e-6)
    assert last.metrics["grad_norm"] == 0.812 and last.metrics["loss_scale"] == 1.0
    assert last.metrics["elapsed_time_per_iteration_ms"] == 850.0
    from orchestrator.watch.logformats import DerivedThroughput
    filled = DerivedThroughput(None, tokens_per_sample=4096).fill(last, 0.0)
    assert filled.tok_s == pytest.approx(64 * 4096 / 0.85, rel=1e-4) and filled.derived


# ----------------------------------------------------------------------- DeepSpeed
def test_deepspeed_steps_and_the_reporting_ranks_throughput_with_the_loops_loss():
    text, truth = deepspeed_log(steps=20, every=5, ranks=2)
    fmt, points = read(text)
    assert fmt.describe() == "auto: deepspeed"
    rates = [(p.step, p.metrics["samples_per_second"]) for p in points if "samples_per_second" in p.metrics]
    assert rates == [(step, pytest.approx(rate)) for step, rate in truth]   # rank 0's only: each is the job's
    assert {p.worker for p in points} == {0}
    last = points[-1]
    assert (last.step, last.loss) == (20, round(losses(20)[20], 4))
    lr = [p for p in points if "lr" in p.metrics]
    assert [p.step for p in lr] == [0, 5, 10, 15, 20] and lr[-1].metrics["skipped"] == 0


# ----------------------------------------------------------------------- Lightning
def test_lightning_bar_steps_carry_across_epochs_and_take_the_last_draw():
    text, truth = lightning_log(epochs=3, batches=7)
    fmt, points = read(text)
    assert fmt.describe() == "auto: lightning"
    last_per_step = {}
    for point in points:
        last_per_step[point.step] = (point.step, point.loss)
    assert list(last_per_step.values()) == truth
    assert points[-1].step == 21 and points[-1].metrics["val_loss"] == 0.811
    assert points[-1].metrics["epoch"] == 2 and points[-1].metrics["it_s"] == 4.3


def test_a_bar_without_lightnings_marks_stays_progress():
    text = "".join(f"\rEpoch 0: {i * 10:3.0f}%|#   | {i}/10 [00:01<00:01, 3.00it/s]" for i in range(11)) + "\n"
    fmt, points = read(text)
    assert fmt.describe() == "auto" and points == []


# ----------------------------------------------------------------- hand-written loops
LOOP_SHAPES = {
    # the line as a loop writes it -> (step, loss, tok/s, a metric it keeps)
    "step 10/60 loss=1.2024": (10, 1.2024, None, None),
    "Step 10/60 | loss 1.2024 | lr 3.0e-04 | tok/s 12,345": (10, 1.2024, 12345, ("lr", 3e-4)),
    "iter 10: loss 1.2024, lr: 0.0003, 812.5 tokens/s": (10, 1.2024, 812.5, ("lr", 3e-4)),
    "iteration 10, train_loss: 1.2024, samples/s: 31.5": (10, 1.2024, None, ("samples_per_second", 31.5)),
    "[epoch 2] global_step 10 avg loss 1.2024 time 81ms": (10, 1.2024, None, ("time_ms", 81.0)),
    "it 10 loss=1.2024 grad_norm=0.5 tps=9,876": (10, 1.2024, 9876, ("grad_norm", 0.5)),
    "step 3/20 loss=2.1234 tok/s 1,234.5": (3, 2.1234, 1234.5, None),
    "2026-08-22 12:00:01,250 INFO train: step 10 | loss 1.2024 | mfu 41.5%": (10, 1.2024, None, ("mfu_pct", 41.5)),
}


@pytest.mark.parametrize("line", LOOP_SHAPES)
def test_hand_written_loop_lines(line):
    step, loss, tok_s, metric = LOOP_SHAPES[line]
    fmt, points = read(f"loading data\n{line}\n")
    assert fmt.describe() == "auto: loop", line
    [point] = points
    assert (point.step, point.tok_s) == (step, tok_s)
    assert point.loss == loss
    if metric:
        assert point.metrics[metric[0]] == pytest.approx(metric[1])
    if tok_s:
        assert point.rate_from in ("tok/s", "tokens/s", "tps")


@pytest.mark.parametrize("line", [
    "step 3 of 5: downloading shards",           # a step word, no loss or rate
    "Saving checkpoint at step 100",
    "it took 10 s to load; loss functions: 3",   # `it` followed by a word
    "steps=100 loss_scale=65536",
    "epoch 3 loss=1.2",                          # no step word
])
def test_near_misses_are_not_loop_lines(line):
    fmt, points = read(line + "\n")
    assert (fmt.describe(), points) == ("auto", []), line


def test_a_step_never_goes_back_within_a_worker():
    text = ("step 10 loss=2.0\nstep 20 loss=1.5\nretrying the download (step 3 loss=9)\n"
            "step 20 loss=1.4\nstep 30 loss=1.0\n")
    fmt = make_format("auto")
    parser = LogParser(fmt)
    lines, points = parser.feed(text)
    assert [(p.step, p.loss) for p in points] == [(10, 2.0), (20, 1.5), (20, 1.4), (30, 1.0)]
    assert fmt.picked.backwards == 1 and len(lines) == 5       # the line itself is kept


def test_the_two_node_ddp_line_of_the_issue():
    text = "".join(f"[default0]:step {s}/60 loss={2.0 - s / 60:.4f}\n" for s in range(10, 61, 10))
    fmt, points = read(text)
    assert fmt.describe() == "auto: loop"
    assert [(p.step, p.total) for p in points][-1] == (60, 60) and points[-1].loss == 1.0


# -------------------------------------------------- Hugging Face dicts: no step invented
def hf_dicts(logs: int, runtime: str, steps_per_second: str, evals: bool = False) -> str:
    """transformers 5.24 PrinterCallback (disable_tqdm=True): `print(logs)` with every float
    as `f"{v:.4g}"`; the closing summary from speed_metrics (num_steps_trained)."""
    out = []
    for k in range(1, logs + 1):
        out.append(str({"loss": f"{4.0 / k:.4g}", "grad_norm": f"{0.96051:.4g}",
                        "learning_rate": f"{5e-5 * (1 - k / logs):.4g}", "epoch": f"{k * 0.25:.4g}"}))
        if evals and k % 2 == 0:
            out.append(str({"eval_loss": f"{4.2 / k:.4g}", "eval_runtime": "0.1234",
                            "eval_samples_per_second": "518.6", "epoch": f"{k * 0.25:.4g}"}))
    out.append(str({"train_runtime": runtime, "train_samples_per_second": "38.7",
                     "train_steps_per_second": steps_per_second, "train_loss": "2.1", "epoch": "1.5"}))
    return "\n".join(out) + "\n"


def test_hf_dicts_without_a_bar_are_points_until_their_spacing_is_known():
    fmt, points = read(hf_dicts(6, runtime="3.1", steps_per_second="9.677", evals=True))
    assert all(p.counted for p in points)
    assert [p.step for p in points if p.loss is not None] == [1, 2, 3, 4, 5, 6]
    assert [p.step for p in points if "eval_loss" in p.metrics] == [2, 4, 6]   # not counted
    assert "log points, no step numbers printed" in fmt.describe()
    # 30 steps trained (9.677 x 3.1) over 6 logs: logging_steps 5, nothing else fits
    assert fmt.picked.spacing() == (5, "train_steps_per_second x train_runtime")


@pytest.mark.parametrize("logs,runtime,rate,spacing", [
    (6, "3.1", "9.677", 5),            # 30 steps
    (6, "3.305", "9.682", 5),          # 32 steps: 6 logs at 5..30, then 2 more
    (1, "3.1", "9.677", None),         # one log in 30 steps: 16 to 30 all fit
    (10, "1.2e+04", "8.333", None),    # 100,000 +- 6 steps: 9,091..10,000 between logs
    (100, "1.2e+04", "0.08333", 10),   # 1000 +- 0.7: 10 (9.90..10.0 excluded 11)
])
def test_hf_spacing_from_the_closing_summary(logs, runtime, rate, spacing):
    fmt, _ = read(hf_dicts(logs, runtime=runtime, steps_per_second=rate))
    found = fmt.picked.spacing()
    assert (found[0] if found else None) == spacing


def test_hf_dicts_with_logging_steps_given_are_steps():
    fmt, points = read(hf_dicts(6, runtime="3.1", steps_per_second="9.677"), logging_steps=5)
    assert [p.step for p in points] == [5, 10, 15, 20, 25, 30, 30] and not any(p.counted for p in points)
