"""The playbook runner: one step after another on each target (targets side by side),
events to the console and, as they happen, to the run store.

The record is written progressively (begin, each step, metric batches, launch info, then
finish), so a killed controller leaves a record with verdict "running" and everything
`orch attach RUN` needs to pick the run up again.
"""

from __future__ import annotations

import copy
import os
import socket
import threading
import time
from datetime import datetime, timezone
from typing import Any, Optional

from orchestrator.config.inventory import ContainerSpec
from orchestrator.errors import ConfigError, ConnectionProblem, ExitCode, OrchError
from orchestrator.fleet import Fleet, each_concurrently
from orchestrator.playbook.loader import (BUILTIN_NAMES, Playbook, StepSpec, load_playbook,
                                          order_vars, parse_extra_vars)
from orchestrator.playbook.render import (Loc, Unknown, UnknownAtPlanTime, evaluate_condition,
                                          render)
from orchestrator.monitor import RunUnreachable
from orchestrator.payload_api import REMOTE_ROOT, launcher, stop_run
from orchestrator.remote.container import Target
from orchestrator.runs.model import (VERDICTS, exit_code_for, Finding, MetricPoint, RunRecord, StepResult,
                                     TargetInfo, new_run_id, now_iso)
from orchestrator.steps import STEP_KINDS
from orchestrator.steps.base import StepContext, StepFailed, StepOutcome, check_value

def worst(verdicts) -> str:
    order = {v: i for i, v in enumerate(VERDICTS)}
    verdicts = [v for v in verdicts if v] or ["ok"]
    return max(verdicts, key=lambda v: order.get(v, order["failed"]))


def masked(value: Any) -> Any:
    """Vars as recorded: values under secret-looking names (…KEY, TOKEN, PASSWORD) hidden."""
    from orchestrator.steps.launch import SECRET_NAME
    if isinstance(value, dict):
        return {k: "***" if SECRET_NAME.search(str(k)) and not isinstance(v, (dict, list)) else masked(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def _stamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def json_safe(value: Any, depth: int = 0) -> Any:
    """Rendered vars and step data as plain JSON values (the store and --json need them)."""
    if depth > 20:
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class TargetRun:
    """The state of one target's pass through the steps."""

    def __init__(self, target: Target, variables: dict):
        self.target = target
        self.variables = variables
        self.verdict: Optional[str] = None         # from a failed step
        self.monitor_verdict: Optional[str] = None  # from the last monitor that ran
        self.failed_step: Optional[str] = None
        self.usage_error = False

    def final_verdict(self) -> str:
        return self.verdict or self.monitor_verdict or "ok"


class Runner:
    def __init__(self, playbook: Playbook, fleet: Fleet, *, reporter, store=None,
                 extra_vars: Optional[dict] = None, target_names=(), dry_run: bool = False,
                 cli: str = "orch", playbook_arg: Optional[str] = None, run_id: Optional[str] = None):
        self.playbook = playbook
        self.fleet = fleet
        self.reporter = reporter
        self.store = store
        self.extra_vars = dict(extra_vars or {})
        self.target_names = list(target_names)
        self.dry_run = dry_run
        self.cli = cli
        self.playbook_arg = playbook_arg or playbook.path
        self.rerun_args = ""        # the -t/-e options as typed, for "rerun with" hints
        self.run_id = run_id or new_run_id()
        self.record: Optional[RunRecord] = None
        self._lock = threading.RLock()
        self._infos: dict[str, TargetInfo] = {}
        self._launches: dict[str, dict] = {}
        self._launch_starting: dict[str, tuple] = {}   # target -> (Target, run dir) once a launch begins
        self._monitor_results: dict[str, dict] = {}

    # -------------------------------------------------------------------- targets
    def resolve_targets(self) -> list[Target]:
        names = self.target_names or self.playbook.targets
        if not names:
            loc = self.playbook.targets_loc
            where = f"{self.playbook.path}: " if loc is None else f"{loc.where()}: "
            raise ConfigError(where + "no targets: give targets: in the playbook or -t TARGET")
        specs: list[ContainerSpec] = []
        for index, name in enumerate(names):
            try:
                found = self.fleet.inventory.resolve([name])
            except ConfigError as error:
                if self.target_names or self.playbook.targets_loc is None:
                    raise
                loc = self.playbook.targets_loc
                loc = loc.child(index) if isinstance(self.playbook_targets_raw(), list) else loc
                raise loc.error(error.message, hint=error.hint) from None
            specs += [s for s in found if s.name not in {x.name for x in specs}]
        return [self.fleet.target(spec) for spec in specs]

    def playbook_targets_raw(self):
        return self.playbook.targets_loc.source.data.get("targets") if self.playbook.targets_loc else None

    # ------------------------------------------------------------------ variables
    def base_context(self, target: Target) -> dict:
        return {
            "target": {"name": target.name, "host": target.host.name, "vmid": target.vmid,
                       "venv": target.venv, "gpus": list(target.gpus), "env": dict(target.env),
                       "cuda_visible_devices": ",".join(str(g) for g in target.gpus)},
            "run_id": self.run_id,
            "playbook_dir": self.playbook.directory,
            "inventory_dir": os.path.dirname(os.path.abspath(self.fleet.inventory.path)),
            "remote_dir": f"{REMOTE_ROOT}/{self.run_id}",
        }

    def render_vars(self, target: Target) -> dict:
        context = self.base_context(target)
        merged = {**self.playbook.vars, **self.extra_vars}
        for name in order_vars(self.playbook.vars, self.playbook.var_locs, self.extra_vars):
            loc = self.playbook.var_locs.get(name) if name not in self.extra_vars else None
            loc = loc or Loc(_ExtraSource(name, merged[name]), ())
            context[name] = render(merged[name], context, loc)
        return context

    # ------------------------------------------------------------------------ run
    def run(self) -> RunRecord:
        targets = self.resolve_targets()
        contexts = {t.name: self.render_vars(t) for t in targets}
        for target in targets:
            # A playbook's `venv` var (or -e venv=...) is the venv every step works on, not
            # only bootstrap: grep, patch and verify must look at the torch it installed.
            venv = contexts[target.name].get("venv")
            if isinstance(venv, str) and venv:
                target.venv = venv
        first = contexts[targets[0].name]
        self.record = RunRecord(
            run_id=self.run_id, playbook=os.path.abspath(self.playbook.path),
            playbook_sha256=self.playbook.sha256, name=self.playbook.name,
            vars=masked(json_safe({k: v for k, v in first.items() if k not in BUILTIN_NAMES})),
            targets=[self._info(t) for t in targets],
            launch={"controller": {"pid": os.getpid(), "host": socket.gethostname(),
                                   "started": time.time()},
                    "targets": {}, "cli": self.cli, "inventory": os.path.abspath(self.fleet.inventory.path)})
        for info in self.record.targets:
            self._infos[info.name] = info
        self.reporter.run_started(self, targets)
        if not self.dry_run and self.store is not None:
            self.store.begin(self.record)
        runs = [TargetRun(t, contexts[t.name]) for t in targets]
        try:
            outcomes = each_concurrently(runs, self._run_target)
        except KeyboardInterrupt:
            launched = self._launched_when_interrupted()
            if not launched:
                # Nothing runs on the targets: the record must not stay "running" for ever.
                self._finish_interrupted(runs)
            # Else the record stays "running": a launched run goes on and `orch attach` finds it.
            self.reporter.interrupted(self, launched)
            raise
        for run, outcome in zip(runs, outcomes):
            if isinstance(outcome, OrchError):
                run.verdict = "unreachable" if isinstance(outcome, ConnectionProblem) else "failed"
        return self._finish(runs)

    def _launched_when_interrupted(self) -> dict[str, str]:
        """target -> run dir of each launch that started (or may have): a launch step that
        was in flight when Ctrl-C came is asked about, once, so that it is neither claimed
        nor forgotten."""
        launched = {}
        for name, (target, run_dir) in list(self._launch_starting.items()):
            if name in self._launches:
                launched[name] = run_dir
                continue
            try:
                status = launcher(target, "status", run_dir, timeout=15)
            except (OrchError, KeyboardInterrupt):
                launched[name] = run_dir + " (it may have started: asking failed)"
                continue
            if status.get("state") not in ("missing", None):
                launched[name] = run_dir
                self.note_launch(name, {"run_dir": run_dir, "pid": status.get("pid"),
                                        "started_at": status.get("started_at"),
                                        "host": target.host.name, "vmid": target.vmid,
                                        "log": f"{run_dir}/output.log"})
        return launched

    def note_launch_starting(self, target: Target, run_dir: str) -> None:
        with self._lock:
            self._launch_starting[target.name] = (target, run_dir)

    def _finish_interrupted(self, runs: list[TargetRun]) -> None:
        record = self.record
        record.verdict = "interrupted"
        record.exit_code = exit_code_for("interrupted")
        record.ended_at = now_iso()
        record.summary = self._summary(runs)
        if not self.dry_run and self.store is not None:
            self.store.finish(record)

    def _finish(self, runs: list[TargetRun]) -> RunRecord:
        record = self.record
        verdict = worst(r.final_verdict() for r in runs)
        record.verdict = verdict
        record.exit_code = exit_code_for(verdict)
        if any(r.usage_error for r in runs):
            record.exit_code = ExitCode.USAGE
        record.ended_at = now_iso()
        record.summary = self._summary(runs)
        if not self.dry_run and self.store is not None:
            self.store.finish(record)
        self.reporter.run_finished(self, record, runs)
        return record

    def _summary(self, runs: list[TargetRun]) -> dict:
        per_target = {name: result for name, result in self._monitor_results.items()}
        summary: dict = {"targets": {r.target.name: {"verdict": r.final_verdict(),
                                                     "failed_step": r.failed_step}
                                     for r in runs}}
        if per_target:
            summary["monitor"] = per_target
            totals = [m.get("total_tok_s") for m in per_target.values() if m.get("total_tok_s")]
            summary["total_tok_s"] = sum(totals) if totals else None
            if len(per_target) == 1:
                only = next(iter(per_target.values()))
                summary["drafters"] = only.get("drafters", {})
                summary["drafters_ok"] = only.get("drafters_ok")
        return json_safe(summary)

    def _info(self, target: Target) -> TargetInfo:
        return TargetInfo(name=target.name, host=target.host.name, vmid=target.vmid)

    def _run_target(self, run: TargetRun) -> TargetRun:
        for spec in self.playbook.steps:
            if run.verdict is not None and not spec.always:
                self._skip(run, spec, "an earlier step failed")
                continue
            self._run_step(run, spec)
        return run

    def _skip(self, run: TargetRun, spec: StepSpec, why: str) -> None:
        if spec.register:
            run.variables[spec.register] = {"skipped": True, "status": "skipped", "changed": False,
                                            "failed": False, "message": why}
        self.reporter.step_skipped(run.target.name, spec, why)
        if not self.dry_run:
            self._save_step(StepResult(name=spec.label(), kind=spec.kind, target=run.target.name,
                                       status="skipped", started_at=_stamp(), message=why))

    def _run_step(self, run: TargetRun, spec: StepSpec) -> None:
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
        if self.dry_run:
            self.reporter.step_plan(target.name, spec, self._plan_lines(step, run, spec))
            if spec.register:
                context[spec.register] = Unknown(spec.register)
            return
        try:
            params = self._params(step, spec, context)
        except ConfigError as error:
            self._usage_failure(run, spec, error)
            return
        started_at = _stamp()
        started = time.monotonic()
        self.reporter.step_started(target.name, spec)
        outcome = self._attempts(step, run, spec, params)
        duration = time.monotonic() - started
        result = StepResult(name=spec.label(), kind=spec.kind, target=target.name,
                            status=outcome.status, started_at=started_at,
                            duration_s=round(duration, 3), message=outcome.message,
                            data=json_safe(_trim(outcome.data)))
        if outcome.verdict and spec.kind == "monitor":
            result.data["verdict"] = outcome.verdict
        self._save_step(result)
        if outcome.findings:
            self._add_findings(outcome.findings)
        if spec.register:
            context[spec.register] = {**outcome.data, "status": outcome.status,
                                      "changed": outcome.status == "changed",
                                      "failed": outcome.failed, "skipped": False,
                                      "message": outcome.message,
                                      **({"verdict": outcome.verdict} if outcome.verdict else {})}
        if spec.kind == "monitor" and outcome.verdict:
            run.monitor_verdict = outcome.verdict
        self.reporter.step_finished(target.name, spec, result, outcome)
        if outcome.failed and not spec.continue_on_error:
            run.verdict = outcome.verdict or "failed"
            run.failed_step = spec.label()

    def _plan_lines(self, step, run: TargetRun, spec: StepSpec) -> list[str]:
        try:
            params = self._params(step, spec, run.variables)
        except UnknownAtPlanTime as unknown:
            return [f"(its settings depend on {unknown.name}, known at run time)"]
        except ConfigError as error:
            return [f"(error: {error})"]
        try:
            return step.plan(StepContext(self, run.target, spec, run.variables), params)
        except UnknownAtPlanTime as unknown:
            return [f"(its settings depend on {unknown.name}, known at run time)"]
        except (StepFailed, OrchError) as error:
            return [f"(would fail: {getattr(error, 'message', error)})"]

    def _params(self, step, spec: StepSpec, context: dict) -> dict:
        rendered = render(spec.params, context, spec.params_loc)
        params = {}
        for name, param in step.params.items():
            if name in rendered:
                value = rendered[name]
                if not _contains_unknown(value):
                    check_value(name, param, value, spec.params_loc.child(name))
                params[name] = value
            else:
                params[name] = copy.deepcopy(param.default)
        return params

    def _attempts(self, step, run: TargetRun, spec: StepSpec, params: dict) -> StepOutcome:
        attempts = spec.retries + 1
        outcome = StepOutcome(status="failed", message="not run")
        for attempt in range(1, attempts + 1):
            ctx = StepContext(self, run.target, spec, run.variables, timeout=spec.timeout)
            outcome = self._attempt(step, ctx, params)
            if not outcome.failed or attempt == attempts:
                break
            self.reporter.step_progress(run.target.name, spec,
                                        f"attempt {attempt}/{attempts} failed: {outcome.message}; "
                                        f"retrying in {spec.retry_delay:g} s")
            time.sleep(spec.retry_delay)
        if outcome.failed and outcome.verdict == "usage":
            run.usage_error = True
            outcome.verdict = "failed"
        return outcome

    def _attempt(self, step, ctx: StepContext, params: dict) -> StepOutcome:
        try:
            return step.run(ctx, params)
        except StepFailed as failure:
            return StepOutcome(status="failed", message=failure.message, data=failure.data,
                               verdict=failure.verdict, findings=failure.findings)
        except (ConnectionProblem, RunUnreachable) as error:
            return StepOutcome(status="failed", message=str(error), verdict="unreachable")
        except ConfigError as error:
            return StepOutcome(status="failed", message=str(error), verdict="usage")
        except OrchError as error:
            return StepOutcome(status="failed", message=str(error), verdict="failed")
        except Exception as error:  # noqa: BLE001 - a bug in a step must not leave the record open
            import traceback
            return StepOutcome(status="failed", verdict="failed",
                               message=f"internal error in the {ctx.spec.kind} step: "
                                       f"{type(error).__name__}: {error} (please report it)",
                               data={"traceback": traceback.format_exc()})

    def _usage_failure(self, run: TargetRun, spec: StepSpec, error: ConfigError) -> None:
        run.usage_error = True
        run.verdict = "failed"
        run.failed_step = spec.label()
        result = StepResult(name=spec.label(), kind=spec.kind, target=run.target.name,
                            status="failed", started_at=_stamp(), message=str(error))
        if not self.dry_run:
            self._save_step(result)
        self.reporter.step_finished(run.target.name, spec, result,
                                    StepOutcome(status="failed", message=str(error)))

    # ------------------------------------------------------- what steps report back
    def target_info(self, name: str) -> Optional[TargetInfo]:
        return self._infos.get(name)

    def save_targets(self) -> None:
        self._update()

    def launch_info(self, target: str) -> Optional[dict]:
        return self._launches.get(target)

    def note_launch(self, target: str, launch: dict) -> None:
        with self._lock:
            self._launches[target] = launch
            if self.record is not None:
                self.record.launch.setdefault("targets", {})[target] = json_safe(launch)
        self._update()

    def note_monitor(self, target: str, step_index: int, settings: dict) -> None:
        with self._lock:
            if self.record is not None:
                entry = self.record.launch.setdefault("targets", {}).setdefault(target, {})
                entry["monitor"] = json_safe(settings)
                entry["monitor_step"] = step_index
        self._update()

    def note_monitor_result(self, target: str, summary: dict) -> None:
        with self._lock:
            self._monitor_results[target] = summary
            if self.record is not None:
                self.record.summary = self._summary_partial()
        self._update()

    def monitor_result(self, target: str) -> Optional[dict]:
        return self._monitor_results.get(target)

    def _summary_partial(self) -> dict:
        return json_safe({"monitor": dict(self._monitor_results)})

    def note_artifacts(self, directory: str) -> None:
        with self._lock:
            if self.record is not None:
                self.record.artifacts_dir = directory
        self._update()

    def monitor_sink(self):
        return _Sink(self)

    def _update(self) -> None:
        if self.dry_run or self.store is None or self.record is None:
            return
        with self._lock:
            self.store.update(self.record)

    def _save_step(self, result: StepResult) -> None:
        self._keep("steps", [result], lambda store: store.save_step(self.run_id, result))

    def _add_findings(self, findings: list[Finding]) -> None:
        self._keep("findings", findings, lambda store: store.add_findings(self.run_id, findings))

    def add_metrics(self, points: list[MetricPoint]) -> None:
        self._keep("metrics", points, lambda store: store.add_metrics(self.run_id, points))

    def _keep(self, field: str, items: list, save) -> None:
        """Add items to the record's list `field` and, for a real run, to the store."""
        with self._lock:
            if self.record is not None:
                getattr(self.record, field).extend(items)
            if self.store is not None and not self.dry_run:
                save(self.store)


class _Sink:
    """The monitor's reports, to the console and the store."""

    def __init__(self, runner: Runner):
        self.runner = runner

    def log_line(self, target: str, line: str) -> None:
        self.runner.reporter.log_line(target, line)

    def progress(self, target: str, classifier, status: dict) -> None:
        self.runner.reporter.monitor_progress(target, classifier, status)

    def note(self, target: str, text: str, level: str = "info") -> None:
        self.runner.reporter.note(target, text, level)

    def metrics(self, target: str, points: list) -> None:
        self.runner.add_metrics(points)


class _ExtraSource:
    """Stands in for a YAML source for -e values (their errors name the -e option)."""

    def __init__(self, name: str, value):
        self.filename = f"-e {name}"
        self.data = value

    def where(self, path, key=False) -> str:
        return self.filename

    def error(self, path, message, key=False, hint=None):
        return ConfigError(f"{self.filename}: {message}", hint=hint)


def _contains_unknown(value) -> bool:
    if isinstance(value, Unknown):
        return True
    if isinstance(value, dict):
        return any(_contains_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_contains_unknown(v) for v in value)
    return False


def _trim(data: dict, limit: int = 20000) -> dict:
    """Step data for the record: long strings cut (the full output is in the collected files)."""
    def cut(value):
        if isinstance(value, str) and len(value) > limit:
            return value[:limit] + f"... [{len(value) - limit} more characters]"
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        if isinstance(value, list):
            return [cut(v) for v in value[:500]]
        return value
    return cut(dict(data or {}))


# ------------------------------------------------------------------- entry points
def normalize_extra_vars(extra_vars) -> dict:
    """-e values: a list of "k=v" as typed (values read as YAML), or a dict already parsed."""
    if extra_vars is None:
        return {}
    if isinstance(extra_vars, dict):
        return dict(extra_vars)
    return parse_extra_vars(list(extra_vars))


def _fleet_for(record: RunRecord, app):
    """The inventory a recorded run was started with, unless the user named one with -i."""
    recorded = (record.launch or {}).get("inventory")
    if getattr(app, "inventory_option", None) is None and recorded and os.path.exists(recorded):
        return Fleet.from_path(recorded, trust_on_first_use=getattr(app, "trust_on_first_use", False))
    return app.fleet


def run_playbook(playbook: str, *, targets=(), extra_vars=None, app=None, reporter=None,
                 store=None, dry_run: bool = False, fleet: Optional[Fleet] = None) -> RunRecord:
    """Load, check and run a playbook; the one entry point for `orch run` and `orch nightly`."""
    from orchestrator.runs.store import RunStore
    from orchestrator.run_console import ConsoleReporter
    extra = normalize_extra_vars(extra_vars)
    book = load_playbook(playbook, extra)
    fleet = fleet or app.fleet
    own_store = store is None and not dry_run
    store = store if store is not None else (None if dry_run else RunStore())
    reporter = reporter or ConsoleReporter()
    cli = cli_prefix(app)
    try:
        runner = Runner(book, fleet, reporter=reporter, store=store, extra_vars=extra,
                        target_names=list(targets), dry_run=dry_run, cli=cli, playbook_arg=playbook)
        runner.rerun_args = rerun_options(targets, extra_vars)
        return runner.run()
    finally:
        if own_store and store is not None:
            store.close()


def rerun_options(targets, extra_vars) -> str:
    """The -t and -e options of this run, quoted for a shell, for remediation hints."""
    import shlex
    words: list[str] = []
    for name in targets or ():
        words += ["-t", name]
    if isinstance(extra_vars, dict):
        items = [f"{k}={v}" for k, v in extra_vars.items()]
    else:
        items = list(extra_vars or ())
    for item in items:
        words += ["-e", item]
    return shlex.join(words)


def cli_prefix(app) -> str:
    """How the user called orch, for remediation commands they can paste (`orch -i sandbox`)."""
    option = getattr(app, "inventory_option", None)
    return f"orch -i {option}" if option else "orch"


# ------------------------------------------------------------------ attach and stop
def _stub_playbook(record: RunRecord) -> Playbook:
    return Playbook(path=record.playbook, name=record.name, description="", targets=[],
                    targets_loc=None, vars={}, var_locs={}, steps=[],
                    sha256=record.playbook_sha256)


def _recorded_playbook(record: RunRecord) -> tuple[Playbook, bool]:
    """The run's playbook when it is still there unchanged (its later steps can run)."""
    try:
        book = load_playbook(record.playbook)
    except OrchError:
        return _stub_playbook(record), False
    return book, book.sha256 == record.playbook_sha256


def controller_alive(record: RunRecord) -> bool:
    """Is the orch process that runs this record still alive (on this machine)?"""
    controller = (record.launch or {}).get("controller") or {}
    pid = controller.get("pid")
    if not pid or controller.get("host") != socket.gethostname() or pid == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"orch" in handle.read()
    except OSError:
        return True


def attach_run(ref: str, *, app, reporter=None, store=None, fleet: Optional[Fleet] = None) -> RunRecord:
    """Follow a launched run again (after a killed controller, a closed laptop, Ctrl-C):
    monitor it to its end, run the playbook's collect steps after it, record the verdict."""
    from orchestrator.monitor import MonitorSettings
    from orchestrator.runs.store import RunStore
    from orchestrator.run_console import ConsoleReporter
    from orchestrator.steps.monitor import monitor_run
    own_store = store is None
    store = store or RunStore()
    reporter = reporter or ConsoleReporter()
    try:
        record = store.get(ref)
        launches = (record.launch or {}).get("targets") or {}
        launches = {name: entry for name, entry in launches.items() if entry.get("run_dir")}
        if not launches:
            raise OrchError(f"run {record.run_id} launched nothing to attach to",
                            hint=f"`orch runs show {record.run_id}` shows what it did")
        fleet = fleet or _fleet_for(record, app)
        book, same = _recorded_playbook(record)
        runner = Runner(book, fleet, reporter=reporter, store=store, run_id=record.run_id,
                        cli=(record.launch or {}).get("cli") or cli_prefix(app),
                        playbook_arg=os.path.relpath(record.playbook) if record.playbook else None)
        was_running = record.verdict == "running"
        if not was_running:
            runner.store = None  # replay only: a finished record is not rewritten
        runner.record = record
        for info in record.targets:
            runner._infos[info.name] = info
        runner._launches = {name: dict(entry) for name, entry in launches.items()}
        if was_running:
            record.launch["controller"] = {"pid": os.getpid(), "host": socket.gethostname(),
                                           "started": time.time(), "attached": True}
            runner._update()
        targets = [fleet.target(spec) for spec in fleet.inventory.resolve(list(launches))]
        reporter.run_started(runner, targets)
        if not same and book.steps:
            reporter.note("attach", f"{record.playbook} changed since the run started: only the "
                               "monitor runs, not its later steps", "warn")

        def follow(target: Target) -> TargetRun:
            entry = launches[target.name]
            variables = runner.render_vars(target) if same else {**runner.base_context(target), **record.vars}
            run = TargetRun(target, variables)
            settings = MonitorSettings.from_params(entry.get("monitor") or {})
            settings.offset = 0  # read it all again: metrics and signatures need the whole log
            spec = _attach_spec(book, entry)
            started, stamp = time.monotonic(), _stamp()
            reporter.step_started(target.name, spec)
            try:
                outcome = monitor_run(runner, target, entry["run_dir"], settings)
            except (ConnectionProblem, RunUnreachable) as error:
                outcome = StepOutcome(status="failed", message=str(error), verdict="unreachable")
            except OrchError as error:
                outcome = StepOutcome(status="failed", message=str(error), verdict="failed")
            result = StepResult(name="attach: " + spec.label(), kind="monitor", target=target.name,
                                status=outcome.status, started_at=stamp,
                                duration_s=round(time.monotonic() - started, 3),
                                message=outcome.message, data=json_safe(_trim(outcome.data)))
            runner._save_step(result)
            if outcome.findings and was_running:
                runner._add_findings(outcome.findings)
            elif outcome.findings:
                record.findings = [f for f in record.findings if f.target != target.name] + outcome.findings
            reporter.step_finished(target.name, spec, result, outcome)
            run.monitor_verdict = outcome.verdict
            if outcome.verdict == "unreachable":
                run.verdict = "unreachable"
            if same and was_running:
                after = entry.get("monitor_step", entry.get("step", -1))
                for later in book.steps:
                    if later.index > after and later.kind == "collect":
                        runner._run_step(run, later)
            return run

        runs = each_concurrently(targets, follow)
        runs = [r if isinstance(r, TargetRun) else _failed_run(t, r) for t, r in zip(targets, runs)]
        if not was_running:
            reporter.note("attach", f"run {record.run_id} had already ended as {record.verdict}; "
                               "its record is left as it was", "info")
            record.verdict = worst(r.final_verdict() for r in runs)
            record.exit_code = exit_code_for(record.verdict)
            reporter.run_finished(runner, record, runs)
            return record
        return runner._finish(runs)
    finally:
        if own_store:
            store.close()


def _attach_spec(book: Playbook, entry: dict) -> StepSpec:
    index = entry.get("monitor_step")
    for spec in book.steps:
        if spec.index == index and spec.kind == "monitor":
            return spec
    loc = Loc(_ExtraSource("attach", None), ())
    return StepSpec(index=index if isinstance(index, int) else 0, kind="monitor", name="monitor",
                    params={}, loc=loc, params_loc=loc)


def _failed_run(target: Target, error) -> TargetRun:
    run = TargetRun(target, {})
    run.verdict = "unreachable" if isinstance(error, ConnectionProblem) else "failed"
    return run


def stop_recorded_run(ref: str, *, app, grace: float = 10.0, target_names=(), store=None,
                      fleet: Optional[Fleet] = None) -> tuple[RunRecord, list[dict]]:
    """SIGTERM the run's process groups (SIGKILL after grace); record it when no live orch
    is watching it (a watching orch records the verdict itself)."""
    from orchestrator.runs.store import RunStore
    own_store = store is None
    store = store or RunStore()
    try:
        record = store.get(ref)
        launches = {n: e for n, e in ((record.launch or {}).get("targets") or {}).items() if e.get("run_dir")}
        if target_names:
            launches = {n: e for n, e in launches.items() if n in target_names}
        if not launches:
            raise OrchError(f"run {record.run_id} has no launched process to stop"
                            + (f" on {', '.join(target_names)}" if target_names else ""))
        fleet = fleet or _fleet_for(record, app)
        targets = [fleet.target(spec) for spec in fleet.inventory.resolve(list(launches))]
        outcomes = each_concurrently(targets, lambda t: stop_run(t, launches[t.name]["run_dir"], grace))
        results = []
        for target, outcome in zip(targets, outcomes):
            if isinstance(outcome, OrchError):
                results.append({"target": target.name, "error": str(outcome)})
            else:
                results.append({"target": target.name, **{k: v for k, v in outcome.items() if k != "event"}})
        if record.verdict == "running" and not controller_alive(record) and \
                not any("error" in r for r in results):
            record.verdict = "killed"
            record.exit_code = exit_code_for("killed")
            record.ended_at = now_iso()
            finding = Finding(target=",".join(launches), signature="killed",
                              message="stopped with `orch stop` while no orch was watching it")
            store.add_findings(record.run_id, [finding])
            store.finish(record)
        return record, results
    finally:
        if own_store:
            store.close()
