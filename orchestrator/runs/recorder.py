"""The run recorder: owns one run's RunRecord, the RunStore it is saved to, and the lock
around both (targets run side by side, each in its own thread).

The record is written progressively (begin, each step, metric batches, launch info, then
finish), so a killed controller leaves a record with verdict "running" and everything
`orch attach RUN` needs to pick the run up again. Without a store (a dry run, the replay of a
finished run) the recorder keeps everything in memory only.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Optional

from orchestrator.runs.model import (LAUNCH_MONITOR, LAUNCH_MONITOR_STEP, LAUNCH_TARGETS, MONITOR, MONITORS,
                                     Finding, MetricPoint, MonitorSummary, RunRecord, StepResult, TargetInfo,
                                     now_iso)

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.remote.container import Target
    from orchestrator.runs.store import RunStore


# Names whose values are secrets (API keys, tokens, passwords): never recorded or shown.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|CRED|AUTH", re.IGNORECASE)


def masked(value: Any) -> Any:
    """Vars as recorded: values under secret-looking names (…KEY, TOKEN, PASSWORD) hidden."""
    if isinstance(value, dict):
        return {k: "***" if SECRET_NAME.search(str(k)) and not isinstance(v, (dict, list)) else masked(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def json_safe(value: Any, depth: int = 0) -> Any:
    """Rendered vars and step data as plain JSON values (the store and --json need them)."""
    if depth > 20:
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def trimmed(data: dict, limit: int = 20000) -> dict:
    """Step data for the record: long strings cut (the full output is in the collected files)."""
    def cut(value):
        if isinstance(value, str) and len(value) > limit:
            return value[:limit] + f"... [{len(value) - limit} more characters]"
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        if isinstance(value, list):
            return [cut(v) for v in value[:500]]
        return value
    return cut(dict(data or {}))


def stamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def step_result(spec, target: str, outcome, started_at: str, duration: Optional[float] = None,
                name: Optional[str] = None) -> StepResult:
    """A step's outcome (a StepOutcome of the step a StepSpec names) as the record keeps it,
    long outputs cut."""
    return StepResult(name=name or spec.label(), kind=spec.kind, target=target,
                      status=outcome.status, started_at=started_at,
                      duration_s=0.0 if duration is None else round(duration, 3),
                      message=outcome.message, data=json_safe(trimmed(outcome.data)))


def controller_entry(**extra) -> dict:
    """This process as the record's controller (`orch attach` and `orch stop` check it)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), **extra}


class RunRecorder:
    """Everything a run learns, kept in its record and (with a store) saved as it happens."""

    def __init__(self, run_id: str, store: Optional["RunStore"] = None):
        self.run_id = run_id
        self.store = store
        self.record: Optional[RunRecord] = None
        self._lock = threading.RLock()
        self._infos: dict[str, TargetInfo] = {}
        self._launches: dict[str, dict] = {}
        self._launch_starting: dict[str, tuple] = {}   # target -> (Target, run dir) once a launch begins
        self._monitor_results: dict[str, dict] = {}
        # Every monitor's summary, in order, per target: a playbook may launch and monitor
        # several runs on one target (the record's monitor() is the last one's).
        self._monitor_history: dict[str, list[dict]] = {}
        self._monitor_step: dict[str, int] = {}

    # ------------------------------------------------------------ begin and resume
    def begin(self, record: RunRecord) -> None:
        """A new run: its record is saved (verdict "running") before any step runs."""
        self._adopt(record)
        if self.store is not None:
            self.store.begin(record)

    def resume(self, record: RunRecord, launches: dict[str, dict],
               controller: Optional[dict] = None) -> None:
        """A recorded run followed again (`orch attach`): its launches as recorded; with a
        controller, the record now names this process as the one watching it."""
        self._adopt(record)
        with self._lock:
            self._launches = {name: dict(entry) for name, entry in launches.items()}
            if controller is not None:
                record.launch["controller"] = controller
        if controller is not None:
            self._update()

    def _adopt(self, record: RunRecord) -> None:
        with self._lock:
            self.record = record
            self._infos = {info.name: info for info in record.targets}

    # ----------------------------------------------------------------- targets
    def target_info(self, name: str) -> Optional[TargetInfo]:
        return self._infos.get(name)

    def save_targets(self) -> None:
        """A step changed a TargetInfo (torch version, fx-tls state, pip freeze): save it."""
        self._update()

    # ---------------------------------------------------------- launch and monitor
    def launch_info(self, target: str) -> Optional[dict]:
        return self._launches.get(target)

    def note_launch_starting(self, target: "Target", run_dir: str) -> None:
        with self._lock:
            self._launch_starting[target.name] = (target, run_dir)

    def launches_starting(self) -> dict[str, tuple]:
        """target name -> (Target, run dir) of every launch that began (maybe not finished)."""
        with self._lock:
            return dict(self._launch_starting)

    def note_launch(self, target: str, launch: dict) -> None:
        with self._lock:
            self._launches[target] = launch
            if self.record is not None:
                self.record.launch.setdefault(LAUNCH_TARGETS, {})[target] = json_safe(launch)
        self._update()

    def note_monitor(self, target: str, step_index: int, settings: dict) -> None:
        with self._lock:
            if self.record is not None:
                entry = self.record.launch.setdefault(LAUNCH_TARGETS, {}).setdefault(target, {})
                entry[LAUNCH_MONITOR] = json_safe(settings)
                entry[LAUNCH_MONITOR_STEP] = step_index
            self._monitor_step[target] = step_index
        self._update()

    def note_monitor_result(self, target: str, summary: dict) -> None:
        with self._lock:
            self._monitor_results[target] = summary
            history = self._monitor_history.setdefault(target, [])
            history.append({"step": self._monitor_step.get(target), **summary})
            if self.record is not None:
                self.record.summary = json_safe(self._monitor_summaries())
        self._update()

    def _monitor_summaries(self) -> dict:
        summary: dict = {MONITOR: dict(self._monitor_results)}
        if any(len(history) > 1 for history in self._monitor_history.values()):
            summary[MONITORS] = {target: list(history) for target, history in self._monitor_history.items()}
        return summary

    def monitor_result(self, target: str) -> Optional[dict]:
        return self._monitor_results.get(target)

    def note_artifacts(self, directory: str) -> None:
        with self._lock:
            if self.record is not None:
                self.record.artifacts_dir = directory
        self._update()

    # ------------------------------------------------------- steps, findings, metrics
    def save_step(self, result: StepResult) -> None:
        self._keep("steps", [result], lambda store: store.save_step(self.run_id, result))

    def add_findings(self, findings: list[Finding]) -> None:
        self._keep("findings", findings, lambda store: store.add_findings(self.run_id, findings))

    def add_metrics(self, points: list[MetricPoint]) -> None:
        self._keep("metrics", points, lambda store: store.add_metrics(self.run_id, points))

    def _keep(self, field: str, items: list, save) -> None:
        """Add items to the record's list `field` and, with a store, save them."""
        with self._lock:
            if self.record is not None:
                getattr(self.record, field).extend(items)
            if self.store is not None:
                save(self.store)

    # ------------------------------------------------------------------ the end
    def finish(self, verdict: str, exit_code: int, targets: dict[str, dict]) -> RunRecord:
        """The verdict, its exit code and the summary (targets: name -> verdict and failed step)."""
        record = self.record
        with self._lock:
            record.verdict = verdict
            record.exit_code = exit_code
            record.ended_at = now_iso()
            record.summary = self._summary(targets)
            if self.store is not None:
                self.store.finish(record)
        return record

    def _summary(self, targets: dict[str, dict]) -> dict:
        per_target = [MonitorSummary.from_dict(result) for result in self._monitor_results.values()]
        summary: dict = {"targets": targets}
        if per_target:
            summary.update(self._monitor_summaries())
            totals = [m.total_tok_s for m in per_target if m.total_tok_s]
            summary["total_tok_s"] = sum(totals) if totals else None
            if len(per_target) == 1:
                # the workers exactly as the monitor wrote them (the record keeps what it got)
                only, = self._monitor_results.values()
                summary["drafters"] = only.get("drafters", {})
                summary["drafters_ok"] = per_target[0].drafters_ok
        return json_safe(summary)

    def _update(self) -> None:
        if self.store is None or self.record is None:
            return
        with self._lock:
            self.store.update(self.record)
