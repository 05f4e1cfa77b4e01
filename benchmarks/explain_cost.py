"""What `orch explain` costs on a 64 MB log, against the manual way, side by side in one run.

Three 64 MB logs, made from the corpus's real output (tests/fixtures/explain_corpus):
- `training`: a long run's lines (a torchrun rank's step lines and its tqdm redraws) and, at its
  end, the real failure of the corpus's ddp-raise case (rank 1's RuntimeError, rank 0's lost
  peer, torchrun's table);
- `tracebacks`: a log that is tracebacks from end to end (a library that logs one per step);
- `one line`: 64 MB without a newline (a progress bar that never ends its line).

Rows, each the median of N runs (whole processes, as a user pays them):
- manual: `tail -c 16M LOG | grep -n -A40 'Traceback (most recent call last)'`, the way one
  looks for the error by hand (explain also reads a log's last 16 MB);
- orch explain: `orch explain --log LOG -t dev` on a local target with the torch 2.13 venv,
  wall time and peak memory (its process and the payload's).
Then the monitor's side: the classifier now parses tracebacks from every line it is fed
(for the run's verdict); its cost per MB of the `training` log, with and without that parser.

    .venv/bin/python benchmarks/explain_cost.py [-n 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.timing import print_table  # noqa: E402
from orchestrator.watch import tracebacks  # noqa: E402
from orchestrator.watch.classify import LogClassifier  # noqa: E402
from tests.support.torchenv import torch_venv  # noqa: E402

SIZE = 64 << 20
CASE = REPO / "tests" / "fixtures" / "explain_corpus" / "ddp-raise"


def failure_text() -> str:
    """The ddp-raise case's output as one log: rank 0's and rank 1's stderr, torchrun's words."""
    ranks = sorted(CASE.glob("ranks/**/stderr.log"))
    return "".join(p.read_text() for p in ranks) + (CASE / "output.log").read_text()


def make_logs(folder: Path) -> dict[str, Path]:
    step = "".join(f"Train - Step {i} [{i}/100000?], Loss: 2.{i % 9999:04d}, Acc: 0.4567\n"
                   f"Training Epoch 0:  {i % 100}%|##        | {i}/100000 [00:{i % 60:02d}<04:50, 3.01it/s, "
                   f"loss=2.1, acc=0.41]\r" for i in range(1, 2001))
    tail = failure_text()
    logs = {"training": step, "tracebacks": tail, "one line": "#" * (1 << 20)}
    paths = {}
    for name, chunk in logs.items():
        path = folder / (name.replace(" ", "-") + ".log")
        with open(path, "w") as out:
            written = 0
            while written < SIZE - len(tail):
                out.write(chunk)
                written += len(chunk)
            if name != "one line":
                out.write(tail)
        paths[name] = path
    return paths


def timed(argv: list[str], env: dict) -> tuple[float, float, int]:
    """(seconds, peak MB of the process or the largest of the children it waited for, exit code)."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - started, usage.ru_maxrss / 1024, process.returncode


def median(rows: list[tuple]) -> tuple:
    return (statistics.median(r[0] for r in rows), max(r[1] for r in rows), rows[-1][2])


def classifier_cost(path: Path, with_tracebacks: bool) -> float:
    """Seconds to feed the log's lines to a classifier (as the monitor does), per MB."""
    text = path.read_text()
    lines = text.replace("\r", "\n").splitlines()
    classifier = LogClassifier("dev")
    if not with_tracebacks:
        classifier._traceback_parser = lambda source, worker: _Nothing()
    started = time.perf_counter()
    for line in lines:
        classifier.feed(line, 0.0)
    return (time.perf_counter() - started) / (len(text) / (1 << 20))


class _Nothing:
    """A traceback parser that reads nothing: the classifier as it was before it read them."""

    def feed_line(self, text: str) -> None:
        return None

    def finish(self):
        return tracebacks.ParseResult([])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=5)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="explain-cost-"))
    try:
        logs = make_logs(folder)
        inventory = folder / "inventory.yaml"
        inventory.write_text(f"hosts:\n  here: {{transport: local}}\ncontainers:\n"
                             f"  dev: {{host: here, venv: '{torch_venv()}'}}\ndefault_target: dev\n")
        env = {**os.environ, "ORCH_DATA_DIR": str(folder / "data"), "ORCH_AGENT_DIR": str(folder / "agent")}
        rows = []
        for name, path in logs.items():
            manual = ["sh", "-c", f"tail -c 16M '{path}' | grep -n -A40 'Traceback (most recent call last)'"]
            explain = [sys.executable, "-m", "orchestrator", "--no-agent", "-i", str(inventory),
                       "explain", "--log", str(path), "-t", "dev"]
            for way, argv in (("manual: `tail -c 16M LOG \\| grep -n -A40 Traceback`", manual), ("orch explain --log", explain)):
                seconds, peak, code = median([timed(argv, env) for _ in range(args.n)])
                rows.append([name, way, f"{seconds:.2f} s", f"{peak:.0f} MB", code])
        print(f"{SIZE >> 20} MB logs, medians of {args.n} runs:\n")
        print_table(["log", "way", "median", "peak memory", "exit"], rows, 2)
        training = logs["training"]
        plain, parsed = classifier_cost(training, False), classifier_cost(training, True)
        print(f"\nthe monitor's classifier on the training log: {plain * 1000:.0f} ms per MB without the "
              f"traceback parser, {parsed * 1000:.0f} ms per MB with it ({parsed / plain:.2f} x)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
