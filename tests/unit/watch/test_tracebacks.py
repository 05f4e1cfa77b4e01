"""watch/tracebacks.py: every worker's traceback out of a log, grouped, bounded."""

from __future__ import annotations

import time

from orchestrator.watch import tracebacks

TB = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/lib/a.py", line 10, in outer
    inner()
  File "/venv/lib/python3.11/site-packages/lib/b.py", line 20, in inner
    raise KeyError('custom')
    ^^^^^^^^^^^^^^^^^^^^^^^^
KeyError: 'custom'
"""


def test_the_stand_in_trainers_error_lines_name_the_threads():
    log = "".join(f"drafter={n} ERROR KeyError: 'custom'\n{TB}" for n in (1, 0, 2))
    result = tracebacks.parse("start drafters=3\n" + log + "summary status=failed\n")
    assert [tb.worker for tb in result.tracebacks] == ["drafter-1", "drafter-0", "drafter-2"]
    first = result.tracebacks[0]
    assert (first.exception, first.message) == ("KeyError", "'custom'")
    assert [(f.file.rsplit("/", 1)[1], f.line, f.function) for f in first.frames] == \
        [("a.py", 10, "outer"), ("b.py", 20, "inner")]
    assert first.frames[1].code == "raise KeyError('custom')"   # the caret line is not code
    [group] = tracebacks.group(result.tracebacks)
    assert (group.workers, group.count) == (["drafter-1", "drafter-0", "drafter-2"], 3)


def test_interleaved_rank_prefixes_are_kept_apart():
    lines = [f"[rank{r}]:{line}" for line in TB.splitlines() for r in (0, 1)]
    result = tracebacks.parse("\n".join(lines) + "\n")
    assert sorted(tb.worker for tb in result.tracebacks) == ["rank 0", "rank 1"]
    assert all(len(tb.frames) == 2 and tb.exception == "KeyError" for tb in result.tracebacks)
    assert len(tracebacks.group(result.tracebacks)) == 1


def test_a_header_glued_to_another_writers_line():
    log = "step=3 loss=1.0drafter=4 ERROR KeyError: 'custom'" + TB.replace(
        "Traceback (most recent call last):\n", "Traceback (most recent call last):", 1)
    [tb] = tracebacks.parse(log).tracebacks
    assert tb.worker == "drafter-4" and tb.frames[0].function == "outer"


def test_a_frame_glued_after_other_text():
    log = TB.replace('  File "/venv/lib/python3.11/site-packages/lib/b.py"',
                     'noise from another thread  File "/venv/lib/python3.11/site-packages/lib/b.py"')
    [tb] = tracebacks.parse(log).tracebacks
    assert [f.function for f in tb.frames] == ["outer", "inner"]


def test_pythons_thread_header_and_chained_exceptions():
    log = ("Exception in thread compile-2 (worker):\n" + TB +
           "\nDuring handling of the above exception, another exception occurred:\n\n" +
           TB.replace("KeyError: 'custom'", "RuntimeError: while handling"))
    [tb] = tracebacks.parse(log).tracebacks
    assert (tb.worker, tb.exception, tb.message) == ("compile-2", "RuntimeError", "while handling")
    assert [c.exception for c in tb.causes] == ["KeyError"]


# The end of what torch 2.13 prints when a compile backend raises (a real run's text): the
# exception line ends in "raised:" and the error that matters is on the next line.
BACKEND_FAILED = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/__init__.py", line 2568, in __call__
    return self.compiler_fn(model_, inputs_, **self.kwargs)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/root/train.py", line 3, in bad_backend
    raise RuntimeError("Detected that you are using FX to symbolically trace a dynamo-optimized function.")
torch._dynamo.exc.BackendCompilerFailed: backend='bad_backend' raised:
RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function.

Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if you're reporting a bug to PyTorch). For even more developer context, set TORCH_LOGS="+dynamo"

step=4 loss=0.5
"""


def test_a_message_announced_by_a_colon_goes_on_to_the_blank_line():
    for log in (BACKEND_FAILED,
                "".join(f"[rank{r}]:{line}\n" for line in BACKEND_FAILED.splitlines()
                        for r in (0, 1))):
        result = tracebacks.parse(log)
        assert {tb.message for tb in result.tracebacks} == {
            "backend='bad_backend' raised:\nRuntimeError: Detected that you are using FX to "
            "symbolically trace a dynamo-optimized function."}
        assert {tb.exception for tb in result.tracebacks} == {"torch._dynamo.exc.BackendCompilerFailed"}
    # a message without the colon stays one line: the trainer's next line is not part of it
    [tb] = tracebacks.parse(TB + "step=4 loss=0.5\n").tracebacks
    assert tb.message == "'custom'"
    # and the message is bounded, however long the announced part runs
    [tb] = tracebacks.parse(BACKEND_FAILED.replace("\n\nSet", "\n" + "more\n" * 500 + "\nSet")).tracebacks
    assert tb.message.count("\n") <= tracebacks.MAX_MESSAGE_LINES


def test_frozen_and_dotted_exceptions():
    log = ('Traceback (most recent call last):\n  File "<frozen importlib._bootstrap>", line 1, in _load\n'
           "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised\n")
    [tb] = tracebacks.parse(log).tracebacks
    assert tb.frames[0].file == "<frozen importlib._bootstrap>"
    assert tb.exception == "torch._dynamo.exc.BackendCompilerFailed"


def test_a_log_cut_inside_a_traceback_keeps_its_frames():
    [tb] = tracebacks.parse(TB.split("KeyError")[0]).tracebacks
    assert tb.exception == "(log ended)" and len(tb.frames) == 2


def test_bounded_frames_and_tracebacks():
    deep = "Traceback (most recent call last):\n" + "".join(
        f'  File "/x/m{i}.py", line {i}, in f{i}\n    f()\n' for i in range(1000)) + "RecursionError: deep\n"
    [tb] = tracebacks.parse(deep).tracebacks
    assert len(tb.frames) == tracebacks.MAX_FRAMES and tb.dropped_frames == 1000 - tracebacks.MAX_FRAMES
    assert tb.frames[-1].function == "f999"           # the innermost frames are the ones kept
    many = tracebacks.parse(TB * (tracebacks.MAX_TRACEBACKS + 10))
    assert len(many.tracebacks) == tracebacks.MAX_TRACEBACKS and many.dropped == 10


def test_hostile_lines_parse_in_linear_time():
    """Untrusted text: a long line of near-matches costs about as much as its length."""
    hostile = ('File "' + "a" * 5000 + '", line ' + "9" * 50) * 200
    words = ("Traceback (most recent call last):\n" + "x." * 200_000 + "\n")
    started = time.perf_counter()
    tracebacks.parse(hostile + "\n" + words + "  File \"" * 100_000 + "\n")
    assert time.perf_counter() - started < 5.0
