"""A torch tree of the issue's frame shape (compile_lock imported under another name) and
its stacks, for the wait-graph tests."""

from __future__ import annotations

import os
import textwrap


# ------------------------------------------------------------------ issue 39's shape
def _padded(lines_at: dict[int, str], head: list[str]) -> str:
    """A module whose given lines stand at the given line numbers (torch 2.11's)."""
    lines = list(head)
    for number in sorted(lines_at):
        lines += ["# (torch's code)"] * (number - 1 - len(lines))
        lines.append(lines_at[number])
    return "\n".join(lines) + "\n"


def fake_torch(root) -> str:
    """torch/_dynamo/convert_frame.py and torch/_inductor/compile_fx.py with the lines issue
    39 quotes at the lines it names: compile_lock = threading.RLock() (line 205 in 2.13), the
    `with compile_lock, _disable_current_modes():` of convert_frame.py:2314 and the
    function-level import of compile_fx.py before its `with compile_lock:` at 2418."""
    for package in ("torch", "torch/_dynamo", "torch/_inductor", "torch/autograd"):
        os.makedirs(os.path.join(root, package), exist_ok=True)
        open(os.path.join(root, package, "__init__.py"), "w").close()
    head = ["import threading", "from contextlib import contextmanager", "",
            "@contextmanager", "def _disable_current_modes():", "    yield"]
    with open(os.path.join(root, "torch/_dynamo/convert_frame.py"), "w") as handle:
        handle.write(_padded({205: "compile_lock = threading.RLock()",
                              2310: "class ConvertFrameAssert:",
                              2311: "    def __call__(self, frame):",
                              2314: "        with compile_lock, _disable_current_modes():",
                              2315: "            return _compile(frame)"}, head))
    with open(os.path.join(root, "torch/_inductor/compile_fx.py"), "w") as handle:
        handle.write(_padded({2410: "def fw_compiler_freezing(gm):",
                              2411: "    from torch._dynamo.convert_frame import compile_lock",
                              2418: "    with compile_lock:",
                              2419: "        return gm"}, ["import threading"]))
    return str(root)


def issue_stacks(root: str) -> str:
    site = root
    return textwrap.dedent(f'''\
        Traceback for thread 4101 (python3) [] (most recent call last):
            (Python) File "/run/train.py", line 40, in drafter
                compiled(q, k, v, block_mask=mask).sum().backward()
            (Python) File "{site}/torch/_dynamo/convert_frame.py", line 2315, in __call__
                return _compile(frame)
            (Python) File "{site}/torch/autograd/__init__.py", line 496, in grad
                result = _engine_run_backward(
            (Python) File "{site}/torch/autograd/graph.py", line 869, in _engine_run_backward
                return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass

        Traceback for thread 4102 (python3) [] (most recent call last):
            (Python) File "/run/train.py", line 40, in drafter
                compiled(q, k, v, block_mask=mask).sum().backward()
            (Python) File "{site}/torch/_dynamo/convert_frame.py", line 2314, in __call__
                with compile_lock, _disable_current_modes():

        Traceback for thread 4107 (pt_autograd_0) [] (most recent call last):
            (Python) File "{site}/torch/_inductor/compile_fx.py", line 2418, in fw_compiler_freezing
                with compile_lock:

        Traceback for thread 4100 (python3) [] (most recent call last):
            (Python) File "/run/train.py", line 60, in <module>
                worker.join(max(0.0, deadline - time.monotonic()))
        ''')
