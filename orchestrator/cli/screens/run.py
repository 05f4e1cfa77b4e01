"""What `orch run` shows: step lines, live per-drafter progress (rich), the verdict.

A step's own output (pip's hundreds of lines, a shell script's) is summarised: on a
terminal a line per running step, updated in place (what it does, its last line, how many
lines); elsewhere a plain line every NOTE_EVERY_S at most. Every line goes to the step's log
in the run's folder (steps/<n>-<kind>-<target>.log), whose path is shown when the step ends;
a step that printed at most SHOWN_LINES, or failed, shows its last SHOWN_LINES then.
verbose=True (`orch run -v`) prints every line as it comes instead.

On a terminal the monitor shows a live table (step, loss, tok/s per drafter) and prints
only the log lines that are not metric lines; elsewhere (CI, a pipe) every log line is
printed as `TARGET | line`, so a log can be read back exactly. With --json all of this
goes to stderr and stdout carries one JSON document at the end.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.ground.console import escape, make_console
from orchestrator.cli.screens.steplog import StepLog, step_log_path
from orchestrator.ground.verdicts import DEGRADED, HANG, OK, RECOMPILE_LIMIT, rule


STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "skipped": "dim"}
TONE_STYLE = {"ok": "bold green", "warn": "bold yellow"}   # a verdict's tone: ground/verdicts.py
SHOWN_LINES = 25      # a step's output shown when it ends: all of a short one, a failed one's last
NOTE_EVERY_S = 15.0   # not on a terminal: at most one "so far" line per step this often
SHOWN_WIDTH = 300     # a shown line is cut here (the log keeps it whole)


@dataclass
class StepView:
    """What the console knows of one running step: its log, its line count, its last lines
    and last progress text (for the live line), when it last said how far it got."""

    where: str
    log: Optional[StepLog]
    started: float
    noted: float
    lines: int = 0
    progress: str = ""
    last: str = ""                      # the last line that is not blank
    recent: deque = field(default_factory=lambda: deque(maxlen=SHOWN_LINES))

    def live_line(self, now: float) -> Text:
        """`  sb1-200 2/5 bootstrap  (212 lines, 31 s)  pip: installing 37 packages  <last line>`,
        cut at the terminal's width."""
        counted = f"{self.lines} lines, " if self.lines else ""
        text = Text.from_markup(f"  {self.where}", end="")
        text.append(f"  ({counted}{now - self.started:.0f} s)", style="dim")
        if self.progress:
            text.append(f"  {self.progress}")
        if self.last:
            text.append(f"  {self.last}", style="dim")
        text.no_wrap, text.overflow = True, "ellipsis"
        return text


class ConsoleReporter:
    def __init__(self, console: Optional[Console] = None, *, json_mode: bool = False,
                 live: Optional[bool] = None, echo: str = "auto", verbose: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self.json_mode = json_mode
        self.out = console or make_console(stderr=json_mode)
        self.live_enabled = self.out.is_terminal if live is None else live
        self.echo = echo
        self.verbose = verbose        # every line of a step's output, as it comes
        self.clock = clock            # for the live line's seconds and NOTE_EVERY_S
        # Two small locks, never held while calling into rich: rich's Live refreshes from its
        # own thread and calls _render(); holding a lock of ours across a print there would
        # deadlock against it (lock order inversion).
        self._state_lock = threading.Lock()   # self._monitors, self._steps
        self._live_lock = threading.Lock()    # starting/stopping the Live display
        self._monitors: dict[str, dict] = {}
        self._steps: dict[tuple, StepView] = {}   # (target, step index): the running ones
        self._live: Optional[Live] = None
        self._total_steps = 0
        self._run_id: Optional[str] = None        # where step logs go (none in a dry run)

    # ------------------------------------------------------------------- run
    def run_started(self, info, targets) -> None:
        self._total_steps = len(info.playbook.steps)
        self._run_id = None if info.dry_run else info.run_id
        mode = " (dry run: nothing is touched)" if info.dry_run else ""
        self._print(f"[bold]orch run[/] {escape(info.playbook.name)} "
                    f"({escape(info.playbook_arg)}){mode}\n"
                    f"  run {info.run_id}  targets: "
                    + ", ".join(escape(t.describe()) for t in targets))

    def _where(self, target: str, spec) -> str:
        return f"[cyan]{escape(target)}[/] {spec.index + 1}/{self._total_steps} [bold]{spec.kind}[/]" + \
            (f" {escape(spec.name)}" if spec.name else "")

    def step_started(self, target: str, spec) -> None:
        self._print(f"> {self._where(target, spec)}")
        self._view(target, spec)
        self._start_live()

    def step_plan(self, target: str, spec, lines: list[str]) -> None:
        extras = []
        if spec.when is not None:
            extras.append(f"when: {spec.when}")
        if spec.register:
            extras.append(f"register: {spec.register}")
        if spec.continue_on_error:
            extras.append("continue_on_error")
        if spec.always:
            extras.append("always")
        self._print(f"- {self._where(target, spec)}" + (f"  [dim]({escape('; '.join(extras))})[/]" if extras else ""))
        for line in lines:
            self._print(f"    {escape(line)}")

    def step_progress(self, target: str, spec, text: str) -> None:
        view = self._view(target, spec)
        with self._state_lock:
            view.progress = text
        self._print(f"  [dim]{escape(target)}: {escape(text)}[/]")

    def step_output(self, target: str, spec, line: str, stream: str) -> None:
        """Into the step's log; on the console every line with -v, else a summary."""
        view = self._view(target, spec)
        if view.log is not None:
            view.log.write(line)
        now = self.clock()
        with self._state_lock:
            view.lines += 1
            view.recent.append(line[:SHOWN_WIDTH])
            view.last = line.strip()[:SHOWN_WIDTH] or view.last
            note = not self.verbose and not self.live_enabled and now - view.noted >= NOTE_EVERY_S
            if note:
                view.noted = now
        if self.verbose:
            self._print_output(target, line)
        elif note:
            self._print(f"  [dim]{view.where}: {view.lines} lines so far; last: "
                        f"{escape(view.last)}[/]")

    def _view(self, target: str, spec) -> StepView:
        """The running step's view, made when it starts (or on its first line, should a step
        speak before the console was told it started)."""
        key = (target, spec.index)
        with self._state_lock:
            view = self._steps.get(key)
            if view is None:
                log = None if self._run_id is None else StepLog(step_log_path(
                    self._run_id, spec.index + 1, spec.kind, target))
                now = self.clock()
                view = self._steps[key] = StepView(self._where(target, spec), log, now, now)
            return view

    def _print_output(self, target: str, line: str) -> None:
        self._print(f"  [dim]{escape(target)} |[/] {escape(line)}")

    def _end_view(self, target: str, spec) -> Optional[StepView]:
        """The step's view, no longer running; its log closed; the Live display stopped
        when nothing else runs."""
        with self._state_lock:
            view = self._steps.pop((target, spec.index), None)
            idle = not self._steps and not self._monitors
        if idle:
            self._stop_live()
        if view is not None and view.log is not None:
            view.log.close()
        return view

    def _close_logs(self) -> None:
        """Steps cut short (Ctrl-C): their logs keep what came, tail included."""
        with self._state_lock:
            views, self._steps = list(self._steps.values()), {}
        for view in views:
            if view.log is not None:
                view.log.close()

    def _show_output(self, target: str, view: Optional[StepView], failed: bool) -> None:
        """A step's last lines, when it printed few or failed (-v printed them all)."""
        if view is None or self.verbose or not view.lines or \
                not (failed or view.lines <= SHOWN_LINES):
            return
        if view.lines > len(view.recent):
            self._print(f"  [dim]{escape(target)}: the last {len(view.recent)} of "
                        f"{view.lines} lines:[/]")
        for line in view.recent:
            self._print_output(target, line)

    def _show_log(self, view: Optional[StepView]) -> None:
        if view is None or not view.lines or view.log is None:
            return
        if view.log.error:
            self._print(f"    [yellow]output not kept[/]: {escape(view.log.error)}")
        else:
            self._print(f"    [dim]output: {view.lines} lines in {escape(view.log.path)}[/]")

    def step_skipped(self, target: str, spec, why: str) -> None:
        self._print(f"  [dim]{self._where(target, spec)}: skipped ({escape(why)})[/]")

    def step_finished(self, target: str, spec, result, outcome) -> None:
        view = self._end_view(target, spec)
        self._show_output(target, view, failed=result.status == "failed")
        style = STATUS_STYLE.get(result.status, "")
        self._print(f"  {self._where(target, spec)}: [{style}]{result.status}[/] "
                    f"{escape(result.message)} [dim]({result.duration_s:.1f} s)[/]")
        self._show_log(view)
        if result.status != "failed" or not outcome.findings:
            return
        if spec.kind == "monitor" and not spec.continue_on_error:
            return  # its diagnosis comes with the verdict, at the end
        for finding in outcome.findings:
            if finding.remediation:
                if spec.kind == "monitor":
                    self._print(f"    [bold]{escape(finding.signature)}[/]: {escape(finding.message)}")
                self._print(f"    [yellow]fix:[/] {escape(finding.remediation)}")

    def interrupted(self, info, launched: Optional[dict] = None) -> None:
        self._stop_live()
        self._close_logs()
        if not launched:
            self._print(f"[yellow]interrupted[/] before anything was launched: nothing runs on "
                        f"the targets; run {info.run_id} is recorded as interrupted.")
            return
        where = ", ".join(f"{name} ({run_dir})" for name, run_dir in sorted(launched.items()))
        self._print(f"[yellow]interrupted.[/] The launched run goes on: {escape(where)}; "
                    f"`{info.cli} attach {info.run_id}` follows it again, "
                    f"`{info.cli} stop {info.run_id}` stops it.")

    def run_finished(self, info, record, runs) -> None:
        self._stop_live()
        if info.dry_run:
            self._print("[dim]dry run: nothing was run, nothing recorded[/]")
            return
        style = TONE_STYLE.get(rule(record.verdict).tone, "bold red")
        self._print(f"\nverdict: [{style}]{record.verdict}[/] (exit {record.exit_code})")
        for run in runs:
            monitor = info.monitor_result(run.target.name) or {}
            line = f"  {escape(run.target.name)}: {run.final_verdict()}"
            if run.failed_step:
                line += f" (failed step: {escape(run.failed_step)})"
            if monitor.get("total_tok_s"):
                line += f", {monitor['total_tok_s']:,.0f} tok/s total"
            self._print(line)
        shown = set()
        verdicts = {run.target.name: run.final_verdict() for run in runs}
        for finding in record.findings:
            verdict = verdicts.get(finding.target, record.verdict)
            if verdict == OK or not finding.remediation or \
                    finding.signature not in (verdict, HANG, DEGRADED, RECOMPILE_LIMIT):
                continue
            key = (finding.target, finding.signature, finding.remediation)
            if key in shown:
                continue
            shown.add(key)
            self._print(f"  [bold]{escape(finding.signature)}[/] on {escape(finding.target)}: "
                        f"{escape(finding.message)}")
            for line in finding.evidence[:3]:
                self._print(f"    [dim]| {escape(line)}[/]")
            self._print(f"    [yellow]fix:[/] {escape(finding.remediation)}")
        self._print(f"record: `{info.cli} runs show {record.run_id}`"
                    + (f"; files: {escape(record.artifacts_dir)}" if record.artifacts_dir else ""))

    # --------------------------------------------------------------- monitor
    def monitor_started(self, target: str, run_dir: str, settings) -> None:
        with self._state_lock:
            self._monitors[target] = {"progress": None, "status": {}, "settings": settings,
                                      "started": time.monotonic(), "run_dir": run_dir}
        self._print(f"  [dim]{escape(target)}: following {escape(run_dir)}/output.log[/]")
        self._start_live()

    def monitor_ended(self, target: str) -> None:
        with self._state_lock:
            state = self._monitors.pop(target, None)
            others = bool(self._monitors or self._steps)
        if not others:
            self._stop_live()
        if state and state.get("progress") is not None:
            self._print_table({target: state})

    def _start_live(self) -> None:
        """On a terminal: the running steps' lines and the monitors' table, redrawn in place."""
        if not self.live_enabled:
            return
        with self._live_lock:
            if self._live is None:
                self._live = Live(console=self.out, refresh_per_second=4, transient=True,
                                  get_renderable=self._render)
                self._live.start()

    def _stop_live(self) -> None:
        with self._live_lock:
            live, self._live = self._live, None
        if live is not None:
            live.stop()

    def monitor_progress(self, target: str, snapshot, status: dict) -> None:
        """snapshot: a frozen ProgressSnapshot (watch/classify.py), never the live classifier."""
        with self._state_lock:
            state = self._monitors.get(target)
            if state is not None:
                state["progress"] = snapshot
                if status:
                    state["status"] = status

    def log_line(self, target: str, line: str) -> None:
        if self.echo == "none":
            return
        if self.echo == "events" or (self.live_enabled and self.echo == "auto"):
            with self._state_lock:
                state = self._monitors.get(target)
                progress = state and state.get("progress")
            if progress is not None and progress.is_metric_line(line):
                return  # the table shows it
        # Console.out: no markup, no emoji codes, no wrapping: the line as the log has it.
        self.out.out(f"{target} | {line}", highlight=False)

    def note(self, target: str, text: str, level: str = "info") -> None:
        style = {"warn": "yellow", "error": "bold red"}.get(level, "dim")
        self._print(f"  [{style}]{escape(target)}: {escape(text)}[/]")

    def _render(self):
        now = self.clock()
        with self._state_lock:
            monitors = {name: dict(state) for name, state in self._monitors.items()}
            steps = [view.live_line(now) for view in self._steps.values()]
        return Group(*steps, self._table(monitors)) if monitors else Group(*steps)

    def _print_table(self, monitors: dict) -> None:
        if self.live_enabled:
            self.out.print(self._table(monitors))

    def _table(self, monitors: dict):
        table = Table(show_edge=False, header_style="bold", box=None, pad_edge=False)
        words = {getattr(state.get("progress"), "worker_word", "drafter") for state in monitors.values()}
        worker = "rank" if words == {"rank"} else "drafter" if words <= {"drafter"} else "worker"
        for column in ("target", worker, "step", "loss", "tok/s", "state"):
            table.add_column(column, justify="right" if column in ("step", "loss", "tok/s") else "left")
        footer = []
        for target, state in monitors.items():
            progress = state.get("progress")
            status = state.get("status") or {}
            settings = state.get("settings")
            if progress is None:
                table.add_row(target, "-", "-", "-", "-", "waiting for the first line")
                continue
            if progress.metric_note and not progress.workers:
                table.add_row(target, "-", "-", "-", "-", progress.metric_note)
            for one in progress.workers:
                table.add_row(target, str(one.worker), one.step_label,
                              "-" if one.loss is None else f"{one.loss:.4f}",
                              "-" if one.tok_s is None else f"{one.tok_s:,.0f}",
                              Text(one.status if not one.error else f"ERROR {one.error[:60]}",
                                   style="red" if one.error else ""))
            total = progress.live_tok_s()
            bits = [f"{target}: {status.get('state', '?')}"]
            if total:
                bits.append(f"total {total:,.0f} tok/s")
            if settings is not None and getattr(settings, "expected_tok_s", None):
                bits.append(f"expected ~{settings.expected_tok_s:,.0f}")
            silent = progress.silent_for(time.monotonic())
            if silent > 10 and settings is not None:
                bits.append(f"no progress for {silent:.0f} s (hang at {settings.hang_after:g} s)")
            gpus = status.get("gpus")
            if gpus:
                bits.append("GPU " + " ".join(f"{g['index']}:{g.get('utilization_pct') or 0:.0f}%" for g in gpus))
            footer.append(" | ".join(bits))
        return Group(table, Text("\n".join(footer), style="dim"))

    # ----------------------------------------------------------------- output
    def _print(self, text: str) -> None:
        self.out.print(text, highlight=False)  # rich's console serialises its own writes
