"""What a playbook run leaves behind: the record that the run store keeps and reports read.

The runner fills a RunRecord as it goes (steps, metrics, findings) and the store saves it
step by step, so a killed controller still leaves a readable, resumable record.

The monitor's part of a record is read through types, not dug out of dicts: each target's
monitor summary is a `MonitorSummary` (`RunRecord.monitor(target)`, `RunRecord.monitors()`),
its workers `WorkerSummary`s, and the launches `RunRecord.launches()`. The record on disk
keeps plain JSON, as before: these types read it (`from_dict`, tolerant of old records) and
give it back unchanged (`to_dict`). The keys of that JSON are named once, below.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

from orchestrator.ground.strenum import StrEnum
from orchestrator.ground.verdicts import RUNNING

# The verdicts, their order and exit codes: the verdict table, orchestrator/ground/verdicts.py.

# ------------------------------------------------------------------ the record's keys
# Where the monitor's part lives in a record: record.summary[MONITOR][TARGET] is a target's
# last monitor summary, record.summary[MONITORS][TARGET] every one of them in order (only
# when a target was monitored more than once); record.launch[LAUNCH_TARGETS][TARGET] is its
# launch, with the settings of the monitor that followed it under LAUNCH_MONITOR.
MONITOR = "monitor"
MONITORS = "monitors"
LAUNCH_TARGETS = "targets"
LAUNCH_MONITOR = "monitor"
LAUNCH_MONITOR_STEP = "monitor_step"


class RunState(StrEnum):
    """A launched process's state, as the launcher payload reports it (payloads/launcher.py,
    which imports nothing of orch's, spells the same words) and records keep it."""

    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"
    VANISHED = "vanished"      # no exit status and no process: its supervisor was killed too
    MISSING = "missing"        # no run folder
    UNKNOWN = "unknown"        # the final event did not say

    @classmethod
    def of(cls, text: Any) -> Any:
        """The state a payload named; one this orch does not know stays as it came."""
        try:
            return cls(text)
        except ValueError:
            return text


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    """Sortable by time and unique: 20261129-0915-3fa2c1."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


@dataclass
class StepResult:
    name: str
    kind: str
    target: str
    status: str                 # ok | changed | failed | skipped
    started_at: str = ""
    duration_s: float = 0.0
    message: str = ""
    data: dict = field(default_factory=dict)


@dataclass
class MetricPoint:
    target: str
    drafter: int                # the worker: a drafter thread, or a torchrun rank
    step: int
    loss: Optional[float] = None
    tok_s: Optional[float] = None
    elapsed_s: float = 0.0      # seconds since the launch
    extra: dict = field(default_factory=dict)   # the trainer's other numbers: acc, lr, grad_norm
    derived: bool = False       # tok_s computed by orch (steps/s x tokens_per_step), not printed


@dataclass
class Finding:
    target: str
    signature: str              # a verdict, or VERDICT:kind, or a note (ground/verdicts.py)
    message: str
    remediation: str = ""
    evidence: list[str] = field(default_factory=list)


@dataclass
class TargetInfo:
    name: str
    host: str
    vmid: Optional[int] = None
    torch_version: Optional[str] = None
    fx_tls_state: Optional[str] = None   # vulnerable | fixed-upstream | patched | drifted | unknown
    pip_freeze: list[str] = field(default_factory=list)
    # GPUs (model, driver, CUDA, clocks) and cgroup limits: the machine payload's result,
    # {} when no step read it (payloads/machine.py names the keys)
    machine: dict = field(default_factory=dict)


# ------------------------------------------------------------------ the monitor's summary
@dataclass(frozen=True)
class WorkerSummary:
    """One worker (a drafter thread, a torchrun rank) as the monitor's summary keeps it, under
    its number in `drafters`. The classifier writes it (watch/classify.py); comparisons read
    its tok_s."""

    step: Optional[int] = None         # its last step (None when steps were counted: log_points)
    loss: Optional[float] = None
    tok_s: Optional[float] = None
    status: Optional[str] = None       # the trainer's word for it: done, running, ...
    error: Optional[str] = None
    log_points: Optional[int] = None   # metric lines read, when the steps were counted, not printed

    def to_dict(self) -> dict[str, Any]:
        data = {"step": self.step, "loss": self.loss, "tok_s": self.tok_s, "status": self.status,
                "error": self.error}
        if self.log_points is not None:
            data["log_points"] = self.log_points
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "WorkerSummary":
        """Tolerant: a missing key is None, an unknown one ignored (no reader needs it)."""
        data = data if isinstance(data, Mapping) else {}
        return cls(**{name: data.get(name) for name in _WORKER_FIELDS})


_WORKER_FIELDS = tuple(f.name for f in dataclasses.fields(WorkerSummary))


@dataclass(frozen=True)
class MonitorSummary:
    """One target's monitor summary, as reports, comparisons and baselines read it.

    The monitor writes many more keys (exit code, signal, lines, format, warnings, GPU
    stats, ...: watch/classify.py's summary() and watch/monitor.py): only the ones orch reads
    back are fields; the rest stay in `extra`, so to_dict() gives the summary back as stored,
    in its order. A missing key reads as its default: records older than a key still load."""

    verdict: Optional[str] = None
    workers: Optional[str] = None                 # the run's word for a worker: rank, drafter, worker
    drafters: Mapping[str, WorkerSummary] = field(default_factory=dict)   # by worker number
    drafters_ok: Optional[int] = None
    drafters_expected: Optional[int] = None
    total_tok_s: Optional[float] = None
    gpu_series: tuple = ()                        # nvidia-smi samples (runs/gpu.py)
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    order: tuple = field(default=(), repr=False, compare=False)   # the stored keys' order

    def worker_count(self) -> int:
        """The workers it expected, else those it saw."""
        return self.drafters_expected or len(self.drafters)

    def to_dict(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in _MONITOR_FIELDS}
        values["drafters"] = {key: worker.to_dict() for key, worker in self.drafters.items()}
        values["gpu_series"] = list(self.gpu_series)
        stored = {name: values[name] for name in _MONITOR_FIELDS
                  if name in self.order or values[name] not in (None, {}, [])}
        stored.update(self.extra)
        ordered = {key: stored[key] for key in self.order if key in stored}
        return {**ordered, **stored}

    @classmethod
    def from_dict(cls, data: Mapping) -> "MonitorSummary":
        """Tolerant: missing keys read as defaults, a wrongly typed one too; unknown keys kept
        in `extra` (so to_dict() writes them back)."""
        data = data if isinstance(data, Mapping) else {}
        drafters = data.get("drafters")
        series = data.get("gpu_series")
        return cls(
            verdict=_text(data.get("verdict")), workers=_text(data.get("workers")),
            drafters={str(key): WorkerSummary.from_dict(value)
                      for key, value in (drafters.items() if isinstance(drafters, Mapping) else ())
                      if isinstance(value, Mapping)},
            drafters_ok=_count(data.get("drafters_ok")),
            drafters_expected=_count(data.get("drafters_expected")),
            total_tok_s=_rate(data.get("total_tok_s")),
            gpu_series=tuple(series) if isinstance(series, list) else (),
            extra={key: value for key, value in data.items() if key not in _MONITOR_FIELDS},
            order=tuple(data))


_MONITOR_FIELDS = tuple(f.name for f in dataclasses.fields(MonitorSummary) if f.name not in ("extra", "order"))


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _count(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rate(value: Any) -> Optional[float]:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def recorded_monitor_settings(launch: Mapping) -> dict:
    """The settings of the monitor that followed a launch, as its record keeps them ({} if
    none did): `orch attach` follows it again with them."""
    settings = launch.get(LAUNCH_MONITOR) if isinstance(launch, Mapping) else None
    return dict(settings) if isinstance(settings, Mapping) else {}


@dataclass
class RunRecord:
    run_id: str
    playbook: str
    playbook_sha256: str
    name: str
    vars: dict = field(default_factory=dict)
    targets: list[TargetInfo] = field(default_factory=list)
    started_at: str = field(default_factory=now_iso)
    ended_at: Optional[str] = None
    verdict: str = RUNNING
    exit_code: Optional[int] = None
    steps: list[StepResult] = field(default_factory=list)
    metrics: list[MetricPoint] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    summary: dict = field(default_factory=dict)   # total_tok_s, per-drafter tok_s, ...
    artifacts_dir: Optional[str] = None
    launch: dict = field(default_factory=dict)    # where the detached run lives (for attach/stop)

    # ------------------------------------------------------- the monitor's part, typed
    def monitors(self) -> dict[str, MonitorSummary]:
        """target -> its (last) monitor's summary, in the order they were recorded."""
        found = (self.summary or {}).get(MONITOR)
        if not isinstance(found, Mapping):
            return {}
        return {name: MonitorSummary.from_dict(entry) for name, entry in found.items()
                if isinstance(entry, Mapping)}

    def monitor(self, target: str) -> Optional[MonitorSummary]:
        """TARGET's (last) monitor summary; None when no monitor on it finished."""
        return self.monitors().get(target)

    def launches(self) -> dict[str, dict]:
        """target -> its launch as recorded (where the detached run lives, how it was started,
        the settings of its monitor); the launches a record names, in their order."""
        found = (self.launch or {}).get(LAUNCH_TARGETS)
        if not isinstance(found, Mapping):
            return {}
        return {name: entry for name, entry in found.items() if isinstance(entry, dict)}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunRecord":
        data = dict(data)
        data["targets"] = [TargetInfo(**t) for t in data.get("targets", [])]
        data["steps"] = [StepResult(**s) for s in data.get("steps", [])]
        data["metrics"] = [MetricPoint(**m) for m in data.get("metrics", [])]
        data["findings"] = [Finding(**f) for f in data.get("findings", [])]
        return cls(**data)
