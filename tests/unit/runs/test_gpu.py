"""The monitor keeps every nvidia-smi sample as a series per GPU (not only the last one),
summarises the samples taken while the workers ran, and reports chart and tabulate them.

The launcher payload runs for real on this machine (local transport); nvidia-smi is a stand-in
on PATH that prints what the real one prints for
`--query-gpu=index,name,utilization.gpu,memory.used,memory.total,power.draw --format=csv,noheader,nounits`
(a value it cannot read is "[N/A]")."""

from __future__ import annotations

import os
import stat
import sys

from orchestrator.watch.monitor import Monitor, MonitorSettings, MonitorSink
from orchestrator.remote.payload_api import launcher
from orchestrator.watch.classify import EndState
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.runs import gpu
from orchestrator.runs.report import render_html, render_markdown
from orchestrator.runs.store import RunStore
from tests.fixtures.synthetic import synthetic_run

FAKE_SMI = """#!/bin/sh
# a counter so that each sample differs: utilisation 10, 20, 30, ...
n=$(cat "$0.count" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$0.count"
echo "0, NVIDIA H200, $((n * 10)), $((1000 * n)), 143771, $((100 + n)).50"
echo "1, NVIDIA H200, 0, 3, 143771, [N/A]"
"""


def test_the_monitor_keeps_a_series_while_the_run_goes(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    target = Target("here", LocalTransport("here"))
    run_dir = str(tmp_path / "run")
    launcher(target, "start", run_dir, argv=[sys.executable, "-c",
                                             "import time\nfor i in range(5):\n"
                                             "    print('drafter=0 step=%d loss=1 tok_s=5' % (i + 1), flush=True)\n"
                                             "    time.sleep(1)\n"])
    monitor = Monitor(target, run_dir, MonitorSettings(gpu_every=0.5, hang_after=60), MonitorSink())
    end, _ = monitor.run()
    assert end.state == "exited"
    summary = monitor.verdict(end, {}, cli="orch", playbook=None).summary
    series = summary["gpu_series"]
    assert len(series) >= 3, series                     # one sample a beat, not only the last
    utils = [s["gpus"][0]["utilization_pct"] for s in series]
    assert utils == sorted(utils) and len(set(utils)) == len(utils)
    assert series[0]["gpus"][0] == {"index": 0, "utilization_pct": 10.0, "memory_used_mib": 1000.0,
                                    "memory_total_mib": 143771.0, "power_w": 101.5}
    assert series[0]["gpus"][1]["power_w"] is None      # "[N/A]"
    assert [s["t"] for s in series] == sorted(s["t"] for s in series)
    stats = {row["index"]: row for row in summary["gpu_stats"]}
    running = [s for s in series if s["running"]]
    assert stats[0]["samples"] == len(running) and stats[0]["utilization_pct_peak"] == max(
        s["gpus"][0]["utilization_pct"] for s in running)
    assert stats[1]["power_w_mean"] is None and stats[1]["memory_total_mib"] == 143771.0


SERIES = [
    {"t": 0.0, "running": True, "gpus": [{"index": 0, "utilization_pct": 50.0, "memory_used_mib": 1000.0,
                                          "memory_total_mib": 143771.0, "power_w": 300.0}]},
    {"t": 5.0, "running": True, "gpus": [{"index": 0, "utilization_pct": 100.0, "memory_used_mib": 3000.0,
                                          "memory_total_mib": 143771.0, "power_w": 500.0}]},
    # after the workers ended: 0 %, and it must not pull the mean down
    {"t": 10.0, "running": False, "gpus": [{"index": 0, "utilization_pct": 0.0, "memory_used_mib": 0.0,
                                            "memory_total_mib": 143771.0, "power_w": 80.0}]},
]


def test_stats_count_only_the_samples_while_the_workers_ran():
    assert gpu.gpu_stats(SERIES) == [{
        "index": 0, "samples": 2, "utilization_pct_mean": 75.0, "utilization_pct_peak": 100.0,
        "memory_used_mib_mean": 2000.0, "memory_used_mib_peak": 3000.0, "power_w_mean": 400.0,
        "power_w_peak": 500.0, "memory_total_mib": 143771.0}]
    assert gpu.gpu_stats(SERIES[2:]) == []


def test_a_long_series_is_thinned_not_cut():
    series: list = []
    for i in range(gpu.MAX_SAMPLES + 1):
        gpu.append_sample(series, {"t": float(i), "running": True, "gpus": []})
    assert len(series) <= gpu.MAX_SAMPLES and series[0]["t"] == 0.0 and series[-1]["t"] >= gpu.MAX_SAMPLES - 1


def test_reports_chart_and_summarise_the_series():
    record = synthetic_run("20261130-010000-gpu000", playbook="dflash.yaml")
    stats = gpu.gpu_stats(SERIES)
    record.summary["monitor"] = {"dev": {"gpu_series": SERIES, "gpu_stats": stats}}
    html = render_html(record)
    assert "chart-gpu-util" in html and "chart-gpu-mem" in html and "chart-gpu-power" in html
    assert "GPU 0" in html
    md = render_markdown(record)
    assert "### GPUs while the workers ran" in md
    assert "| `dev` | 0 | 2 | 75 % / 100 % | 2,000 / 3,000 of 143,771 MiB | 400 / 500 W |" in md


def test_reports_without_gpu_samples_say_nothing_about_gpus():
    record = synthetic_run("20261130-010000-gpu001", playbook="dflash.yaml")
    assert "GPUs while the workers ran" not in render_markdown(record)
    assert "chart-gpu" not in render_html(record)


# How orch stored a run's GPU series before the payloads shared one GPU query: its rows named
# util_pct, mem_used_mib and mem_total_mib, and the stats beside them were named after those.
OLD_NAMES = (("utilization_pct", "util_pct"), ("memory_used_mib", "mem_used_mib"),
             ("memory_total_mib", "mem_total_mib"))


def with_old_names(row: dict) -> dict:
    renamed = {}
    for key, value in row.items():
        for new, old in OLD_NAMES:
            key = key.replace(new, old)
        renamed[key] = value
    return renamed


OLD_SERIES = [{**sample, "gpus": [with_old_names(row) for row in sample["gpus"]]} for sample in SERIES]
OLD_STATS = [with_old_names(row) for row in gpu.gpu_stats(SERIES)]


def test_a_record_stored_with_the_old_key_names_still_loads_and_renders(tmp_path):
    record = synthetic_run("20261130-010000-gpu002", playbook="dflash.yaml")
    record.summary["monitor"] = {"dev": {"gpu_series": OLD_SERIES, "gpu_stats": OLD_STATS}}
    with RunStore(str(tmp_path / "runs.sqlite")) as store:
        store.begin(record)
        store.finish(record)
    with RunStore(str(tmp_path / "runs.sqlite")) as store:   # a later orch reads it back
        loaded = store.get(record.run_id)
    series = gpu.series_by_target(loaded)["dev"]
    assert series[0]["gpus"][0]["util_pct"] == 50.0              # stored as it was
    assert gpu.gpu_stats(series) == gpu.gpu_stats(SERIES)      # read as if stored today
    md = render_markdown(loaded)
    assert "| `dev` | 0 | 2 | 75 % / 100 % | 2,000 / 3,000 of 143,771 MiB | 400 / 500 W |" in md
    html = render_html(loaded)
    assert "chart-gpu-util" in html and "chart-gpu-mem" in html and "chart-gpu-power" in html
