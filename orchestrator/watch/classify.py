"""Reading a training log: metric lines, failure signatures, and the run's verdict.

Pure functions and small state machines, no I/O: the monitor feeds lines and the process
state in, gets metric points, live per-worker progress and, at the end, a verdict with
findings and remediations out. Liveness comes from output until a step is recognised, from
steps after; a failure signature decides the verdict only when the run ended badly (else it
is a warning in the summary). What decides the verdict is the verdict table
(ground/verdicts.py): the classifier gathers its Evidence. The DFlash stand-in trainer's own
lines (`drafter=N done ...`, `start ...`, `summary ...`) and the advice that fits only its
threads are in dflash.py.
"""

from __future__ import annotations

import re
import signal as signals
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from orchestrator.ground import verdicts
from orchestrator.ground.fx_states import THREAD_LOCAL
from orchestrator.ground.verdicts import (COLLECTIVE_TIMEOUT, CUDA_OOM, DEGRADED, FAILED, FIRST_COMPILE_HANG,
                                          FX_NODE_META, FX_RACE, FX_TRACE_PATCHER, HANG,
                                          KILLED, NCCL_ERROR, NCCL_WARN, NONZERO_EXIT, OK, RANK_FAILED,
                                          RECOMPILE_LIMIT, RENDEZVOUS_RETRY, RENDEZVOUS_TIMEOUT, STUCK_RANK,
                                          TIMEOUT, TRACEBACK, WORKER_ERROR, Evidence, remedy)
from orchestrator.watch import causes, dflash, stacks, tracebacks
from orchestrator.watch.dflash import first_compile_remediation, fx_remediation, fx_state_finding
from orchestrator.watch.distributed import (ChildFailedReader, handled_signal, rank_failure_remediation,
                                            signal_name, stuck_message)
from orchestrator.watch.logformats import DEFAULT_METRIC_REGEX, MAX_WORKERS, LogPoint, WorkerCap
from orchestrator.runs.model import Finding, MetricPoint, RunState, WorkerSummary

_KEYVALUES = re.compile(r"(\w+)=(\S+)")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)\b:?.*")

EVIDENCE_LINES = 5
TAIL_LINES = 40
# What a seen signature is called in a run that ended well: a warning in the record.
WARNINGS = {s.name: s.warning for s in verdicts.SIGNATURES if s.warning}
FX_OTHER_STATES = (FX_NODE_META, FX_TRACE_PATCHER)


@dataclass
class WorkerProgress:
    worker: int
    step: int = 0
    loss: Optional[float] = None
    tok_s: Optional[float] = None          # the latest rate (what the live view shows)
    rates: list = field(default_factory=list)  # post-warmup rates, for the final mean
    done: bool = False
    done_tok_s: Optional[float] = None
    error: Optional[str] = None
    last_seen: float = 0.0
    last_step_at: float = 0.0              # when its step last moved
    bar_step: Optional[int] = None         # the last progress bar's count
    final: Optional[str] = None            # its status once the run ended (done, stopped, failed)
    counted: bool = False                  # its points carry no step number: step is their count

    @property
    def status(self) -> str:
        return "failed" if self.error else "done" if self.done else self.final or "running"

    def throughput(self) -> Optional[float]:
        if self.done_tok_s:
            return self.done_tok_s
        if self.rates:
            return sum(self.rates) / len(self.rates)
        return None


@dataclass(frozen=True)
class WorkerSnapshot:
    """One worker's progress at one moment (a copy: reporters keep it while the run goes on)."""

    worker: int
    step: int
    loss: Optional[float]
    tok_s: Optional[float]          # its latest rate
    status: str                     # running | done | failed | stopped | ended
    error: Optional[str]
    warmed: bool                    # past its warmup steps: its rate counts in the live total
    counted: bool = False           # step is a count of log points: no step numbers were printed

    @property
    def step_label(self) -> str:
        """What the live view shows in its step column."""
        return f"{self.step} pts" if self.counted else str(self.step)


@dataclass(frozen=True)
class ProgressSnapshot:
    """A run's live progress, frozen: what reporters (the console's table, the MCP server's
    progress, records) read. The classifier itself belongs to the monitor's thread, which goes
    on changing it while they read."""

    target: str
    worker_word: str
    workers: tuple[WorkerSnapshot, ...]
    lines: int
    metric_note: Optional[str]
    silent_since: float             # the clock (monotonic) of the last sign of life
    metric_line: Callable[[str], bool] = field(repr=False, default=lambda line: False)

    def silent_for(self, now: float) -> float:
        return now - self.silent_since

    def is_metric_line(self, line: str) -> bool:
        """Whether the line carries a metric point (a live table shows those)."""
        return self.metric_line(line)

    def live_tok_s(self) -> Optional[float]:
        """The total of the workers past warmup (a compile step does not count)."""
        rates = [w.tok_s for w in self.workers if w.tok_s is not None and w.warmed]
        return sum(rates) if rates else None


@dataclass
class EndState:
    """How the process ended (or why the monitor stopped watching)."""

    state: str = RunState.EXITED          # a RunState (or a state this orch does not know)
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    stopped_for: Optional[str] = None     # hang | timeout | user (orch stop) | PEER_FAILED | None
    watch_ended: bool = False             # watch_for elapsed while it ran: left running
    hang_seconds: Optional[float] = None
    # the stacks orch took when it called the run hung, before stopping it:
    # {taken_at, results: [explain.Stacks as dicts], error}
    hang_stacks: Optional[dict] = None


PEER_FAILED = "node-failed"   # stopped_for of a node orch stopped because another node failed


@dataclass
class Verdict:
    verdict: str
    message: str
    findings: list[Finding]
    summary: dict


def compile_metric_regex(text: Optional[str]) -> re.Pattern:
    pattern = re.compile(text or DEFAULT_METRIC_REGEX)
    if "step" not in pattern.groupindex:
        raise ValueError("the metric regex needs a named group (?P<step>...)")
    return pattern


def _number(text: Optional[str]) -> Optional[float]:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class ClassifierSettings:
    """What the classifier is told before the first line: the playbook's monitor settings and
    the log format's. What it learns later it is told by a method (rank_logs_started,
    format_chosen), never by an attribute set from outside."""

    target: str
    metric_regex: Optional[str] = None
    hang_after: float = 120.0
    expected_tok_s: Optional[float] = None
    degraded_below: Optional[float] = None
    warmup_steps: int = 1
    expect_drafters: Optional[int] = None
    # False: a log format (logformats.py) reads the points and hands them to observe();
    # feed() then only looks for failures and the trainer's own words.
    metrics_from_lines: bool = True
    worker_word: Optional[str] = None           # the playbook's word for a worker, if it says
    rank_logs_expected: bool = False            # torchrun was asked for one log per rank
    metric_lines: Optional[Callable[[str], bool]] = field(default=None, repr=False)  # the format's test
    format_name: str = "orch"                   # the log format, as the record names it
    format_tried: str = ""                      # what `auto` looked for, for the note


class LogClassifier:
    """Feed it log lines as they come; ask it about progress; classify at the end."""

    def __init__(self, settings: ClassifierSettings, now: float = 0.0):
        self.settings = settings
        self.target = settings.target
        self.metric = compile_metric_regex(settings.metric_regex) if settings.metrics_from_lines else None
        self.hang_after = float(settings.hang_after)
        self.expected_tok_s = settings.expected_tok_s
        self.degraded_below = settings.degraded_below
        self.warmup_steps = settings.warmup_steps
        self.expect_drafters = settings.expect_drafters
        self.workers: dict[int, WorkerProgress] = {}
        self.start_fields: dict = {}
        self.summary_fields: dict = {}
        self.seen: dict[str, list[str]] = {}
        self.tail: deque = deque(maxlen=TAIL_LINES)
        self.last_progress = now
        self.lines = 0
        self.first_line_at: Optional[float] = None
        self.started_at = now
        self.child_failed = ChildFailedReader()     # torchrun's closing summary, if any
        self.tracebacks: dict[Optional[str], tracebacks.TracebackParser] = {}   # per log
        self.parsed: list[tracebacks.Traceback] = []   # those the parsers finished
        self.derived = False                        # tok/s computed by orch, not printed
        self.derived_from: set[str] = set()         # ... from what: step times, samples/s
        self.rates_from: set[str] = set()           # the printed fields tok/s came from (tps, ...)
        self.never_met = False                      # a hang before any step, ranks not connected
        self._last_points: dict[int, MetricPoint] = {}
        self.rank_logs_expected = settings.rank_logs_expected
        self.rank_logs_seen = False                 # ... and one appeared: its workers started
        self.metric_lines = settings.metric_lines
        self.explicit_word: Optional[str] = settings.worker_word or None
        self.format_name = settings.format_name     # `auto` says later which one it picked
        self.format_tried = settings.format_tried
        self.steps_seen = False                     # a step (line or bar) was recognised
        self.last_output = now                      # any output at all (liveness before steps)
        self.output_at: dict[Optional[int], float] = {}   # per worker (None: the run's own log)
        self.worker_cap = WorkerCap()               # the workers tracked; the monitor's parsers share it

    # ------------------------------------------------------- what it learns later
    def rank_logs_started(self) -> None:
        """A rank's own log appeared: torchrun started its workers (the ranks met)."""
        self.rank_logs_seen = True

    def format_chosen(self, name: str) -> None:
        """The log format's name now (`auto` says which one it picked once it has seen lines)."""
        self.format_name = name

    # ------------------------------------------------------------- vocabulary
    @property
    def worker_word(self) -> str:
        """The run's own word for a worker: a rank under torchrun, a drafter thread in the
        DFlash trainer, a worker elsewhere."""
        if self.explicit_word:
            return self.explicit_word
        return dflash.WORD if self.dflash else "worker"

    @property
    def dflash(self) -> bool:
        """The DFlash stand-in trainer (its start line or its step lines, or the FX race)."""
        if self.explicit_word == "rank" or self.rank_logs_expected or self.child_failed.failures \
                or RENDEZVOUS_RETRY in self.seen or RENDEZVOUS_TIMEOUT in self.seen:
            return False      # torchrun's ranks: one process each, no drafter threads
        return (self.metric is not None or self.format_name in ("orch", "auto: orch")
                or dflash.START_FIELD in self.start_fields or FX_RACE in self.seen)

    def metric_note(self) -> Optional[str]:
        """Said live and in the record while no step line has been recognised."""
        if self.steps_seen:
            return None
        tried = f"; looked for {self.format_tried}" if self.format_tried else ""
        return f"no metric lines recognised (format {self.format_name}{tried})"

    def saw_output(self, now: float, worker: Optional[int] = None) -> None:
        """Bytes arrived (a whole line or not): before any step, the run is alive."""
        self.last_output = now
        if self.worker_cap.admit(worker):
            self.output_at[worker] = now

    # ------------------------------------------------------------------ feeding
    def feed(self, line: str, now: float, source: Optional[str] = None,
             worker: Optional[int] = None) -> Optional[MetricPoint]:
        """One log line (of SOURCE, a rank's own log: WORKER); returns the metric point it
        carried, if any."""
        self._traceback_parser(source, worker).feed_line(line)
        self.lines += 1
        self.tail.append(line)
        if self.first_line_at is None:
            self.first_line_at = now
        for signature in verdicts.SIGNATURES:
            if signature.pattern.search(line):
                kept = self.seen.setdefault(signature.name, [])
                if len(kept) < EVIDENCE_LINES:
                    kept.append(line.strip())
        self.child_failed.feed(line)
        if line.startswith("start ") and not self.start_fields:
            self.start_fields = dict(_KEYVALUES.findall(line))
            return None
        if line.startswith("summary "):
            self.summary_fields = dict(_KEYVALUES.findall(line))
            return None
        error = dflash.ERROR_LINE.search(line)
        if error:
            progress = self._worker(int(error["drafter"]), now)
            if progress is not None:
                progress.error = progress.error or error["error"].strip()
            kept = self.seen.setdefault(WORKER_ERROR, [])
            if len(kept) < EVIDENCE_LINES:
                kept.append(line.strip())
            return None
        done = dflash.DONE_LINE.search(line)
        if done:
            progress = self._worker(int(done["drafter"]), now)
            if progress is None:
                return None
            progress.done = True
            progress.done_tok_s = _number(done["tok_s"])
            progress.tok_s = progress.done_tok_s or progress.tok_s  # its whole-run rate now
            progress.loss = _number(done["loss"]) if done["loss"] else progress.loss
            self.last_progress = now
            return None
        if self.metric is None:
            return None   # the monitor's log format reads the points (observe)
        match = self.metric.search(line)
        if not match:
            return None
        groups = match.groupdict()
        return self.observe(LogPoint(step=int(groups["step"]), worker=int(groups.get("drafter") or 0),
                                     loss=_number(groups.get("loss")),
                                     tok_s=_number(groups.get("tok_s"))), now)

    def _traceback_parser(self, source: Optional[str], worker: Optional[int]) -> tracebacks.TracebackParser:
        if source not in self.tracebacks:
            self.tracebacks[source] = tracebacks.TracebackParser(
                source or "", f"rank {worker}" if worker is not None else "")
        return self.tracebacks[source]

    def lead(self, end: EndState) -> Optional[causes.Lead]:
        """What the run's failure leads with (causes.py, as `orch explain` reads it): the first
        failure in time, torchrun's wrappers unwrapped to the worker's exception."""
        for parser in self.tracebacks.values():     # finished once: a second verdict reads them again
            self.parsed += parser.finish().tracebacks
        self.tracebacks = {}
        # a rank's own file is named by its local rank; torchrun's table gives the global one
        # (on a node of a job over several nodes they differ)
        global_rank = {f"rank {f.local_rank}": f"rank {f.rank}" for f in self.child_failed.failures
                       if f.local_rank is not None and f.rank is not None}
        for tb in self.parsed:
            tb.worker = global_rank.get(tb.worker, tb.worker)
        hints = causes.RunHints(stopped_for=end.stopped_for, signal=end.signal, exit_code=end.exit_code)
        return causes.find_lead(tracebacks.group(self.parsed), self.child_failed.failures, hints)[0]

    def is_metric_line(self, line: str) -> bool:
        """Whether the line carries a metric point (the live table shows those)."""
        if self.metric is not None:
            return bool(self.metric.search(line))
        return bool(self.metric_lines and self.metric_lines(line))

    def observe(self, point: LogPoint, now: float) -> Optional[MetricPoint]:
        """A point a log format read: per-worker progress; a MetricPoint unless it was only a
        progress-bar redraw (live step counter: a bar moving on is progress, not a hang)."""
        progress = self._worker(point.worker, now)
        if progress is None:
            return None
        self.steps_seen = True
        if point.progress:
            if point.step != progress.bar_step:
                # a bar moving is progress, also one that restarted (a new epoch, a new bar)
                progress.bar_step = point.step
                progress.step = max(progress.step, point.step)
                progress.last_step_at = now
                self.last_progress = now
            return None
        progress.step = point.step
        progress.counted = point.counted
        progress.last_step_at = now
        progress.loss = point.loss
        progress.tok_s = point.tok_s
        self.derived = self.derived or point.derived
        if point.derived:
            self.derived_from.add(point.derived_from)
        elif point.tok_s is not None and point.rate_from and len(self.rates_from) < 8:
            self.rates_from.add(point.rate_from)
        if point.tok_s is not None and point.step > self.warmup_steps:
            progress.rates.append(point.tok_s)
        self.last_progress = now
        metric = MetricPoint(target=self.target, drafter=point.worker, step=point.step,
                             loss=point.loss, tok_s=point.tok_s, elapsed_s=round(now - self.started_at, 3),
                             extra=dict(point.metrics), derived=point.derived)
        before = self._last_points.get(point.worker)
        if before is not None and before.step == metric.step:
            # One step said twice (a Trainer's closing summary after its last log): one
            # point with both, since the store keeps one point per worker and step.
            metric = MetricPoint(target=self.target, drafter=point.worker, step=point.step,
                                 loss=metric.loss if metric.loss is not None else before.loss,
                                 tok_s=metric.tok_s if metric.tok_s is not None else before.tok_s,
                                 elapsed_s=metric.elapsed_s, extra={**before.extra, **metric.extra},
                                 derived=metric.derived if metric.tok_s is not None else before.derived)
        self._last_points[point.worker] = metric
        return metric

    def _worker(self, index: int, now: float) -> Optional[WorkerProgress]:
        """The worker's progress; None for a worker past the cap (not tracked)."""
        if index not in self.workers:
            if not self.worker_cap.admit(index):
                return None
            self.workers[index] = WorkerProgress(index)
        self.workers[index].last_seen = now
        return self.workers[index]

    def number_points(self, spacing: int) -> None:
        """The log points of workers that printed no step numbers, now that the steps between
        two of them are known: the n-th point is step n x spacing."""
        for progress in self.workers.values():
            if progress.counted:
                progress.step *= spacing
                progress.counted = False
        for worker, metric in list(self._last_points.items()):
            self._last_points[worker] = MetricPoint(**{**metric.__dict__, "step": metric.step * spacing})

    def counted_points(self) -> int:
        """How many log points the workers without step numbers gave (0: none are such)."""
        return sum(d.step for d in self.workers.values() if d.counted)

    # ----------------------------------------------------------------- progress
    def shift(self, seconds: float) -> None:
        """Time the monitor could not see (a dropped link) does not count as silence."""
        self.last_progress += seconds
        self.last_output += seconds

    def silent_for(self, now: float) -> float:
        """Seconds without progress: without a recognised step yet, without any output
        (parsing never decides liveness); once steps flow, without a new step. Ranks retrying
        a rendezvous store they cannot reach print all along: that output is not life."""
        if not self.steps_seen and RENDEZVOUS_RETRY not in self.seen:
            return now - max(self.last_progress, self.last_output)
        return now - self.last_progress

    def silent_workers(self, now: float) -> Optional[str]:
        """Once steps flow and stop: the workers whose steps stopped while output went on."""
        if not self.steps_seen or not self.output_at:
            return None
        latest = max(self.output_at.values())
        stepping = [d for d in self.workers.values() if d.last_step_at]
        if not stepping or now - latest >= self.hang_after:
            return None
        word = self.worker_word
        names = ", ".join(f"{word} {d.worker} (at step {d.step}, its last step {now - d.last_step_at:.0f} s ago)"
                          for d in sorted(stepping, key=lambda d: d.worker))
        talking = sorted(w for w, at in self.output_at.items() if now - at < self.hang_after and w is not None)
        who = (f"{word}{'s' if len(talking) > 1 else ''} {', '.join(map(str, talking))}" if talking
               else "the run")
        return (f"the steps stopped: {names}, while {who} kept printing "
                f"(last output {now - latest:.0f} s ago)")

    def snapshot(self) -> ProgressSnapshot:
        """A frozen copy of the live progress, for reporters."""
        workers = tuple(WorkerSnapshot(d.worker, d.step, d.loss, d.tok_s, d.status, d.error, bool(d.rates),
                                       d.counted)
                        for d in sorted(self.workers.values(), key=lambda d: d.worker))
        since = self.last_progress if self.steps_seen or RENDEZVOUS_RETRY in self.seen \
            else max(self.last_progress, self.last_output)
        pattern = self.metric
        metric_line = ((lambda line: bool(pattern.search(line))) if pattern is not None
                       else self.metric_lines or (lambda line: False))
        return ProgressSnapshot(target=self.target, worker_word=self.worker_word, workers=workers,
                                lines=self.lines, metric_note=self.metric_note() if self.lines else None,
                                silent_since=since, metric_line=metric_line)

    def hung(self, now: float, alive: bool) -> bool:
        return alive and self.silent_for(now) >= self.hang_after

    def total_tok_s(self, live: bool = False) -> Optional[float]:
        if not live and _number(self.summary_fields.get("total_tok_s")):
            return _number(self.summary_fields["total_tok_s"])
        rates = [d.tok_s if live else d.throughput() for d in self.workers.values()]
        rates = [r for r in rates if r is not None]
        if live:
            # Live: only drafters past warmup, so a compile step does not read as "degraded".
            rates = [d.tok_s for d in self.workers.values() if d.tok_s is not None and d.rates]
        return sum(rates) if rates else None

    def degraded(self, live: bool = False) -> bool:
        total = self.total_tok_s(live)
        return bool(self.degraded_below) and total is not None and total < float(self.degraded_below)

    # ----------------------------------------------------------------- verdict
    def classify(self, end: EndState, facts: Optional[dict] = None, cli: str = "orch",
                 playbook: Optional[str] = None) -> Verdict:
        """The verdict. A failure signature decides it only when the run ended badly: seen
        in a run that ended well (an `NCCL WARN`, a traceback a library caught) it is a
        warning in the summary."""
        self._settle(end)
        warnings = self._warnings(end)
        seen, self.seen = self.seen, {k: v for k, v in self.seen.items()
                                      if k not in {w["signature"] for w in warnings}}
        try:
            result = self._classify(end, facts, cli, playbook)
        finally:
            self.seen = seen
        if warnings:
            result.summary["warnings"] = warnings
        return result

    def failed_end(self, end: EndState) -> bool:
        """Whether the run ended badly (or, still running, has already failed)."""
        return bool(end.exit_code not in (None, 0) or end.signal is not None
                    or end.state in (RunState.VANISHED, RunState.MISSING) or end.stopped_for
                    or self.summary_fields.get("status") in ("failed", "timeout")
                    or self.child_failed.root_cause() is not None
                    or any(d.error for d in self.workers.values())
                    or (end.state == RunState.RUNNING and ({FX_RACE, CUDA_OOM} & set(self.seen))))

    def _warnings(self, end: EndState) -> list[dict]:
        demote = (NCCL_WARN,) if self.failed_end(end) else tuple(WARNINGS)
        return [{"signature": name, "message": f"{WARNINGS[name]} seen; the run ended well"
                 if name != NCCL_WARN else WARNINGS[name], "evidence": list(self.seen[name])}
                for name in demote if name in self.seen and name != RECOMPILE_LIMIT]

    def _settle(self, end: EndState) -> None:
        """Once the process has ended, no worker is still "running"."""
        if end.state == RunState.RUNNING:
            return
        failed = {f.rank: f for f in self.child_failed.failures if f.rank is not None}
        root = self.child_failed.root_cause()
        for progress in self.workers.values():
            if progress.done or progress.error:
                continue
            if end.exit_code == 0 and end.state == RunState.EXITED and not end.stopped_for:
                progress.final = "done"
            elif root is not None and progress.worker == root.rank:
                progress.final = "failed"
            elif progress.worker in failed or end.stopped_for:
                progress.final = "stopped"
            else:
                progress.final = "ended"

    def _hang_now(self, end: EndState) -> float:
        """The moment a hang was declared: its silence after the last progress."""
        return self.last_progress + (end.hang_seconds if end.hang_seconds is not None else self.hang_after)

    def _classify(self, end: EndState, facts: Optional[dict], cli: str,
                  playbook: Optional[str]) -> Verdict:
        facts = dict(facts or {})
        facts.setdefault("torch_version", self.start_fields.get("torch"))
        findings: list[Finding] = []
        total = self.total_tok_s()
        summary = self.summary(end, total)

        def add(signature: str, message: str, remediation: str = "", evidence=None) -> None:
            findings.append(Finding(target=self.target, signature=signature, message=message,
                                    remediation=remediation,
                                    evidence=list(evidence if evidence is not None
                                                  else self.seen.get(signature, []))))

        hang = end.stopped_for == "hang" or (
            self.summary_fields.get("status") == "timeout" and
            int(_number(self.summary_fields.get("stalled")) or 0) > 0)
        lead = self.lead(end)
        self._signature_findings(add, hang, end, facts, cli, playbook)
        override = self._distributed_findings(add, hang, end, cli, lead)
        evidence = self._evidence(end, hang)
        verdict = verdicts.decide(evidence)
        self._ending_finding(add, verdict, evidence, end, total, cli, lead)
        message = self._message(verdict, end, total)
        if override and verdict != OK:
            message = f"{verdict}: {override}"
        elif verdict == TRACEBACK and _quotes(lead):
            message = f"{verdict}: {lead.summary}"
        if verdict != OK and not any(verdicts.verdict_of(f.signature) == verdict for f in findings):
            # The report lists findings: every failed verdict is one, with what to do.
            related = [f for f in findings if f.signature == RANK_FAILED] + findings
            add(verdict, message.split(": ", 1)[-1], remedy(verdict, cli, self.target),
                evidence=related[0].evidence if related else list(self.tail)[-5:])
        summary["verdict"] = verdict
        return Verdict(verdict=verdict, message=message, findings=findings, summary=summary)

    def _evidence(self, end: EndState, hang: bool) -> Evidence:
        """The run's end in the words of the verdict table's detectors."""
        aborted_on_timeout = COLLECTIVE_TIMEOUT in self.seen and (
            end.signal == signals.SIGABRT or end.exit_code == -signals.SIGABRT)
        handled = handled_signal(end.exit_code) if not end.stopped_for else None
        done = sum(d.done for d in self.workers.values())
        return Evidence(
            signs=frozenset(filter(None, (verdicts.SIGNATURE_VERDICT.get(name) for name in self.seen))),
            hang=hang, never_met=hang and self.never_met, rank_killed=self._rank_killed(end),
            signalled=handled is not None and not self.child_failed.failures,
            stopped_for=end.stopped_for,
            ended_killed=end.state in (RunState.VANISHED, RunState.MISSING) or (
                end.signal is not None and not end.stopped_for and not aborted_on_timeout),
            failed_exit=end.exit_code not in (None, 0) or self.summary_fields.get("status") == "failed",
            traceback=TRACEBACK in self.seen or WORKER_ERROR in self.seen,
            workers_short=bool(self.expect_drafters) and end.state == RunState.EXITED and done < self.expect_drafters,
            degraded=self.degraded(live=end.state == RunState.RUNNING))

    def _signature_findings(self, add, hang: bool, end: EndState, facts: dict, cli: str,
                            playbook: Optional[str]) -> None:
        """A finding for each failure signature the log showed, and for a hang."""
        if FX_RACE in self.seen:
            count = sum("FX" in (d.error or "") for d in self.workers.values()) or 1
            add(FX_RACE, dflash.fx_message(count, self.target, facts),
                fx_remediation(self.target, facts, cli, playbook))
        for signature in FX_OTHER_STATES:
            if signature in self.seen:
                message, remediation = fx_state_finding(signature, self.target, facts, cli,
                                                        playbook, self.seen)
                add(signature, message, remediation)
        if hang:
            self._hang_finding(add, end, facts, cli, playbook)
        if CUDA_OOM in self.seen:
            add(CUDA_OOM, "CUDA ran out of memory", remedy(CUDA_OOM, cli, self.target))
        if NCCL_ERROR in self.seen:
            add(NCCL_ERROR, "NCCL reported an error", remedy(NCCL_ERROR, cli, self.target))
        if RECOMPILE_LIMIT in self.seen:
            add(RECOMPILE_LIMIT, "torch._dynamo hit its recompile limit: the function runs "
                                 "uncompiled from then on (slow)", remedy(RECOMPILE_LIMIT, cli, self.target))

    def _hang_finding(self, add, end: EndState, facts: dict, cli: str, playbook: Optional[str]) -> None:
        silent = end.hang_seconds if end.hang_seconds is not None else self.hang_after
        errored = [d for d in self.workers.values() if d.error]
        cause = (f"; {self.worker_word} {errored[0].worker} had raised {errored[0].error!r} first"
                 if errored else "")
        ended_by = ("orch stopped it (SIGTERM, then SIGKILL)" if end.stopped_for == "hang"
                    else "the trainer's watchdog ended it")
        evidence = [line for line in self.seen.get(WORKER_ERROR, [])][:EVIDENCE_LINES] \
            or list(self.tail)[-5:]
        thread_local = facts.get("fx_tls_state") in THREAD_LOCAL
        stuck = self.never_stepped()
        waits, fix = stacks.hang_words(end.hang_stacks)
        if waits or fix:        # the stacks say who waits on whom: that, not a guess
            what = ("no new step line" if self.steps_seen else "no output at all")
            add(HANG, f"{what} for {silent:.0f} s while the process lived{cause}; " + ended_by + waits, fix or remedy(HANG, cli, self.target), evidence=evidence)
        elif thread_local and stuck and not errored:
            add(FIRST_COMPILE_HANG, dflash.first_compile_message(stuck, self.expected_workers(), silent, facts)
                + ended_by,
                first_compile_remediation(cli, playbook), evidence=evidence)
        elif not self.dflash:
            quiet = self.silent_workers(self._hang_now(end)) if self.steps_seen else None
            what = (f"no new step line for {silent:.0f} s while the process lived"
                    if self.steps_seen else f"no output at all for {silent:.0f} s while the process lived")
            add(HANG, what + (f": {quiet}" if quiet else "") + "; " + ended_by,
                remedy(HANG, cli, self.target), evidence=list(self.tail)[-5:])
        else:
            add(HANG, f"no new step line for {silent:.0f} s while the process lived{cause}; "
                      + ended_by, dflash.hang_remediation(cli, self.target, thread_local), evidence=evidence)

    def _ending_finding(self, add, verdict: str, e: Evidence, end: EndState, total: Optional[float],
                        cli: str, lead: Optional[causes.Lead] = None) -> None:
        """The finding for a verdict that no signature explained: how the run ended."""
        fix = remedy(verdict, cli, self.target)
        if verdict == KILLED and not e.rank_killed:
            if e.signalled:
                handled = handled_signal(end.exit_code)
                add(KILLED, f"the process was stopped by {signal_name(handled)}: it handled the signal "
                            f"and exited with {end.exit_code} (128+{handled})", fix,
                    evidence=list(self.tail)[-5:])
            elif e.stopped_for == "user":
                add(KILLED, "stopped with `orch stop`")     # nothing to fix: someone asked
            else:
                how = (f"by signal {end.signal}" if end.signal is not None
                       else "without an exit status (its supervisor was killed too)")
                add(KILLED, f"the process was killed {how}", fix)
        elif verdict == TIMEOUT:
            add(TIMEOUT, "the monitor's time limit ran out; orch stopped the run", fix)
        elif verdict == TRACEBACK:
            # the cause, as `orch explain` leads with it; else the last exception line seen
            exception = lead.summary if _quotes(lead) else self._last_exception()
            add(TRACEBACK, f"the run failed with {exception or 'a Python traceback'}", fix,
                evidence=self.seen.get(WORKER_ERROR, [])[:EVIDENCE_LINES] + ([exception] if exception else []))
        elif verdict == NONZERO_EXIT:
            add(NONZERO_EXIT, f"the process exited with code {end.exit_code}", fix,
                evidence=list(self.tail)[-8:])
        elif verdict == FAILED:
            done = sum(d.done for d in self.workers.values())
            add(FAILED, f"{done} of the expected {self.expect_drafters} {self.worker_word}s finished", fix)
        elif verdict in (DEGRADED, RECOMPILE_LIMIT):
            add(DEGRADED, f"throughput {total or self.total_tok_s(True) or 0:,.0f} tok/s is under the "
                          f"playbook's threshold of {float(self.degraded_below):,.0f}"
                          + (f" (expected about {float(self.expected_tok_s):,.0f})"
                             if self.expected_tok_s else ""), remedy(DEGRADED, cli, self.target))

    def _rank_killed(self, end: EndState) -> bool:
        """A rank died by a signal orch did not send (a stop ends the ranks with SIGTERM), or
        handled one and stopped (exit 128+N). A SIGABRT after a collective timeout is torch's
        watchdog ending the rank: the collective timeout is the verdict."""
        root = self.child_failed.root_cause()
        if root is None or (end.stopped_for and not self._died_before_peer_stop(end, root)):
            return False
        if root.signal == signals.SIGABRT and COLLECTIVE_TIMEOUT in self.seen:
            return False
        return root.signal is not None or root.handled_signal is not None

    @staticmethod
    def _died_before_peer_stop(end: EndState, root) -> bool:
        """On a node orch stopped for another node's failure, a rank that torchrun reports
        killed by a signal other than the stop's SIGTERM died on its own first: the stop came
        while torchrun was already ending (a SIGTERMed torchrun prints no failure table)."""
        return end.stopped_for == PEER_FAILED and root.signal not in (None, signals.SIGTERM)

    def _distributed_findings(self, add, hang: bool, end: EndState, cli: str,
                              lead: Optional[causes.Lead] = None) -> Optional[str]:
        """torchrun's failed rank, collective and rendezvous timeouts, the rank a hang is
        about. Returns what the verdict's message should say, if these explain the end."""
        said = None
        self.never_met = False
        stuck = stuck_message({d.worker: d.step for d in self.workers.values()},
                              self.worker_word) if len(self.workers) > 1 else None
        if RENDEZVOUS_TIMEOUT in self.seen:
            add(RENDEZVOUS_TIMEOUT, "the rendezvous never completed: not every rank joined",
                remedy(RENDEZVOUS_TIMEOUT, cli, self.target))
            said = "the rendezvous never completed (not every rank joined)"
        elif hang and not any(d.step for d in self.workers.values()) and (
                RENDEZVOUS_RETRY in self.seen or (self.rank_logs_expected and not self.rank_logs_seen)):
            # torch retries the store for 15 min by default, and torchrun starts its workers
            # (and their logs) only once the rendezvous is complete: the hang is the rendezvous
            self.never_met = True
            unreachable = RENDEZVOUS_RETRY in self.seen
            add(RENDEZVOUS_TIMEOUT,
                "the ranks never met: " + ("no step was logged while they kept failing to reach "
                                           "their rendezvous store" if unreachable else
                                           "torchrun started no rank (no rank log appeared): its "
                                           "rendezvous never completed"),
                remedy(RENDEZVOUS_TIMEOUT, cli, self.target) + "; in a container, check that its loopback is up "
                "(`ip link set lo up`) when the master address is 127.0.0.1",
                evidence=self.seen.get(RENDEZVOUS_RETRY) or list(self.tail)[-5:])
            said = ("the ranks never met: their rendezvous store could not be reached" if unreachable
                    else "the ranks never met: torchrun's rendezvous never completed")
        if COLLECTIVE_TIMEOUT in self.seen:
            add(COLLECTIVE_TIMEOUT, "a collective timed out" + (f": {stuck}" if stuck else ""),
                remedy(COLLECTIVE_TIMEOUT, cli, self.target))
            said = "a collective timed out" + (f"; {stuck}" if stuck else "")
        elif hang and stuck:
            add(STUCK_RANK, stuck, remedy(COLLECTIVE_TIMEOUT, cli, self.target), evidence=list(self.tail)[-5:])
            said = f"{stuck}; no progress for {self.hang_after:.0f} s or more"
        root = self.child_failed.root_cause()
        if root is not None:
            others = [f for f in self.child_failed.failures if f is not root]
            text = f"torchrun: {root.describe()}"
            if _quotes(lead) and f"rank {root.rank}" in lead.workers:
                text += f": {lead.quote}"     # the rank's own exception
            text += (f", the first failure; torchrun then stopped {len(others)} other rank(s)" if others else "")
            if root.signal == 9:
                text += " (SIGKILL from outside: most likely the host's OOM killer)"
            add(RANK_FAILED, text, rank_failure_remediation(root),
                evidence=[f.describe() + (f": {f.traceback}" if f.traceback else "")
                          for f in self.child_failed.failures][:EVIDENCE_LINES])
            if said is None or self._rank_killed(end):
                said = text
        return said

    def _steps_message(self, verdict: str, end: EndState, total: Optional[float]) -> str:
        """For trainers that say no "done" per worker (a log format's): their last steps."""
        count = len(self.workers)
        word = self.worker_word + ("s" if count != 1 else "")
        last = max((d.step for d in self.workers.values()), default=0)
        how = " and ".join(sorted(self.derived_from)) or "step times"
        printed = f" (printed: {', '.join(sorted(self.rates_from))})" if self.rates_from else ""
        rate = (f", {total:,.0f} tok/s total" + (f" (derived from {how})" if self.derived else printed)
                if total else "")
        ending = (f"exit {end.exit_code}" if end.exit_code is not None
                  else "still running" if end.state == RunState.RUNNING else end.state)
        if not self.workers:
            # nothing recognised: say what was looked for, never "0 workers trained to step 0"
            return f"ok: {self.metric_note()}" if verdict == OK else f"{verdict}: {self.metric_note()} ({ending})"
        if all(d.counted for d in self.workers.values()):
            points = f"{self.counted_points()} log points, no step numbers printed"
            return (f"ok: {count} {word}, {points}{rate}" if verdict == OK
                    else f"{verdict}: {count} {word}, {points}{rate} ({ending})")
        if verdict == OK:
            going = "training; the run goes on" if end.watch_ended else "trained"
            return f"ok: {count} {word} {going} to step {last}{rate}"
        return f"{verdict}: {count} {word}, last step {last}{rate} ({ending})"

    def summary(self, end: EndState, total: Optional[float]) -> dict:
        return {
            "total_tok_s": round(total, 1) if total is not None else None,
            "drafters": {str(d.worker): WorkerSummary(
                step=None if d.counted else d.step, loss=d.loss, tok_s=d.throughput(), status=d.status,
                error=d.error, log_points=d.step if d.counted else None).to_dict()
                         for d in sorted(self.workers.values(), key=lambda d: d.worker)},
            "drafters_ok": sum((d.done or d.final == "done") and not d.error for d in self.workers.values()),
            "drafters_expected": self.expected_workers(),
            "exit_code": end.exit_code, "signal": end.signal, "state": end.state,
            "stopped_for": end.stopped_for, "lines": self.lines,
            "trainer_summary": dict(self.summary_fields),
            "workers": self.worker_word, "tok_s_derived": self.derived,
            **({"tok_s_printed_as": sorted(self.rates_from)} if self.rates_from else {}),
            "format": self.format_name, "metric_note": self.metric_note(),
            "torch_version": self.start_fields.get("torch"),
            **({"workers_not_tracked": self.worker_cap.note(self.worker_word)}
               if self.worker_cap.refused else {}),
        }

    def expected_workers(self) -> int:
        """How many drafters the run should have: the playbook's expect_drafters, else the
        trainer's start line (drafters=N), else those seen in the log."""
        announced = min(_number(self.start_fields.get(dflash.START_FIELD)) or 0, MAX_WORKERS)  # from the log
        return max(self.expect_drafters or 0, int(announced), len(self.workers))

    def never_stepped(self) -> list[int]:
        """The workers that never logged a step: still in their first (compiling) step."""
        return [index for index in range(self.expected_workers())
                if index not in self.workers or not self.workers[index].step]

    def _last_exception(self) -> Optional[str]:
        """The last line that looks like an exception (no traceback was read whole)."""
        for line in reversed(self.tail):
            text = line.strip()
            if _EXCEPTION_LINE.match(text) and not text.startswith("Traceback"):
                return text[:300]
        return None

    def _message(self, verdict: str, end: EndState, total: Optional[float]) -> str:
        if self.metric is None and not any(d.done for d in self.workers.values()):
            return self._steps_message(verdict, end, total)
        workers = sorted(self.workers.values(), key=lambda d: d.worker)
        done = sum(d.done and not d.error for d in workers)
        expected = self.expected_workers()
        words = self.worker_word + "s"
        rate = f", {total:,.0f} tok/s total" if total else ""
        if verdict == OK:
            if end.watch_ended:
                return f"healthy: {len(workers)} {words} training{rate}; the run goes on"
            return f"ok: {done}/{len(workers)} {words} trained{rate}"
        ending = (f"exit {end.exit_code}" if end.exit_code is not None
                  else "still running" if end.state == RunState.RUNNING else end.state)
        return f"{verdict}: {done}/{expected} {words} finished{rate} ({ending})"


def _quotes(lead: Optional[causes.Lead]) -> bool:
    """Whether the lead is an exception the verdict can quote."""
    return lead is not None and lead.kind in ("exception", "waited") and not lead.consequence_of
