"""What a playbook run leaves behind: the record that the run store keeps and reports read.

The runner fills a RunRecord as it goes (steps, metrics, findings) and the store saves it
step by step, so a killed controller still leaves a readable, resumable record.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

from orchestrator.ground.verdicts import RUNNING

# The verdicts, their order and exit codes: the verdict table, orchestrator/ground/verdicts.py.


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
