"""Watching a detached run: follow its log by byte offset, survive link drops, classify.

Pieces (the launcher payload's calls themselves are in payload_api):
- LogFollower: one long-lived launcher `tail` in the container over one channel. Its JSON
  events carry the byte offset each chunk starts at, so after a reconnect the follower
  asks for exactly the bytes after the last one it has: no line lost, none repeated.
  Heartbeats every second tell a live link from a dead one: after `stall_after` seconds of
  silence the follower drops the channel (and the host's connection, which a dead link has
  left half-open) and starts again.
- Monitor: feeds the lines to a LogClassifier, batches metric points into the run store,
  stops a hung process, and turns the end into a verdict.
- monitor_run(): one launched run watched to its end for a run's record (the monitor step
  and `orch attach` both call it).
"""

from __future__ import annotations

import codecs
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Protocol

from orchestrator.ground import paths
from orchestrator.ground.strenum import StrEnum
from orchestrator.ground.errors import CommandTimeout, ExitCode, OrchError
from orchestrator.watch.logformats import (MAX_WORKERS, DerivedThroughput, LogParser, TrainerStateError,
                                           log_history_points, make_format, trainer_state_spacing)
from orchestrator.ground.verdicts import FX_RACE
from orchestrator.watch.classify import ClassifierSettings, EndState, LogClassifier, ProgressSnapshot, Verdict
from orchestrator.watch.tbevents import TAGS, ReaderMissing, read_event_file, tensorboard_points
from orchestrator.remote.payload_api import collect_files, error_event, launcher, parse_event, start_tail, stop_run
from orchestrator.remote.container import Target
from orchestrator.runs.gpu import append_sample, gpu_sample, gpu_stats
from orchestrator.runs.model import MetricPoint, RunState

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.runs.recorder import RunRecorder


class RunUnreachable(OrchError):
    exit_code = ExitCode.RUN_UNREACHABLE


# ------------------------------------------------------------------------ the follower
class FollowOutcome(StrEnum):
    """How one tail channel ended (LogFollower._pump); follow() decides what comes next."""

    ENDED = "ended"                     # the run's result came: the process ended, its log read whole
    STOP = "stop"                       # the handler said stop
    ROTATE = "connected-rotate"         # the tail ended on purpose (its max_seconds, superseded): a new one
    LOST = "lost"                       # the channel closed before the tail's first word
    CONNECTED_LOST = "connected-lost"   # ... after it: the link went away under a running tail
    STALLED = "stalled"                 # no first word in first_event_after seconds
    ERROR = "error"                     # starting or reading the tail raised


class FollowHandler:
    """What a follower tells its user; every method is optional."""

    def on_data(self, data: bytes) -> None: ...
    def on_file_data(self, name: str, data: bytes) -> None: ...
    def on_beat(self, event: dict) -> None: ...
    def on_gpu(self, event: dict) -> None: ...
    def on_connection(self, up: bool, detail: str, downtime: float = 0.0) -> None: ...
    def tick(self) -> None: ...
    def should_stop(self) -> bool:
        return False


class LogFollower:
    def __init__(self, target: Target, run_dir: str, *, offset: int = 0, stall_after: float = 8.0,
                 first_event_after: float = 30.0, unreachable_after: float = 300.0,
                 rotate_after: float = 3600.0, gpu_every: float = 0.0, gpus=(),
                 min_interval: float = 0.05, max_interval: float = 0.2,
                 follower_id: Optional[str] = None, clock: Callable[[], float] = time.monotonic,
                 follow: tuple = (), offsets: Optional[dict] = None):
        self.target = target
        self.run_dir = run_dir
        self.offset = offset
        self.extra_logs = list(follow)          # more logs under run_dir (glob patterns)
        self.offsets = dict(offsets or {})      # their byte offsets, by path under run_dir
        self.stall_after = stall_after
        self.first_event_after = first_event_after
        self.unreachable_after = unreachable_after
        self.rotate_after = rotate_after
        self.gpu_every = gpu_every
        self.gpus = list(gpus)
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.follower_id = follower_id or uuid.uuid4().hex[:12]
        self.clock = clock
        self.reconnects = 0
        self.last_beat: dict = {}
        self._last_event = clock()

    def follow(self, handler: FollowHandler) -> Optional[dict]:
        """Until the process ended and its whole log was read: returns the final event.
        Returns None when handler.should_stop() said so. Raises RunUnreachable when the
        target stayed out of reach for unreachable_after seconds."""
        down_since: Optional[float] = None
        backoff = 0.5
        silent_starts = 0
        while True:
            if handler.should_stop():
                return None
            process = None
            timed_out = False
            try:
                process = self._spawn()
                outcome, final = self._pump(process, handler, down_since)
            except OrchError as error:
                outcome, final = FollowOutcome.ERROR, str(error)
                timed_out = isinstance(error, CommandTimeout)   # by type: not by its wording
            finally:
                if process is not None:
                    _close_quietly(process)
            if outcome == FollowOutcome.ENDED:
                return final
            if outcome == FollowOutcome.STOP:
                return None
            if outcome == FollowOutcome.ROTATE:
                down_since, backoff, silent_starts = None, 0.5, 0
                continue
            if outcome == FollowOutcome.LOST:
                # The payload ended without a word: ask the launcher the usual way, which
                # raises the real reason (container stopped, no python3, no such CT).
                silent_starts += 1
                launcher(self.target, "status", self.run_dir, timeout=60)
                if silent_starts >= 3:
                    raise OrchError(f"{self.target.describe()}: the log follower ends at once "
                                    f"without output (tried {silent_starts} times)",
                                    hint=f"try `orch exec {self.target.name} -- python3 -V`")
            # Lost: a stall, an end of output without a result, or a failed start.
            now = self.clock()
            if outcome == FollowOutcome.CONNECTED_LOST:
                down_since = None
            if down_since is None:
                # The link went quiet when its last event came, not when the silence was noticed.
                down_since = self._last_event if outcome == FollowOutcome.CONNECTED_LOST else now
                self.reconnects += 1
                handler.on_connection(False, final if isinstance(final, str) else outcome)
            if outcome in (FollowOutcome.STALLED, FollowOutcome.CONNECTED_LOST) or timed_out:
                # A silent channel on a dead link leaves the SSH connection half-open: drop it
                # so the next try connects afresh instead of waiting out TCP's back-off.
                _drop_connection(self.target)
            if now - down_since > self.unreachable_after:
                raise RunUnreachable(
                    f"{self.target.describe()} unreachable for {now - down_since:.0f} s while "
                    f"monitoring {self.run_dir}: {final}",
                    hint="the run goes on in the container; `orch attach RUN` follows it again")
            deadline = self.clock() + backoff
            while self.clock() < deadline:
                handler.tick()
                if handler.should_stop():
                    return None
                time.sleep(0.1)
            backoff = min(backoff * 2, 4.0)

    def _spawn(self):
        args = {"offset": self.offset, "follower": self.follower_id,
                "max_seconds": self.rotate_after, "gpu_every": self.gpu_every, "gpus": self.gpus,
                "min_interval": self.min_interval, "max_interval": self.max_interval}
        if self.extra_logs:
            args.update(follow=self.extra_logs, offsets=self.offsets)
        return start_tail(self.target, self.run_dir, **args)

    def _pump(self, process, handler: FollowHandler, down_since: Optional[float]):
        last_event = self.clock()
        connected = False
        while True:
            try:
                line = process.readline(0.25)
            except TimeoutError:
                now = self.clock()
                handler.tick()
                if handler.should_stop():
                    return FollowOutcome.STOP, None
                limit = self.stall_after if connected else self.first_event_after
                if now - last_event > limit:
                    return (FollowOutcome.CONNECTED_LOST if connected else FollowOutcome.STALLED), \
                        f"no word from the monitor in {now - last_event:.0f} s"
                continue
            except (BrokenPipeError, ConnectionError, EOFError, OSError) as error:
                return (FollowOutcome.CONNECTED_LOST if connected else FollowOutcome.LOST), str(error)
            if not line:
                return (FollowOutcome.CONNECTED_LOST if connected else FollowOutcome.LOST), \
                    "the monitor's channel closed"
            event = parse_event(line)
            if event is None:
                continue
            last_event = self._last_event = self.clock()
            kind = event.get("event")
            if kind == "hello":
                connected = True
                if down_since is not None:
                    handler.on_connection(True, "reconnected", last_event - down_since)
                self.last_beat = event
                handler.on_beat(event)
            elif kind == "data":
                self._data(event, handler)
            elif kind == "beat":
                self.last_beat = event
                handler.on_beat(event)
            elif kind == "gpu":
                handler.on_gpu(event)
            elif kind == "truncated":
                # The log shrank under us (rotated or rewritten): start over at its beginning.
                self.offset = 0
            elif kind == "result":
                self.last_beat = event
                if event.get("rotate") or event.get("superseded"):
                    return FollowOutcome.ROTATE, event
                return FollowOutcome.ENDED, event
            elif kind == "error":
                raise error_event(self.target, event)
            handler.tick()
            if handler.should_stop():
                return FollowOutcome.STOP, None

    def _data(self, event: dict, handler: FollowHandler) -> None:
        raw = str(event.get("text", "")).encode("utf-8", "surrogateescape")
        at = int(event.get("at", 0))
        end = at + len(raw)
        name = event.get("file")
        seen = self.offset if name is None else self.offsets.get(str(name), 0)
        if end <= seen:
            return  # all seen already (an older tail's last words)
        if at < seen:
            raw = raw[seen - at:]
        if name is None:
            self.offset = end
            handler.on_data(raw)
        else:
            self.offsets[str(name)] = end
            handler.on_file_data(str(name), raw)


def _close_quietly(process) -> None:
    try:
        process.close()
    except Exception:  # noqa: BLE001 - a channel on a dead link may fail to close; it is gone
        pass


def _drop_connection(target: Target) -> None:
    """Close the host's connection without waiting (a close on a dead link may take a while)."""
    host = getattr(target, "host", None)
    if host is not None and hasattr(host, "close"):
        threading.Thread(target=_close_quietly, args=(host,), daemon=True).start()


# --------------------------------------------------------------------------- settings
@dataclass
class MonitorSettings:
    hang_after: float = 120.0
    expected_tok_s: Optional[float] = None
    degraded_below: Optional[float] = None
    metric_regex: Optional[str] = None
    format: str = "auto"                    # how to read the log: logformats.FORMATS
    tokens_per_step: Optional[float] = None  # for tok/s where the trainer prints none
    tokens_per_sample: Optional[float] = None  # x the samples/s a trainer prints, for tok/s
    follow: list = field(default_factory=list)   # more logs under the run dir (torchrun's ranks)
    worker_word: str = ""                   # what a worker is: rank (torchrun); else from the log
    logging_steps: Optional[int] = None     # a Hugging Face Trainer's, for dicts without a bar
    rank_offset: int = 0                    # a node's first global rank (node rank x nproc per node)
    trainer_state: Optional[str] = None     # a trainer_state.json in the target, read at the end
    tensorboard: Optional[str] = None       # TensorBoard event files (a folder or a file), ditto
    warmup_steps: int = 1
    expect_drafters: Optional[int] = None
    watch_for: Optional[float] = None       # seconds; then leave a healthy run going
    timeout: Optional[float] = None         # seconds; then stop the run (verdict timeout)
    stop_on_hang: bool = True
    grace: float = 10.0
    gpu_every: float = 5.0
    gpus: list = field(default_factory=list)
    stall_after: float = 8.0
    unreachable_after: float = 300.0
    offset: int = 0
    offsets: dict = field(default_factory=dict)   # the followed logs' byte offsets

    @classmethod
    def from_params(cls, params: dict) -> "MonitorSettings":
        known = {k: v for k, v in params.items() if k in cls.__dataclass_fields__ and v is not None}
        return cls(**known)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class MonitorSink:
    """Where a monitor reports: the console and the run store (the runner provides one)."""

    def log_line(self, target: str, line: str) -> None: ...
    def progress(self, target: str, snapshot: ProgressSnapshot, status: dict) -> None: ...
    def note(self, target: str, text: str, level: str = "info") -> None: ...
    def metrics(self, target: str, points: list[MetricPoint]) -> None: ...


class Monitor(FollowHandler):
    """Watches one launched run on one target until it ends (or watch_for, or a stop)."""

    METRIC_FLUSH_S = 1.0

    def __init__(self, target: Target, run_dir: str, settings: MonitorSettings, sink: MonitorSink,
                 *, stream_copy: Optional[str] = None, follower_id: Optional[str] = None,
                 stacks_taker: Optional[Callable[[], dict]] = None):
        self.target = target
        # takes the run's stacks (every rank's under torchrun) when it is called hung, before
        # anything is stopped: a stopped process has none left to show
        self.stacks_taker = stacks_taker
        self.hang_stacks: Optional[dict] = None
        self.run_dir = run_dir
        self.settings = settings
        self.sink = sink
        self.started = time.monotonic()
        # One format for all of a run's logs: its state (a Trainer dict waiting for its
        # step) is per worker. One stream per log file: each has its own partial line.
        self.log_format = make_format(settings.format, settings.metric_regex, settings.logging_steps)
        self.classifier = LogClassifier(ClassifierSettings(
            target.name, metric_regex=settings.metric_regex, hang_after=settings.hang_after,
            expected_tok_s=settings.expected_tok_s, degraded_below=settings.degraded_below,
            warmup_steps=settings.warmup_steps, expect_drafters=settings.expect_drafters,
            metrics_from_lines=False, worker_word=settings.worker_word,
            rank_logs_expected=bool(settings.follow), metric_lines=self.log_format.is_metric_line,
            format_name=self.log_format.describe(),
            format_tried=getattr(self.log_format, "tried", lambda: "")() or self.log_format.shape),
            now=self.started)
        self._decoders: dict = {}
        self.parsers: dict[Optional[str], LogParser] = {}
        self.derive = DerivedThroughput(settings.tokens_per_step, settings.tokens_per_sample)
        self.follower = LogFollower(target, run_dir, offset=settings.offset,
                                    stall_after=settings.stall_after,
                                    unreachable_after=settings.unreachable_after,
                                    gpu_every=settings.gpu_every, gpus=settings.gpus,
                                    follower_id=follower_id, follow=settings.follow,
                                    offsets=settings.offsets)
        self._copies: dict = {}
        self._points: list[MetricPoint] = []
        # points that carry no step number (a Trainer's dicts, no bar, no logging_steps), held
        # until the run's end says the steps between them; past HELD_POINTS stored as counted
        self._counted: list[MetricPoint] = []
        self.counted_note: Optional[str] = None
        # the steps handed to the sink, kept only to compare with what the trainer wrote as
        # data (a trainer_state.json, TensorBoard event files)
        self.recorded_steps: Optional[set] = (set() if settings.trainer_state or settings.tensorboard
                                              else None)
        self._flushed = time.monotonic()
        self._alive = True
        self._state: dict = {}
        self.stopped_for: Optional[str] = None
        self.hang_seconds: Optional[float] = None
        self._stopper: Optional[threading.Thread] = None
        self._stop_error: Optional[str] = None
        self._watch_ended = False
        self._warned_degraded = False
        self._down_since: Optional[float] = None
        self.gpus_seen: list = []
        self.gpu_series: list = []      # every sample (runs/gpu.py), not only the last
        self.cpu_s: Optional[float] = None
        self._stream = open(stream_copy, "ab" if settings.offset else "wb") if stream_copy else None
        self._copy_dir = os.path.dirname(stream_copy) if stream_copy else None

    # ----------------------------------------------------------------- the run
    def run(self) -> tuple[EndState, dict]:
        """Follow to the end; returns how it ended and the tail payload's last status."""
        try:
            final = self.follower.follow(self)
        finally:
            self._flush_lines(final=True)
            self._flush_metrics(force=True)
            if self._stream:
                self._stream.close()
            for copy in self._copies.values():
                copy.close()
        if self._stopper is not None:
            self._stopper.join(timeout=self.settings.grace + 40)
        if final is None:
            # watch_for elapsed (or a stop was asked): the run goes on.
            status = self.follower.last_beat or {}
            return EndState(state=RunState.RUNNING, watch_ended=self._watch_ended,
                            stopped_for=self.stopped_for), status
        stop_requested = bool(final.get("stop_requested"))
        stopped_for = self.stopped_for or ("user" if stop_requested else None)
        return EndState(state=RunState.of(final.get("state", RunState.UNKNOWN)), exit_code=final.get("exit_code"),
                        signal=final.get("signal"), stopped_for=stopped_for,
                        hang_seconds=self.hang_seconds, hang_stacks=self.hang_stacks), final

    TRAINER_STATE_LIMIT = 16 << 20     # bytes of a trainer_state.json read, at most

    def read_trainer_state(self) -> dict:
        """The trainer's own record (a Hugging Face trainer_state.json) once the run ended,
        parsed here. Its steps say whether the log's points were right; where the log gave
        no point at all, its entries become the run's points. Returns what the summary keeps."""
        path = self.settings.trainer_state
        found: dict = {"path": path}
        try:
            result = self.target.run(["head", "-c", str(self.TRAINER_STATE_LIMIT), path], timeout=60)
        except OrchError as error:
            return {**found, "error": str(error)}
        if not result.ok:
            return {**found, "error": result.error_text.strip()[-300:] or f"exit {result.exit_code}"}
        try:
            points = log_history_points(result.text)
        except TrainerStateError as error:
            return {**found, "error": str(error)}
        found.update(entries=len(points), steps=sorted({p.step for p in points}))
        self.settle_counted(trainer_state_spacing(result.text), "trainer_state.json's logging_steps")
        return self._check_or_adopt(found, points, "trainer_state.json")

    HELD_POINTS = 100_000     # points without step numbers held for their spacing, at most

    def settle_counted(self, spacing: Optional[int] = None, how: str = "") -> None:
        """The held log points (no step numbers printed) at the run's end: numbered by the
        spacing the log format worked out (the Trainer's logging_steps, or its closing
        summary), or the one given (trainer_state.json's logging_steps); else stored as what
        they are, log points in order, and the record says so."""
        if not self._counted:
            return
        known = self.log_format.spacing() if hasattr(self.log_format, "spacing") else None
        if known is None and spacing:
            known = (spacing, how)
        if known is not None:
            every, how = known
            self.classifier.number_points(every)
            for metric in self._counted:
                metric.step *= every
            self.counted_note = f"steps numbered in log order x {every} ({how})"
        else:
            self.counted_note = (f"{self.classifier.counted_points()} log points, no step numbers printed (no "
                                 f"logging_steps on the command line, in the monitor or in a trainer_state.json)")
        self._points.extend(self._counted)
        self._counted = []
        self._flush_metrics(force=True)

    def _check_or_adopt(self, found: dict, points: list, source: str) -> dict:
        """The steps a trainer wrote as data against the points read from its log: whether
        they agree, or, where the log gave no point at all, they become the run's points."""
        logged = sorted(self.recorded_steps or ())
        if not logged and points:
            now = time.monotonic()
            for point in points:
                metric = self.classifier.observe(self.derive.fill(point, now), now)
                if metric is not None:
                    self._points.append(metric)
            self._flush_metrics(force=True)
            found["points_from"] = f"{source} (the log gave none)"
        else:
            found["agrees_with_log"] = logged == sorted({p.step for p in points})
        return found

    TENSORBOARD_LIMIT = 16 << 20       # bytes of event files collected, at most, all together

    def read_tensorboard(self) -> dict:
        """A trainer's TensorBoard event files under settings.tensorboard once the run ended:
        collected from the target (bounded, stdlib), kept beside stream.log (tensorboard/),
        parsed here with TensorBoard's loader. As read_trainer_state: they check the log's
        steps, or give the points the log did not. Returns what the summary keeps."""
        path = self.settings.tensorboard
        found: dict = {"path": path}
        try:
            collected = collect_files(self.target, path, max_bytes=self.TENSORBOARD_LIMIT)
        except OrchError as error:
            return {**found, "error": str(error)}
        files, events = [], []
        for entry in collected["files"]:
            row = {k: entry[k] for k in ("path", "size", "read", "error") if k in entry}
            files.append(row)
            if "data" not in entry:
                continue
            self._keep_event_file(entry["path"], entry["data"])
            try:
                event_file = read_event_file(entry["path"], entry["data"])
            except ReaderMissing as error:
                return {**found, "files": files, "error": str(error)}
            row["records"] = event_file.records
            if event_file.problem:
                row["problem"] = event_file.problem
            if event_file.tags_left_out:
                row["tags_left_out"] = event_file.tags_left_out
            events.append(event_file)
        found.update(files=files, left_out=collected.get("left_out", 0))
        if not files:
            return {**found, "error": f"no TensorBoard event file (*tfevents*) under {path}"}
        points = tensorboard_points(events)
        steps = sorted({p.step for p in points})
        found.update(entries=len(points), first_step=steps[0] if steps else None,
                     last_step=steps[-1] if steps else None,
                     tags=sorted({tag for f in events for _, tag, _ in f.scalars})[:TAGS])
        return self._check_or_adopt(found, points, "TensorBoard event files")

    def _keep_event_file(self, name: str, data: bytes) -> None:
        """The run's copy of an event file (open it with `tensorboard --logdir`)."""
        if self._copy_dir is None or ".." in name.split("/") or name.startswith("/"):
            return
        path = os.path.join(self._copy_dir, "tensorboard", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)

    def verdict(self, end: EndState, facts: dict, cli: str, playbook: Optional[str]) -> Verdict:
        if end.state != RunState.RUNNING:
            self.settle_counted()
        result = self.classifier.classify(end, facts, cli=cli, playbook=playbook)
        result.summary["reconnects"] = self.follower.reconnects
        if self.counted_note:
            result.summary["steps_numbered"] = self.counted_note
        backwards = getattr(getattr(self.log_format, "picked", None) or self.log_format, "backwards", 0)
        if backwards:
            result.summary["steps_not_read"] = (f"{backwards} line(s) whose step was lower than their "
                                                f"worker's last: not read as steps")
        if self.gpus_seen:
            result.summary["gpus"] = self.gpus_seen
        if self.gpu_series:
            result.summary["gpu_series"] = self.gpu_series
            result.summary["gpu_stats"] = gpu_stats(self.gpu_series)
        if self.cpu_s is not None:
            result.summary["monitor_cpu_s"] = self.cpu_s
        if self._stop_error:
            result.summary["stop_error"] = self._stop_error
        return result

    # ------------------------------------------------------------ FollowHandler
    def on_data(self, data: bytes) -> None:
        if self._stream:
            self._stream.write(data)
            self._stream.flush()
        self._read(None, data)

    def on_file_data(self, name: str, data: bytes) -> None:
        """A chunk of one more log (a torchrun rank's), kept beside stream.log."""
        self.classifier.rank_logs_started()
        copy = self._copy(name)
        if copy is not None:
            copy.write(data)
            copy.flush()
        self._read(name, data)

    def _copy(self, name: str):
        if self._copy_dir is None or ".." in name.split("/") or name.startswith("/"):
            return None
        if name not in self._copies and len(self._copies) >= MAX_WORKERS:   # an open file each
            return None
        if name not in self._copies:
            path = os.path.join(self._copy_dir, "logs", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._copies[name] = open(path, "ab" if self.settings.offsets.get(name) else "wb")
        return self._copies[name]

    def _parser(self, name: Optional[str]) -> LogParser:
        if name not in self.parsers:
            self.parsers[name] = LogParser(self.log_format, worker=self._global(worker_of(name)),
                                           workers=self.classifier.worker_cap, source=name,
                                           rank_offset=self.settings.rank_offset)
        return self.parsers[name]

    def _global(self, local: Optional[int]) -> Optional[int]:
        """A rank log's local rank as the job's global rank (node rank x nproc + local rank)."""
        return None if local is None else local + self.settings.rank_offset

    def _read(self, name: Optional[str], data: bytes) -> None:
        # Output is life, parsed or not: liveness never waits for a line orch can read.
        self.classifier.saw_output(time.monotonic(), self._global(worker_of(name)))
        if name not in self.parsers and len(self.parsers) > MAX_WORKERS:
            self.classifier.worker_cap.refused += 1   # one log too many: a decoder and a parser each
            return
        if name not in self._decoders:     # a character cut between two chunks stays whole
            self._decoders[name] = codecs.getincrementaldecoder("utf-8")("replace")
        self._take(name, *self._parser(name).feed(self._decoders[name].decode(data)))

    def _flush_lines(self, final: bool) -> None:
        """At the end: what the logs said after their last newline, and held-back points."""
        if final:
            for name, parser in list(self.parsers.items()):
                self._take(name, *parser.finish())

    def _take(self, name: Optional[str], lines: list, points: list) -> None:
        now = time.monotonic()
        worker = self._global(worker_of(name))
        for line in lines:
            self.classifier.feed(line, now, name, worker)
            shown = line if worker is None else f"[{self.classifier.worker_word} {worker}] {line}"
            self.sink.log_line(self.target.name, shown)
        for point in points:
            metric = self.classifier.observe(self.derive.fill(point, time.time()), now)
            if metric is None:
                continue
            if point.counted and len(self._counted) < self.HELD_POINTS:
                self._counted.append(metric)        # its step waits for the spacing (the end)
            else:
                self._points.append(metric)
        self.classifier.format_chosen(self.log_format.describe())   # auto says what it picked
        if lines or points:
            self.sink.progress(self.target.name, self.classifier.snapshot(), self._state)
        self._flush_metrics()

    def _flush_metrics(self, force: bool = False) -> None:
        if self._points and (force or time.monotonic() - self._flushed >= self.METRIC_FLUSH_S
                             or len(self._points) >= 200):
            points, self._points = self._points, []
            self._flushed = time.monotonic()
            if self.recorded_steps is not None:
                self.recorded_steps.update(p.step for p in points)
            self.sink.metrics(self.target.name, points)

    def on_beat(self, event: dict) -> None:
        self._state = event
        self._alive = event.get("state") == RunState.RUNNING
        if event.get("cpu_s") is not None:
            self.cpu_s = event["cpu_s"]
        self.sink.progress(self.target.name, self.classifier.snapshot(), event)

    def on_gpu(self, event: dict) -> None:
        self.gpus_seen = event.get("gpus") or []
        if any(isinstance(g, dict) and (g.get("utilization_pct") or 0) > 0 for g in self.gpus_seen):
            # busy GPUs are a run at work (a long first compile, a silent data loader)
            self.classifier.saw_output(time.monotonic())
        self._state = {**self._state, "gpus": self.gpus_seen}
        append_sample(self.gpu_series, gpu_sample(event, time.monotonic() - self.started))

    def on_connection(self, up: bool, detail: str, downtime: float = 0.0) -> None:
        if up:
            # Silence we could not see is not evidence of a hang.
            self.classifier.shift(downtime)
            self._down_since = None
            self.sink.note(self.target.name, f"reconnected after {downtime:.1f} s; resuming the "
                                             f"log at byte {self.follower.offset}", "warn")
        else:
            self._down_since = time.monotonic()
            self.sink.note(self.target.name, f"lost the monitor's connection ({detail}); "
                                             "the run goes on; reconnecting", "warn")

    def tick(self) -> None:
        self._flush_metrics()
        now = time.monotonic()
        s = self.settings
        if self._down_since is not None or self._stopper is not None:
            return
        if s.timeout and now - self.started >= s.timeout and self._alive:
            self._stop("timeout", f"the monitor's limit of {s.timeout:g} s is reached")
            return
        if s.stop_on_hang and self.classifier.hung(now, self._alive):
            self.hang_seconds = self.classifier.silent_for(now)
            quiet = self.classifier.silent_workers(now)
            what = ("no new step line" if self.classifier.steps_seen else "no output at all")
            self._stop("hang", f"{what} for {self.hang_seconds:.0f} s while the process lives: a hang"
                               + (f" ({quiet})" if quiet else ""))
            return
        if s.watch_for and now - self.started >= s.watch_for and self._alive:
            self._watch_ended = True
        if not self._warned_degraded and self.classifier.degraded(live=True) and \
                len([d for d in self.classifier.workers.values() if d.rates]) > 0 and \
                now - self.started > 30:
            self._warned_degraded = True
            total = self.classifier.total_tok_s(live=True) or 0
            self.sink.note(self.target.name, f"throughput {total:,.0f} tok/s is under the "
                                             f"threshold {float(s.degraded_below):,.0f}", "warn")

    def should_stop(self) -> bool:
        return self._watch_ended

    def stop(self, reason: str, why: str) -> None:
        """Stop the run from outside (another node of the job failed): SIGTERM to its
        process group, SIGKILL after the grace; the follower reads it to its end."""
        if self._stopper is None:
            self._stop(reason, why)

    def _stop(self, reason: str, why: str) -> None:
        self.stopped_for = reason
        self.sink.note(self.target.name, f"{why}; stopping it (SIGTERM, SIGKILL after "
                                         f"{self.settings.grace:g} s)", "warn")

        def work() -> None:
            if reason == "hang" and self.stacks_taker is not None:
                self._take_hang_stacks()
            try:
                stop_run(self.target, self.run_dir, self.settings.grace, reason=reason)
            except OrchError as error:
                self._stop_error = str(error)
                self.sink.note(self.target.name, f"could not stop the run: {error}", "error")

        self._stopper = threading.Thread(target=work, daemon=True)
        self._stopper.start()


    def _take_hang_stacks(self) -> None:
        """The hung process's stacks, kept for the record and as stacks.json in the run's
        folder; a failure to take them is recorded, and the run is stopped all the same."""
        self.sink.note(self.target.name, "taking the stacks of the run's processes before stopping it")
        started = time.monotonic()
        try:
            taken = self.stacks_taker()
        except Exception as error:  # noqa: BLE001 - no stacks must never keep a hung run alive
            taken = {"results": [], "error": f"{type(error).__name__}: {error}"[:600]}
        taken["seconds"] = round(time.monotonic() - started, 1)
        self.hang_stacks = taken
        for result in taken.get("results") or []:
            for cycle in result.get("cycles") or []:
                self.sink.note(self.target.name, f"{cycle['line']}: {cycle['words']}", "warn")
        if self._copy_dir is not None:
            with open(os.path.join(self._copy_dir, "stacks.json"), "w") as handle:
                json.dump(taken, handle, indent=1, default=str)


def worker_of(name: Optional[str]) -> Optional[int]:
    """The rank a followed log belongs to: torchrun's --log-dir layout is
    <run id>/attempt_<n>/<local rank>/stdout.log (or stderr.log)."""
    if not name:
        return None
    parts = name.split("/")
    return int(parts[-2]) if len(parts) >= 2 and parts[-2].isdigit() else None


def stream_copy_path(local_dir: str) -> str:
    os.makedirs(local_dir, exist_ok=True)
    return os.path.join(local_dir, "stream.log")


# ------------------------------------------------------------ a run's monitor
class MonitorReporter(Protocol):
    """What a monitor tells the console (the run's Reporter has these and more)."""

    def monitor_started(self, target: str, run_dir: str, settings: MonitorSettings) -> None: ...
    def monitor_ended(self, target: str) -> None: ...
    def monitor_progress(self, target: str, snapshot: ProgressSnapshot, status: dict) -> None: ...
    def log_line(self, target: str, line: str) -> None: ...
    def note(self, target: str, text: str, level: str = "info") -> None: ...


class ReportingSink(MonitorSink):
    """A monitor's reports: lines and progress to the console, metric points to the record."""

    def __init__(self, reporter: MonitorReporter, recorder: "RunRecorder"):
        self.reporter = reporter
        self.recorder = recorder

    def log_line(self, target: str, line: str) -> None:
        self.reporter.log_line(target, line)

    def progress(self, target: str, snapshot: ProgressSnapshot, status: dict) -> None:
        self.reporter.monitor_progress(target, snapshot, status)

    def note(self, target: str, text: str, level: str = "info") -> None:
        self.reporter.note(target, text, level)

    def metrics(self, target: str, points: list[MetricPoint]) -> None:
        self.recorder.add_metrics(points)


def monitor_run(target: Target, run_dir: str, settings: MonitorSettings, *,
                recorder: "RunRecorder", reporter: MonitorReporter, cli: str = "orch",
                rerun: str = "", fresh_facts: Optional[Callable[[Target], dict]] = None,
                follower_id: Optional[str] = None,
                stacks_taker: Optional[Callable[[], dict]] = None) -> tuple[Verdict, dict]:
    """Watch one run to its end; its metrics, target facts and summary go to the recorder.
    fresh_facts(target) asks the target again (torch version, fx-tls state) once an FX race
    is seen; cli and rerun make the remediation commands. Returns the verdict and the data
    a step records."""
    monitor = make_monitor(target, run_dir, settings, recorder=recorder, reporter=reporter,
                           follower_id=follower_id, stacks_taker=stacks_taker)
    reporter.monitor_started(target.name, run_dir, settings)
    try:
        end, _final = monitor.run()
    finally:
        reporter.monitor_ended(target.name)
    return judge(monitor, end, recorder=recorder, cli=cli, rerun=rerun, fresh_facts=fresh_facts)


def make_monitor(target: Target, run_dir: str, settings: MonitorSettings, *,
                 recorder: "RunRecorder", reporter: MonitorReporter,
                 follower_id: Optional[str] = None,
                 stacks_taker: Optional[Callable[[], dict]] = None) -> Monitor:
    """A run's monitor reporting to the console and the record, its stream kept in the
    run's folder (one folder per target)."""
    local = os.path.join(paths.run_dir(recorder.run_id), target.name)
    return Monitor(target, run_dir, settings, ReportingSink(reporter, recorder),
                   stream_copy=stream_copy_path(local), follower_id=follower_id,
                   stacks_taker=stacks_taker)


def judge(monitor: Monitor, end: EndState, *, recorder: "RunRecorder", cli: str = "orch",
          rerun: str = "", fresh_facts: Optional[Callable[[Target], dict]] = None
          ) -> tuple[Verdict, dict]:
    """The verdict on a followed run's end; the summary goes to the recorder. Returns the
    verdict and the data a step records."""
    target, run_dir, settings = monitor.target, monitor.run_dir, monitor.settings
    local = os.path.join(paths.run_dir(recorder.run_id), target.name)
    facts = {}
    info = recorder.target_info(target.name)
    if info is not None:
        facts = {"torch_version": info.torch_version, "fx_tls_state": info.fx_tls_state}
    if FX_RACE in monitor.classifier.seen and fresh_facts is not None:
        facts.update(fresh_facts(target))
        if info is not None and facts.get("fx_tls_state"):
            info.fx_tls_state = facts["fx_tls_state"]
            info.torch_version = facts.get("torch_version") or info.torch_version
            recorder.save_targets()
    if not facts.get("torch_version"):
        facts.pop("torch_version", None)
    ended = end.state != RunState.RUNNING
    trainer_state = monitor.read_trainer_state() if settings.trainer_state and ended else None
    tensorboard = monitor.read_tensorboard() if settings.tensorboard and ended else None
    result = monitor.verdict(end, facts, cli=cli, playbook=rerun)
    if trainer_state is not None:
        result.summary["trainer_state"] = trainer_state
    if tensorboard is not None:
        result.summary["tensorboard"] = tensorboard
    result.summary["run_dir"] = run_dir
    result.summary["stream_log"] = os.path.join(local, "stream.log")
    recorder.note_monitor_result(target.name, result.summary)
    data = {"verdict": result.verdict, "message": result.message, "summary": result.summary,
            "exit_code": end.exit_code, "total_tok_s": result.summary.get("total_tok_s"),
            "drafters_ok": result.summary.get("drafters_ok"), "run_dir": run_dir,
            "signatures": sorted({f.signature for f in result.findings}),
            "running": end.state == RunState.RUNNING}
    if end.hang_stacks is not None:
        data["hang_stacks"] = end.hang_stacks
        data["stacks_json"] = os.path.join(local, "stacks.json")
    return result, data
