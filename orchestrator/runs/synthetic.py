"""Made-up but realistic run records: for tests, and to preview a report without a real run.

The series follow the stand-in trainer's shape: step 1 slow (the torch.compile), then a
steady tok/s with some noise, a loss that falls.
"""

from __future__ import annotations

import math
import random
from typing import Optional

from orchestrator.runs.model import Finding, MetricPoint, RunRecord, StepResult, TargetInfo

FREEZE = ["filelock==3.16.1", "jinja2==3.1.4", "numpy==2.1.3", "sympy==1.13.3",
          "torch==2.13.0+cpu", "typing_extensions==4.12.2"]


def synthetic_run(run_id: str, *, playbook: str = "playbooks/dflash.yaml",
                  started_at: str = "2026-11-29T02:00:00+00:00", verdict: str = "ok",
                  drafters: int = 3, steps: int = 60, tok_s: float = 5400.0,
                  torch_version: str = "2.13.0+cpu", fx_tls_state: str = "patched",
                  freeze: Optional[list[str]] = None, findings: Optional[list[Finding]] = None,
                  target: str = "sb1-200", seed: int = 1, states_seen: Optional[list[str]] = None,
                  ) -> RunRecord:
    rng = random.Random(seed)
    metrics = []
    for drafter in range(drafters):
        base = tok_s * (1.0 + 0.03 * (drafter - 1))
        for step in range(1, steps + 1, 5 if steps > 20 else 1):
            rate = base / 12 if step == 1 else base * (1 + rng.uniform(-0.04, 0.04))
            loss = 2.0 + 4.0 * math.exp(-step / 18) + rng.uniform(-0.05, 0.05)
            metrics.append(MetricPoint(target, drafter, step, loss=round(loss, 4),
                                       tok_s=round(rate), elapsed_s=2.5 + step * 0.3))
    step_states = states_seen or [fx_tls_state]
    record_steps = [
        StepResult("ensure container", "ensure", target, "ok", started_at, 0.4),
        StepResult("bootstrap venv", "bootstrap", target, "ok", started_at, 1.2,
                   "already bootstrapped"),
        StepResult("fx-tls status", "grep", target, "ok", started_at, 0.8,
                   data={"state": step_states[0]}),
        StepResult("patch fx-tls", "patch", target, "ok" if step_states[-1] == "patched" else "changed",
                   started_at, 1.1, data={"state": step_states[-1]}),
        StepResult("launch drafters", "launch", target, "ok", started_at, 0.6),
        StepResult("monitor", "monitor", target, "ok" if verdict == "ok" else "failed",
                   started_at, 24.0, verdict),
        StepResult("collect", "collect", target, "ok", started_at, 0.9),
    ]
    if verdict != "ok" and findings is None:
        findings = [Finding(target, verdict, f"the run ended {verdict}", "see the log")]
    return RunRecord(
        run_id=run_id, playbook=playbook, playbook_sha256="5f" * 32, name="dflash",
        vars={"drafters": drafters, "slow_ms": 0, "gpus": "5,6,7"},
        targets=[TargetInfo(target, target.split("-")[0], 200, torch_version, fx_tls_state,
                            list(freeze if freeze is not None else FREEZE))],
        started_at=started_at, ended_at=started_at.replace("T02:00", "T02:01"),
        verdict=verdict, exit_code=0 if verdict == "ok" else 10,
        steps=record_steps, metrics=metrics, findings=list(findings or []),
        summary={"status": "ok" if verdict == "ok" else "failed", "drafters": drafters},
        artifacts_dir=None,
    )
