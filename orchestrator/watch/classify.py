"""Reading a training log: metric lines, failure signatures, and the run's verdict.

Pure functions and small state machines, no I/O: the monitor feeds lines and the process
state in, gets metric points, live per-worker progress and, at the end, a verdict with
findings and remediations out. Liveness comes from output until a step is recognised, from
steps after; a failure signature decides the verdict only when the run ended badly (else it
is a warning in the summary). The DFlash stand-in trainer's own words are read here too:

    start drafters=3 devices=cuda:0,cuda:1,cuda:2 torch=2.13.0+cpu pid=123 ...
    drafter=1 step=20 loss=3.21 tok_s=1234
    drafter=1 ERROR RuntimeError: ...
    drafter=1 done steps=50 loss=2.10 tok_s=5321
    summary status=ok|failed|timeout drafters=3 ok=3 failed=0 total_tok_s=16000 stalled=0
"""

from __future__ import annotations

import re
import signal as signals
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.watch.distributed import (COLLECTIVE_REMEDIATION, COLLECTIVE_TIMEOUT, RENDEZVOUS_REMEDIATION,
                                      RENDEZVOUS_RETRY, RENDEZVOUS_TIMEOUT, ChildFailedReader, handled_signal,
                                      rank_failure_remediation, signal_name, stuck_message)
from orchestrator.ground.fx_states import THREAD_LOCAL
from orchestrator.watch.logformats import DEFAULT_METRIC_REGEX, LogPoint
from orchestrator.runs.model import Finding, MetricPoint

_DONE = re.compile(r"drafter=(?P<drafter>\d+)\s+done\s+steps=(?P<steps>\d+)"
                   r"(?:\s+loss=(?P<loss>\S+))?(?:\s+tok_s=(?P<tok_s>[0-9.eE+-]+))?")
_ERROR = re.compile(r"drafter=(?P<drafter>\d+)\s+ERROR\s+(?P<error>.*)")
_KEYVALUES = re.compile(r"(\w+)=(\S+)")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)\b:?.*")

FX_NODE_META = "fx-race:node-meta"
FX_NODE_META_FRAME = "fx-node-meta-frame"        # evidence only: where the KeyError came from
FX_TRACE_PATCHER = "fx-race:trace-patcher"
FX_OTHER_STATES = (FX_NODE_META, FX_TRACE_PATCHER)

# Failure signatures, most specific first. Each names the verdict it leads to.
SIGNATURES: list[tuple[str, re.Pattern]] = [
    ("fx-race", re.compile(r"Detected that you are using FX to symbolically trace a "
                           r"dynamo-optimized function")),
    # The other FX state threads share (verdict fx-race too; docs/design/torch-releases.md): the
    # node-meta race raises KeyError 'custom' from annotate() in torch/fx/traceback.py; FX's
    # process-wide trace-time patching shows as CURRENT_PATCHER errors or another thread's
    # "module is not installed as a submodule".
    (FX_NODE_META, re.compile(r"KeyError: '?custom'?(?:\W|$)")),
    (FX_NODE_META_FRAME, re.compile(r"torch/fx/traceback\.py\S*, line \d+, in \w+")),
    (FX_TRACE_PATCHER, re.compile(r"CURRENT_PATCHER|module is not installed as a submodule")),
    ("cuda-oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
                            r"CUDA error: out of memory")),
    ("collective-timeout", COLLECTIVE_TIMEOUT),
    ("rendezvous-timeout", RENDEZVOUS_TIMEOUT),
    ("rendezvous-retry", RENDEZVOUS_RETRY),
    ("nccl-error", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|"
                              r"ncclRemoteError|Watchdog caught collective operation timeout|"
                              r"ProcessGroupNCCL.{0,400}?(?:[Tt]imeout|[Ee]rror)")),
    ("nccl-warn", re.compile(r"NCCL WARN")),
    ("recompile-limit", re.compile(r"hit config\.(?:recompile_limit|cache_size_limit|"
                                   r"accumulated_recompile_limit)")),
    ("traceback", re.compile(r"^Traceback \(most recent call last\):")),
]
EVIDENCE_LINES = 5
TAIL_LINES = 40
# What a seen signature is called in a run that ended well: a warning in the record.
WARNINGS = {"fx-race": "the FX tracing race error", "cuda-oom": "CUDA out of memory",
            "collective-timeout": "a collective timeout", "rendezvous-timeout": "a rendezvous timeout",
            "nccl-error": "an NCCL error", "nccl-warn": "NCCL warnings (common in healthy runs)",
            "recompile-limit": "torch._dynamo's recompile limit", "traceback": "a Python traceback"}


@dataclass
class DrafterProgress:
    drafter: int
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

    @property
    def status(self) -> str:
        return "failed" if self.error else "done" if self.done else self.final or "running"

    def throughput(self) -> Optional[float]:
        if self.done_tok_s:
            return self.done_tok_s
        if self.rates:
            return sum(self.rates) / len(self.rates)
        return None


@dataclass
class EndState:
    """How the process ended (or why the monitor stopped watching)."""

    state: str = "exited"                 # exited | vanished | running | unknown
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    stopped_for: Optional[str] = None     # hang | timeout | user (orch stop) | None
    watch_ended: bool = False             # watch_for elapsed while it ran: left running
    hang_seconds: Optional[float] = None


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


class LogClassifier:
    """Feed it log lines as they come; ask it about progress; classify at the end."""

    def __init__(self, target: str, *, metric_regex: Optional[str] = None, hang_after: float = 120.0,
                 expected_tok_s: Optional[float] = None, degraded_below: Optional[float] = None,
                 warmup_steps: int = 1, expect_drafters: Optional[int] = None, now: float = 0.0,
                 metrics_from_lines: bool = True):
        self.target = target
        # metrics_from_lines=False: a log format (logformats.py) reads the points and hands
        # them to observe(); feed() then only looks for failures and the trainer's own words.
        self.metric = compile_metric_regex(metric_regex) if metrics_from_lines else None
        self.hang_after = float(hang_after)
        self.expected_tok_s = expected_tok_s
        self.degraded_below = degraded_below
        self.warmup_steps = warmup_steps
        self.expect_drafters = expect_drafters
        self.drafters: dict[int, DrafterProgress] = {}
        self.start_fields: dict = {}
        self.summary_fields: dict = {}
        self.seen: dict[str, list[str]] = {}
        self.tail: deque = deque(maxlen=TAIL_LINES)
        self.last_progress = now
        self.lines = 0
        self.first_line_at: Optional[float] = None
        self.started_at = now
        self.child_failed = ChildFailedReader()     # torchrun's closing summary, if any
        self.derived = False                        # tok/s computed by orch, not printed
        self.derived_from: set[str] = set()         # ... from what: step times, samples/s
        self.never_met = False                      # a hang before any step, ranks not connected
        self._last_points: dict[int, MetricPoint] = {}
        self.rank_logs_expected = False             # torchrun was asked for one log per rank
        self.rank_logs_seen = False                 # ... and one appeared: its workers started
        self.metric_lines = None                    # the log format's test for a metric line
        self.explicit_word: Optional[str] = None    # the playbook's word for a worker, if it says
        self.format_name = "orch"                   # the log format, as the record names it
        self.format_tried = ""                      # what `auto` looked for, for the note
        self.steps_seen = False                     # a step (line or bar) was recognised
        self.last_output = now                      # any output at all (liveness before steps)
        self.output_at: dict[Optional[int], float] = {}   # per worker (None: the run's own log)

    # ------------------------------------------------------------- vocabulary
    @property
    def worker_word(self) -> str:
        """The run's own word for a worker: a rank under torchrun, a drafter thread in the
        DFlash trainer, a worker elsewhere."""
        if self.explicit_word:
            return self.explicit_word
        return "drafter" if self.dflash else "worker"

    @worker_word.setter
    def worker_word(self, word: Optional[str]) -> None:
        self.explicit_word = word or None

    @property
    def dflash(self) -> bool:
        """The DFlash stand-in trainer (its start line or its step lines, or the FX race)."""
        if self.explicit_word == "rank" or self.rank_logs_expected or self.child_failed.failures \
                or "rendezvous-retry" in self.seen or "rendezvous-timeout" in self.seen:
            return False      # torchrun's ranks: one process each, no drafter threads
        return (self.metric is not None or self.format_name in ("orch", "auto: orch")
                or "drafters" in self.start_fields or "fx-race" in self.seen)

    def metric_note(self) -> Optional[str]:
        """Said live and in the record while no step line has been recognised."""
        if self.steps_seen:
            return None
        tried = f"; looked for {self.format_tried}" if self.format_tried else ""
        return f"no metric lines recognised (format {self.format_name}{tried})"

    def saw_output(self, now: float, worker: Optional[int] = None) -> None:
        """Bytes arrived (a whole line or not): before any step, the run is alive."""
        self.last_output = now
        self.output_at[worker] = now

    # ------------------------------------------------------------------ feeding
    def feed(self, line: str, now: float) -> Optional[MetricPoint]:
        """One log line; returns the metric point it carried, if any."""
        self.lines += 1
        self.tail.append(line)
        if self.first_line_at is None:
            self.first_line_at = now
        for name, pattern in SIGNATURES:
            if pattern.search(line):
                kept = self.seen.setdefault(name, [])
                if len(kept) < EVIDENCE_LINES:
                    kept.append(line.strip())
        self.child_failed.feed(line)
        if line.startswith("start ") and not self.start_fields:
            self.start_fields = dict(_KEYVALUES.findall(line))
            return None
        if line.startswith("summary "):
            self.summary_fields = dict(_KEYVALUES.findall(line))
            return None
        error = _ERROR.search(line)
        if error:
            progress = self._drafter(int(error["drafter"]), now)
            progress.error = progress.error or error["error"].strip()
            self.seen.setdefault("drafter-error", []).append(line.strip())
            return None
        done = _DONE.search(line)
        if done:
            progress = self._drafter(int(done["drafter"]), now)
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

    def is_metric_line(self, line: str) -> bool:
        """Whether the line carries a metric point (the live table shows those)."""
        if self.metric is not None:
            return bool(self.metric.search(line))
        return bool(self.metric_lines and self.metric_lines(line))

    def observe(self, point: LogPoint, now: float) -> Optional[MetricPoint]:
        """A point a log format read: per-worker progress; a MetricPoint unless it was only a
        progress-bar redraw (live step counter: a bar moving on is progress, not a hang)."""
        progress = self._drafter(point.worker, now)
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
        progress.last_step_at = now
        progress.loss = point.loss
        progress.tok_s = point.tok_s
        self.derived = self.derived or point.derived
        if point.derived:
            self.derived_from.add(point.derived_from)
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

    def _drafter(self, index: int, now: float) -> DrafterProgress:
        if index not in self.drafters:
            self.drafters[index] = DrafterProgress(index)
        self.drafters[index].last_seen = now
        return self.drafters[index]

    # ----------------------------------------------------------------- progress
    def shift(self, seconds: float) -> None:
        """Time the monitor could not see (a dropped link) does not count as silence."""
        self.last_progress += seconds
        self.last_output += seconds

    def silent_for(self, now: float) -> float:
        """Seconds without progress: without a recognised step yet, without any output
        (parsing never decides liveness); once steps flow, without a new step. Ranks retrying
        a rendezvous store they cannot reach print all along: that output is not life."""
        if not self.steps_seen and "rendezvous-retry" not in self.seen:
            return now - max(self.last_progress, self.last_output)
        return now - self.last_progress

    def silent_workers(self, now: float) -> Optional[str]:
        """Once steps flow and stop: the workers whose steps stopped while output went on."""
        if not self.steps_seen or not self.output_at:
            return None
        latest = max(self.output_at.values())
        stepping = [d for d in self.drafters.values() if d.last_step_at]
        if not stepping or now - latest >= self.hang_after:
            return None
        word = self.worker_word
        names = ", ".join(f"{word} {d.drafter} (at step {d.step}, its last step {now - d.last_step_at:.0f} s ago)"
                          for d in sorted(stepping, key=lambda d: d.drafter))
        talking = sorted(w for w, at in self.output_at.items() if now - at < self.hang_after and w is not None)
        who = (f"{word}{'s' if len(talking) > 1 else ''} {', '.join(map(str, talking))}" if talking
               else "the run")
        return (f"the steps stopped: {names}, while {who} kept printing "
                f"(last output {now - latest:.0f} s ago)")

    def hung(self, now: float, alive: bool) -> bool:
        return alive and self.silent_for(now) >= self.hang_after

    def total_tok_s(self, live: bool = False) -> Optional[float]:
        if not live and _number(self.summary_fields.get("total_tok_s")):
            return _number(self.summary_fields["total_tok_s"])
        rates = [d.tok_s if live else d.throughput() for d in self.drafters.values()]
        rates = [r for r in rates if r is not None]
        if live:
            # Live: only drafters past warmup, so a compile step does not read as "degraded".
            rates = [d.tok_s for d in self.drafters.values() if d.tok_s is not None and d.rates]
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
                    or end.state in ("vanished", "missing") or end.stopped_for
                    or self.summary_fields.get("status") in ("failed", "timeout")
                    or self.child_failed.root_cause() is not None
                    or any(d.error for d in self.drafters.values())
                    or (end.state == "running" and ({"fx-race", "cuda-oom"} & set(self.seen))))

    def _warnings(self, end: EndState) -> list[dict]:
        demote = ("nccl-warn",) if self.failed_end(end) else tuple(WARNINGS)
        return [{"signature": name, "message": f"{WARNINGS[name]} seen; the run ended well"
                 if name != "nccl-warn" else WARNINGS[name], "evidence": list(self.seen[name])}
                for name in demote if name in self.seen and name != "recompile-limit"]

    def _settle(self, end: EndState) -> None:
        """Once the process has ended, no worker is still "running"."""
        if end.state == "running":
            return
        failed = {f.rank: f for f in self.child_failed.failures if f.rank is not None}
        root = self.child_failed.root_cause()
        for progress in self.drafters.values():
            if progress.done or progress.error:
                continue
            if end.exit_code == 0 and end.state == "exited" and not end.stopped_for:
                progress.final = "done"
            elif root is not None and progress.drafter == root.rank:
                progress.final = "failed"
            elif progress.drafter in failed or end.stopped_for:
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
        failed_exit = end.exit_code not in (None, 0)

        def add(signature: str, message: str, remediation: str = "", evidence=None) -> None:
            findings.append(Finding(target=self.target, signature=signature, message=message,
                                    remediation=remediation,
                                    evidence=list(evidence if evidence is not None
                                                  else self.seen.get(signature, []))))

        if "fx-race" in self.seen:
            add("fx-race", self._fx_message(facts), fx_remediation(self.target, facts, cli, playbook))
        for signature in FX_OTHER_STATES:
            if signature in self.seen:
                message, remediation = fx_state_finding(signature, self.target, facts, cli,
                                                        playbook, self.seen)
                add(signature, message, remediation)
        hang = end.stopped_for == "hang" or (
            self.summary_fields.get("status") == "timeout" and
            int(_number(self.summary_fields.get("stalled")) or 0) > 0)
        if hang:
            silent = end.hang_seconds if end.hang_seconds is not None else self.hang_after
            errored = [d for d in self.drafters.values() if d.error]
            cause = (f"; drafter {errored[0].drafter} had raised {errored[0].error!r} first"
                     if errored else "")
            ended_by = ("orch stopped it (SIGTERM, then SIGKILL)" if end.stopped_for == "hang"
                        else "the trainer's watchdog ended it")
            evidence = [line for line in self.seen.get("drafter-error", [])][:EVIDENCE_LINES] \
                or list(self.tail)[-5:]
            thread_local = facts.get("fx_tls_state") in THREAD_LOCAL
            stuck = self.never_stepped()
            if thread_local and stuck and not errored:
                add(FIRST_COMPILE_HANG, self._first_compile_message(stuck, silent, facts) + ended_by,
                    first_compile_remediation(cli, playbook), evidence=evidence)
            elif not self.dflash:
                quiet = self.silent_workers(self._hang_now(end)) if self.steps_seen else None
                what = (f"no new step line for {silent:.0f} s while the process lived"
                        if self.steps_seen else f"no output at all for {silent:.0f} s while the process lived")
                add("hang", what + (f": {quiet}" if quiet else "") + "; " + ended_by,
                    "see what the process is doing before it is gone next time: `py-spy dump --pid PID` "
                    f"(`{cli} exec {self.target} -- py-spy dump --pid PID`), or run with a timeout "
                    "in the trainer's own collectives; the last lines it printed are the evidence",
                    evidence=list(self.tail)[-5:])
            else:
                fix_race = ("" if thread_local else
                            f"If it is the FX race, apply `{cli} patch fx-threads apply -t {self.target}`; ")
                add("hang", f"no new step line for {silent:.0f} s while the process lived{cause}; "
                            + ended_by,
                    "look at the first drafter error above; a drafter that died inside a compile can "
                    "leave the others waiting on its lock. " + fix_race +
                    "serialising each drafter's first step (--serialize-compile) also avoids it.",
                    evidence=evidence)
        if "cuda-oom" in self.seen:
            add("cuda-oom", "CUDA ran out of memory",
                "lower --batch or --seq, check for other processes on the GPUs "
                f"(`{cli} exec {self.target} -- nvidia-smi`), or use fewer drafters per GPU")
        if "nccl-error" in self.seen:
            add("nccl-error", "NCCL reported an error",
                "rerun with NCCL_DEBUG=INFO in the launch env; check that every rank sees its GPU "
                "(CUDA_VISIBLE_DEVICES from the inventory's gpus) and that P2P/IB work in the container")
        if "recompile-limit" in self.seen:
            add("recompile-limit", "torch._dynamo hit its recompile limit: the function runs "
                                   "uncompiled from then on (slow)",
                "Dynamo config is per thread since torch 2.12: set torch._dynamo.config."
                "recompile_limit inside each drafter thread (worker threads get the default of 8), "
                "or mark the varying dimension dynamic")
        override = self._distributed_findings(add, hang, end)
        exception = self._last_exception()
        traceback_seen = "traceback" in self.seen or "drafter-error" in self.seen
        stopped_by_user = end.stopped_for == "user"
        aborted_on_timeout = "collective-timeout" in self.seen and (
            end.signal == signals.SIGABRT or end.exit_code == -signals.SIGABRT)
        killed = end.state in ("vanished", "missing") or (
            end.signal is not None and not end.stopped_for and not aborted_on_timeout)
        handled = handled_signal(end.exit_code) if not end.stopped_for else None
        verdict = None
        if "fx-race" in self.seen or any(s in self.seen for s in FX_OTHER_STATES):
            verdict = "fx-race"
        elif hang and self.never_met:
            verdict = "rendezvous-timeout"
        elif hang:
            verdict = "hang"
        elif "cuda-oom" in self.seen:
            verdict = "cuda-oom"
        elif self._rank_killed(end):
            verdict = "killed"
        elif "rendezvous-timeout" in self.seen:
            verdict = "rendezvous-timeout"
        elif "collective-timeout" in self.seen:
            verdict = "collective-timeout"
        elif "nccl-error" in self.seen:
            verdict = "nccl-error"
        elif handled is not None and not self.child_failed.failures:
            verdict = "killed"
            add("killed", f"the process was stopped by {signal_name(handled)}: it handled the signal "
                          f"and exited with {end.exit_code} (128+{handled})",
                "someone or something sent it the signal (a scheduler's preemption, a supervisor, "
                "an `orch stop` from elsewhere): look there", evidence=list(self.tail)[-5:])
        elif end.stopped_for == "timeout":
            verdict = "timeout"
            add("timeout", "the monitor's time limit ran out; orch stopped the run")
        elif stopped_by_user:
            verdict = "killed"
            add("killed", "stopped with `orch stop`")
        elif traceback_seen and (failed_exit or killed or self.summary_fields.get("status") == "failed"):
            verdict = "traceback"
            add("traceback", f"the run failed with {exception or 'a Python traceback'}",
                "read the traceback in the collected log (orch collects it into the run folder)",
                evidence=self.seen.get("drafter-error", [])[:EVIDENCE_LINES]
                + ([exception] if exception else []))
        elif killed:
            verdict = "killed"
            how = (f"by signal {end.signal}" if end.signal is not None
                   else "without an exit status (its supervisor was killed too)")
            add("killed", f"the process was killed {how}",
                "look for the OOM killer (`dmesg` on the host) or someone's kill")
        elif failed_exit or self.summary_fields.get("status") == "failed":
            verdict = "nonzero-exit"
            add("nonzero-exit", f"the process exited with code {end.exit_code}",
                evidence=list(self.tail)[-8:])
        elif self.expect_drafters and end.state == "exited" and \
                sum(d.done for d in self.drafters.values()) < self.expect_drafters:
            verdict = "failed"
            done = sum(d.done for d in self.drafters.values())
            add("failed", f"{done} of the expected {self.expect_drafters} drafters finished")
        elif self.degraded(live=end.state == "running"):
            verdict = "recompile-limit" if "recompile-limit" in self.seen else "degraded"
            add("degraded", f"throughput {total or self.total_tok_s(True) or 0:,.0f} tok/s is under the "
                            f"playbook's threshold of {float(self.degraded_below):,.0f}"
                            + (f" (expected about {float(self.expected_tok_s):,.0f})"
                               if self.expected_tok_s else ""),
                "check that the kernels compiled (no --uncompiled, no recompile-limit warnings), "
                "the GPUs' use (nvidia-smi) and that each drafter has its own GPU")
        else:
            verdict = "ok"
        message = self._message(verdict, end, total)
        if override and verdict != "ok":
            message = f"{verdict}: {override}"
        if verdict != "ok" and not any(f.signature.split(":", 1)[0] == verdict for f in findings):
            # The report lists findings: every failed verdict is one, with what to do.
            related = [f for f in findings if f.signature == "rank-failed"] + findings
            add(verdict, message.split(": ", 1)[-1], related[0].remediation if related else "",
                evidence=related[0].evidence if related else list(self.tail)[-5:])
        summary["verdict"] = verdict
        return Verdict(verdict=verdict, message=message, findings=findings, summary=summary)

    def _rank_killed(self, end: EndState) -> bool:
        """A rank died by a signal orch did not send (a stop ends the ranks with SIGTERM), or
        handled one and stopped (exit 128+N). A SIGABRT after a collective timeout is torch's
        watchdog ending the rank: the collective timeout is the verdict."""
        root = self.child_failed.root_cause()
        if root is None or end.stopped_for:
            return False
        if root.signal == signals.SIGABRT and "collective-timeout" in self.seen:
            return False
        return root.signal is not None or root.handled_signal is not None

    def _distributed_findings(self, add, hang: bool, end: EndState) -> Optional[str]:
        """torchrun's failed rank, collective and rendezvous timeouts, the rank a hang is
        about. Returns what the verdict's message should say, if these explain the end."""
        said = None
        self.never_met = False
        stuck = stuck_message({d.drafter: d.step for d in self.drafters.values()},
                              self.worker_word) if len(self.drafters) > 1 else None
        if "rendezvous-timeout" in self.seen:
            add("rendezvous-timeout", "the rendezvous never completed: not every rank joined",
                RENDEZVOUS_REMEDIATION)
            said = "the rendezvous never completed (not every rank joined)"
        elif hang and not any(d.step for d in self.drafters.values()) and (
                "rendezvous-retry" in self.seen or (self.rank_logs_expected and not self.rank_logs_seen)):
            # torch retries the store for 15 min by default, and torchrun starts its workers
            # (and their logs) only once the rendezvous is complete: the hang is the rendezvous
            self.never_met = True
            unreachable = "rendezvous-retry" in self.seen
            add("rendezvous-timeout",
                "the ranks never met: " + ("no step was logged while they kept failing to reach "
                                           "their rendezvous store" if unreachable else
                                           "torchrun started no rank (no rank log appeared): its "
                                           "rendezvous never completed"),
                RENDEZVOUS_REMEDIATION + "; in a container, check that its loopback is up "
                "(`ip link set lo up`) when the master address is 127.0.0.1",
                evidence=self.seen.get("rendezvous-retry") or list(self.tail)[-5:])
            said = ("the ranks never met: their rendezvous store could not be reached" if unreachable
                    else "the ranks never met: torchrun's rendezvous never completed")
        if "collective-timeout" in self.seen:
            add("collective-timeout", "a collective timed out" + (f": {stuck}" if stuck else ""),
                COLLECTIVE_REMEDIATION)
            said = "a collective timed out" + (f"; {stuck}" if stuck else "")
        elif hang and stuck:
            add("hang:stuck-rank", stuck, COLLECTIVE_REMEDIATION, evidence=list(self.tail)[-5:])
            said = f"{stuck}; no progress for {self.hang_after:.0f} s or more"
        root = self.child_failed.root_cause()
        if root is not None:
            others = [f for f in self.child_failed.failures if f is not root]
            text = f"torchrun: {root.describe()}" + (
                f", the first failure; torchrun then stopped {len(others)} other rank(s)" if others else "")
            if root.signal == 9:
                text += " (SIGKILL from outside: most likely the host's OOM killer)"
            add("rank-failed", text, rank_failure_remediation(root),
                evidence=[f.describe() + (f": {f.traceback}" if f.traceback else "")
                          for f in self.child_failed.failures][:EVIDENCE_LINES])
            if said is None or self._rank_killed(end):
                said = text
        return said

    def _steps_message(self, verdict: str, end: EndState, total: Optional[float]) -> str:
        """For trainers that say no "done" per worker (a log format's): their last steps."""
        count = len(self.drafters)
        word = self.worker_word + ("s" if count != 1 else "")
        last = max((d.step for d in self.drafters.values()), default=0)
        how = " and ".join(sorted(self.derived_from)) or "step times"
        rate = (f", {total:,.0f} tok/s total" + (f" (derived from {how})" if self.derived else "")
                if total else "")
        if verdict == "ok":
            going = "training; the run goes on" if end.watch_ended else "trained"
            return f"ok: {count} {word} {going} to step {last}{rate}"
        ending = (f"exit {end.exit_code}" if end.exit_code is not None
                  else "still running" if end.state == "running" else end.state)
        return f"{verdict}: {count} {word}, last step {last}{rate} ({ending})"

    def summary(self, end: EndState, total: Optional[float]) -> dict:
        return {
            "total_tok_s": round(total, 1) if total is not None else None,
            "drafters": {str(d.drafter): {"step": d.step, "loss": d.loss, "tok_s": d.throughput(),
                                          "status": d.status, "error": d.error}
                         for d in sorted(self.drafters.values(), key=lambda d: d.drafter)},
            "drafters_ok": sum((d.done or d.final == "done") and not d.error for d in self.drafters.values()),
            "drafters_expected": self.expected_drafters(),
            "exit_code": end.exit_code, "signal": end.signal, "state": end.state,
            "stopped_for": end.stopped_for, "lines": self.lines,
            "trainer_summary": dict(self.summary_fields),
            "workers": self.worker_word, "tok_s_derived": self.derived,
            "format": self.format_name, "metric_note": self.metric_note(),
            "torch_version": self.start_fields.get("torch"),
        }

    def expected_drafters(self) -> int:
        """How many drafters the run should have: the playbook's expect_drafters, else the
        trainer's start line (drafters=N), else those seen in the log."""
        announced = _number(self.start_fields.get("drafters"))
        return max(self.expect_drafters or 0, int(announced or 0), len(self.drafters))

    def never_stepped(self) -> list[int]:
        """The drafters that never logged a step: still in their first (compiling) step."""
        return [index for index in range(self.expected_drafters())
                if index not in self.drafters or not self.drafters[index].step]

    def _first_compile_message(self, stuck: list[int], silent: float, facts: dict) -> str:
        version = facts.get("torch_version") or "?"
        return (f"{len(stuck)} of the {self.expected_drafters()} drafters (drafter "
                f"{', '.join(str(d) for d in stuck)}) hung in their first compile: no new step line "
                f"for {silent:.0f} s while the process lived, on torch {version} whose FX tracing "
                f"flag is already thread-local ({facts.get('fx_tls_state')}), so not the FX race; ")

    def _fx_message(self, facts: dict) -> str:
        version = facts.get("torch_version") or "?"
        state = facts.get("fx_tls_state")
        state_text = {"vulnerable": "vulnerable (process-wide, shared by all threads)",
                      "drifted": "drifted (orch's patch was undone, e.g. by a reinstall)",
                      "patched": "patched by orch, yet the error appeared",
                      "fixed-upstream": "fixed upstream, yet the error appeared"}.get(
            state, state or "not checked")
        count = len({line for line in self.seen.get("drafter-error", []) if "FX" in line}) or 1
        return (f"FX tracing race: {count} drafter(s) raised \"Detected that you are using FX to "
                f"symbolically trace a dynamo-optimized function\"; torch {version} on "
                f"{self.target}: its FX state {state_text}")

    def _last_exception(self) -> Optional[str]:
        for line in reversed(self.tail):
            text = line.strip()
            if _EXCEPTION_LINE.match(text) and not text.startswith("Traceback"):
                return text[:300]
        return None

    def _message(self, verdict: str, end: EndState, total: Optional[float]) -> str:
        if self.metric is None and not any(d.done for d in self.drafters.values()):
            return self._steps_message(verdict, end, total)
        drafters = sorted(self.drafters.values(), key=lambda d: d.drafter)
        done = sum(d.done and not d.error for d in drafters)
        expected = self.expected_drafters()
        rate = f", {total:,.0f} tok/s total" if total else ""
        if verdict == "ok":
            if end.watch_ended:
                return f"healthy: {len(drafters)} drafters training{rate}; the run goes on"
            return f"ok: {done}/{len(drafters)} drafters trained{rate}"
        ending = (f"exit {end.exit_code}" if end.exit_code is not None
                  else "still running" if end.state == "running" else end.state)
        return f"{verdict}: {done}/{expected} drafters finished{rate} ({ending})"


FIRST_COMPILE_HANG = "hang:first-compile"   # a hang (verdict hang, exit 11) of its own kind


def first_compile_remediation(cli: str = "orch", playbook: Optional[str] = None) -> str:
    """A hang in the first compile on a torch whose FX flag is thread-local: compile threads
    deadlocking on a shared GPU (seen 1 run in 3 with two drafters on one H200)."""
    rerun = (f" (`{cli} run {playbook} -e 'extra_args=[--serialize-compile]'`)" if playbook else "")
    return ("the drafters' compile threads deadlocked on a shared GPU (seen 1 run in 3 with two "
            "drafters on one H200; orch's FX patch is in place and does not help here). Serialise "
            "the first compile: the stand-in trainer's --serialize-compile, set through the "
            f"playbook's extra_args var{rerun}, or run one drafter per GPU.")


def fx_remediation(target: str, facts: dict, cli: str = "orch", playbook: Optional[str] = None) -> str:
    version = facts.get("torch_version") or "this torch"
    state = facts.get("fx_tls_state")
    rerun = f"; then rerun: `{cli} run {playbook}`" if playbook else "; then rerun the playbook"
    if state in THREAD_LOCAL:
        return (f"the flag is already thread-local in torch {version} on {target}; the race left "
                "another trace: FX also patches nn.Module.__call__ process-wide while tracing "
                "(upstream PR 187589). Serialise each drafter's first step (--serialize-compile).")
    state_word = "vulnerable" if state in (None, "vulnerable") else state
    # fx-threads, not the flag-only fx-tls: the same threads also share FX's node-meta state
    # and its trace-time patches, and the next compile would trip over those.
    return (f"torch {version} on {target} is {state_word}: its FX tracing flag (and the other FX "
            f"state threads share) is process-wide. Make it thread-local: `{cli} patch fx-threads "
            f"apply -t {target}`" + rerun + f" (check with `{cli} verify fx-threads -t {target}`)")


def fx_state_finding(signature: str, target: str, facts: dict, cli: str, playbook: Optional[str],
                     seen: dict) -> tuple[str, str]:
    """(message, remediation) for an FX state other than the flag that threads shared."""
    version = facts.get("torch_version") or "this torch"
    rerun = f"; then rerun: `{cli} run {playbook}`" if playbook else "; then rerun the playbook"
    if signature == FX_NODE_META:
        where = seen.get(FX_NODE_META_FRAME, [])
        raised = f" ({where[-1]})" if where else " (torch/fx/traceback.py's annotate())"
        return (f"FX node-meta race: KeyError 'custom'{raised}: another thread left "
                f"preserve_node_meta() while this one's annotate() was open; torch {version} on "
                f"{target} keeps current_meta as a process-global",
                f"make FX's node-meta state thread-local: `{cli} patch fx-threads apply -t "
                f"{target}`" + rerun + f" (check with `{cli} verify fx-threads -t {target}`)")
    return (f"FX trace-time patching leaked into another thread: {seen[signature][0][:200]!r}: "
            f"while one thread traces, torch {version} on {target} patches nn.Module.__call__/"
            "__getattr__ and math.* process-wide (CURRENT_PATCHER in torch/fx/_symbolic_trace.py)",
            f"make the trace-time patches act only in the tracing thread: `{cli} patch fx-threads "
            f"apply -t {target}`" + rerun + f" (check with `{cli} verify fx-threads -t {target}`);"
            " serialising each drafter's first, compiling step (--serialize-compile) also avoids it")
