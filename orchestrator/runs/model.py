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

from orchestrator.ground.errors import ExitCode

# Verdicts, from best to worst for display; each maps to an exit code in errors.ExitCode.
VERDICTS = ("ok", "degraded", "recompile-limit", "fx-race", "hang", "cuda-oom", "nccl-error",
            "collective-timeout", "rendezvous-timeout", "traceback", "nonzero-exit", "killed", "timeout",
            "failed", "unreachable", "interrupted", "abandoned", "running")

VERDICT_EXIT = {
    "ok": ExitCode.OK,
    "degraded": ExitCode.RUN_DEGRADED,
    "recompile-limit": ExitCode.RUN_DEGRADED,
    "hang": ExitCode.RUN_HANG,
    "unreachable": ExitCode.RUN_UNREACHABLE,
    "interrupted": ExitCode.INTERRUPTED,   # Ctrl-C before anything was launched
    # "abandoned" (its controller died without a verdict; settled by attach, stop or
    # `orch runs abandon`) is a failure: 10
}


# What each verdict means to a user: the text of docs/reference/verdicts.md (orchestrator.cli.reference).
VERDICT_MEANINGS = {
    "ok": "the run trained: every worker finished (or is healthy when `watch_for` left it going).",
    "degraded": "it ran, below the playbook's throughput threshold (`degraded_below`).",
    "recompile-limit": "degraded because torch._dynamo hit its recompile limit: the function runs "
                       "uncompiled from then on.",
    "fx-race": "the FX race: threads compiling side by side shared torch's FX state (the tracing "
               "flag's RuntimeError, `KeyError: 'custom'` from fx/traceback.py, CURRENT_PATCHER "
               "errors). FX-race advice only for DFlash runs.",
    "hang": "no progress for `hang_after` seconds while the process lived; it was stopped "
            "(`stop_on_hang`). Once steps flow, steps that stop while output goes on are a hang "
            "that names the silent worker.",
    "cuda-oom": "CUDA ran out of memory.",
    "nccl-error": "NCCL reported an error (an `NCCL WARN` in a run that exits 0 is a warning).",
    "collective-timeout": "a collective timed out (torchrun's SIGABRT after NCCL's watchdog line "
                          "included).",
    "rendezvous-timeout": "the ranks never met: the rendezvous never completed, or its store could "
                          "not be reached.",
    "traceback": "the run failed with a Python traceback.",
    "nonzero-exit": "the process exited with a non-zero code and no known signature.",
    "killed": "the process was killed by a signal, or stopped with `orch stop` (a worker's exit "
              "143 is a stop by SIGTERM, named).",
    "timeout": "the monitor's time limit ran out; orch stopped the run.",
    "failed": "a step failed, or fewer workers finished than `expect_drafters`.",
    "unreachable": "a target could not be reached during the run.",
    "interrupted": "Ctrl-C before anything was launched.",
    "abandoned": "its orch (the controller) died without a verdict: settled by `orch attach`, "
                 "`orch stop` or `orch runs abandon`.",
    "running": "the run is still going (its record has no verdict yet).",
}


def exit_code_for(verdict: str) -> int:
    """ok 0, hang 11, degraded 12, unreachable 13, every other failure 10 (errors.ExitCode)."""
    return VERDICT_EXIT.get(verdict, ExitCode.RUN_FAILED)


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
    signature: str              # fx-race | hang | degraded | recompile-limit | cuda-oom | ...
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
    verdict: str = "running"
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
