"""The log formats: each real trainer's lines become the same metric points.

The fixed examples are lines real libraries printed (tqdm 4.70, transformers 5.24, torch
2.13's torchrun, a loop logging like SpecForge's train_dflash.py); the property tests feed
generated logs cut into arbitrary chunks, with progress redraws and several workers' lines
interleaved, and garbage.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from orchestrator.watch import logformats
from orchestrator.watch.logformats import (FORMATS, MAX_LINE, DerivedThroughput, LogParser, LogPoint, LogStream,
                                     find_bars, log_time, make_format, parse_text)

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def stored(points):
    return [(p.worker, p.step, p.loss, p.metrics) for p in points if not p.progress]


# ------------------------------------------------------------------------- tqdm bars
def test_tqdm_bar_fields():
    [bar] = find_bars("Training Epoch 0:  12%|#2        | 120/1000 [00:40<04:50, 3.01it/s, "
                      "loss=2.1, acc=0.41, iter_time=0.33s]")
    assert (bar.n, bar.total, bar.desc, bar.rate) == (120, 1000, "Training Epoch 0", 3.01)
    assert bar.postfix == {"loss": "2.1", "acc": "0.41", "iter_time": "0.33s"}


@pytest.mark.parametrize("text,n,total,rate", [
    ("  0%|          | 0/12 [00:00<?, ?it/s]", 0, 12, None),
    (" 33%|███▎      | 4/12 [00:00<00:02,  3.34it/s]", 4, 12, 3.34),
    ("120it [00:40,  3.01it/s]", 120, None, 3.01),
    ("Epoch 2: 50%|#####     | 5/10 [01:00<01:00, 12.00s/it, loss=1]", 5, 10, 1 / 12),
    ("tokens: 45%|####5     | 4.5k/10.0k [00:02<00:02, 1.9kB/s]", 4500, 10000, 1900),
])
def test_tqdm_shapes(text, n, total, rate):
    [bar] = find_bars(text)
    assert (bar.n, bar.total) == (n, total)
    assert bar.rate == pytest.approx(rate) if rate else bar.rate is None


def test_tqdm_format_makes_a_point_per_new_step_and_keeps_no_line():
    text = "".join(f"\rEpoch 1: {i * 10:3d}%|#   | {i}/10 [00:0{i}<00:05, 2.00it/s, loss={3 - i / 10}]"
                   for i in (0, 1, 1, 2, 3)) + "\n"
    parser = LogParser(make_format("tqdm"))
    lines, points = parser.feed(text)
    assert lines == []                       # redraws are progress, not lines to store
    assert [(p.step, p.loss, p.metrics["it_s"]) for p in points] == [
        (0, 3.0, 2.0), (1, 2.9, 2.0), (2, 2.8, 2.0), (3, 2.7, 2.0)]
    assert all(not p.progress and p.total == 10 for p in points)


# --------------------------------------------------------------------- each format
def test_specforge_lines_with_python_logging_and_a_glued_bar():
    text = ("2026-11-30 12:22:33,023 - INFO - specforge.utils - rank 0: Starting training\n"
            "\rTraining Epoch 0:  17%|█▋        | 2/12 [00:00<00:00, 18.88it/s, loss=2.1385, "
            "acc=0.0625, iter_time=0.05s]2026-11-30 12:22:33,235 - INFO - specforge.utils - "
            "Train - Step 4 [4/12?], Loss: 2.0083, Acc: 0.1875\n"
            "2026-11-30 12:22:40,000 - INFO - specforge.utils - Eval - Step 4 [4/12?], Loss: 2.5, Acc: 0.2\n")
    parser = LogParser(make_format("specforge"))
    lines, points = parser.feed(text)
    assert lines[1].startswith("2026-11-30 12:22:33,235 - INFO") and "Training Epoch" not in lines[1]
    progress = [p for p in points if p.progress]
    assert [(p.step, p.total, p.loss) for p in progress] == [(2, 12, 2.1385)]
    [train, evaluation] = [p for p in points if not p.progress]
    assert (train.step, train.loss, train.metrics, train.total) == (4, 2.0083, {"acc": 0.1875}, 12)
    assert train.at == pytest.approx(log_time("2026-11-30 12:22:33,235"))
    assert evaluation.loss is None and evaluation.metrics == {"eval_loss": 2.5, "eval_acc": 0.2}


def test_hf_trainer_dicts_take_the_step_of_the_bar_redrawn_after_them():
    # The Trainer's own output (stdout and stderr in one log): the dict is written with
    # tqdm.write, which clears the bar and redraws it at the logged step afterwards.
    text = ("\r  8%|▊         | 1/12 [00:00<00:03,  3.40it/s]\r 25%|██▌       | 3/12 [00:00<00:02,  3.34it/s]"
            "\r                                              \r"
            "{'loss': '5.388', 'grad_norm': '1.798', 'learning_rate': '3.75e-05', 'epoch': '0.25'}\n"
            "\r 33%|███▎      | 4/12 [00:00<00:02,  3.34it/s]\r100%|██████████| 12/12 [00:02<00:00,  5.82it/s]"
            "{'train_runtime': '2.062', 'train_samples_per_second': '23.28', "
            "'train_steps_per_second': '5.821', 'train_loss': '5.391', 'epoch': '0.75'}\n")
    points = stored(parse_text(text, make_format("hf-trainer")))
    assert points == [
        (0, 4, 5.388, {"grad_norm": 1.798, "learning_rate": 3.75e-05, "epoch": 0.25}),
        (0, 12, None, {"train_runtime": 2.062, "train_samples_per_second": 23.28,
                       "train_steps_per_second": 5.821, "train_loss": 5.391, "epoch": 0.75})]


def test_hf_trainer_unquoted_values_and_a_dict_at_the_end_of_the_log():
    text = "\r 50%|#####     | 5/10 [00:01<00:01, 5.0it/s]{'loss': 2.31, 'epoch': 0.5}\n"
    assert stored(parse_text(text, make_format("hf-trainer"))) == [(0, 5, 2.31, {"epoch": 0.5})]


def test_jsonl_and_regex_and_orch():
    jsonl = '{"step": 3, "loss": 1.5, "rank": 2, "tokens_per_second": 900, "lr": 0.1}\nnot json\n[1, 2]\n'
    assert [(p.worker, p.step, p.loss, p.tok_s, p.metrics) for p in parse_text(jsonl, make_format("jsonl"))] \
        == [(2, 3, 1.5, 900.0, {"lr": 0.1})]
    custom = make_format("regex", r"it (?P<step>\d+) rank (?P<rank>\d+) loss (?P<loss>\S+) gn (?P<gn>\S+)")
    assert stored(parse_text("it 7 rank 1 loss 0.5 gn 2\n", custom)) == [(1, 7, 0.5, {"gn": 2.0})]
    orch = parse_text("drafter=1 step=20 loss=3.21 tok_s=1234\ndrafter=1 done steps=20\n", make_format("orch"))
    assert [(p.worker, p.step, p.loss, p.tok_s) for p in orch] == [(1, 20, 3.21, 1234.0)]


def test_unknown_format_and_a_regex_without_step_are_refused():
    with pytest.raises(ValueError, match="unknown log format 'nope'"):
        make_format("nope")
    with pytest.raises(ValueError, match=r"\(\?P<step>"):
        make_format("regex", r"loss=(?P<loss>\S+)")
    with pytest.raises(ValueError, match="needs a metric_regex"):
        make_format("regex")


# ------------------------------------------------------------------- torchrun output
def test_torchrun_tee_prefixes_name_the_worker_even_mid_line():
    # Real `torchrun --nproc-per-node 2 --tee 3` output: torchrun glues one rank's bar and
    # the other rank's line together; `\r` redraws arrive as separate prefixed lines.
    text = (LOGS / "torchrun-tee.log").read_bytes().decode()
    points = parse_text(text, make_format("specforge"))
    steps = {w: [s for (worker, s, _, _) in stored(points) if worker == w] for w in (0, 1)}
    assert steps == {0: [4, 8, 12], 1: [4, 8, 12]}
    assert {p.worker for p in points if p.progress} == {0}     # only rank 0 has the bar
    assert max(p.step for p in points if p.progress) == 12


def test_stream_worker_prefix_split_across_chunks():
    stream = LogStream()
    segments = stream.feed("[defau") + stream.feed("lt1]:Train - Step 1 [1/2?], Loss: 1.0\n[rank0]:x\n")
    assert [(s.worker, s.text) for s in segments] == [(1, "Train - Step 1 [1/2?], Loss: 1.0"), (0, "x")]


def test_crlf_split_between_chunks_is_one_line_end():
    stream = LogStream()
    out = stream.feed("a\r") + stream.feed("\nb\r\n")
    assert [s.text for s in out] == ["a", "b"]


def test_a_runaway_line_keeps_its_first_max_line_characters_and_counts_the_rest():
    stream = LogStream()
    assert stream.feed("x" * 70000) == [] and stream.feed("tail") == []
    [segment] = stream.finish()
    assert segment.text == "x" * MAX_LINE and segment.dropped == 70004 - MAX_LINE
    assert stream.feed("next\n")[0].text == "next"


# ------------------------------------------------------------------ derived throughput
def test_derived_throughput_from_the_logs_own_times():
    derive = DerivedThroughput(tokens_per_step=4096)
    first = derive.fill(LogPoint(step=50, at=100.0), arrived=0)
    second = derive.fill(LogPoint(step=100, at=125.0), arrived=0)
    assert first.tok_s is None and not first.derived
    assert second.tok_s == 50 / 25 * 4096 and second.derived
    printed = derive.fill(LogPoint(step=150, at=150.0, tok_s=7.0), arrived=0)
    assert printed.tok_s == 7.0 and not printed.derived   # the trainer's own number wins


def test_derived_throughput_falls_back_to_arrival_time_and_is_per_worker():
    derive = DerivedThroughput(tokens_per_step=10)
    derive.fill(LogPoint(step=1, worker=0), arrived=10.0)
    derive.fill(LogPoint(step=1, worker=1), arrived=10.0)
    assert derive.fill(LogPoint(step=3, worker=1), arrived=12.0).tok_s == 10.0
    assert DerivedThroughput(None).fill(LogPoint(step=3), arrived=1).tok_s is None


# ------------------------------------------------------------------- property tests
def specforge_line(worker: int, step: int, loss: float) -> str:
    return (f"2026-11-30 12:00:{step % 60:02d},000 - INFO - specforge.utils - "
            f"Train - Step {step} [{step}/999?], Loss: {loss:.4f}, Acc: 0.5000")


def bar(step: int) -> str:
    return f"\rTraining Epoch 0:  {step % 100:2d}%|#   | {step}/999 [00:01<00:09, 9.00it/s, loss=1.0000]"


# each worker's steps in order: a step lower than the worker's last is not read as one
worker_logs = st.dictionaries(
    st.integers(0, 3),
    st.lists(st.tuples(st.integers(1, 10 ** 6), st.floats(0, 50, allow_nan=False)), min_size=1,
             max_size=6).map(sorted),
    min_size=1, max_size=4)


def cut(text: str, data) -> list[str]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def feed_in_pieces(parser: LogParser, pieces: list[str]) -> tuple[list, list]:
    """(lines, points) of the pieces fed one by one, then the end of the stream."""
    lines, points = [], []
    for piece in pieces:
        got_lines, got = parser.feed(piece)
        lines += got_lines
        points += got
    end_lines, end_points = parser.finish()
    return lines + end_lines, points + end_points


@settings(max_examples=150, deadline=None)
@given(logs=worker_logs, data=st.data())
def test_any_interleaving_of_redraws_partial_lines_and_workers_gives_the_same_points(logs, data):
    expected = {w: [(step, round(loss, 4)) for step, loss in lines] for w, lines in logs.items()}
    # Interleave the workers' lines in any order that keeps each worker's own order, each
    # line behind a torchrun prefix, with tqdm redraws (glued or on their own) anywhere.
    queues = {w: list(lines) for w, lines in logs.items()}
    text = ""
    while any(queues.values()):
        worker = data.draw(st.sampled_from(sorted(w for w, q in queues.items() if q)))
        step, loss = queues[worker].pop(0)
        redraws = "".join(bar(s) for s in data.draw(st.lists(st.integers(0, 999), max_size=3)))
        newline_after_bar = data.draw(st.booleans())
        text += f"[default{worker}]:{redraws}{chr(10) if newline_after_bar and redraws else ''}"
        text += f"[default{worker}]:{specforge_line(worker, step, loss)}\n"
    lines, points = feed_in_pieces(LogParser(make_format("specforge")), cut(text, data))
    got = {w: [(p.step, p.loss) for p in points if p.worker == w and not p.progress] for w in logs}
    assert got == expected
    assert not any("%|" in line for line in lines)       # no redraw stored as a line
    assert len(lines) == sum(len(v) for v in logs.values())


@settings(max_examples=100, deadline=None)
@given(text=st.lists(st.sampled_from(list("ab1.=:%|/[]{}'\"\r\n ,-?s") + [
    "it/s", "[default1]:", "{'loss': ", "Step 3 [3/4?]", " 5/9 [00:01<00:02, ", "\r\n"])).map("".join),
       data=st.data())
def test_chunking_never_changes_what_comes_out(text, data):
    for name in FORMATS:
        fmt_args = (r"(?P<step>\d+)",) if name == "regex" else ()
        whole = LogParser(make_format(name, *fmt_args))
        expected = [whole.feed(text), whole.finish()]
        lines, points = feed_in_pieces(LogParser(make_format(name, *fmt_args)), cut(text, data))
        assert lines == expected[0][0] + expected[1][0]
        assert points == expected[0][1] + expected[1][1]


@settings(max_examples=200, deadline=None)
@given(garbage=st.one_of(st.text(), st.binary().map(lambda b: b.decode("utf-8", "surrogateescape"))))
def test_garbage_never_crashes_any_format(garbage):
    for name in FORMATS:
        fmt = make_format(name, r"(?P<step>\d+)") if name == "regex" else make_format(name)
        for point in parse_text(garbage, fmt):
            assert isinstance(point.step, int) and isinstance(point.metrics, dict)


def test_lines_are_kept_as_written_blank_ones_too_but_not_blank_redraws():
    text = "Traceback (most recent call last):\n  File \"t.py\", line 1\n\n\r      \r\rloss 1\n"
    parser = LogParser(make_format("specforge"))
    lines = parser.feed(text)[0] + parser.finish()[0]
    assert lines == ["Traceback (most recent call last):", '  File "t.py", line 1', "", "loss 1"]


def test_a_bar_per_epoch_carries_its_steps_on_and_other_ranks_bars_are_not_steps():
    # SpecForge's old script: `Training Epoch N` restarts its count every epoch (3 steps each)
    epochs = "".join(f"\rTraining Epoch {e}: {n * 33}%|#  | {n}/3 [00:01<00:02, 1.00it/s, loss=1.0]"
                     for e in (0, 1) for n in (1, 2, 3))
    points = parse_text(epochs + "\n", make_format("tqdm"))
    assert [p.step for p in points] == [1, 2, 3, 4, 5, 6]
    # rank 1 tokenizing its dataset: output, not its steps
    dataset = "[default1]:\rMap: 45%|####5 | 4500/10000 [00:02<00:02, 1900.00 examples/s]\n"
    assert [p for p in parse_text(dataset, make_format("specforge")) if p.worker == 1] == []


def test_auto_detects_each_known_shape_and_says_which():
    shapes = {
        "drafter=1 step=20 loss=3.21 tok_s=1234\n": ("auto: orch", 20),
        "08/08/2026 17:44:20 - INFO - specforge.utils - Train - Step 50 [50/72000?], Loss: 6.1234, Acc: 0.1567\n":
            ("auto: specforge", 50),
        "step 50: {'train/loss': 2.12, 'train/acc': 0.45}\n": ("auto: specforge", 50),
        "{'loss': '2.31', 'grad_norm': '1.2', 'epoch': '0.5'}\n": ("auto: hf-trainer, no progress bar and no "
                                                                "logging_steps: log points, no step numbers "
                                                                "printed", 1),
        '{"step": 7, "loss": 1.5}\n': ("auto: jsonl", 7),
        "iter: 9, loss: 0.25, lr: 1e-4\n": ("auto: keyvalue", 9),
    }
    for text, (name, step) in shapes.items():
        fmt = make_format("auto")
        points = parse_text("loading the model\n" + text, fmt)
        assert (fmt.describe(), [p.step for p in points]) == (name, [step]), text
        assert points[0].loss is not None
    assert log_time("08/08/2026 17:44:20 - INFO - x") == log_time("2026-08-08 17:44:20,000 - INFO - x")


class _EpochLines(logformats.LogFormat):
    """A shape a test adds: `epoch-step N cost X` lines."""

    name = "epoch-step"
    shape = "epoch-step N cost X"

    def is_metric_line(self, line: str) -> bool:
        return line.startswith("epoch-step ")

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        if not self.is_metric_line(line):
            return []
        _, step, _, cost = line.split()
        return [LogPoint(step=int(step), worker=worker, loss=float(cost))]


def test_a_new_shape_is_one_class_listed_in_shapes(monkeypatch):
    """Adding a log format touches no parser but its own: listed in SHAPES, `format: auto`
    tries it and picks it, and make_format knows its name."""
    monkeypatch.setattr(logformats, "SHAPES", logformats.SHAPES + (_EpochLines,))
    log = "loading\nepoch-step 1 cost 2.5\nepoch-step 2 cost 2.0\n"
    auto = make_format("auto")
    points = parse_text(log, auto)
    assert [(p.step, p.loss) for p in points] == [(1, 2.5), (2, 2.0)]
    assert auto.describe() == "auto: epoch-step"
    assert [p.step for p in parse_text(log, make_format("epoch-step"))] == [1, 2]


def test_every_shape_has_a_name_a_shape_and_a_place_in_formats():
    names = [shape.name for shape in logformats.SHAPES]
    assert len(set(names)) == len(names) and all(shape.shape for shape in logformats.SHAPES)
    assert FORMATS == ("auto", "regex", *names)
    for name in FORMATS:
        assert make_format(name, metric_regex=r"step=(?P<step>\d+)" if name == "regex" else None)
