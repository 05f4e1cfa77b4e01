"""ensure: the target is there and running (started when the playbook allows it)."""

from __future__ import annotations

import time

from orchestrator.ground.errors import ContainerNotRunning, OrchError
from orchestrator.targets.proxmox import ProxmoxClient
from orchestrator.playbook.steps.base import Param, Step, StepContext, StepFailed, StepOutcome


class EnsureStep(Step):
    kind = "ensure"
    summary = "the container exists and runs; start it when start: true"
    params = {
        "start": Param((bool,), default=False, doc="start a stopped container"),
        "wait": Param((int, float), default=60, doc="seconds to wait for it to run"),
        "python": Param((str,), default="python3", doc="an interpreter that must answer"),
    }

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        target = ctx.target
        lines = []
        if target.vmid:
            lines.append(f"pvesh get /nodes/NODE/lxc/{target.vmid}/status/current on {target.host.name}"
                         + (f"; pct start {target.vmid} if stopped" if params["start"] else ""))
        lines.append(f"run: {params['python']} -c 'import sys; print(sys.version)'")
        return lines

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        target = ctx.target
        started = False
        if target.vmid:
            started = self._ensure_running(ctx, params)
        result = target.run([params["python"], "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                            timeout=ctx.remaining(60))
        if not result.ok:
            raise StepFailed(f"{params['python']} does not run on {target.name}: "
                             f"{' '.join(result.stderr_tail(2)) or result.exit_code}")
        version = result.text.strip()
        where = target.describe()
        return StepOutcome(status="changed" if started else "ok",
                           message=(f"started {where}; " if started else f"{where} is running; ")
                           + f"python {version}",
                           data={"running": True, "started": started, "python_version": version})

    def _ensure_running(self, ctx: StepContext, params: dict) -> bool:
        target = ctx.target
        spec = ctx.run.inventory.hosts.get(target.host.name) if ctx.run.inventory else None
        if spec is None or not spec.kind.proxmox:
            return False
        client = ProxmoxClient(spec, target.host)
        state = client.status(target.vmid).get("status")
        if state == "running":
            return False
        if not params["start"]:
            raise ContainerNotRunning(
                f"{target.describe()} is {state}",
                hint=f"start it with `orch ct start {target.name}`, or set start: true in the ensure step")
        ctx.progress(f"starting CT {target.vmid}")
        client.start(target.vmid)
        deadline = time.monotonic() + float(params["wait"])
        while client.status(target.vmid).get("status") != "running":
            if time.monotonic() > deadline:
                raise OrchError(f"{target.describe()} did not start within {params['wait']} s")
            time.sleep(0.3)
        return True
