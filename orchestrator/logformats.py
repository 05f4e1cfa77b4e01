"""Reading real trainers' logs: named formats that all give the same metric points.

A playbook picks one (`monitor: {format: specforge}`):

    orch        the stand-in trainer: `drafter=1 step=20 loss=3.21 tok_s=1234`
    regex       the playbook's own `metric_regex` (named groups step, loss, tok_s, worker, ...)
    specforge   SpecForge's train_dflash.py: `Train - Step 50 [50/6000?], Loss: 2.1, Acc: 0.45`
    hf-trainer  Hugging Face Trainer dicts: `{'loss': '2.31', 'grad_norm': '1.2', 'epoch': '0.5'}`
    tqdm        any tqdm bar: `Epoch 1: 12%|#   | 120/1000 [00:40<04:50, 3.01it/s, loss=2.1]`
    jsonl       one JSON object per line: `{"step": 20, "loss": 3.2, "rank": 1}`

Two layers, both pure (no I/O, no clock):
- LogStream cuts the raw byte stream into segments: at newlines, at carriage returns (tqdm
  redraws its bar with `\\r`), and at torchrun's worker prefixes (`[default1]:` with `--tee`,
  `[rank1]:` on a rank's traceback), which torchrun may glue in the middle of a line. The
  text is only cut at a delimiter, so how the bytes arrive in chunks never changes what
  comes out.
- A LogFormat turns a segment into LogPoints. A tqdm bar anywhere in a segment is progress
  (the live view's step counter), never a line to store; the text around it is a line.
  Under `tqdm` the bar is the trainer's only report, so a bar at a new step is a point.

What each real trainer prints is described in docs/trainer-logs.md.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Optional

# The stand-in trainer's step lines (the `orch` format; monitor_classify reads them too).
DEFAULT_METRIC_REGEX = (r"drafter=(?P<drafter>\d+)\s+step=(?P<step>\d+)"
                        r"(?:\s+loss=(?P<loss>\S+))?(?:\s+tok_s=(?P<tok_s>[0-9.eE+-]+))?")
FORMATS = ("orch", "regex", "specforge", "hf-trainer", "tqdm", "jsonl")
MAX_SEGMENT = 64 * 1024      # a "line" with no newline this long is cut (a runaway writer)


@dataclass
class LogPoint:
    """One observation of a worker's training: what the record and the live view keep."""

    step: int
    worker: int = 0                      # drafter thread or torchrun rank
    loss: Optional[float] = None
    metrics: dict = field(default_factory=dict)   # the other numbers: acc, lr, grad_norm, ...
    tok_s: Optional[float] = None
    derived: bool = False                # tok_s computed from step times x tokens_per_step
    total: Optional[int] = None          # the run's step count, where the trainer says it
    at: Optional[float] = None           # the log's own time (epoch seconds), where it has one
    progress: bool = False               # a progress-bar redraw: live view only, not stored


@dataclass
class Segment:
    text: str
    worker: Optional[int]                # from a torchrun prefix, else None (the caller's)
    ends_line: bool = True               # ended by a newline (not a redraw's \r or a prefix)


# ----------------------------------------------------------------------------- stream
_DELIMITER = re.compile(r"\r\n|\r|\n")
_WORKER_PREFIX = re.compile(r"\[(?:default|rank)(\d+)\]:")


class LogStream:
    """Cuts a log's text into segments; feed it chunks as they arrive, in order."""

    def __init__(self, worker: Optional[int] = None):
        self.worker = worker
        self._pending = ""

    def feed(self, text: str) -> list[Segment]:
        self._pending += text
        cut = _last_delimiter_end(self._pending)
        if cut == 0 and len(self._pending) <= MAX_SEGMENT:
            return []
        if cut == 0:
            cut = len(self._pending)
        done, self._pending = self._pending[:cut], self._pending[cut:]
        return self._segments(done)

    def finish(self) -> list[Segment]:
        """The last words of a log that ended without a newline."""
        done, self._pending = self._pending, ""
        return self._segments(done)

    def _segments(self, text: str) -> list[Segment]:
        out: list[Segment] = []
        position = 0
        ends = [(m.start(), m.end(), m.group() != "\r") for m in _DELIMITER.finditer(text)]
        if position < len(text) and (not ends or ends[-1][1] < len(text)):
            ends.append((len(text), len(text), True))     # the log's last words, no newline
        for start_of_end, end, newline in ends:
            piece, start = text[position:start_of_end], 0
            position = end
            for marker in _WORKER_PREFIX.finditer(piece):
                self._add(out, piece[start:marker.start()], False)
                self.worker = int(marker.group(1))
                start = marker.end()
            self._add(out, piece[start:], newline)
        return out

    def _add(self, out: list, text: str, newline: bool) -> None:
        # A blank line is a line of the log; a blank redraw (tqdm clearing its bar) is not.
        if text.strip() or newline:
            out.append(Segment(text, self.worker, newline))


def _last_delimiter_end(text: str) -> int:
    at = max(text.rfind("\n"), text.rfind("\r"))
    if at < 0:
        return 0
    if text[at] == "\r" and at == len(text) - 1:
        # A lone \r at the end may be the first half of \r\n: wait for the next byte, unless
        # something before it already ended a segment.
        earlier = max(text.rfind("\n", 0, at), text.rfind("\r", 0, at))
        return earlier + 1 if earlier >= 0 else 0
    return at + 1


# ------------------------------------------------------------------------------ tqdm
# `desc: 12%|bar| 120/1000 [00:40<04:50, 3.01it/s, loss=2.1, acc=0.41]` and the forms
# without a total (`120it [00:40, 3.01it/s]`). The bar itself never contains `|`.
_TQDM = re.compile(
    r"(?:(?P<desc>[^\r\n|:\]\[]{0,200}?):\s*)?"
    r"(?:(?P<pct>\d{1,3})%\|[^|]*\|\s*)?"
    r"(?P<n>\d+(?:\.\d+)?[kMGTPEZY]?)(?:/(?P<total>\d+(?:\.\d+)?[kMGTPEZY]?))?(?P<unit_n>[A-Za-z]*)\s*"
    r"\[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[\d:?]+))?,\s*"
    r"(?P<rate>\?|[\d.]+[kMGTPEZY]?)\s*(?P<rate_unit>[^,\]\s]*)"
    r"(?:,\s*(?P<postfix>[^\]]*))?\]")
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}
_POSTFIX_ITEM = re.compile(r"([\w./-]+)=([^,]*)")


@dataclass
class Bar:
    n: int
    total: Optional[int]
    desc: str
    rate: Optional[float]         # iterations per second, whatever tqdm's display unit
    postfix: dict
    span: tuple


def find_bars(text: str) -> list[Bar]:
    bars: list[Bar] = []
    if "[" not in text or "]" not in text:
        return bars   # the cheap test first: most lines are not bars
    for match in _TQDM.finditer(text):
        if match["pct"] is None and match["total"] is None and not match["unit_n"]:
            continue  # `3 [00:01, ...]` alone is too loose to be a bar
        bars.append(Bar(n=int(_scaled(match["n"]) or 0), total=_int(_scaled(match["total"])),
                        desc=(match["desc"] or "").strip(), rate=_rate(match["rate"], match["rate_unit"]),
                        postfix=_postfix(match["postfix"] or ""), span=match.span()))
    return bars


def _scaled(text: Optional[str]) -> Optional[float]:
    """tqdm's unit_scale numbers: `1.2k` -> 1200."""
    if not text:
        return None
    amount = number(text.rstrip("kMGTPEZY"))
    return amount * _SCALE.get(text[-1], 1.0) if amount is not None else None


def _int(value: Optional[float]) -> Optional[int]:
    return int(value) if value is not None else None


def _rate(value: str, unit: str) -> Optional[float]:
    amount = _scaled(value) if value != "?" else None
    if amount is None:
        return None
    if unit.startswith("s/"):          # tqdm shows slow loops as seconds per iteration
        return 1.0 / amount if amount else None
    return amount


def _postfix(text: str) -> dict:
    return {key: value.strip() for key, value in _POSTFIX_ITEM.findall(text)}


# --------------------------------------------------------------------------- helpers
_NUMBER = re.compile(r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_LOG_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:[,.](\d{1,6}))?")


def number(value) -> Optional[float]:
    """A float from a number or from text that starts with one (`0.33s` -> 0.33); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    match = _NUMBER.match(value)
    if not match:
        return None
    result = float(match.group(0))
    return result if math.isfinite(result) else None


def log_time(text: str) -> Optional[float]:
    """Python logging's asctime (`2026-11-30 12:22:33,235`), as naive local epoch seconds."""
    match = _LOG_TIME.search(text)
    if not match:
        return None
    try:
        moment = datetime.strptime(match.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    fraction = float("0." + match.group(2)) if match.group(2) else 0.0
    return moment.timestamp() + fraction


def numeric_fields(fields: dict, skip: Iterable[str] = ()) -> dict:
    skip = set(skip)
    out = {}
    for key, value in fields.items():
        value = number(value)
        if key not in skip and value is not None:
            out[str(key)] = value
    return out


# --------------------------------------------------------------------------- formats
class LogFormat:
    """Turns segments into points. Stateful where a format needs it (hf-trainer)."""

    name = "base"
    bars_are_points = False

    def read(self, segment: Segment, default_worker: int = 0) -> tuple[Optional[str], list[LogPoint]]:
        """The segment as a log line worth storing (None for a bare progress redraw; the
        text as written otherwise, without the bars glued to it) and the points it carries."""
        worker = segment.worker if segment.worker is not None else default_worker
        points: list[LogPoint] = []
        bars = find_bars(segment.text)
        line: Optional[str] = segment.text
        if bars:
            kept, last = [], 0
            for bar in bars:
                points.extend(self.on_bar(bar, worker))
                kept.append(segment.text[last:bar.span[0]])
                last = bar.span[1]
            kept.append(segment.text[last:])
            line = "".join(kept).strip() or None
        if line and line.strip():
            points.extend(self.on_line(line.strip(), worker))
        return line, points

    def on_bar(self, bar: Bar, worker: int) -> list[LogPoint]:
        loss = number(bar.postfix.get("loss"))
        return [LogPoint(step=bar.n, worker=worker, loss=loss, total=bar.total,
                         metrics=numeric_fields(bar.postfix, skip=("loss",)),
                         progress=not self.bars_are_points)]

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        return []

    def finish(self) -> list[LogPoint]:
        return []

    def is_metric_line(self, line: str) -> bool:
        """Whether a stored line carries a point; no state is touched (the live view asks)."""
        return False


class RegexFormat(LogFormat):
    """A regex with named groups: step (required), loss, tok_s, worker/rank/drafter; any
    other named group that holds a number is an extra metric. `orch` is this with the
    stand-in trainer's regex (DEFAULT_METRIC_REGEX)."""

    name = "regex"
    _WORKER_GROUPS = ("worker", "rank", "drafter")

    def __init__(self, pattern: Optional[str] = None):
        self.pattern = re.compile(pattern or DEFAULT_METRIC_REGEX)
        if "step" not in self.pattern.groupindex:
            raise ValueError("the metric regex needs a named group (?P<step>...)")

    def is_metric_line(self, line: str) -> bool:
        return bool(self.pattern.search(line))

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        match = self.pattern.search(line)
        if not match:
            return []
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        step = number(groups.get("step"))
        if step is None:
            return []
        for key in self._WORKER_GROUPS:
            if number(groups.get(key)) is not None:
                worker = int(number(groups[key]))
                break
        extra = numeric_fields(groups, skip=("step", "loss", "tok_s", *self._WORKER_GROUPS))
        return [LogPoint(step=int(step), worker=worker, loss=number(groups.get("loss")),
                         tok_s=number(groups.get("tok_s")), metrics=extra, at=log_time(line))]


class OrchFormat(RegexFormat):
    name = "orch"

    def __init__(self):
        super().__init__(DEFAULT_METRIC_REGEX)


class SpecForgeFormat(LogFormat):
    """`Train - Step 50 [50/6000?], Loss: 2.1234, Acc: 0.4567` (rank 0's logger; loss and
    accuracy are already averaged over ranks). `Eval - Step ...` lines are metrics too."""

    name = "specforge"
    _STEP = re.compile(r"\b(?P<mode>Train|Eval) - Step (?P<step>\d+)\s*\[\d+/(?P<total>\d+)\??\]"
                       r"(?P<rest>.*)")
    _FIELD = re.compile(r"(\w[\w ]*?):\s*([-+]?[\d.]+(?:[eE][-+]?\d+)?)")

    def is_metric_line(self, line: str) -> bool:
        return bool(self._STEP.search(line))

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        match = self._STEP.search(line)
        if not match:
            return []
        fields = {key.strip().lower(): value for key, value in self._FIELD.findall(match["rest"])}
        loss = number(fields.pop("loss", None))
        prefix = "" if match["mode"] == "Train" else "eval_"
        metrics = {prefix + key: value for key, value in numeric_fields(fields).items()}
        if prefix and loss is not None:
            metrics["eval_loss"], loss = loss, None
        return [LogPoint(step=int(match["step"]), worker=worker, loss=loss, metrics=metrics,
                         total=int(match["total"]), at=log_time(line))]


class HfTrainerFormat(LogFormat):
    """Hugging Face Trainer's log dicts. They carry no step: the Trainer writes each dict with
    tqdm.write, which redraws the bar right after it, at the step just logged. So a dict
    waits for the next bar of its worker (or, at the end, takes the last bar's step)."""

    name = "hf-trainer"
    _DICT = re.compile(r"\{'[^{}]*\}")

    def __init__(self):
        self._waiting: dict[int, list[dict]] = {}
        self._last_step: dict[int, int] = {}

    def is_metric_line(self, line: str) -> bool:
        return bool(self._DICT.search(line))

    def on_bar(self, bar: Bar, worker: int) -> list[LogPoint]:
        self._last_step[worker] = bar.n
        out = [self._point(fields, bar.n, worker) for fields in self._waiting.pop(worker, [])]
        return out + super().on_bar(bar, worker)

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        match = self._DICT.search(line)
        if not match:
            return []
        try:
            fields = ast.literal_eval(match.group(0))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return []
        if not isinstance(fields, dict) or not numeric_fields(fields):
            return []
        if "train_runtime" in fields:
            # The closing summary comes after the bar is closed: its step is the last one.
            return [self._point(fields, self._last_step.get(worker, 0), worker)]
        self._waiting.setdefault(worker, []).append(fields)
        return []

    def finish(self) -> list[LogPoint]:
        out = [self._point(fields, self._last_step.get(worker, 0), worker)
               for worker, waiting in sorted(self._waiting.items()) for fields in waiting]
        self._waiting.clear()
        return out

    @staticmethod
    def _point(fields: dict, step: int, worker: int) -> LogPoint:
        step = int(number(fields.get("step")) or step)
        return LogPoint(step=step, worker=worker, loss=number(fields.get("loss")),
                        metrics=numeric_fields(fields, skip=("loss", "step")))


class TqdmFormat(LogFormat):
    """Any tqdm bar is the report: a point each time a worker's bar reaches a new step."""

    name = "tqdm"
    bars_are_points = True

    def __init__(self):
        self._last_step: dict[int, int] = {}

    def on_bar(self, bar: Bar, worker: int) -> list[LogPoint]:
        if self._last_step.get(worker) == bar.n:
            return []
        self._last_step[worker] = bar.n
        points = super().on_bar(bar, worker)
        for point in points:
            point.tok_s = None
            if bar.rate is not None:
                point.metrics["it_s"] = bar.rate
        return points


class JsonlFormat(LogFormat):
    """One JSON object per line: step (or global_step, iter), loss, tok_s (or tokens_per_s,
    throughput), worker (or rank); every other number is a metric."""

    name = "jsonl"
    _STEP_KEYS = ("step", "global_step", "iter", "iteration")
    _RATE_KEYS = ("tok_s", "tokens_per_s", "tokens_per_second", "throughput")
    _WORKER_KEYS = ("worker", "rank", "drafter")

    def is_metric_line(self, line: str) -> bool:
        return bool(self.on_line(line, 0))     # stateless: a JSON object with a step

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        start = line.find("{")
        if start < 0:
            return []
        try:
            fields = json.loads(line[start:])
        except (ValueError, RecursionError):
            return []
        if not isinstance(fields, dict):
            return []
        step = _first(fields, self._STEP_KEYS)
        if step is None:
            return []
        found = _first(fields, self._WORKER_KEYS)
        worker = int(found) if found is not None else worker
        skip = ("loss", *self._STEP_KEYS, *self._RATE_KEYS, *self._WORKER_KEYS)
        return [LogPoint(step=int(step), worker=worker, loss=number(fields.get("loss")),
                         tok_s=_first(fields, self._RATE_KEYS), metrics=numeric_fields(fields, skip),
                         at=number(fields.get("time")))]


def _first(fields: dict, keys: Iterable[str]) -> Optional[float]:
    for key in keys:
        value = number(fields.get(key))
        if value is not None:
            return value
    return None


def make_format(name: str, metric_regex: Optional[str] = None) -> LogFormat:
    """The parser for a playbook's `format` (and its `metric_regex`, for `regex`)."""
    if name == "regex" or (name == "orch" and metric_regex):
        if not metric_regex:
            raise ValueError("format regex needs a metric_regex")
        return RegexFormat(metric_regex)
    factories = {"orch": OrchFormat, "specforge": SpecForgeFormat, "hf-trainer": HfTrainerFormat,
                 "tqdm": TqdmFormat, "jsonl": JsonlFormat}
    if name not in factories:
        raise ValueError(f"unknown log format {name!r}; known: {', '.join(FORMATS)}")
    return factories[name]()


# ----------------------------------------------------------------------- throughput
class DerivedThroughput:
    """tok/s for trainers that print none: steps per second between a worker's logged
    points (by the log's own time where it has one, else by arrival) x tokens_per_step."""

    def __init__(self, tokens_per_step: Optional[float]):
        self.tokens_per_step = tokens_per_step
        self._last: dict[int, tuple[float, int]] = {}

    def fill(self, point: LogPoint, arrived: float) -> LogPoint:
        if point.progress or point.tok_s is not None or not self.tokens_per_step:
            return point
        moment = point.at if point.at is not None else arrived
        previous = self._last.get(point.worker)
        self._last[point.worker] = (moment, point.step)
        if previous is None:
            return point
        seconds, steps = moment - previous[0], point.step - previous[1]
        if seconds > 0 and steps > 0:
            point.tok_s = round(steps / seconds * float(self.tokens_per_step), 1)
            point.derived = True
        return point


# -------------------------------------------------------------------------- parsing
class LogParser:
    """A stream and a format together: bytes in, (stored lines, points) out."""

    def __init__(self, fmt: LogFormat, worker: Optional[int] = None):
        self.format = fmt
        self.stream = LogStream(worker)
        self.default_worker = worker if worker is not None else 0

    def feed(self, text: str) -> tuple[list[str], list[LogPoint]]:
        return self._read(self.stream.feed(text))

    def finish(self) -> tuple[list[str], list[LogPoint]]:
        lines, points = self._read(self.stream.finish())
        return lines, points + self.format.finish()

    def _read(self, segments: list[Segment]) -> tuple[list[str], list[LogPoint]]:
        lines, points = [], []
        for segment in segments:
            text, found = self.format.read(segment, self.default_worker)
            if text is not None:
                lines.append(text)
            points.extend(found)
        return lines, points


def parse_text(text: str, fmt: LogFormat, worker: Optional[int] = None) -> list[LogPoint]:
    """Every point in a whole log (tests, and reading a collected log again)."""
    parser = LogParser(fmt, worker)
    _, points = parser.feed(text)
    return points + parser.finish()[1]
