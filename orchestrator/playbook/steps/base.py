"""What every step kind shares: its parameter schema, its context, and its outcome.

A step kind is a small class with `params` (the schema the loader and the validator check,
with file:line:col), `plan()` (what --dry-run prints: the rendered commands, nothing
touched) and `run()` (does the work on one target and returns a StepOutcome).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Protocol

from orchestrator.config.schema import Param
from orchestrator.config.yamlsrc import Loc
from orchestrator.ground.verdicts import FAILED
from orchestrator.playbook.model import Playbook, StepSpec
from orchestrator.watch.monitor import MonitorReporter
from orchestrator.remote.base import LineSplitter
from orchestrator.runs.model import Finding, RunRecord
from orchestrator.runs.recorder import RunRecorder

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.config.inventory import Inventory
    from orchestrator.targets.fleet import Fleet
    from orchestrator.remote.container import Target


@dataclass
class StepOutcome:
    status: str = "ok"                  # ok | changed | failed | skipped
    message: str = ""
    data: dict = field(default_factory=dict)
    verdict: Optional[str] = None       # a monitor's classification, or why a step failed
    findings: list[Finding] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status == "failed"


class StepFailed(Exception):
    """Raised inside a step to end it as failed with a sentence (and maybe a verdict)."""

    def __init__(self, message: str, *, verdict: str = FAILED, data: Optional[dict] = None,
                 findings: Optional[list] = None):
        super().__init__(message)
        self.message = message
        self.verdict = verdict
        self.data = data or {}
        self.findings = list(findings or [])


@dataclass
class RunInfo:
    """What a run is, for its steps and its console: id, playbook, mode, how to name orch in
    hints, the recorder that keeps what it learns, and the inventory (hosts' API settings)."""

    run_id: str
    playbook: Playbook
    recorder: RunRecorder
    playbook_arg: str = ""               # the playbook as the user typed it
    dry_run: bool = False
    cli: str = "orch"                    # `orch -i sandbox`: the prefix of commands in hints
    rerun_args: str = ""                 # the -t/-e options as typed, for "rerun with" hints
    inventory: Optional["Inventory"] = None
    fleet: Optional["Fleet"] = None      # the open hosts (a container's address from the Proxmox API)

    def monitor_result(self, target: str) -> Optional[dict]:
        return self.recorder.monitor_result(target)

    def rerun_hint(self) -> str:
        """The playbook and options a remediation's rerun command repeats."""
        return " ".join(part for part in (self.playbook_arg, self.rerun_args) if part)


def rerun_options(targets, extra_vars) -> str:
    """The -t and -e options of this run, quoted for a shell, for remediation hints."""
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


def cli_prefix(inventory_option: Optional[str]) -> str:
    """How the user called orch, for remediation commands they can paste (`orch -i sandbox`)."""
    return f"orch -i {inventory_option}" if inventory_option else "orch"


class Reporter(MonitorReporter, Protocol):
    """Everything the engine, the steps and the monitor tell the console about a run."""

    def run_started(self, run: RunInfo, targets: list) -> None: ...
    def step_started(self, target: str, spec: StepSpec) -> None: ...
    def step_plan(self, target: str, spec: StepSpec, lines: list[str]) -> None: ...
    def step_progress(self, target: str, spec: StepSpec, text: str) -> None: ...
    def step_output(self, target: str, spec: StepSpec, line: str, stream: str) -> None: ...
    def step_skipped(self, target: str, spec: StepSpec, why: str) -> None: ...
    def step_finished(self, target: str, spec: StepSpec, result, outcome: "StepOutcome") -> None: ...
    def interrupted(self, run: RunInfo, launched: Optional[dict] = None) -> None: ...
    def run_finished(self, run: RunInfo, record: RunRecord, runs: list) -> None: ...


@dataclass
class StepContext:
    """Everything a step may use on one target."""

    run: RunInfo
    reporter: Reporter
    target: "Target"
    spec: StepSpec
    variables: dict                      # the template context for this target
    timeout: Optional[float] = None      # the step's own `timeout:`, if any
    started: float = field(default_factory=time.monotonic)
    # A step that spans the run's targets (spans_nodes): every target, in node-rank order;
    # `target` is the first of them. Empty for a step on one target.
    nodes: list = field(default_factory=list)

    @property
    def recorder(self) -> RunRecorder:
        return self.run.recorder

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def dry_run(self) -> bool:
        return self.run.dry_run

    @property
    def info(self):
        return self.recorder.target_info(self.target.name)

    def remaining(self, default: Optional[float]) -> Optional[float]:
        """The timeout for one remote call: the step's limit minus what it has used."""
        if self.timeout is None:
            return default
        left = max(1.0, self.timeout - (time.monotonic() - self.started))
        return left if default is None else min(default, left)

    def progress(self, text: str) -> None:
        self.reporter.step_progress(self.target.name, self.spec, text)

    def output(self, line: str, stream: str = "stdout") -> None:
        self.reporter.step_output(self.target.name, self.spec, line, stream)

    def python(self) -> str:
        """The target's venv python, with ~ left alone in dry runs (expanding asks the target)."""
        if self.dry_run:
            venv = self.target.venv
            return venv.rstrip("/") + "/bin/python" if venv else "python3"
        return self.target.python()


class Step:
    """A step kind. What the engine, the loader and attach need to know about a kind beyond
    running it is declared here, with the common answer, and overridden in the kind's own
    module: they never ask which kind a step is."""

    kind: str = ""
    summary: str = ""
    params: dict[str, Param] = {}
    shorthand: Optional[str] = None      # `- shell: [argv]` means `- shell: {argv: [...]}`
    # Its verdict judges the run (monitor): kept with the step's record and as the target's
    # verdict unless a step fails later. Other kinds' verdicts only say why they failed.
    judges_run: bool = False
    # `orch attach` runs it after following a launched run to its end (collect: the logs).
    runs_on_attach: bool = False

    def check(self, params: dict, loc: Loc) -> None:
        """Extra load-time checks of literal values (the schema checks types already)."""

    def check_loaded(self, playbook: Playbook, spec: StepSpec) -> None:
        """Load-time checks that need the whole playbook (push: its files, found from the
        playbook's directory, which `extends` makes the extending file's)."""

    def spans_nodes(self, playbook: Playbook, spec: StepSpec) -> bool:
        """Whether the step runs once for all of the run's targets, as the nodes of one job
        (a launch over many nodes, its monitor), after each target finished the steps before
        it; the engine gives it ctx.nodes. The common answer: once per target."""
        return False

    def check_nodes(self, spec: StepSpec, nodes: list[str]) -> None:
        """For a step that spans the run's targets: raise ConfigError (at its file:line) when
        the targets do not fit it (a fixed nnodes and another number of targets). The
        engine asks before anything runs."""

    def reattach(self, launch: dict) -> Optional["Step"]:
        """For `orch attach`: the step that follows this recorded launch again, from what the
        record holds (its run dir, its monitor settings); None: this kind does not follow one."""
        return None

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        return [f"{self.kind} {params}"]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:  # pragma: no cover
        raise NotImplementedError


def line_callback(ctx: StepContext, stream: str = "stdout") -> Callable[[bytes], None]:
    """Bytes from a remote command -> whole lines on the console, live."""
    splitter = LineSplitter(lambda line: ctx.output(line, stream))
    return splitter.feed
