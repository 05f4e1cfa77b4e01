"""What the benchmarks share: timed repeats after a warm-up, medians and p95 in ms, and the
target a sandbox benchmark measures (-i INVENTORY -t TARGET)."""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import statistics
import sys
import time
import uuid

import orch_sandbox as sandboxes
from orchestrator.config.inventory import inventory_path
from orchestrator.targets.fleet import Fleet


def bytecode_as_installed() -> None:
    """Compile orch's modules to .pyc, as pip does when it installs the wheel: a checkout
    installed with -e writes them on first use, unless PYTHONDONTWRITEBYTECODE is set (it
    is on some machines, CI's included), and then every orch process of a benchmark would
    compile its modules again (a 3-byte `orch cp`: 0.42 s with them, 0.51 s without)."""
    package = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "orchestrator")
    compileall.compile_dir(package, quiet=1)


def samples_ms(call, count: int) -> list[float]:
    """call() once to warm up (connections, caches are not per-call costs), then count timed calls."""
    call()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def asamples_ms(call, count: int) -> list[float]:
    """samples_ms for a coroutine function."""
    await call()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(samples: list[float]) -> dict:
    """Median and p95 (the lower sample at 95 %) of samples in ms, and how many."""
    ordered = sorted(samples)
    return {"median_ms": statistics.median(ordered),
            "p95_ms": ordered[int(0.95 * (len(ordered) - 1))], "n": len(ordered)}


def latency_row(seconds: list[float]) -> dict:
    """Line latencies (s) as the monitor benchmarks print them: median, p95, max in ms."""
    return {"median_ms": statistics.median(seconds) * 1000,
            "p95_ms": percentile(seconds, 0.95) * 1000, "max_ms": max(seconds) * 1000}


def print_table(headers: list[str], rows: list[list], left: int) -> None:
    """A Markdown table: the first `left` columns (names) aligned left, the figures right."""
    print("| " + " | ".join(headers) + " |")
    print("| " + " | ".join("---" if i < left else "---:" for i in range(len(headers))) + " |")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def latency_cells(row: dict) -> list[str]:
    """A latency_row's median, p95 and max as table cells."""
    return [f"{row[key]:.0f} ms" for key in ("median_ms", "p95_ms", "max_ms")]


def healthy_bed():
    """The running sandbox; exits with what to do when it is not up and healthy."""
    if not sandboxes.status()["healthy"]:
        raise SystemExit("the sandbox is not up and healthy: `orch sandbox up` first")
    return sandboxes.current()


def orch_executable() -> str:
    """The `orch` of this python's venv: the checkout under test, not one elsewhere on PATH."""
    return os.path.join(os.path.dirname(sys.executable), "orch")


def agent_env(scratch: str) -> dict[str, str]:
    """The environment of a benchmark's orch commands: the warm agent on, its folder and
    orch's data folder (the direct rows' index of hosts, docs/design/transport.md) in scratch."""
    return {**os.environ, "ORCH_AGENT": "on", "ORCH_AGENT_DIR": os.path.join(scratch, "agent"),
            "ORCH_DATA_DIR": os.path.join(scratch, "data")}


def bench_dir() -> str:
    """A fresh run directory in the container for one measurement."""
    return f"/var/tmp/orch/bench/{uuid.uuid4().hex[:10]}"


def target_parser(doc: str, inventory: str = "sandbox") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("-i", "--inventory", default=inventory)
    parser.add_argument("-t", "--target", default="sb1-200")
    return parser


@contextlib.contextmanager
def opened_target(args: argparse.Namespace):
    """The fleet of -i and its target -t, closed at the end."""
    with Fleet.from_path(inventory_path(args.inventory)) as fleet:
        yield fleet, fleet.targets([args.target])[0]
