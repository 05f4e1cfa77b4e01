"""launch: start the training command DETACHED in the target (its own session, pid file,
exit-code file, log file), so it survives an SSH drop and the controller's exit.

With `torchrun: {nproc_per_node: N, ...}` the command runs under torchrun with one log per
rank (orchestrator/watch/torchrun.py), which the monitor step follows.

The environment gets CUDA_VISIBLE_DEVICES from the inventory's gpus (or the step's gpus:),
the inventory's env, the venv's bin on PATH, then the step's env: (which wins).
"""

from __future__ import annotations

import re
import shlex

from orchestrator.watch import torchrun
from orchestrator.config.yamlsrc import Loc
from orchestrator.remote.payload_api import REMOTE_ROOT, launcher
from orchestrator.runs.recorder import SECRET_NAME
from orchestrator.playbook.steps.base import Param, Step, StepContext, StepFailed, StepOutcome
from orchestrator.playbook.steps.shell import flatten

class LaunchStep(Step):
    kind = "launch"
    summary = "start the training command detached (setsid, pid/exit/log files)"
    shorthand = "command"
    params = {
        "command": Param((list,), required=True, items=(str, int, float, list),
                         doc="the command as an argv list"),
        "env": Param((dict,), default={}, doc="variables for the trainer; never in an argv (secrets "
                                                "travel with the launcher on stdin, masked in records)"),
        "cwd": Param((str,), doc="working directory (default: the run directory)"),
        "gpus": Param((list,), items=(int,), doc="GPU indices (default: the inventory's gpus)"),
        "venv": Param((str, bool), doc="venv to activate (default: the target's; false: none)"),
        "run_dir": Param((str,), doc=f"where pid/exit/log files live (default: {REMOTE_ROOT}/RUN_ID/NAME)"),
        "torchrun": Param((dict,), doc="run the command under torchrun, one log per rank: "
                                       "{nproc_per_node: N, master_port: P, nnodes, node_rank, "
                                       "master_addr, rdzv_backend, rdzv_endpoint, rdzv_id, max_restarts}"),
    }

    def check(self, params: dict, loc: Loc) -> None:
        spec = params.get("torchrun")
        if spec is not None and not (isinstance(spec, str) and "{{" in spec):
            try:
                torchrun.check_spec(spec)
            except torchrun.TorchrunError as error:
                where = loc.child("torchrun")
                if not error.key:
                    raise where.error(str(error)) from None
                unknown = error.key not in torchrun.OPTIONS
                raise where.child(error.key).error(str(error), key=unknown) from None

    def _prepare(self, ctx: StepContext, params: dict) -> dict:
        argv = [str(part) for part in flatten(params["command"])]
        if not argv:
            raise StepFailed("launch: the command is empty")
        target = ctx.target
        gpus = params["gpus"] if params["gpus"] is not None else target.gpus
        env = dict(target.env)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        env.update({str(k): str(v) for k, v in (params["env"] or {}).items()})
        venv = params["venv"]
        if venv is None or venv is True:
            venv = target.venv
        elif venv is False:
            venv = None
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", ctx.spec.name or f"launch{ctx.spec.index + 1}").strip("-.")
        run_dir = params["run_dir"] or f"{target.state_dir()}/runs/{ctx.run_id}/{slug or 'launch'}"
        prepared = {"argv": argv, "env": env, "venv": venv, "cwd": params["cwd"], "run_dir": run_dir}
        if params["torchrun"] is not None:
            try:
                prepared["argv"] = torchrun.build_argv(params["torchrun"], argv, run_dir)
            except torchrun.TorchrunError as error:
                raise StepFailed(f"launch: {error}") from None
            prepared["ranks"] = torchrun.ranks(params["torchrun"])
        return prepared

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        p = self._prepare(ctx, params)
        env = " ".join(f"{k}={'***' if SECRET_NAME.search(k) else shlex.quote(v)}"
                       for k, v in p["env"].items())
        return [f"detached in {p['run_dir']} (setsid; log output.log, pid.json, exit.json)"
                + (f", venv {p['venv']}" if p["venv"] else "")
                + (f"; {p['ranks']} ranks under torchrun, their logs in {p['run_dir']}/"
                   f"{torchrun.RANK_LOG_DIR}/" if "ranks" in p else ""),
                (env + " " if env else "") + shlex.join(p["argv"])]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        p = self._prepare(ctx, params)
        target = ctx.target
        venv = target.expand(p["venv"]) if p["venv"] else None
        # A leading ~ as a shell would expand it (there is no shell in between).
        p["argv"] = [target.expand(arg) if arg == "~" or arg.startswith("~/") else arg
                     for arg in p["argv"]]
        ctx.recorder.note_launch_starting(target, p["run_dir"])   # a Ctrl-C from here on asks
        result = launcher(target, "start", p["run_dir"], timeout=ctx.remaining(120),
                          argv=p["argv"], env=p["env"], venv=venv, cwd=p["cwd"])
        launch = {"run_dir": result.get("run_dir", p["run_dir"]), "pid": result.get("pid"),
                  "log": result.get("log"), "step": ctx.spec.index, "step_name": ctx.spec.label(),
                  "argv": p["argv"], "env_keys": sorted(p["env"]), "started_at": result.get("started_at"),
                  # the device layout, part of the run's shape (runs/baseline.py)
                  "cuda_visible_devices": p["env"].get("CUDA_VISIBLE_DEVICES"),
                  "host": target.host.name, "vmid": target.vmid}
        if "ranks" in p:
            # the monitor step follows every rank's log, and calls its workers ranks
            launch.update(ranks=p["ranks"], logs=list(torchrun.RANK_LOGS), workers="rank")
        ctx.recorder.note_launch(target.name, launch)
        gpus = p["env"].get("CUDA_VISIBLE_DEVICES")
        return StepOutcome(status="changed",
                           message=f"pid {launch['pid']} in {launch['run_dir']}"
                                   + (f" (CUDA_VISIBLE_DEVICES={gpus})" if gpus else ""),
                           data=launch)
