"""The step engine: a playbook's steps, one after another on each target (targets side by
side), with when/register/retries, and --dry-run plans. What the run learns goes to its
RunRecorder (runs/recorder.py), what happens to the Reporter (the console).

The engine takes plain values (a Fleet, the CLI prefix for hints), never the CLI's objects.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Optional

from orchestrator.config.inventory import ContainerSpec, Inventory
from orchestrator.ground import invocation
from orchestrator.config.yamlsrc import Loc, OptionSource
from orchestrator.ground.errors import ConfigError, ConnectionProblem, ExitCode, OrchError
from orchestrator.ground.verdicts import FAILED, INTERRUPTED, OK, UNREACHABLE, exit_code_for, worst
from orchestrator.targets.fleet import Fleet, fan_out
from orchestrator.watch.monitor import RunUnreachable
from orchestrator.remote.payload_api import launcher
from orchestrator.playbook.loader import load_playbook, normalize_extra_vars, order_vars
from orchestrator.playbook.model import BUILTIN_NAMES, Playbook, StepSpec
from orchestrator.playbook.render import (Unknown, UnknownAtPlanTime, evaluate_condition, render,
                                          render_params)
from orchestrator.remote.container import Target
from orchestrator.runs.model import RunRecord, TargetInfo, new_run_id
from orchestrator.runs.recorder import RunRecorder, controller_entry, json_safe, masked, stamp, step_result
from orchestrator.runs.store import RunStore
from orchestrator.playbook.steps import STEP_KINDS
from orchestrator.playbook.steps.base import (Reporter, RunInfo, Step, StepContext, StepFailed,
                                              StepOutcome, cli_prefix, rerun_options)


def resolve_specs(book: Playbook, inventory: Inventory, target_names=()) -> list[ContainerSpec]:
    """The containers a run works on: the -t names, else the playbook's targets (a name the
    inventory does not know is an error at its file:line:col)."""
    names = list(target_names) or book.targets
    if not names:
        loc = book.targets_loc
        where = f"{book.path}: " if loc is None else f"{loc.where()}: "
        raise ConfigError(where + "no targets: give targets: in the playbook or -t TARGET")
    specs: list[ContainerSpec] = []
    for index, name in enumerate(names):
        try:
            found = inventory.resolve([name])
        except ConfigError as error:
            loc = book.targets_loc
            if target_names or loc is None:
                raise
            loc = loc.child(index) if isinstance(loc.source.data.get("targets"), list) else loc
            raise loc.error(error.message, hint=error.hint) from None
        specs += [s for s in found if s.name not in {x.name for x in specs}]
    return specs


def check_node_steps(book: Playbook, names: list[str]) -> None:
    """Each step that spans the run's targets (the nodes of one job) against them: a
    ConfigError at its file:line:col when they do not fit (`orch run` and `orch validate`)."""
    for spec in book.steps:
        step = STEP_KINDS[spec.kind]()
        if step.spans_nodes(book, spec):
            step.check_nodes(spec, names)


class TargetRun:
    """The state of one target's pass through the steps."""

    def __init__(self, target: Target, variables: dict):
        self.target = target
        self.variables = variables
        self.verdict: Optional[str] = None         # from a failed step
        self.monitor_verdict: Optional[str] = None  # from the last step that judges the run
        self.failed_step: Optional[str] = None
        self.usage_error = False

    def final_verdict(self) -> str:
        return self.verdict or self.monitor_verdict or OK


# How long a Ctrl-C'd run asks a launch that was in flight whether it started. The question
# runs in its own thread with a deadline: the interrupt may have landed inside paramiko while it
# held its send lock, and then every later request on that connection waits for ever (seen:
# an `orch run` hung 72 minutes after Ctrl-C in the launch step). The user pressed Ctrl-C;
# an answer of "it may have started" is better than no exit.
ASK_AFTER_INTERRUPT_S = 20.0


def _status_within(target: Target, run_dir: str, seconds: float) -> Optional[dict]:
    """The launcher's status of RUN_DIR, or None when asking failed or took over SECONDS."""
    answer: list = []
    # the question is asked because of the interrupt: it must not be closed by it
    despite_interrupt = invocation.current().detached()

    def ask() -> None:
        try:
            with invocation.using(despite_interrupt):
                answer.append(launcher(target, "status", run_dir, timeout=max(1.0, seconds - 5)))
        except Exception:  # noqa: BLE001 - whatever stops the question, the answer is "asking failed"
            pass

    asking = threading.Thread(target=ask, name="orch-ask-launch", daemon=True)
    asking.start()
    asking.join(seconds)
    return answer[0] if answer else None


class Engine:
    """Runs one playbook's steps on its targets; run() returns the finished record."""

    def __init__(self, run: RunInfo, fleet: Fleet, reporter: Reporter, *,
                 extra_vars: Optional[dict] = None, target_names=()):
        self.run_info = run
        self.playbook = run.playbook
        self.recorder = run.recorder
        self.fleet = fleet
        self.reporter = reporter
        self.extra_vars = dict(extra_vars or {})
        self.target_names = list(target_names)

    # ------------------------------------------------------------ targets and vars
    def resolve_targets(self) -> list[Target]:
        specs = resolve_specs(self.playbook, self.fleet.inventory, self.target_names)
        return [self.fleet.target(spec) for spec in specs]

    def base_context(self, target: Target) -> dict:
        run_id = self.run_info.run_id
        return {
            "target": {"name": target.name, "host": target.host.name, "vmid": target.vmid,
                       "venv": target.venv, "gpus": list(target.gpus), "env": dict(target.env),
                       "cuda_visible_devices": ",".join(str(g) for g in target.gpus)},
            "run_id": run_id,
            "playbook_dir": self.playbook.directory,
            "inventory_dir": os.path.dirname(os.path.abspath(self.fleet.inventory.path)),
            "remote_dir": f"{target.state_dir()}/runs/{run_id}",
            "state_dir": target.state_dir(),
        }

    def render_vars(self, target: Target) -> dict:
        context = self.base_context(target)
        merged = {**self.playbook.vars, **self.extra_vars}
        for name in order_vars(self.playbook.vars, self.playbook.var_locs, self.extra_vars):
            loc = self.playbook.var_locs.get(name) if name not in self.extra_vars else None
            loc = loc or Loc(OptionSource(f"-e {name}", merged[name]), ())
            context[name] = render(merged[name], context, loc)
        return context

    # ------------------------------------------------------------------------ run
    def run(self) -> RunRecord:
        targets = self.resolve_targets()
        check_node_steps(self.playbook, [t.name for t in targets])
        segments = self._segments()
        contexts = {t.name: self.render_vars(t) for t in targets}
        for target in targets:
            # A playbook's `venv` var (or -e venv=...) is the venv every step works on, not
            # only bootstrap: grep, patch and verify must look at the torch it installed.
            venv = contexts[target.name].get("venv")
            if isinstance(venv, str) and venv:
                target.venv = venv
        first = contexts[targets[0].name]
        self.recorder.begin(RunRecord(
            run_id=self.run_info.run_id, playbook=os.path.abspath(self.playbook.path),
            playbook_sha256=self.playbook.sha256, name=self.playbook.name,
            vars=masked(json_safe({k: v for k, v in first.items() if k not in BUILTIN_NAMES})),
            targets=[TargetInfo(name=t.name, host=t.host.name, vmid=t.vmid) for t in targets],
            launch={"controller": controller_entry(),
                    "targets": {}, "cli": self.run_info.cli,
                    "inventory": os.path.abspath(self.fleet.inventory.path)}))
        self.reporter.run_started(self.run_info, targets)
        runs = [TargetRun(t, contexts[t.name]) for t in targets]
        try:
            for spans, specs in segments:
                if spans:
                    self.run_node_step(runs, specs[0])
                    continue
                group = fan_out(runs, lambda run, specs=specs: self._run_target(run, specs))
                for run, error in group.failed.items():
                    run.verdict = UNREACHABLE if isinstance(error, ConnectionProblem) else FAILED
        except KeyboardInterrupt:
            launched = self._launched_when_interrupted()
            if not launched:
                # Nothing runs on the targets: the record must not stay "running" for ever.
                self.recorder.finish(INTERRUPTED, exit_code_for(INTERRUPTED), self._summary(runs))
            # Else the record stays "running": a launched run goes on and `orch attach` finds it.
            self.reporter.interrupted(self.run_info, launched)
            raise
        return self.finish(runs)

    def _segments(self) -> list[tuple[bool, list[StepSpec]]]:
        """The steps in stretches: steps each target runs on its own (targets side by side),
        and, alone, each step that spans the run's targets (spans_nodes: the nodes of one
        job), which starts once every target finished the stretch before it."""
        segments: list[tuple[bool, list[StepSpec]]] = []
        for spec in self.playbook.steps:
            spans = STEP_KINDS[spec.kind]().spans_nodes(self.playbook, spec)
            if spans or not segments or segments[-1][0]:
                segments.append((spans, [spec]))
            else:
                segments[-1][1].append(spec)
        return segments

    def _launched_when_interrupted(self) -> dict[str, str]:
        """target -> run dir of each launch that started (or may have): a launch step that
        was in flight when Ctrl-C came is asked about, once, so that it is neither claimed
        nor forgotten."""
        launched = {}
        for name, (target, run_dir) in self.recorder.launches_starting().items():
            if self.recorder.launch_info(name) is not None:
                launched[name] = run_dir
                continue
            status = _status_within(target, run_dir, ASK_AFTER_INTERRUPT_S)
            if status is None:
                launched[name] = run_dir + " (it may have started: asking failed)"
                continue
            if status.get("state") not in ("missing", None):
                launched[name] = run_dir
                self.recorder.note_launch(name, {"run_dir": run_dir, "pid": status.get("pid"),
                                                 "started_at": status.get("started_at"),
                                                 "host": target.host.name, "vmid": target.vmid,
                                                 "log": f"{run_dir}/output.log"})
        return launched

    def finish(self, runs: list[TargetRun]) -> RunRecord:
        verdict = worst(r.final_verdict() for r in runs)
        exit_code = ExitCode.USAGE if any(r.usage_error for r in runs) else exit_code_for(verdict)
        record = self.recorder.finish(verdict, exit_code, self._summary(runs))
        self.reporter.run_finished(self.run_info, record, runs)
        return record

    @staticmethod
    def _summary(runs: list[TargetRun]) -> dict[str, dict]:
        return {r.target.name: {"verdict": r.final_verdict(), "failed_step": r.failed_step}
                for r in runs}

    def _run_target(self, run: TargetRun, specs: list[StepSpec]) -> TargetRun:
        for spec in specs:
            if run.verdict is not None and not spec.always:
                self._skip(run, spec, "an earlier step failed")
                continue
            self.run_step(run, spec)
        return run

    def _skip(self, run: TargetRun, spec: StepSpec, why: str) -> None:
        if spec.register:
            run.variables[spec.register] = {"skipped": True, "status": "skipped", "changed": False,
                                            "failed": False, "message": why}
        self.reporter.step_skipped(run.target.name, spec, why)
        if not self.run_info.dry_run:
            self.recorder.save_step(step_result(spec, run.target.name,
                                                StepOutcome(status="skipped", message=why), stamp()))

    def run_node_step(self, runs: list[TargetRun], spec: StepSpec) -> None:
        """A step that spans the run's targets (the nodes of one job): once, for all of them,
        with the first target's variables; its outcome is every node's."""
        failed = [r.target.name for r in runs if r.verdict is not None]
        if failed and not spec.always:
            for run in runs:
                self._skip(run, spec, f"{', '.join(failed)} failed an earlier step; the step "
                                      f"needs every node")
            return
        head = runs[0]
        step = STEP_KINDS[spec.kind]()
        nodes = [r.target for r in runs]
        if spec.when is not None and not self.run_info.dry_run:
            try:
                wanted = evaluate_condition(spec.when, head.variables, spec.loc.child("when"))
            except ConfigError as error:
                for run in runs:
                    self._usage_failure(run, spec, error)
                return
            if not wanted:
                for run in runs:
                    self._skip(run, spec, f"when: {spec.when} is false (on {head.target.name})")
                return
        if self.run_info.dry_run:
            self.reporter.step_plan(head.target.name, spec,
                                    self._plan_lines(step, head, spec, nodes=nodes))
            return
        try:
            params = render_params(step.params, spec, head.variables)
        except ConfigError as error:
            for run in runs:
                self._usage_failure(run, spec, error)
            return
        self.perform_nodes(runs, spec, step, params)

    def perform_nodes(self, runs: list[TargetRun], spec: StepSpec, step: Step, params: dict, *,
                      name: Optional[str] = None) -> StepOutcome:
        """A step whose settings are rendered, once for the nodes of one job (runs, in node-rank
        order): performed on the first, its outcome every node's (`orch attach` too)."""
        outcome = self.perform(runs[0], spec, step, params, name=name,
                               nodes=[r.target for r in runs])
        for run in runs[1:]:
            # the other nodes' record of the same step (the console showed it once)
            node = dict((outcome.data.get("nodes") or {}).get(run.target.name) or {})
            result = step_result(spec, run.target.name, StepOutcome(
                status=outcome.status, message=outcome.message, data=node, verdict=outcome.verdict),
                stamp(), name=name)
            self.recorder.save_step(result)
            self._settle(run, spec, step, outcome)
        return outcome

    def run_step(self, run: TargetRun, spec: StepSpec) -> None:
        """One step on one target: its `when`, its settings rendered and checked, perform()."""
        step = STEP_KINDS[spec.kind]()
        target = run.target
        context = run.variables
        if spec.when is not None:
            try:
                wanted = evaluate_condition(spec.when, context, spec.loc.child("when"))
            except UnknownAtPlanTime as unknown:
                self.reporter.step_plan(target.name, spec, [f"when: {spec.when}  (decided at run "
                                                            f"time: needs {unknown.name})"]
                                        + self._plan_lines(step, run, spec))
                return
            except ConfigError as error:
                self._usage_failure(run, spec, error)
                return
            if not wanted:
                self._skip(run, spec, f"when: {spec.when} is false")
                return
        if self.run_info.dry_run:
            self.reporter.step_plan(target.name, spec, self._plan_lines(step, run, spec))
            if spec.register:
                context[spec.register] = Unknown(spec.register)
            return
        try:
            params = render_params(step.params, spec, context)
        except ConfigError as error:
            self._usage_failure(run, spec, error)
            return
        self.perform(run, spec, step, params)

    def perform(self, run: TargetRun, spec: StepSpec, step: Step, params: dict, *,
                name: Optional[str] = None, nodes: Optional[list] = None) -> StepOutcome:
        """A step whose settings are rendered, on one target: its attempts, its record, its
        registered result and what it means for the target's verdict. Every step that runs
        goes this way, `orch attach`'s too (name: how the record names it, if not its label)."""
        target = run.target
        started_at, started = stamp(), time.monotonic()
        self.reporter.step_started(target.name, spec)
        outcome = self._attempts(step, run, spec, params, nodes)
        result = step_result(spec, target.name, outcome, started_at, time.monotonic() - started,
                             name=name)
        if outcome.verdict and step.judges_run:
            result.data["verdict"] = outcome.verdict
        self.recorder.save_step(result)
        if outcome.findings:
            self.recorder.add_findings(outcome.findings)
        self._settle(run, spec, step, outcome)
        self.reporter.step_finished(target.name, spec, result, outcome)
        return outcome

    @staticmethod
    def _settle(run: TargetRun, spec: StepSpec, step: Step, outcome: StepOutcome) -> None:
        """What a step's outcome means for its target: registered result, verdict."""
        if spec.register:
            run.variables[spec.register] = registered(outcome)
        if outcome.verdict and step.judges_run:
            run.monitor_verdict = outcome.verdict
        if outcome.failed and not spec.continue_on_error:
            run.verdict = outcome.verdict or FAILED
            run.failed_step = spec.label()

    def _context(self, run: TargetRun, spec: StepSpec, nodes: Optional[list] = None) -> StepContext:
        return StepContext(self.run_info, self.reporter, run.target, spec, run.variables,
                           timeout=spec.timeout, nodes=list(nodes or []))

    def _plan_lines(self, step, run: TargetRun, spec: StepSpec,
                    nodes: Optional[list] = None) -> list[str]:
        try:
            params = render_params(step.params, spec, run.variables)
        except UnknownAtPlanTime as unknown:
            return [f"(its settings depend on {unknown.name}, known at run time)"]
        except ConfigError as error:
            return [f"(error: {error})"]
        try:
            return step.plan(self._context(run, spec, nodes), params)
        except UnknownAtPlanTime as unknown:
            return [f"(its settings depend on {unknown.name}, known at run time)"]
        except (StepFailed, OrchError) as error:
            return [f"(would fail: {getattr(error, 'message', error)})"]

    def _attempts(self, step, run: TargetRun, spec: StepSpec, params: dict,
                  nodes: Optional[list] = None) -> StepOutcome:
        attempts = spec.retries + 1
        outcome = StepOutcome(status="failed", message="not run")
        for attempt in range(1, attempts + 1):
            outcome = self._attempt(step, self._context(run, spec, nodes), params)
            if not outcome.failed or attempt == attempts:
                break
            self.reporter.step_progress(run.target.name, spec,
                                        f"attempt {attempt}/{attempts} failed: {outcome.message}; "
                                        f"retrying in {spec.retry_delay:g} s")
            time.sleep(spec.retry_delay)
        if outcome.failed and outcome.verdict == "usage":
            run.usage_error = True
            outcome.verdict = FAILED
        return outcome

    @staticmethod
    def _attempt(step, ctx: StepContext, params: dict) -> StepOutcome:
        try:
            return step.run(ctx, params)
        except StepFailed as failure:
            return StepOutcome(status="failed", message=failure.message, data=failure.data,
                               verdict=failure.verdict, findings=failure.findings)
        except (ConnectionProblem, RunUnreachable) as error:
            return StepOutcome(status="failed", message=str(error), verdict=UNREACHABLE)
        except ConfigError as error:
            return StepOutcome(status="failed", message=str(error), verdict="usage")
        except OrchError as error:
            return StepOutcome(status="failed", message=str(error), verdict=FAILED)
        except Exception as error:  # noqa: BLE001 - a bug in a step must not leave the record open
            return StepOutcome(status="failed", verdict=FAILED,
                               message=f"internal error in the {ctx.spec.kind} step: "
                                       f"{type(error).__name__}: {error} (please report it)",
                               data={"traceback": traceback.format_exc()})

    def _usage_failure(self, run: TargetRun, spec: StepSpec, error: ConfigError) -> None:
        run.usage_error = True
        run.verdict = FAILED
        run.failed_step = spec.label()
        outcome = StepOutcome(status="failed", message=str(error))
        result = step_result(spec, run.target.name, outcome, stamp())
        if not self.run_info.dry_run:
            self.recorder.save_step(result)
        self.reporter.step_finished(run.target.name, spec, result, outcome)


def registered(outcome: StepOutcome) -> dict:
    """What `register: NAME` keeps of a step's outcome, for the templates of later steps."""
    return {**outcome.data, "status": outcome.status, "changed": outcome.status == "changed",
            "failed": outcome.failed, "skipped": False, "message": outcome.message,
            **({"verdict": outcome.verdict} if outcome.verdict else {})}


# ------------------------------------------------------------------- entry points
def run_playbook(playbook: str, *, reporter: Reporter, inventory: Optional[str] = None,
                 trust_on_first_use: bool = False, fleet: Optional[Fleet] = None, targets=(),
                 extra_vars=None, store: Optional[RunStore] = None, dry_run: bool = False,
                 cli: Optional[str] = None) -> RunRecord:
    """Load, check and run a playbook; the one entry point for `orch run` and `orch nightly`.
    Without a fleet, the inventory file (-i, None: the default one) is opened once the
    playbook has loaded. cli is how the user called orch, for the commands hints print."""
    extra = normalize_extra_vars(extra_vars)
    book = load_playbook(playbook, extra)
    own_fleet = fleet is None
    own_store = store is None and not dry_run
    store = store if store is not None else (None if dry_run else RunStore())
    try:
        fleet = fleet or Fleet.from_path(inventory, trust_on_first_use=trust_on_first_use)
        run_id = new_run_id()
        recorder = RunRecorder(run_id, None if dry_run else store)
        run = RunInfo(run_id=run_id, playbook=book, recorder=recorder, playbook_arg=playbook,
                      dry_run=dry_run, cli=cli or cli_prefix(inventory),
                      rerun_args=rerun_options(targets, extra_vars), inventory=fleet.inventory,
                      fleet=fleet)
        return Engine(run, fleet, reporter, extra_vars=extra, target_names=list(targets)).run()
    finally:
        if own_fleet and fleet is not None:
            fleet.close()
        if own_store and store is not None:
            store.close()
