"""What every step kind shares: its parameter schema, its context, and its outcome.

A step kind is a small class with `params` (the schema the loader and the validator check,
with file:line:col), `plan()` (what --dry-run prints: the rendered commands, nothing
touched) and `run()` (does the work on one target and returns a StepOutcome).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from orchestrator.config.schema import type_name
from orchestrator.playbook.render import Loc, is_template
from orchestrator.runs.model import Finding

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.remote.container import Target
    from orchestrator.runner import Runner


@dataclass(frozen=True)
class Param:
    types: tuple
    required: bool = False
    default: Any = None
    choices: tuple = ()
    items: Optional[tuple] = None      # for lists: the type of each item
    doc: str = ""


def check_value(name: str, param: Param, value: Any, loc: Loc) -> Any:
    """Type-check one parameter value (a literal at load time, a rendered one at run time)."""
    if value is None and not param.required:
        return value
    types = param.types
    if float in types and int not in types:
        types = types + (int,)
    wrong_bool = isinstance(value, bool) and bool not in types
    if wrong_bool or not isinstance(value, types):
        shown = "null" if value is None else repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        raise loc.error(f"{name} must be {type_name(param.types)}, not {shown}")
    if param.choices and value not in param.choices:
        raise loc.error(f"{name} must be one of {', '.join(map(str, param.choices))}, "
                        f"not {value!r}")
    if isinstance(value, list) and param.items:
        for index, item in enumerate(value):
            if is_template(item):
                continue
            if isinstance(item, bool) and bool not in param.items or not isinstance(item, param.items):
                raise loc.child(index).error(
                    f"each item of {name} must be {type_name(param.items)}, not {item!r}")
    return value


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

    def __init__(self, message: str, *, verdict: str = "failed", data: Optional[dict] = None,
                 findings: Optional[list] = None):
        super().__init__(message)
        self.message = message
        self.verdict = verdict
        self.data = data or {}
        self.findings = list(findings or [])


@dataclass
class StepContext:
    """Everything a step may use on one target."""

    runner: "Runner"
    target: "Target"
    spec: Any                            # playbook.model.StepSpec
    variables: dict                      # the template context for this target
    timeout: Optional[float] = None      # the step's own `timeout:`, if any
    started: float = field(default_factory=time.monotonic)

    @property
    def record(self):
        return self.runner.record

    @property
    def dry_run(self) -> bool:
        return self.runner.dry_run

    @property
    def info(self):
        return self.runner.target_info(self.target.name)

    def remaining(self, default: Optional[float]) -> Optional[float]:
        """The timeout for one remote call: the step's limit minus what it has used."""
        if self.timeout is None:
            return default
        left = max(1.0, self.timeout - (time.monotonic() - self.started))
        return left if default is None else min(default, left)

    def progress(self, text: str) -> None:
        self.runner.reporter.step_progress(self.target.name, self.spec, text)

    def output(self, line: str, stream: str = "stdout") -> None:
        self.runner.reporter.step_output(self.target.name, self.spec, line, stream)

    def python(self) -> str:
        """The target's venv python, with ~ left alone in dry runs (expanding asks the target)."""
        if self.dry_run:
            venv = self.target.venv
            return venv.rstrip("/") + "/bin/python" if venv else "python3"
        return self.target.python()


class Step:
    kind: str = ""
    summary: str = ""
    params: dict[str, Param] = {}
    shorthand: Optional[str] = None      # `- shell: [argv]` means `- shell: {argv: [...]}`

    def check(self, params: dict, loc: Loc) -> None:
        """Extra load-time checks of literal values (the schema checks types already)."""

    def plan(self, ctx: StepContext, params: dict) -> list[str]:
        return [f"{self.kind} {params}"]

    def run(self, ctx: StepContext, params: dict) -> StepOutcome:  # pragma: no cover
        raise NotImplementedError


def line_callback(ctx: StepContext, stream: str = "stdout") -> Callable[[bytes], None]:
    """Bytes from a remote command -> whole lines on the console, live."""
    from orchestrator.remote.base import LineSplitter
    splitter = LineSplitter(lambda line: ctx.output(line, stream))
    return splitter.feed
