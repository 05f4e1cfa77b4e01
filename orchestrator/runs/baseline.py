"""Which earlier run a run is compared with: one of the same shape.

Throughput only compares between runs that did the same work on the same devices: a
3-drafter run is not a regression of a 2-drafter run, nor a run on one GPU of a run on three.
A run's shape is
  - its targets,
  - its worker count (the drafters the monitor expected, else the `drafters` variable),
  - its device layout (CUDA_VISIBLE_DEVICES each launch got),
  - the variables that change throughput: SHAPE_VARS when the playbook has them, plus the
    names a playbook lists in its own `shape_vars` variable (e.g. [extra_args] where the
    trainer's flags change the speed).
The baseline is the pinned run when its shape matches, else the newest ok run of the same
playbook and shape; the choice comes with a sentence saying which run and why, or why none.
A part of the shape the new run does not know (it never launched: no devices, no workers) is
left out of the match, so a run that failed early is still compared (its verdict regressed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from orchestrator.ground.errors import OrchError
from orchestrator.runs.model import RunRecord
from orchestrator.runs.store import RunStore

OK_RUNS_READ = 1800     # enough for 90 nights (the change points' history) of 20 repeats each
SHAPE_VARS = ("drafters", "devices", "gpus", "batch", "seq", "d_model", "layers", "heads", "dtype")


@dataclass
class BaselineChoice:
    record: Optional[RunRecord]
    reason: str


def run_shape(record: RunRecord) -> dict:
    variables = record.vars or {}
    extra = variables.get("shape_vars")
    names = list(SHAPE_VARS) + [n for n in (extra if isinstance(extra, list) else [])
                                if isinstance(n, str) and n not in SHAPE_VARS]
    launches = record.launches()
    devices = {name: str(info.get("cuda_visible_devices")) for name, info in sorted(launches.items())
               if info.get("cuda_visible_devices") is not None}
    return {"targets": sorted(t.name for t in record.targets) or sorted(launches),
            "workers": worker_count(record),
            "devices": devices,
            "vars": {name: variables[name] for name in names if name in variables}}


def worker_count(record: RunRecord) -> Optional[int]:
    monitors = record.monitors()
    if monitors:
        counts = [m.worker_count() for m in monitors.values()]
        if any(counts):
            return sum(c for c in counts if c)
    drafters = (record.vars or {}).get("drafters")
    return drafters if isinstance(drafters, int) and not isinstance(drafters, bool) else None


def differences(base: dict, new: dict) -> list[str]:
    """What differs between two shapes, as short phrases; parts the new run lacks are skipped."""
    found = []
    for key in ("targets", "workers", "devices"):
        if new[key] in (None, {}, []):
            continue
        if base[key] != new[key]:
            found.append(f"{key} {_show(base[key])}, this run {_show(new[key])}")
    for name in sorted(set(base["vars"]) | set(new["vars"])):
        if base["vars"].get(name) != new["vars"].get(name):
            found.append(f"{name} {_show(base['vars'].get(name))}, this run {_show(new['vars'].get(name))}")
    return found


def describe(shape: dict) -> str:
    parts = [f"targets {_show(shape['targets'])}"]
    if shape["workers"] is not None:
        parts.append(f"{shape['workers']} workers")
    if shape["devices"]:
        parts.append("devices " + ", ".join(f"{t}={d}" for t, d in shape["devices"].items()))
    if shape["vars"]:
        parts.append(", ".join(f"{k}={_show(v)}" for k, v in shape["vars"].items()))
    return "; ".join(parts)


def choose_baseline(store: RunStore, record: RunRecord) -> BaselineChoice:
    """The run RECORD is compared with, and why (see the module docstring)."""
    shape = run_shape(record)
    skipped = []
    pinned = store.pinned(record.playbook)
    if pinned and pinned != record.run_id:
        candidate = store.get(pinned)
        differ = differences(run_shape(candidate), shape)
        if not differ:
            return BaselineChoice(candidate, f"the pinned run {pinned}, of the same shape "
                                             f"({describe(shape)})")
        skipped.append(f"the pinned run {pinned} ({'; '.join(differ)})")
    for candidate in store.ok_runs(record.playbook, exclude=record.run_id):
        if candidate.run_id == pinned:
            continue
        differ = differences(run_shape(candidate), shape)
        if not differ:
            why = f"the last ok run of the same shape ({describe(shape)})"
            if skipped:
                why += "; not " + ", not ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else "")
            return BaselineChoice(store.get(candidate.run_id), why)
        skipped.append(f"{candidate.run_id} ({'; '.join(differ)})")
    if not skipped:
        return BaselineChoice(None, "this playbook has no earlier ok run and none is pinned")
    return BaselineChoice(None, f"no earlier ok run has this run's shape ({describe(shape)}): "
                                + ", ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else ""))


def _show(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "{}"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value) if value else "[]"
    return value if isinstance(value, str) else json.dumps(value)


def night_of(record: RunRecord) -> str:
    """The night a run belongs to: the first run of its `orch nightly --repeat N` (recorded in
    its summary by orch nightly), else the run itself."""
    night = (record.summary or {}).get("nightly")
    return str(night.get("night") or record.run_id) if isinstance(night, dict) else record.run_id


def newest_night(store: RunStore, playbook: str, *, until: Optional[RunRecord] = None,
                 repeats: int = 20) -> list[RunRecord]:
    """The runs (with their series, oldest first) of PLAYBOOK's newest night, or of the
    night UNTIL belongs to: at most REPEATS runs. OrchError when PLAYBOOK has no run."""
    newest = [until] if until else store.list(playbook, last=1)
    if not newest:
        raise OrchError(f"no run of {playbook} in the run store",
                        hint="`orch runs list` shows the recorded runs")
    key = night_of(newest[0])
    runs = [run for run in store.list(newest[0].playbook, last=repeats * 4)
            if night_of(run) == key and run.started_at <= newest[0].started_at]
    return [store.get(run.run_id) for run in runs[:repeats]][::-1]


def same_shape_nights(store: RunStore, records: list[RunRecord], last: int) -> list[list[RunRecord]]:
    """The newest LAST nights of the same playbook and shape before tonight's RECORDS (one
    run, or a night's repeats), newest first, each its ok runs oldest first, with their
    metric series: the window runs/noise.py measures a metric's noise in. The pin is not
    consulted: noise is measured over what the runs did, not over one chosen run."""
    tonight = records[0]
    shape = run_shape(tonight)
    own = {record.run_id for record in records}
    nights: dict[str, list[RunRecord]] = {}
    for candidate in store.ok_runs(tonight.playbook, exclude=tonight.run_id, last=OK_RUNS_READ):
        key = night_of(candidate)
        if key not in nights and len(nights) >= last:
            break
        if (candidate.run_id not in own and candidate.started_at <= tonight.started_at
                and not differences(run_shape(candidate), shape)):
            nights.setdefault(key, []).insert(0, store.get(candidate.run_id))
    return list(nights.values())
