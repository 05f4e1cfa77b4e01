"""verify: run the deterministic FX race reproducers in the target's venv (fx-race: the
tracing flag; fx-threads: every FX state threads share, one row each)."""

from __future__ import annotations

from orchestrator.remote import payload_api
from orchestrator.ground.fx_states import SHARED_STATES
from orchestrator.runs.model import Finding
from orchestrator.playbook.steps.base import Param, Step, StepContext, StepFailed, StepOutcome


class VerifyStep(Step):
    kind = "verify"
    summary = "the FX race reproducer (orch verify fx-race as a step)"
    params = {
        "check": Param((str,), default="fx-race", choices=("fx-race", "fx-threads"),
                       doc="fx-race: the flag's reproducer; fx-threads: one per shared FX state"),
        "trials": Param((int,), default=5, doc="runs of each reproducer"),
        "expect": Param((str,), default="fixed",
                        choices=("fixed", "vulnerable", "any"),
                        doc="fail the step unless the reproducer says this"),
    }

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        return [f"orch verify {params['check']} -t {ctx.target.name} --trials {params['trials']} "
                f"(fx_race payload with {ctx.python()}; expect {params['expect']})"]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        def on_event(event: dict) -> None:
            if event.get("event") == "trial":
                ctx.progress(f"trial {event.get('index')}/{event.get('trials')}: cross-thread "
                             f"{'raised' if event.get('cross_thread_raised') else 'no error'}")

        every_state = params["check"] == "fx-threads"
        result = payload_api.fx_race(ctx.target, params["trials"], on_event=on_event,
                                     states=list(SHARED_STATES) if every_state else None)
        verdict = result.get("overall_verdict" if every_state else "verdict", "inconclusive")
        data = {k: result.get(k) for k in ("verdict", "torch_version", "cross_thread_raised", "trials",
                                           "same_thread_raised", "same_thread_trials", "problems")}
        message = (f"torch {result.get('torch_version')}: cross-thread raised "
                   f"{result.get('cross_thread_raised')}/{result.get('trials')}, same-thread control "
                   f"{result.get('same_thread_raised')}/{result.get('same_thread_trials')} -> {verdict}")
        if every_state:
            data.update(verdict=verdict, states=result.get("states"))
            message = f"torch {result.get('torch_version')}: " + "; ".join(
                f"{row.get('state')} raised {row.get('raised')}/{row.get('trials')}, control held "
                f"{row.get('control_held')}/{row.get('trials')} -> {row.get('verdict')}"
                for row in result.get("states") or [] if isinstance(row, dict)) + f" -> {verdict}"
        finding = Finding(target=ctx.target.name, signature=f"fx-race-check:{verdict}", message=message,
                          remediation=(f"orch patch {'fx-threads' if every_state else 'fx-tls'} "
                                       f"apply -t {ctx.target.name}"
                                       if verdict == "vulnerable" else ""))
        # The run record keeps the installed distribution's version (grep, patch, monitor
        # read it from the dist-info); torch.__version__ here can carry a local label
        # ("+cu130") the METADATA lacks, and a mix of both would read as "torch changed".
        if params["expect"] != "any" and verdict != params["expect"]:
            raise StepFailed(message + f" (expected {params['expect']})", data=data,
                             findings=[finding])
        return StepOutcome(message=message, data=data, findings=[finding])
