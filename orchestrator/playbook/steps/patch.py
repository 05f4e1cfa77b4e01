"""patch: orch's patches of the installed torch as a step (fx-threads or fx-tls:
status|diff|apply|revert)."""

from __future__ import annotations

from orchestrator.ground import fx_states

from orchestrator.remote import payload_api
from orchestrator.ground.fx_states import patch_state
from orchestrator.runs.model import Finding
from orchestrator.playbook.steps.base import Param, Step, StepContext, StepFailed, StepOutcome


class PatchStep(Step):
    kind = "patch"
    summary = ("make the FX state threads share thread-local (orch patch fx-threads|fx-tls as a "
               "step)")
    params = {
        "name": Param((str,), default="fx-tls", choices=fx_states.PATCH_SETS,
                      doc="fx-threads: every FX state threads share; fx-tls: the flag alone"),
        "action": Param((str,), default="status", choices=payload_api.PATCH_ACTIONS,
                        doc="what to do, as `orch patch NAME ACTION`"),
        "require": Param((list,), default=[], items=(str,),
                         doc="fail unless the state after the action is one of these"),
    }

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        return [f"orch patch {params['name']} {params['action']} -t {ctx.target.name} "
                f"(fx_patch payload with {ctx.python()})"]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        action = params["action"]
        name = params["name"]
        result = payload_api.fx_patch(ctx.target, action, patch_set=name)
        state = patch_state(result)
        version = result.get("torch_version")
        info = ctx.info
        if info is not None:
            info.torch_version = version or info.torch_version
            info.fx_tls_state = state
            ctx.recorder.save_targets()
        if action == "diff" and result.get("diff"):
            for line in str(result["diff"]).splitlines()[:200]:
                ctx.output(line)
        data = {"state": state, "torch_version": version, "changed": bool(result.get("changed")),
                "action": action, "message": result.get("message", ""),
                "files": [f.get("path") for f in result.get("files", []) or [] if isinstance(f, dict)],
                "patch_set": name,
                "states": {r.get("state"): r.get("status") for r in result.get("states") or []
                           if isinstance(r, dict)}}
        text = f"torch {version}: {fx_states.meaning(state)}"
        if result.get("message"):
            text += f" ({result['message']})"
        findings = [Finding(target=ctx.target.name, signature=f"fx-tls:{state}", message=text,
                            remediation=(f"orch patch {name} apply -t {ctx.target.name}"
                                         if state in fx_states.NEEDS_PATCH else ""))]
        if params["require"] and state not in params["require"]:
            raise StepFailed(f"{name} is {state} after {action}; the playbook requires "
                             f"{' or '.join(params['require'])}", data=data,
                             findings=findings)
        if action == "apply" and state not in fx_states.THREAD_LOCAL:
            raise StepFailed(f"{name} apply left torch {version} {state}", data=data,
                             findings=findings)
        return StepOutcome(status="changed" if data["changed"] else "ok", message=text, data=data,
                           findings=findings)
