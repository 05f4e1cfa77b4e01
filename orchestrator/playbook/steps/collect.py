"""collect: the run's log, pip freeze, nvidia-smi and the JSON summary into a local run folder
(the data directory's runs/RUN_ID/TARGET/), recorded as the run's artifacts; and what the run
ran on (GPU models, driver, CUDA, clocks, cgroup limits: payloads/machine.py) into the record,
where orch nightly's environment diff compares it with the baseline's.

Files of the target (the log, the launch's JSON files, `files:`) come the way `orch cp`
pulls one (remote/transfer.py): one stream each, sha256-checked on both sides, written
under a temporary name and renamed once checked; the log's last max_log_mb only (a byte
range, as `tail -c`)."""

from __future__ import annotations

import json
import os
import posixpath

from orchestrator.ground import paths
from orchestrator.ground.errors import (CommandTimeout, ConnectionProblem, ContainerProblem,
                                        OrchError)
from orchestrator.playbook.steps.base import Param, Step, StepContext, StepOutcome
from orchestrator.remote import payload_api, transfer

_HAS_SMI = "command -v nvidia-smi >/dev/null 2>&1"


class CollectStep(Step):
    kind = "collect"
    summary = "logs, pip freeze, nvidia-smi, summary.json into the local run folder"
    runs_on_attach = True   # the logs of a run `orch attach` followed to its end
    params = {
        "log": Param((bool,), default=True, doc="the training log, as output.log"),
        "freeze": Param((bool,), default=True, doc="the venv's pip freeze, as pip-freeze.txt"),
        "nvidia_smi": Param((bool,), default=True, doc="nvidia-smi's output, as nvidia-smi.txt"),
        "summary": Param((bool,), default=True, doc="the run's summary, as summary.json"),
        "machine": Param((bool,), default=True,
                         doc="GPU models, driver, CUDA, clocks and cgroup limits, into the "
                             "record and machine.json"),
        "files": Param((list,), default=[], items=(str,), doc="more files from the target"),
        "max_log_mb": Param((int, float), default=64, doc="keep the last this-many MB of the log"),
    }

    def _dest(self, ctx: StepContext) -> str:
        return os.path.join(paths.run_dir(ctx.run_id), ctx.target.name)

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        items = [name for name, on in (("output.log", params["log"]), ("pip-freeze.txt", params["freeze"]),
                                       ("nvidia-smi.txt", params["nvidia_smi"]),
                                       ("machine.json", params["machine"]),
                                       ("summary.json", params["summary"])) if on]
        return [f"into {self._dest(ctx)}: {', '.join(items + [posixpath.basename(f) for f in params['files']])}"]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        target = ctx.target
        dest = self._dest(ctx)
        os.makedirs(dest, exist_ok=True)
        saved, problems = [], []
        launch = ctx.recorder.launch_info(target.name) or {}
        run_dir = launch.get("run_dir")

        def save(name: str, data: bytes) -> None:
            with open(os.path.join(dest, name), "wb") as handle:
                handle.write(data)
            saved.append(name)

        def fetch(path: str, name: str, seconds: float, last_bytes=None) -> None:
            transfer.pull(target, path, os.path.join(dest, name), last_bytes=last_bytes,
                          timeout=ctx.remaining(seconds))
            saved.append(name)

        if params["log"] and run_dir:
            limit = int(float(params["max_log_mb"]) * 1024 * 1024)
            try:
                fetch(posixpath.join(run_dir, "output.log"), "output.log", 300, last_bytes=limit)
            except OrchError as error:
                problems.append(f"log: {_said(error, target)}")
            for name in ("cmd.json", "pid.json", "exit.json"):
                try:
                    fetch(posixpath.join(run_dir, name), name, 60)
                except OrchError as error:
                    _unless_the_target_is_gone(error)   # written at some stages of a launch only
        if params["freeze"]:
            try:
                python = target.python()
                result = target.run([python, "-m", "pip", "freeze", "--all",
                                     "--disable-pip-version-check"], timeout=ctx.remaining(300))
                if result.ok:
                    save("pip-freeze.txt", result.stdout)
                    if ctx.info is not None:
                        ctx.info.pip_freeze = result.text.splitlines()
                        ctx.recorder.save_targets()
                else:
                    problems.append(f"pip freeze: {' '.join(result.stderr_tail(1))}")
            except OrchError as error:
                problems.append(f"pip freeze: {error}")
        if params["nvidia_smi"]:
            probe = target.run(["sh", "-c", _HAS_SMI], timeout=ctx.remaining(30))
            if probe.ok:
                result = target.run(["nvidia-smi"], timeout=ctx.remaining(60))
                save("nvidia-smi.txt", result.stdout + result.stderr)
        if params["machine"]:
            self._machine(ctx, save, problems)
        for path in params["files"]:
            try:
                fetch(path, posixpath.basename(path) or "file", 300)
            except OrchError as error:
                problems.append(f"{path}: {_said(error, target)}")
        if params["summary"]:
            summary = {"run_id": ctx.run_id, "target": target.name,
                       "monitor": ctx.recorder.monitor_result(target.name), "launch": launch,
                       "torch_version": getattr(ctx.info, "torch_version", None),
                       "fx_tls_state": getattr(ctx.info, "fx_tls_state", None)}
            save("summary.json", json.dumps(summary, indent=2, sort_keys=True, default=str).encode())
        ctx.recorder.note_artifacts(paths.run_dir(ctx.run_id))
        message = f"{len(saved)} file(s) in {dest}" + (f"; missing: {'; '.join(problems)}" if problems else "")
        return StepOutcome(status="changed" if saved else "ok", message=message,
                           data={"dir": dest, "files": saved, "problems": problems})

    @staticmethod
    def _machine(ctx: StepContext, save, problems: list) -> None:
        """The machine payload's facts into the record (a CPU container: gpus null, which is
        a fact, not a problem)."""
        try:
            facts = payload_api.machine(ctx.target)
        except OrchError as error:
            problems.append(f"machine: {error}")
            return
        facts = {key: value for key, value in facts.items() if key != "event"}
        save("machine.json", json.dumps(facts, indent=2, sort_keys=True).encode())
        if ctx.info is not None:
            ctx.info.machine = facts
            ctx.recorder.save_targets()


def _unless_the_target_is_gone(error: OrchError) -> None:
    """A file that could not be copied is the step's problem to report; a host lost, a
    container stopped or a timeout ends the step, as any command of it would."""
    if isinstance(error, (ConnectionProblem, ContainerProblem, CommandTimeout)):
        raise error


def _said(error: OrchError, target) -> str:
    """The error's first line without the target's name in front (the step names it);
    raises the errors that end the step instead (_unless_the_target_is_gone)."""
    _unless_the_target_is_gone(error)
    text = str(error).splitlines()[0]
    return text[len(target.name) + 2:] if text.startswith(f"{target.name}: ") else text
