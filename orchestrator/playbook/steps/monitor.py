"""monitor: follow the launched run's log (by byte offset, across link drops), show live
per-drafter progress, classify the outcome (ok, fx-race, hang, degraded, recompile-limit,
cuda-oom, nccl-error, traceback, nonzero-exit, killed) and print remediations.

It watches until the process ends; with watch_for: N it leaves a healthy run going after N
seconds (verdict ok, `orch attach RUN` follows it later). The step's own `timeout:` is a hard
limit: reached, it stops the run (verdict timeout). A hang (no new step line for hang_after
seconds while the process lives) stops it too, unless stop_on_hang: false. Until a step line
is recognised, any output keeps the run alive (format auto says what it looked for)."""

from __future__ import annotations

import re
import time
from dataclasses import asdict
from typing import Callable, Optional

from orchestrator.remote import payload_api
from orchestrator.config.yamlsrc import Loc
from orchestrator.ground.errors import OrchError
from orchestrator.ground.fx_states import patch_state
from orchestrator.ground.verdicts import OK
from orchestrator.watch.logformats import FORMATS, command_line_settings, make_format
from orchestrator.forensics.explain import launch_logs, stacks_of
from orchestrator.watch.monitor import MonitorSettings, monitor_run
from orchestrator.watch.nodes import monitor_nodes
from orchestrator.playbook.model import Playbook, StepSpec
from orchestrator.playbook.steps.launch import spans_nodes as launch_spans_nodes
from orchestrator.watch.classify import compile_metric_regex
from orchestrator.remote.container import Target
from orchestrator.runs.model import recorded_monitor_settings
from orchestrator.playbook.steps.base import (Param, Reporter, RunInfo, Step, StepContext, StepFailed,
                                     StepOutcome)


class MonitorStep(Step):
    kind = "monitor"
    summary = "follow the launched run, live progress, verdict with remediation"
    judges_run = True   # its verdict is the run's (ok, fx-race, hang, ...)
    params = {
        "run_dir": Param((str,), doc="the run to follow (default: this target's last launch)"),
        "hang_after": Param((int, float), default=120, doc="seconds without a new step line"),
        "expected_tok_s": Param((int, float), doc="healthy total throughput (shown)"),
        "degraded_below": Param((int, float), doc="total tok/s under this = degraded"),
        "metric_regex": Param((str,), doc="named groups step (required), drafter, loss, tok_s"),
        "format": Param((str,), default="auto", choices=FORMATS,
                        doc="how the trainer logs: auto (detect the shape; the default), orch (the "
                            "stand-in), specforge, hf-trainer, nanogpt, torchtitan, megatron, deepspeed, "
                            "lightning, loop (a hand-written loop's `step N loss X`), tqdm, jsonl, "
                            "keyvalue, regex (metric_regex)"),
        "logging_steps": Param((int,), doc="a Hugging Face Trainer's logging_steps: numbers its "
                                           "dicts when it shows no progress bar (default: "
                                           "--logging_steps on the launch's command line)"),
        "trainer_state": Param((str,), doc="a Hugging Face trainer_state.json in the target, read "
                                           "when the run has ended: its log_history checks the "
                                           "log's steps, or gives the points the log did not"),
        "tensorboard": Param((str,), doc="TensorBoard event files in the target (a folder searched "
                                         "for *tfevents*, or one file; SpecForge: OUTPUT_DIR/runs), "
                                         "read when the run has ended, like trainer_state; needs "
                                         "orch[tensorboard] on the controller"),
        "workers": Param((str,), doc="what a worker is called in this run (default: rank under "
                                     "torchrun, drafter for the DFlash trainer, else worker)"),
        "tokens_per_step": Param((int, float), doc="tokens one step trains (all ranks): tok/s "
                                                   "from the step times where the trainer prints none"),
        "tokens_per_sample": Param((int, float), doc="tokens in one sample (max length): tok/s from the "
                                                     "samples/s a trainer prints (SpecForge's perf/"
                                                     "global_samples_per_second, DeepSpeed's, Megatron's; "
                                                     "default: --seq-length on the launch's command line)"),
        "warmup_steps": Param((int,), default=1, doc="steps whose tok/s includes the compile"),
        "expect_drafters": Param((int,), doc="fail unless this many drafters finish"),
        "watch_for": Param((int, float), doc="seconds to watch, then leave a healthy run going"),
        "stop_on_hang": Param((bool,), default=True, doc="stop a hung run (SIGTERM, then SIGKILL)"),
        "grace": Param((int, float), default=10, doc="seconds between SIGTERM and SIGKILL"),
        "gpu_every": Param((int, float), default=5, doc="seconds between nvidia-smi samples, kept as a series (0: off)"),
        "stall_after": Param((int, float), default=8, doc="silent seconds before reconnecting"),
        "unreachable_after": Param((int, float), default=300,
                                   doc="seconds out of reach before the verdict is unreachable"),
    }

    def check(self, params: dict, loc: Loc) -> None:
        fmt = params.get("format")
        regex = params.get("metric_regex")
        if isinstance(fmt, str) and "{{" not in fmt:
            if fmt == "regex" and regex is None:
                raise loc.child("format").error("format regex needs a metric_regex")
            if regex is not None and fmt not in ("auto", "orch", "regex"):
                raise loc.child("metric_regex").error(
                    f"metric_regex is for format regex; format {fmt} reads its own lines")
        if isinstance(regex, str) and "{{" not in regex:
            try:
                compile_metric_regex(regex)
            except Exception as error:  # noqa: BLE001 - re.error or our own ValueError
                raise loc.child("metric_regex").error(f"bad metric_regex: {error}") from None

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        run_dir = params["run_dir"] or "<the last launch's run directory>"
        parts = [f"hang after {params['hang_after']} s"]
        if params["degraded_below"]:
            parts.append(f"degraded under {params['degraded_below']:,} tok/s")
        if params["expected_tok_s"]:
            parts.append(f"expected {params['expected_tok_s']:,} tok/s")
        if params["watch_for"]:
            parts.append(f"watch {params['watch_for']} s, then leave it running")
        if params["tokens_per_step"]:
            parts.append(f"tok/s derived from {params['tokens_per_step']:,} tokens per step")
        launch = ctx.recorder.launch_info(ctx.target.name) or {}
        ranks = " and every rank's log" if launch.get("logs") or self._torchrun_before(ctx) else ""
        reading = ("lines recognised by shape (format auto)" if params["format"] == "auto"
                   else f"read as {params['format']} lines")
        where = (f"on every node ({', '.join(n.name for n in ctx.nodes)}), as one job (the first "
                 f"node that fails or hangs stops the others): " if ctx.nodes else "")
        return [f"{where}follow {run_dir}/output.log{ranks} by byte offset (tail payload), {reading}; "
                + ", ".join(parts)]

    def spans_nodes(self, playbook: Playbook, spec: StepSpec) -> bool:
        """It follows a launch over many nodes (the last launch before it), as one job."""
        if isinstance(spec.params, dict) and spec.params.get("run_dir") is not None:
            return False
        launches = [s for s in playbook.steps if s.kind == "launch" and s.index < spec.index]
        return bool(launches) and launch_spans_nodes(launches[-1])

    @staticmethod
    def _torchrun_before(ctx: StepContext) -> bool:
        """In a dry run nothing was launched: did an earlier launch step ask for torchrun?"""
        return any(s.kind == "launch" and isinstance(s.params, dict) and s.params.get("torchrun")
                   for s in ctx.run.playbook.steps if s.index < ctx.spec.index)

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        if ctx.nodes:
            return self._run_nodes(ctx, params)
        target = ctx.target
        launch = ctx.recorder.launch_info(target.name)
        run_dir = params["run_dir"] or (launch or {}).get("run_dir")
        if not run_dir:
            raise StepFailed("monitor: nothing to follow: no launch step ran on "
                             f"{target.name} before this one (or give run_dir:)")
        settings = MonitorSettings.from_params({**params, "timeout": ctx.timeout})
        settings.worker_word = params.get("workers") or ""
        settings.gpus = list(target.gpus)
        _from_command_line(settings, launch or {})
        if launch and launch.get("logs"):
            settings.follow = list(launch["logs"])          # torchrun: every rank's log
            settings.worker_word = params.get("workers") or launch.get("workers") or "rank"
        try:
            make_format(settings.format, settings.metric_regex)
        except (ValueError, re.error) as error:
            raise StepFailed(f"monitor: {error}") from None
        ctx.recorder.note_monitor(target.name, ctx.spec.index, settings.to_dict())
        return follow_run(ctx.run, ctx.reporter, target, run_dir, settings)

    def _run_nodes(self, ctx: StepContext, params: dict) -> StepOutcome:
        """Every node of a launch over many, followed as one job (watch/nodes.py)."""
        nodes = []
        for node in ctx.nodes:
            launch = ctx.recorder.launch_info(node.name)
            if not launch:
                raise StepFailed(f"monitor: nothing to follow on node {node.name}: its launch "
                                 f"did not run")
            settings = self._settings(ctx, params, node, launch)
            ctx.recorder.note_monitor(node.name, ctx.spec.index, settings.to_dict())
            nodes.append((node, launch["run_dir"], settings))
        return follow_nodes(ctx.run, ctx.reporter, nodes)

    @staticmethod
    def _settings(ctx: StepContext, params: dict, target: Target, launch: dict) -> MonitorSettings:
        settings = MonitorSettings.from_params({**params, "timeout": ctx.timeout})
        settings.gpus = list(target.gpus)
        _from_command_line(settings, launch)
        # the live view and the record name the job's global ranks: node rank x nproc + local
        settings.rank_offset = int(launch.get("node_rank") or 0) * int(launch.get("ranks") or 1)
        settings.follow = list(launch.get("logs") or [])
        settings.worker_word = params.get("workers") or launch.get("workers") or "rank"
        try:
            make_format(settings.format, settings.metric_regex)
        except (ValueError, re.error) as error:
            raise StepFailed(f"monitor: {error}") from None
        return settings


    def reattach(self, launch: dict) -> "FollowAgain":
        return FollowAgain(launch)


class FollowAgain(MonitorStep):
    """`orch attach`: the monitor again, on a recorded launch, with the settings its monitor
    step recorded, from the log's start (metrics and signatures need the whole log)."""

    params: dict = {}   # nothing to render: what it follows, and how, comes from the record

    def __init__(self, launch: dict):
        self.launch = launch

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:
        if ctx.nodes:          # one job over many nodes: every node's launch, followed as one
            nodes = []
            for node in ctx.nodes:
                launch = ctx.recorder.launch_info(node.name) or {}
                nodes.append((node, launch["run_dir"], self._again(launch)))
            return follow_nodes(ctx.run, ctx.reporter, nodes)
        return follow_run(ctx.run, ctx.reporter, ctx.target, self.launch["run_dir"],
                          self._again(self.launch))

    @staticmethod
    def _again(launch: dict) -> MonitorSettings:
        settings = MonitorSettings.from_params(recorded_monitor_settings(launch))
        settings.offset = 0
        settings.offsets = {}
        return settings


def _from_command_line(settings: MonitorSettings, launch: dict) -> None:
    """What the launch's command line says (--logging_steps, --seq-length), where the monitor
    step does not say it itself."""
    for key, value in command_line_settings(launch.get("argv")).items():
        if getattr(settings, key) is None:
            setattr(settings, key, value)


def follow_run(run: RunInfo, reporter: Reporter, target: Target, run_dir: str,
               settings: MonitorSettings) -> StepOutcome:
    """Watch one run to its end, as a step's outcome; shared by the monitor step and
    `orch attach`."""
    result, data = monitor_run(target, run_dir, settings, recorder=run.recorder,
                               reporter=reporter, cli=run.cli, rerun=run.rerun_hint(),
                               fresh_facts=_fresh_patch_facts,
                               stacks_taker=stacks_taker(target, run.recorder.launch_info(target.name)))
    status = "ok" if result.verdict == OK else "failed"
    return StepOutcome(status=status, message=result.message, data=data, verdict=result.verdict,
                       findings=result.findings)


def stacks_taker(target: Target, launch: Optional[dict]) -> Optional[Callable[[], dict]]:
    """What takes a hung run's stacks (`orch stacks`' way: pystack, every rank under
    torchrun), or None when the launch recorded no process."""
    pid = (launch or {}).get("pid")
    if not pid:
        return None

    def take() -> dict:
        taken_at = time.time()
        try:
            # with the run's logs: a thread that died holding a lock is named as its holder
            logs = launch_logs(target, launch) if launch.get("run_dir") else None
            results = stacks_of(target, int(pid), logs)
        except OrchError as error:
            return {"taken_at": taken_at, "pid": int(pid), "results": [], "error": str(error)[:600]}
        return {"taken_at": taken_at, "pid": int(pid), "results": [asdict(r) for r in results]}
    return take


def follow_nodes(run: RunInfo, reporter: Reporter, nodes: list) -> StepOutcome:
    """Watch one job over many nodes to its end, as a step's outcome (the monitor step and
    `orch attach`)."""
    takers = {target.name: stacks_taker(target, run.recorder.launch_info(target.name))
              for target, _run_dir, _settings in nodes}
    result, data = monitor_nodes(nodes, recorder=run.recorder, reporter=reporter, cli=run.cli,
                                 rerun=run.rerun_hint(), fresh_facts=_fresh_patch_facts,
                                 stacks_takers=takers)
    status = "ok" if result.verdict == OK else "failed"
    return StepOutcome(status=status, message=result.message, data=data, verdict=result.verdict,
                       findings=result.findings)


def _fresh_patch_facts(target) -> dict:
    """The FX state now (every state threads share, fx-threads): the remediation names the
    torch version and whether it is vulnerable. Best effort: the verdict stands without it."""
    try:
        result = payload_api.fx_patch(target, "status", patch_set="fx-threads")
        return {"torch_version": result.get("torch_version"), "fx_tls_state": patch_state(result)}
    except OrchError:
        return {}
