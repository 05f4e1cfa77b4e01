"""verify: run the deterministic FX race reproducer in the target's venv."""

from __future__ import annotations

from orchestrator import payload_api
from orchestrator.runs.model import Finding
from orchestrator.steps.base import Param, Step, StepContext, StepFailed, StepOutcome


class VerifyStep(Step):
    kind = "verify"
    summary = "the FX race reproducer (orch verify fx-race as a step)"
    params = {
        "check": Param((str,), default="fx-race", choices=("fx-race",)),
        "trials": Param((int,), default=5),
        "expect": Param((str,), default="fixed",
                        choices=("fixed", "vulnerable", "any"),
                        doc="fail the step unless the reproducer says this"),
    }

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        return [f"orch verify fx-race -t {ctx.target.name} --trials {params['trials']} "
                f"(fx_race payload with {ctx.python()}; expect {params['expect']})"]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        def on_event(event: dict) -> None:
            if event.get("event") == "trial":
                ctx.progress(f"trial {event.get('index')}/{event.get('trials')}: cross-thread "
                             f"{'raised' if event.get('cross_thread_raised') else 'no error'}")

        result = payload_api.fx_race(ctx.target, params["trials"], on_event=on_event)
        verdict = result.get("verdict", "inconclusive")
        data = {k: result.get(k) for k in ("verdict", "torch_version", "cross_thread_raised", "trials",
                                           "same_thread_raised", "same_thread_trials", "problems")}
        message = (f"torch {result.get('torch_version')}: cross-thread raised "
                   f"{result.get('cross_thread_raised')}/{result.get('trials')}, same-thread control "
                   f"{result.get('same_thread_raised')}/{result.get('same_thread_trials')} -> {verdict}")
        finding = Finding(target=ctx.target.name, signature=f"fx-race-check:{verdict}", message=message,
                          remediation=(f"orch patch fx-tls apply -t {ctx.target.name}"
                                       if verdict == "vulnerable" else ""))
        # The run record keeps the installed distribution's version (grep, patch, monitor
        # read it from the dist-info); torch.__version__ here can carry a local label
        # ("+cu130") the METADATA lacks, and a mix of both would read as "torch changed".
        if params["expect"] != "any" and verdict != params["expect"]:
            raise StepFailed(message + f" (expected {params['expect']})", data=data,
                             findings=[finding])
        return StepOutcome(message=message, data=data, findings=[finding])
