"""The GPUs over a run: the monitor's nvidia-smi samples, kept as a series per target, and
what reports make of them (a chart per quantity, mean and peak while the workers ran).

A sample is {"t": seconds since the monitor started, "running": the trained process was
alive, "gpus": [{"index", "utilization_pct", "memory_used_mib", "memory_total_mib", "power_w"},
...]}, the key names of the payloads' GPU query (orchestrator/payloads/_gpus.py); the monitor
stores the series in the run's summary (each target's MonitorSummary.gpu_series). Records
stored by earlier orch versions named them util_pct, mem_used_mib and mem_total_mib: a series is
read with either names (gpu_row).
Only samples taken while the process ran count for the means and peaks: a sample after the
workers ended reads 0 % and says nothing about the run.
"""

from __future__ import annotations

from typing import Optional

from orchestrator.runs.model import RunRecord, RunState

MAX_SAMPLES = 2000        # a long run keeps every other sample once this many are kept

QUANTITIES = (("utilization_pct", "utilisation", "%"), ("memory_used_mib", "memory used", "MiB"),
              ("power_w", "power", "W"))
SAMPLE_KEYS = ("index", "utilization_pct", "memory_used_mib", "memory_total_mib", "power_w")
OLD_KEYS = {"util_pct": "utilization_pct", "mem_used_mib": "memory_used_mib",
            "mem_total_mib": "memory_total_mib"}


def gpu_row(row: dict) -> dict:
    """One GPU of a sample with today's key names, whichever names it was stored with."""
    renamed = {OLD_KEYS.get(key, key): value for key, value in row.items()}
    return {key: renamed.get(key) for key in SAMPLE_KEYS}


def gpu_sample(event: dict, elapsed_s: float) -> dict:
    """One monitor gpu event as a series sample."""
    rows = [gpu_row(row) for row in event.get("gpus") or [] if isinstance(row, dict)]
    return {"t": round(elapsed_s, 1), "running": event.get("state", RunState.RUNNING) == RunState.RUNNING,
            "gpus": rows}


def append_sample(series: list, sample: dict) -> list:
    """Add a sample, thinning the series to every other sample once it is full."""
    series.append(sample)
    if len(series) > MAX_SAMPLES:
        series[:] = series[::2]
    return series


def gpu_stats(series: list) -> list[dict]:
    """Per GPU, over the samples taken while the workers ran: sample count, mean and peak of
    utilisation, memory used and power (None where the board does not report it)."""
    per_gpu: dict[int, list[dict]] = {}
    for sample in series or []:
        if not sample.get("running"):
            continue
        for row in map(gpu_row, sample.get("gpus") or []):
            if row.get("index") is not None:
                per_gpu.setdefault(int(row["index"]), []).append(row)
    stats = []
    for index, rows in sorted(per_gpu.items()):
        entry: dict = {"index": index, "samples": len(rows)}
        for key, _, _ in QUANTITIES:
            values = [float(r[key]) for r in rows if r.get(key) is not None]
            entry[f"{key}_mean"] = round(sum(values) / len(values), 1) if values else None
            entry[f"{key}_peak"] = max(values) if values else None
        totals = [r["memory_total_mib"] for r in rows if r.get("memory_total_mib") is not None]
        entry["memory_total_mib"] = max(totals) if totals else None
        stats.append(entry)
    return stats


def series_by_target(record: Optional[RunRecord]) -> dict[str, list]:
    """target -> its GPU series, for the targets whose monitor kept one."""
    monitors = record.monitors() if record else {}
    return {name: list(m.gpu_series) for name, m in monitors.items() if m.gpu_series}


def chart_series(by_target: dict[str, list], key: str) -> dict[str, list[tuple[float, float]]]:
    """{"GPU 0" (or "TARGET GPU 0" for several targets): [(t, value), ...]} for one quantity."""
    lines: dict[str, list] = {}
    for target, series in by_target.items():
        for sample in series:
            for row in map(gpu_row, sample.get("gpus") or []):
                label = f"GPU {row.get('index')}" if len(by_target) == 1 else \
                    f"{target} GPU {row.get('index')}"
                lines.setdefault(label, []).append((sample.get("t"), row.get(key)))
    return lines
