"""A real `torchrun --nproc-per-node 2` (gloo, torch 2.13 CPU) launched and watched the way a
playbook's torchrun launch does it (orch's argv, one log per rank, the real monitor), running
a loop that prints SpecForge's `step N: {...}` lines (tests/trainer/real/ddp_step_dicts.py).

- a clean end: rank 0's points equal what it printed; both ranks end "done", not "running";
- a rank that prints the NCCL watchdog's timeout line and calls os.abort(): torchrun reports
  exitcode -6 (SIGABRT), and the verdict is a collective timeout, not a kill from outside.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.watch.monitor import Monitor, MonitorSettings, MonitorSink, stream_copy_path
from orchestrator.remote.payload_api import launcher
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.watch.torchrun import RANK_LOGS, build_argv

pytestmark = pytest.mark.torch
LOOP = Path(__file__).resolve().parent / "real" / "ddp_step_dicts.py"


class Sink(MonitorSink):
    def __init__(self):
        self.points = []

    def metrics(self, target, points):
        self.points.extend(points)


def watch(torch_python, tmp_path, port: int, *args: str):
    target = Target("here", LocalTransport("here"))
    run_dir = tmp_path / "run"
    argv = build_argv({"nproc_per_node": 2, "master_port": port},
                      [str(torch_python), str(LOOP), *args], str(run_dir))
    launcher(target, "start", str(run_dir), argv=argv)
    sink = Sink()
    settings = MonitorSettings(follow=list(RANK_LOGS), worker_word="rank", gpu_every=0, hang_after=120)
    monitor = Monitor(target, str(run_dir), settings, sink, stream_copy=stream_copy_path(str(tmp_path / "local")))
    end, _ = monitor.run()
    return monitor.verdict(end, {}, cli="orch", playbook=None), sink


@pytest.mark.timeout(240)
def test_a_clean_two_rank_end_settles_every_rank(torch_python, tmp_path):
    truth = tmp_path / "truth.json"
    verdict, sink = watch(torch_python, tmp_path, 29671, "--steps", "8", "--truth", str(truth))
    assert verdict.verdict == "ok", verdict.message
    printed = [tuple(row) for row in json.loads(truth.read_text())]
    assert [(p.drafter, p.step, p.loss) for p in sink.points] == [(0, s, l) for s, l in printed]
    assert verdict.summary["format"] == "auto: specforge" and verdict.summary["workers"] == "rank"
    assert {r["status"] for r in verdict.summary["drafters"].values()} == {"done"}
    assert verdict.summary["drafters_ok"] == len(verdict.summary["drafters"])


@pytest.mark.timeout(240)
def test_os_abort_after_a_watchdog_timeout_line_is_a_collective_timeout(torch_python, tmp_path):
    verdict, _ = watch(torch_python, tmp_path, 29672, "--steps", "40", "--abort-rank", "1",
                       "--abort-at-step", "4")
    assert verdict.verdict == "collective-timeout", verdict.message
    rank = next(f for f in verdict.findings if f.signature == "rank-failed")
    assert "rank 1" in rank.message and "SIGABRT (signal 6)" in rank.message
    assert "outside the run" not in rank.remediation and "aborting itself" in rank.remediation
