"""Reading real trainers' logs: named formats that all give the same metric points.

A playbook picks one (`monitor: {format: specforge}`), or leaves the default:

    auto        the first of the shapes below (all but tqdm and regex, in this order) that
                reads a step from a line (Lightning's: from its bar); the record says which
    orch        the stand-in trainer: `drafter=1 step=20 loss=3.21 tok_s=1234`
    regex       the playbook's own `metric_regex` (named groups step, loss, tok_s, worker, ...)
    specforge   SpecForge's `specforge train`: `step 50: {'loss': 2.1, 'acc': 0.45, ...}`, and
                its old train_dflash.py: `Train - Step 50 [50/6000?], Loss: 2.1, Acc: 0.45`
    hf-trainer  Hugging Face Trainer dicts: `{'loss': '2.31', 'grad_norm': '1.2', 'epoch': '0.5'}`
    tqdm        any tqdm bar: `Epoch 1: 12%|#   | 120/1000 [00:40<04:50, 3.01it/s, loss=2.1]`
    jsonl       one JSON object per line: `{"step": 20, "loss": 3.2, "rank": 1}`
    nanogpt     `iter 120: loss 3.2142, time 251.30ms, mfu 35.12%`
    torchtitan  `step: 10  loss:  3.21420  grad_norm: ...  tps: 12,345  tflops: ...  mfu: ...%`
    megatron    ` [...] iteration       10/     100 | consumed samples: ... | lm loss: ... |`
    deepspeed   `[Rank 0] step=10, skipped=0, lr=[0.001], mom=[...]` and its throughput lines
    lightning   Lightning's bar: `Epoch 1:  45%|...| 45/100 [..., 4.30it/s, v_num=0, train_loss=0.123]`
    keyvalue    `step=20 loss=3.2` or `step: 20, loss: 3.2`
    loop        a hand-written loop's `step 10/60 loss=1.2 tok/s 12,345`, `iter 5 | loss 2.3`

Container output is untrusted: every pattern here is linear in its input, and a line is
parsed only up to MAX_LINE characters.

Two layers, both pure (no I/O, no clock):
- LogStream cuts the raw byte stream into segments: at newlines, at carriage returns (tqdm
  redraws its bar with `\\r`), and at torchrun's worker prefixes (`[default1]:` with `--tee`,
  `[rank1]:` on a rank's traceback), which torchrun may glue in the middle of a line. The
  text is only cut at a delimiter, so how the bytes arrive in chunks never changes what
  comes out.
- A LogFormat turns a segment into LogPoints. A tqdm bar anywhere in a segment is progress
  (the live view's step counter), never a line to store; the text around it is a line.
  Under `tqdm` the bar is the trainer's only report, so a bar at a new step is a point.

What each real trainer prints is described in docs/design/trainer-logs.md.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Optional

from orchestrator.payloads import AST_LOCK

# The stand-in trainer's step lines (the `orch` format; watch/classify.py reads them too).
DEFAULT_METRIC_REGEX = (r"drafter=(?P<drafter>\d+)\s+step=(?P<step>\d+)"
                        r"(?:\s+loss=(?P<loss>\S+))?(?:\s+tok_s=(?P<tok_s>[0-9.eE+-]+))?")
# Of a longer line only this much is parsed, kept in the record and shown (a tensor repr, a
# writer that never prints a newline); the run's copy of its log keeps every byte.
MAX_LINE = 16 * 1024
_HELD = 4096           # a worker's dicts (or bar steps) waiting for their pair, at most


@dataclass
class LogPoint:
    """One observation of a worker's training: what the record and the live view keep."""

    step: int
    worker: int = 0                      # drafter thread or torchrun rank
    loss: Optional[float] = None
    metrics: dict = field(default_factory=dict)   # the other numbers: acc, lr, grad_norm, ...
    tok_s: Optional[float] = None
    derived: bool = False                # tok_s computed by orch, not printed by the trainer
    derived_from: str = "step times"     # ... from step times x tokens_per_step, or samples/s
    total: Optional[int] = None          # the run's step count, where the trainer says it
    at: Optional[float] = None           # the log's own time (epoch seconds), where it has one
    progress: bool = False               # a progress-bar redraw: live view only, not stored
    counted: bool = False                # step is the line's place in the log, not a step number
    rate_from: Optional[str] = None      # the printed field tok_s came from (tps, tokens/s...)


@dataclass
class Segment:
    text: str
    worker: Optional[int]                # from a torchrun prefix, else None (the caller's)
    ends_line: bool = True               # ended by a newline (not a redraw's \r or a prefix)
    dropped: int = 0                     # characters past MAX_LINE, not kept
    source: Optional[str] = None         # the log it came from (a followed file's name)
    after_clear: bool = False            # tqdm cleared its bar just before (a tqdm.write)


# ----------------------------------------------------------------------------- stream
_DELIMITER = re.compile(r"\r\n|\r|\n")
_WORKER_PREFIX = re.compile(r"\[(?:default|rank)(\d{1,6})\]:")
# Terminal escapes (torchtitan colours its metric line; tqdm moves the cursor for a second
# bar): CSI sequences, bounded, dropped before anything reads the text.
_ANSI = re.compile(r"\x1b\[[0-?]{0,32}[ -/]{0,8}[@-~]|\x1b")


class LogStream:
    """Cuts a log's text into segments; feed it chunks as they arrive, in order.

    Linear in the text and bounded in memory: only the delimiters of each new chunk are
    looked for, and of a line longer than MAX_LINE only its first MAX_LINE characters are
    kept (the rest is counted in Segment.dropped; the raw log keeps every byte)."""

    def __init__(self, worker: Optional[int] = None, source: Optional[str] = None, rank_offset: int = 0):
        self.worker = worker
        self.source = source
        self.rank_offset = rank_offset   # a node's first global rank: `[defaultN]:` is local rank N
        self._cleared = False       # a blank redraw was dropped: the next segment follows it
        self._pending: list[str] = []
        self._kept = 0
        self._dropped = 0
        self._held_cr = False       # a \r at a chunk's end may be the first half of \r\n

    def feed(self, text: str) -> list[Segment]:
        if self._held_cr:
            text, self._held_cr = "\r" + text, False
        if text.endswith("\r"):
            text, self._held_cr = text[:-1], True
        out: list[Segment] = []
        position = 0
        for match in _DELIMITER.finditer(text):
            self._keep(text, position, match.start())
            self._cut(out, newline=match.group() != "\r")
            position = match.end()
        self._keep(text, position, len(text))
        return out

    def finish(self) -> list[Segment]:
        """The last words of a log that ended without a newline."""
        out: list[Segment] = []
        held, self._held_cr = self._held_cr, False
        if self._kept or self._dropped or held:
            self._cut(out, newline=not held)
        return out

    def _keep(self, text: str, start: int, end: int) -> None:
        room = MAX_LINE - self._kept
        take = min(end - start, max(room, 0))
        if take:
            self._pending.append(text[start:start + take])
            self._kept += take
        self._dropped += end - start - take

    def _cut(self, out: list, newline: bool) -> None:
        piece, dropped = "".join(self._pending), self._dropped
        if "\x1b" in piece:
            piece = _ANSI.sub("", piece)
        self._pending, self._kept, self._dropped = [], 0, 0
        start = 0
        for marker in _WORKER_PREFIX.finditer(piece):
            self._add(out, piece[start:marker.start()], False)
            # torchrun's --tee prefix names the local rank; torch's `[rankN]:` the global one
            local = marker.group(0).startswith("[default")
            self.worker = int(marker.group(1)) + (self.rank_offset if local else 0)
            start = marker.end()
        self._add(out, piece[start:], newline, dropped)

    def _add(self, out: list, text: str, newline: bool, dropped: int = 0) -> None:
        # A blank line is a line of the log; a blank redraw (tqdm clearing its bar) is not,
        # but the redraw after it is the bar tqdm.write puts back under a message.
        if text.strip() or newline or dropped:
            out.append(Segment(text, self.worker, newline, dropped, self.source, self._cleared))
            self._cleared = False
        elif text:
            self._cleared = True


# ------------------------------------------------------------------------------ tqdm
# `desc: 12%|bar| 120/1000 [00:40<04:50, 3.01it/s, loss=2.1, acc=0.41]` and the forms
# without a total (`120it [00:40, 3.01it/s]`). Found in linear time: Python's regex engine
# backtracks, so one pattern for the whole bar is quadratic on a long digit run. The tail
# `[elapsed<remaining, rate, postfix]` starts with a literal `[` and has bounded parts; the
# count, the bar and the description before it are read backwards from there, each within
# a bounded window.
_TQDM_TAIL = re.compile(
    r"\[(?P<elapsed>[\d:]{1,20}|\d{1,6}d \d{1,2}:\d{2}:\d{2})(?:<(?P<remaining>[\d:?]{1,20}))?,\s{0,8}"
    r"(?P<rate>\?|\d{1,20}(?:\.\d{1,20})?[kMGTPEZY]?)\s{0,8}(?P<rate_unit>[^,\]\s]{0,40})")
_COUNT = re.compile(r"(?P<n>\d{1,30}(?:\.\d{1,10})?[kMGTPEZY]?)"
                    r"(?:/(?P<total>\d{1,30}(?:\.\d{1,10})?[kMGTPEZY]?))?(?P<unit_n>[A-Za-z]{0,20})\Z")
_COUNT_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ./")
_DIGITS = frozenset("0123456789")
_COUNT_WIDTH = 64         # the most `4.5k/10.0kB` before the tail may span
_POSTFIX_WIDTH = 2000
_BAR_WIDTH = 400          # the most a drawn bar `|####    |` may span
_DESC_WIDTH = 200
_DESC_STOP = frozenset("|:[]\r\n")
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}
_POSTFIX_ITEM = re.compile(r"([\w./-]{1,100})=([^,]{0,200})")


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
    floor = 0         # bars do not overlap: the next one starts after the last one's end
    close = -2        # the next `]` (found once per stretch: the search never goes back)
    for tail in _TQDM_TAIL.finditer(text):
        after = tail.end()
        if close < after and close != -1:
            close = text.find("]", after)
        if close < 0 or (close > after and (text[after] != "," or close - after > _POSTFIX_WIDTH)):
            continue
        head = _bar_head(text, tail.start(), floor)
        if head is None:
            continue
        start, count, pct, desc = head
        if pct is None and count["total"] is None and not count["unit_n"]:
            continue  # `3 [00:01, ...]` alone is too loose to be a bar
        postfix = text[after + 1:close] if close > after else ""
        bars.append(Bar(n=int(_scaled(count["n"]) or 0), total=_int(_scaled(count["total"])),
                        desc=desc, rate=_rate(tail["rate"], tail["rate_unit"]),
                        postfix=_postfix(postfix), span=(start, close + 1)))
        floor = close + 1
    return bars


def _bar_head(text: str, end: int, floor: int):
    """What precedes a bar's `[elapsed...]` tail: (start, count match, pct, desc), or None."""
    stop = _skip_back(text, end, floor, " \t")
    count = _count(text, stop, floor)
    if count is None:
        return None
    start, pct = count.start(), None
    before = _skip_back(text, start, floor, " \t")
    if before > floor and text[before - 1] == "|":
        opening = text.rfind("|", max(floor, before - 1 - _BAR_WIDTH), before - 1)
        digits = _skip_back(text, opening - 1, max(floor, opening - 4), "0123456789") if opening > 0 else -1
        if opening > 0 and text[opening - 1] == "%" and digits < opening - 1:
            start, pct = digits, text[digits:opening - 1]
    desc = ""
    colon = _skip_back(text, start, floor, " \t")
    if colon > floor and text[colon - 1] == ":":
        first = colon - 1
        limit = max(floor, first - _DESC_WIDTH)
        while first > limit and text[first - 1] not in _DESC_STOP:
            first -= 1
        if first == floor or text[first - 1] in _DESC_STOP:
            desc, start = text[first:colon - 1].strip(), first
    return start, count, pct, desc


def _count(text: str, stop: int, floor: int):
    """`120/1000` or `4.5kit` right before stop: tried from each number's first digit."""
    limit = max(floor, stop - _COUNT_WIDTH)
    first = stop
    while first > limit and text[first - 1] in _COUNT_CHARS:
        first -= 1
    # a token going on past the window: the number at its edge is not whole
    cut = first == limit and first > floor and text[first - 1] in _COUNT_CHARS
    for at in range(first, stop):
        if text[at] in _DIGITS and (not text[at - 1] in _DIGITS if at > first else not cut):
            match = _COUNT.match(text, at, stop)
            if match:
                return match
    return None


def _skip_back(text: str, end: int, floor: int, chars: str) -> int:
    """The index after the last character before end that is not in chars (not below floor)."""
    while end > floor and text[end - 1] in chars:
        end -= 1
    return end


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
# Python logging's asctime: its default (`2026-11-30 12:22:33,235`, ISO) and the
# `datefmt="%m/%d/%Y %H:%M:%S"` SpecForge's old scripts set (`08/08/2026 17:44:20`).
_LOG_TIMES = ((re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[,.](\d{1,6}))?"), "%Y-%m-%d"),
              (re.compile(r"(\d{2}/\d{2}/\d{4}) (\d{2}:\d{2}:\d{2})(?:[,.](\d{1,6}))?"), "%m/%d/%Y"))
_LOG_TIME_AT = 80          # a log's own time is at the start of its line


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
    """Python logging's asctime near a line's start (`2026-11-30 12:22:33,235`, or
    `11/30/2026 12:22:33` as SpecForge's datefmt has it), as naive local epoch seconds."""
    head = text[:_LOG_TIME_AT]
    for pattern, date_format in _LOG_TIMES:
        match = pattern.search(head)
        if not match:
            continue
        try:
            moment = datetime.strptime(f"{match.group(1)} {match.group(2)}", date_format + " %H:%M:%S")
        except ValueError:
            return None
        fraction = float("0." + match.group(3)) if match.group(3) else 0.0
        return moment.timestamp() + fraction
    return None


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
    """Turns segments into points. Stateful where a format needs it (hf-trainer, tqdm)."""

    name = "base"
    shape = ""                 # what its metric lines look like (the record says which was read)
    bars_are_points = False
    detected = True            # whether `format: auto` offers lines to it (tqdm's bars are
                               # progress under auto, and a step only when pinned)

    @classmethod
    def make(cls, logging_steps: Optional[int] = None) -> "LogFormat":
        """A fresh parser for one run (logging_steps: the playbook's, for those that use it)."""
        return cls()

    def watch_progress(self, segment: Segment, points: list) -> None:
        """Under `format: auto`, before any shape was picked: the progress points read so far
        (bars), for a shape that pairs its lines with them later (hf-trainer)."""

    def __init__(self):
        self._bars: dict[int, tuple[str, int, int]] = {}   # worker -> (desc stem, n, offset)
        self._stepped: dict[int, int] = {}   # worker -> its last step (they never go back)
        self.backwards = 0                   # points dropped: a step lower than the one before

    def is_metric_bar(self, bar: Bar) -> bool:
        """Whether a bar is this shape's report (Lightning's `Epoch N` bar), for `auto`."""
        return False

    def read(self, segment: Segment, default_worker: int = 0) -> tuple[Optional[str], list[LogPoint]]:
        """The segment as a log line worth storing (None for a bare progress redraw; the
        text as written otherwise, without the bars glued to it) and the points it carries."""
        line, points = self._read(segment, default_worker)
        return line, self._forward(points)

    def _forward(self, points: list[LogPoint]) -> list[LogPoint]:
        """A worker's steps never go back: a lower step than its last is some other count
        (a loose shape's near miss, a progress bar of something else), not a step."""
        kept = []
        for point in points:
            if not point.progress and not point.counted:
                last = self._stepped.get(point.worker)
                if last is not None and point.step < last:
                    self.backwards += 1
                    continue
                if last is not None or len(self._stepped) < 2 * MAX_WORKERS:
                    self._stepped[point.worker] = point.step
            kept.append(point)
        return kept

    def _read(self, segment: Segment, default_worker: int) -> tuple[Optional[str], list[LogPoint]]:
        worker = segment.worker if segment.worker is not None else default_worker
        points: list[LogPoint] = []
        bars = find_bars(segment.text)
        line: Optional[str] = segment.text
        if bars:
            kept, last = [], 0
            for bar in bars:
                if worker == 0:
                    # Only rank 0's bar is the training's: other ranks' bars (tokenizing a
                    # dataset, loading shards) are their output, not steps.
                    points.extend(self.on_bar(self._continued(bar, worker), worker))
                kept.append(segment.text[last:bar.span[0]])
                last = bar.span[1]
            kept.append(segment.text[last:])
            line = "".join(kept).strip() or None
        if line and line.strip():
            points.extend(self.on_line(line.strip(), worker))
        if segment.dropped:
            line = (line or "") + f" [... {segment.dropped:,} more characters, in the run's log copy]"
        return line, points

    def _continued(self, bar: Bar, worker: int) -> Bar:
        """A bar per epoch (`Training Epoch 1`) restarts its count: carry the steps on."""
        stem = _DIGIT_RUN.sub("#", bar.desc)
        before = self._bars.get(worker)
        offset = 0
        if before is not None:
            offset = before[2]
            if stem == before[0] and bar.n < before[1] and bar.desc and "#" in stem:
                offset += before[1]
        self._bars[worker] = (stem, bar.n, offset)
        if offset:
            bar = Bar(n=bar.n + offset, total=None, desc=bar.desc, rate=bar.rate,
                      postfix=bar.postfix, span=bar.span)
        return bar

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

    def describe(self) -> str:
        """The format as the record and the live view name it."""
        return self.name


_DIGIT_RUN = re.compile(r"\d+")


class RegexFormat(LogFormat):
    """A regex with named groups: step (required), loss, tok_s, worker/rank/drafter; any
    other named group that holds a number is an extra metric. `orch` is this with the
    stand-in trainer's regex (DEFAULT_METRIC_REGEX)."""

    name = "regex"
    shape = "the playbook's metric_regex"
    _WORKER_GROUPS = ("worker", "rank", "drafter")

    def __init__(self, pattern: Optional[str] = None):
        super().__init__()
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
    shape = "drafter=N step=N loss=X tok_s=X"

    def __init__(self):
        super().__init__(DEFAULT_METRIC_REGEX)


class SpecForgeFormat(LogFormat):
    """Both SpecForge releases' metric lines (docs/design/trainer-logs.md):

    - `specforge train` (since 2026-07): `step 50: {'loss': 2.12, 'acc': 0.45, ...}` on
      stdout, a Python dict repr (plain keys, or `train/` ones with tracking on);
    - scripts/train_dflash.py before it: `Train - Step 50 [50/6000?], Loss: 2.1234, Acc:
      0.4567` through logging (rank 0's logger; loss and accuracy averaged over ranks).
      `Eval - Step ...` lines are metrics too."""

    name = "specforge"
    shape = "Train - Step N [N/M?], Loss: X (train_dflash.py) or step N: {...} (specforge train)"
    _OLD = re.compile(r"\b(?P<mode>Train|Eval) - Step (?P<step>\d{1,15})\s{0,4}\[\d{1,15}/(?P<total>\d{1,15})\??\]")
    _NEW = re.compile(r"^step (?P<step>\d{1,15}): (?=\{)")

    def is_metric_line(self, line: str) -> bool:
        return bool(self._OLD.search(line) or self._NEW.match(line))

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        new = self._NEW.match(line)
        if new:
            return self._new(int(new["step"]), line[new.end():], worker)
        match = self._OLD.search(line)
        if not match:
            return []
        fields = {}
        for part in line[match.end():].split(","):      # `, Loss: 2.1, Acc: 0.4`
            name, colon, value = part.partition(":")
            if colon and name.strip():
                fields[name.strip().lower()] = value.strip()
        loss = number(fields.pop("loss", None))
        prefix = "" if match["mode"] == "Train" else "eval_"
        metrics = {prefix + key: value for key, value in numeric_fields(fields).items()}
        if prefix and loss is not None:
            metrics["eval_loss"], loss = loss, None
        return [LogPoint(step=int(match["step"]), worker=worker, loss=loss, metrics=metrics,
                         total=int(match["total"]), at=log_time(line))]

    @staticmethod
    def _new(step: int, text: str, worker: int) -> list[LogPoint]:
        fields = literal_dict(text)
        if fields is None:
            return []
        metrics = {}
        for key, value in numeric_fields(fields).items():
            metrics[key[len("train/"):] if key.startswith("train/") else key] = value
        loss = metrics.pop("loss", None)
        return [LogPoint(step=step, worker=worker, loss=loss, metrics=metrics)]


MAX_LITERAL = 8 * 1024      # the longest dict repr given to ast.literal_eval


def literal_dict(text: str) -> Optional[dict]:
    """A Python dict repr (`{'loss': 2.1}`) at the start of text, read with
    ast.literal_eval (never eval) on a bounded string; None if it is not one."""
    text = text.strip()
    if not text.startswith("{") or not text.endswith("}") or len(text) > MAX_LITERAL:
        return None
    try:
        with AST_LOCK:   # one node's monitor per thread: ast is not thread-safe (payloads/)
            fields = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return fields if isinstance(fields, dict) else None


def _dict_span(line: str) -> Optional[tuple[int, int]]:
    """Where `{'...}` (a dict repr with no dict inside) is in line, found in linear time."""
    start = line.find("{'")
    while start >= 0:
        end = line.find("}", start)
        if end < 0:
            return None
        inner = line.find("{", start + 1, end)
        if inner < 0:
            return start, end + 1
        start = line.find("{'", inner)
    return None


class HfTrainerFormat(LogFormat):
    """Hugging Face Trainer's log dicts. They carry no step. With a bar, the Trainer writes
    each dict with tqdm.write, which redraws the bar right after it, at the step just logged:
    a dict waits for the next bar of its worker (or, at the end, takes the last bar's step).
    Without one (`disable_tqdm=True`) a worker's dicts are numbered in the order they come,
    times `logging_steps` when the playbook says it (else 1: the step is the log's count)."""

    name = "hf-trainer"
    shape = "{'loss': X, ...} dicts (Hugging Face Trainer)"

    @classmethod
    def make(cls, logging_steps: Optional[int] = None) -> "HfTrainerFormat":
        return cls(logging_steps)

    def watch_progress(self, segment: Segment, points: list) -> None:
        # The Trainer's dicts need the bars seen before them.
        self._segment = segment
        for point in points:
            self._last_step[point.worker] = point.step
            self.saw_bar(point.step, point.worker)   # no dict is held yet: nothing to pair

    def __init__(self, logging_steps: Optional[int] = None):
        super().__init__()
        self.logging_steps = logging_steps
        self._waiting: dict[int, list[dict]] = {}
        self._last_step: dict[int, int] = {}
        self._counted: dict[int, int] = {}       # dicts seen without a bar, per worker
        self.counted = False                     # some steps came from the order of the dicts
        self._segment: Optional[Segment] = None  # the segment being read
        self._bar_log: dict[int, Optional[str]] = {}   # worker -> the log its bars are in
        self._cleared: dict[int, deque] = {}     # worker -> steps of redraws after a clear
        self._apart: dict[int, deque] = {}       # worker -> dicts from a log without its bar
        self._dict_step: dict[int, int] = {}     # worker -> the step its last such dict got
        self._trained: dict[int, tuple] = {}     # worker -> the closing summary's steps (low, high)

    def is_metric_line(self, line: str) -> bool:
        span = _dict_span(line)
        return bool(span) and bool(numeric_fields(literal_dict(line[span[0]:span[1]]) or {}))

    def describe(self) -> str:
        if not self.counted:
            return self.name
        if self.logging_steps:
            return f"{self.name}, no progress bar: steps numbered in log order x logging_steps {self.logging_steps}"
        return f"{self.name}, no progress bar and no logging_steps: log points, no step numbers printed"

    def read(self, segment: Segment, default_worker: int = 0) -> tuple[Optional[str], list[LogPoint]]:
        self._segment = segment      # on_bar and on_line need to know which log, and the clear
        return super().read(segment, default_worker)

    def on_bar(self, bar: Bar, worker: int) -> list[LogPoint]:
        self._last_step[worker] = bar.n
        out = self.saw_bar(bar.n, worker)
        out += [self._point(fields, bar.n, worker) for fields in self._waiting.pop(worker, [])]
        return out + super().on_bar(bar, worker)

    def saw_bar(self, step: int, worker: int) -> list[LogPoint]:
        """A bar of `worker` in the log now read: which log has its bars, and a redraw after
        a clear (tqdm.write's) is the step of a dict written meanwhile to another log."""
        segment = self._segment
        self._bar_log[worker] = segment.source if segment else None
        if segment is None or not segment.after_clear:
            return []
        cleared = self._cleared.setdefault(worker, deque(maxlen=_HELD))
        cleared.append(step)
        return self._pair_apart(worker)

    def _pair_apart(self, worker: int) -> list[LogPoint]:
        """The dicts of a log without the bar, in order, each with the step of the next
        cleared redraw in the bar's log (the closing summary: the step before it)."""
        out, apart, cleared = [], self._apart.get(worker, deque()), self._cleared.get(worker, deque())
        while apart and (cleared or _closing(apart[0])):
            fields = apart.popleft()
            step = self._dict_step.get(worker, 0) if _closing(fields) else cleared.popleft()
            self._dict_step[worker] = step
            out.append(self._point(fields, step, worker))
        return out

    def _apart_log(self, worker: int) -> bool:
        """The dicts come from a log that is not the one with this worker's bar: torchrun's
        --redirects 3 puts a rank's stdout (the dicts) and stderr (the bar) in two files,
        read as they grow, so which arrives first says nothing."""
        source = self._segment.source if self._segment else None
        if worker in self._bar_log:
            return self._bar_log[worker] != source
        return bool(source) and source.endswith("stdout.log")

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        span = _dict_span(line)
        fields = literal_dict(line[span[0]:span[1]]) if span else None
        if not fields or not numeric_fields(fields):
            return []
        if self._apart_log(worker):
            if self.logging_steps:
                return [self._counted_point(fields, worker)]   # exact, whatever the order
            self._apart.setdefault(worker, deque(maxlen=_HELD)).append(fields)
            return self._pair_apart(worker)
        if worker not in self._last_step:
            # No bar: the dict's place in the log is all it says (logging_steps makes it a step).
            return [self._counted_point(fields, worker)]
        if _closing(fields):
            # The closing summary comes after the bar is closed: its step is the last one.
            return [self._point(fields, self._last_step.get(worker, 0), worker)]
        self._waiting.setdefault(worker, []).append(fields)
        return []

    def _counted_point(self, fields: dict, worker: int) -> LogPoint:
        """A dict with no bar to give it a step: its place among the worker's log dicts,
        times logging_steps where that is known; else only its place (a point, no step).
        An eval dict and the closing summary belong to the log before them."""
        self.counted = True
        if not _closing(fields) and not _evaluation(fields):
            self._counted[worker] = self._counted.get(worker, 0) + 1
        if _closing(fields) and not self.logging_steps:
            self._trained[worker] = trained_steps(fields)
        point = self._point(fields, self._counted.get(worker, 0) * (self.logging_steps or 1), worker)
        point.counted = not self.logging_steps
        return point

    def spacing(self) -> Optional[tuple[int, str]]:
        """The steps between two log dicts, and how orch knows it: logging_steps as given,
        or (numbered in log order, no bar) worked out from the closing summary: the steps
        trained (train_steps_per_second x train_runtime) over the dicts logged. None when
        neither says it exactly."""
        if self.logging_steps:
            return self.logging_steps, "logging_steps"
        found = {spacing_from_total(self._counted.get(w, 0), span) for w, span in self._trained.items()}
        if len(found) == 1 and None not in found:
            return found.pop(), "train_steps_per_second x train_runtime"
        return None

    def finish(self) -> list[LogPoint]:
        out = [self._point(fields, self._last_step.get(worker, 0), worker)
               for worker, waiting in sorted(self._waiting.items()) for fields in waiting]
        self._waiting.clear()
        for worker, apart in sorted(self._apart.items()):   # no cleared redraw came for them
            out += [self._counted_point(fields, worker) for fields in apart]
        self._apart.clear()
        return out

    def _point(self, fields: dict, step: int, worker: int) -> LogPoint:
        if _closing(fields) and worker not in self._last_step:
            step = self._counted.get(worker, 0) * (self.logging_steps or 1)
        step = int(number(fields.get("step")) or step)
        metrics = numeric_fields(fields, skip=("loss", "step"))
        tok_s = metrics.pop("train_tokens_per_second", None)
        return LogPoint(step=step, worker=worker, loss=number(fields.get("loss")),
                        metrics=metrics, tok_s=tok_s)


def _evaluation(fields: dict) -> bool:
    """An evaluation's dict (`eval_loss`, `eval_runtime`, ...): logged at a training log's step."""
    return "loss" not in fields and any(str(key).startswith("eval_") for key in fields)


def _bounds(value) -> Optional[tuple[float, float]]:
    """What a printed number may have been before rounding: transformers 5 prints 4
    significant digits (`{v:.4g}`), after speed_metrics rounded to 3 decimals (runtime 4)."""
    amount = number(value)
    if amount is None or amount <= 0:
        return None
    digits = 10 ** (math.floor(math.log10(amount)) - 3) / 2
    slack = digits + 0.0005
    return max(amount - slack, 0.0), amount + slack


def trained_steps(fields: dict) -> Optional[tuple[float, float]]:
    """The steps a Trainer's closing summary says it trained (num_steps_trained over the
    runtime, times the runtime), as the range its rounding leaves; None if not said."""
    rate, runtime = _bounds(fields.get("train_steps_per_second")), _bounds(fields.get("train_runtime"))
    if rate is None or runtime is None:
        return None
    return rate[0] * runtime[0], rate[1] * runtime[1]


def spacing_from_total(logs: int, trained: Optional[tuple[float, float]]) -> Optional[int]:
    """logging_steps from `logs` dicts over `trained` steps: the one whole s with
    logs * s <= steps < (logs + 1) * s for a whole number of steps in the range; None
    when the range leaves more than one (or none)."""
    if not logs or trained is None:
        return None
    low, high = math.ceil(trained[0] - 1e-9), math.floor(trained[1] + 1e-9)
    # s fits some steps in [low, high] when logs * s <= high and (logs + 1) * s - 1 >= low
    smallest, largest = max(1, -(-(low + 1) // (logs + 1))), high // logs
    return smallest if smallest == largest else None


def _closing(fields: dict) -> bool:
    """The Trainer's end-of-training dict (`train_loss`, `train_samples_per_second`); with
    include_num_input_tokens_seen every log dict has `train_runtime` and tokens/s too."""
    return "train_loss" in fields or "train_samples_per_second" in fields


class TqdmFormat(LogFormat):
    """Any tqdm bar is the report: a point each time a worker's bar reaches a new step."""

    name = "tqdm"
    shape = "tqdm bars"
    detected = False
    bars_are_points = True

    def __init__(self):
        super().__init__()
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
    shape = '{"step": N, ...} JSON lines'
    _STEP_KEYS = ("step", "global_step", "iter", "iteration")
    _RATE_KEYS = ("tok_s", "tokens_per_s", "tokens_per_second", "throughput")
    _WORKER_KEYS = ("worker", "rank", "drafter")

    def is_metric_line(self, line: str) -> bool:
        return bool(self.on_line(line, 0))     # stateless: a JSON object with a step

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        start = line.find("{")
        if start < 0 or '"' not in line[start:start + 3]:
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


class KeyValueFormat(LogFormat):
    """`step=20 loss=3.2 lr=1e-4` or `step: 20, loss: 3.2` (a line with a step key and
    numbers): the shape many hand-written loops print."""

    name = "keyvalue"
    shape = "step=N loss=X / step: N, loss: X lines"
    _PAIR = re.compile(r"(?<![\w./-])([A-Za-z_][\w./-]{0,63})\s{0,4}[=:]\s{0,4}"
                       r"([-+]?(?:\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})(?:[eE][-+]?\d{1,4})?)(?![\w.])")
    _STEP_KEYS = ("step", "global_step", "iter", "iteration")
    _RATE_KEYS = ("tok_s", "tokens_per_s", "tokens_per_second", "tok/s", "throughput")
    _WORKER_KEYS = ("worker", "rank", "drafter")

    def _fields(self, line: str) -> dict:
        return {key.lower(): value for key, value in self._PAIR.findall(line)}

    def is_metric_line(self, line: str) -> bool:
        return _first(self._fields(line), self._STEP_KEYS) is not None

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        fields = self._fields(line)
        step = _first(fields, self._STEP_KEYS)
        if step is None:
            return []
        found = _first(fields, self._WORKER_KEYS)
        skip = ("loss", *self._STEP_KEYS, *self._RATE_KEYS, *self._WORKER_KEYS)
        return [LogPoint(step=int(step), worker=int(found) if found is not None else worker,
                         loss=number(fields.get("loss")), tok_s=_first(fields, self._RATE_KEYS),
                         metrics=numeric_fields(fields, skip), at=log_time(line))]


# ---------------------------------------------------------- the trainers people run
# Each reads its trainer's metric line as upstream prints it today (the format strings and
# the commits read are in docs/design/trainer-logs.md). Every pattern starts at a literal
# and has bounded parts: linear in the line.
_SNAKE = re.compile(r"[^0-9A-Za-z/]+")


def snake(key: str) -> str:
    """A printed field name as a metric name: `grad norm` -> grad_norm, `(ms)` -> ms."""
    return _SNAKE.sub("_", key.strip().lower()).strip("_")


def _plain_number(text: Optional[str]) -> Optional[float]:
    """`12,345` (a thousands separator) or `1.5E-04` as a float."""
    return number(text.replace(",", "")) if text else None


class NanoGptFormat(LogFormat):
    """karpathy/nanoGPT's train.py: `iter N: loss X, time Tms, mfu M%` every log_interval
    and `step N: train loss X, val loss Y` every eval_interval, by print() on the master
    process. tok/s: its own `tokens per iteration will be: 491,520` over the iteration's
    time."""

    name = "nanogpt"
    shape = "iter N: loss X, time Tms, mfu M% (nanoGPT)"
    _ITER = re.compile(r"\biter (?P<step>\d{1,15}): loss (?P<loss>[-+\w.]{1,30}), "
                       r"time (?P<ms>\d{1,15}(?:\.\d{1,10})?)ms, mfu (?P<mfu>-?\d{1,10}(?:\.\d{1,10})?)%")
    _EVAL = re.compile(r"\bstep (?P<step>\d{1,15}): train loss (?P<train>[-+\w.]{1,30}), "
                       r"val loss (?P<val>[-+\w.]{1,30})")
    _TOKENS = re.compile(r"\btokens per iteration will be: (?P<n>\d{1,3}(?:,\d{3}){0,8})")

    def __init__(self):
        super().__init__()
        self.tokens_per_iter: Optional[float] = None

    def watch_progress(self, segment: Segment, points: list) -> None:
        self._tokens(segment.text)      # printed before the first iteration

    def _tokens(self, line: str) -> bool:
        found = self._TOKENS.search(line) if "tokens per iteration" in line else None
        if found:
            self.tokens_per_iter = _plain_number(found["n"])
        return bool(found)

    def is_metric_line(self, line: str) -> bool:
        return bool(self._ITER.search(line) or self._EVAL.search(line))

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        if self._tokens(line):
            return []
        found = self._ITER.search(line)
        if found:
            metrics = {"time_ms": float(found["ms"])}
            if float(found["mfu"]) >= 0:        # -100.00% until its 5th iteration
                metrics["mfu_pct"] = float(found["mfu"])
            point = LogPoint(step=int(found["step"]), worker=worker, loss=number(found["loss"]),
                             metrics=metrics)
            seconds = metrics["time_ms"] / 1000
            if self.tokens_per_iter and seconds > 0:
                point.tok_s = round(self.tokens_per_iter / seconds, 1)
                point.derived, point.derived_from = True, "nanoGPT's tokens per iteration / its time"
            return [point]
        found = self._EVAL.search(line)
        if found:
            return [LogPoint(step=int(found["step"]), worker=worker,
                             metrics=numeric_fields({"eval_train_loss": found["train"],
                                                     "val_loss": found["val"]}))]
        return []


class _MarkedFormat(LogFormat):
    """A shape whose metric line always holds a literal (`marker`): looked for first, cheap,
    before its pattern (`_STEP`) is searched."""

    marker = ""
    _STEP: re.Pattern

    def _found(self, line: str) -> Optional[re.Match]:
        return self._STEP.search(line) if self.marker in line else None

    def is_metric_line(self, line: str) -> bool:
        return bool(self._found(line))

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        found = self._found(line)
        return self._points(found, line, worker) if found else []

    def _points(self, found: re.Match, line: str, worker: int) -> list[LogPoint]:
        return []


class TorchtitanFormat(_MarkedFormat):
    """pytorch/torchtitan's metrics line (components/metrics.py), through its logger
    (`[titan] 2026-08-21 12:00:00,123 - root - INFO - `), in colours:
    `step:  1  loss: 12.25190  grad_norm:  1.2345  memory: 12.34GiB(15.61%)  tps: 1,234
    tflops: 12.34  mfu: 3.95%`; `validate step: ...` for its validation. tps is tokens per
    second per device, as torchtitan computes it."""

    name = "torchtitan"
    shape = "step: N  loss: X  ...  tps: N (torchtitan)"
    _STEP = re.compile(r"(?P<validate>\bvalidate )?\bstep:\s{1,8}(?P<step>\d{1,15})\s{1,8}"
                       r"loss:\s{0,8}(?P<loss>[-+\w.]{1,30})")
    _FIELD = re.compile(r"\b(?P<key>grad_norm|memory|tps|tflops|mfu):\s{0,8}(?P<value>[-+\d.,]{1,40})")
    marker = "tps:"

    def _points(self, found: re.Match, line: str, worker: int) -> list[LogPoint]:
        fields = {m["key"]: _plain_number(m["value"]) for m in self._FIELD.finditer(line, found.end())}
        tps = fields.pop("tps", None)
        metrics = {("memory_gib" if k == "memory" else "mfu_pct" if k == "mfu" else k): v
                   for k, v in fields.items() if v is not None}
        loss = number(found["loss"])
        if found["validate"]:
            metrics["validation_loss"] = loss
            if tps is not None:
                metrics["validation_tps"] = tps
            return [LogPoint(step=int(found["step"]), worker=worker, metrics=metrics, at=log_time(line))]
        return [LogPoint(step=int(found["step"]), worker=worker, loss=loss, metrics=metrics, tok_s=tps,
                         rate_from="torchtitan's tps (tokens/s per device)" if tps is not None else None,
                         at=log_time(line))]


class MegatronFormat(_MarkedFormat):
    """NVIDIA/Megatron-LM's training_log (megatron/training/training.py), print_rank_last:
    ` [2026-08-22 12:00:00.123456] iteration       10/     100 | consumed samples: 640 |
    elapsed time per iteration (ms): 1234.5 | ... | learning rate: 1.000000E-04 | global
    batch size:    64 | lm loss: 1.234567E+01 | loss scale: 1.0 | grad norm: 1.234 | ...`.
    samples/s (global batch size over the iteration time) x tokens_per_sample (its
    --seq-length) is tok/s."""

    name = "megatron"
    shape = "iteration N/ M | ... | lm loss: X | (Megatron-LM)"
    _STEP = re.compile(r"\biteration\s{1,16}(?P<step>\d{1,15})/\s{0,16}(?P<total>\d{1,15}) \|")
    marker = "consumed samples:"

    def _points(self, found: re.Match, line: str, worker: int) -> list[LogPoint]:
        fields = {}
        for part in line[found.end():].split("|"):
            key, colon, value = part.rpartition(":")
            amount = _plain_number(value.strip()) if colon else None
            if amount is not None and key.strip():
                fields[key.strip()] = amount
        loss_key = "lm loss" if "lm loss" in fields else next(
            (k for k in fields if k.endswith("loss") and "scale" not in k), None)
        loss = fields.pop(loss_key) if loss_key else None
        metrics = {snake(k): v for k, v in fields.items()}
        elapsed, batch = metrics.get("elapsed_time_per_iteration_ms"), metrics.get("global_batch_size")
        if elapsed and batch:
            metrics["samples_per_second"] = round(batch / (elapsed / 1000), 3)
        return [LogPoint(step=int(found["step"]), worker=worker, loss=loss, metrics=metrics,
                         total=int(found["total"]), at=log_time(line))]


class LoopFormat(LogFormat):
    """A hand-written loop's line: a step word (step, iter, iteration, global_step, it) and
    its number, optionally `/TOTAL`, with a loss-like or a rate field, the fields written
    `key=value`, `key: value` or `key value`, apart by spaces, commas or `|`:
    `step 10/60 loss=1.2024`, `iter 100 | loss 2.34 | lr 1e-4 | tok/s 12,345`. Rates: tok/s,
    tokens/s, tps, tokens_per_sec... (tokens); samples/s (x tokens_per_sample)."""

    name = "loop"
    shape = "step N[/M] loss X ... (a hand-written loop)"
    _STEP = re.compile(r"(?<![\w./-])(?P<word>global[_ ]step|iteration|iter|step|it)(?![\w/-])\s{0,4}"
                       r"[=:#]?\s{0,4}(?P<step>\d{1,15})(?:\s{0,2}/\s{0,2}(?P<total>\d{1,15}))?(?![\w.])",
                       re.IGNORECASE)
    _NUMBER_TEXT = (r"[-+]?(?:\d{1,3}(?:,\d{3}){1,6}(?:\.\d{1,30})?|\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})"
                    r"(?:[eE][-+]?\d{1,4})?")
    _FIELD = re.compile(r"(?<![\w./-])(?P<key>[A-Za-z_][\w./-]{0,63}(?: loss)?)\s{0,4}(?:[=:]\s{0,4}|\s{1,4})"
                        r"(?P<value>" + _NUMBER_TEXT + r")(?P<unit>ms|s|%|[KMGT]i?B)?(?![\w.])")
    _RATE_AFTER = re.compile(r"(?<![\w.])(?P<value>" + _NUMBER_TEXT + r")\s{0,2}"
                             r"(?P<unit>tok/s|tokens/s|tok/sec|tokens/sec|samples/s|samples/sec)(?![\w/])")
    TOKEN_RATES = ("tok/s", "tokens/s", "tok_s", "tok/sec", "tokens/sec", "toks/s", "tokens_per_s",
                   "tokens_per_sec", "tokens_per_second", "tps", "throughput")
    SAMPLE_RATES = ("samples/s", "samples/sec", "samples_per_s", "samples_per_sec", "samples_per_second")
    _OTHER_SPLITS = ("val", "eval", "test", "valid")

    def is_metric_line(self, line: str) -> bool:
        return bool(self._read_line(line))

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        found = self._read_line(line)
        if not found:
            return []
        step, total, fields = found
        loss_key = self._loss_key(fields)
        loss = fields.pop(loss_key) if loss_key else None
        rate_key = next((k for k in self.TOKEN_RATES if k in fields), None)
        tok_s = fields.pop(rate_key) if rate_key else None
        samples = next((fields.pop(k) for k in self.SAMPLE_RATES if k in fields), None)
        if samples is not None:
            fields["samples_per_second"] = samples
        return [LogPoint(step=step, worker=worker, loss=loss, tok_s=tok_s, total=total,
                         metrics={snake(k) if " " in k else k: v for k, v in fields.items()},
                         rate_from=rate_key, at=log_time(line))]

    def _read_line(self, line: str) -> Optional[tuple[int, Optional[int], dict]]:
        """(step, total, fields) of a loop's metric line; None unless it has a step and a
        loss-like or rate field."""
        found = self._STEP.search(line)
        if not found:
            return None
        fields: dict = {}
        for match in self._FIELD.finditer(line, found.end()):
            key, unit = match["key"].lower(), match["unit"]
            key = f"{key}_{'pct' if unit == '%' else unit.lower()}" if unit else key
            fields.setdefault(key, _plain_number(match["value"]))
        for match in self._RATE_AFTER.finditer(line, found.end()):
            fields.setdefault(match["unit"], _plain_number(match["value"]))
        fields = {k: v for k, v in fields.items() if v is not None}
        if not (self._loss_key(fields) or any(k in fields for k in self.TOKEN_RATES + self.SAMPLE_RATES)):
            return None
        return int(found["step"]), int(found["total"]) if found["total"] else None, fields

    def _loss_key(self, fields: dict) -> Optional[str]:
        for key in ("loss", "train_loss", "train loss", "train/loss"):
            if key in fields:
                return key
        return next((k for k in fields if k.endswith("loss") and not k.startswith(self._OTHER_SPLITS)), None)


class DeepSpeedFormat(_MarkedFormat):
    """deepspeedai/DeepSpeed's engine (`steps_per_print` set and its logger at INFO):
    `[Rank 0] step=10, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]` (log_dist, rank 0) and the
    throughput timer's `epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=...,
    CurrSamplesPerSec=..., MemAllocated=...GB, MaxMemAllocated=...GB` (every rank, each
    about the whole job's batch: only the reporting rank's are read). DeepSpeed prints no
    loss: the loop's own lines (the `loop` shape) give it."""

    name = "deepspeed"
    shape = "[Rank 0] step=N, skipped=K, lr=[...] (DeepSpeed)"
    _STEP = re.compile(r"\[Rank (?P<rank>-?\d{1,9})\] step=(?P<step>\d{1,15}), skipped=(?P<skipped>\d{1,15}), "
                       r"lr=\[?(?P<lr>[-+\w.]{1,40})")
    _RATE = re.compile(r"\bepoch=(?P<epoch>\d{1,9})/micro_step=\d{1,15}/global_step=(?P<step>\d{1,15}), "
                       r"RunningAvgSamplesPerSec=(?P<avg>[-+\w.]{1,40}), CurrSamplesPerSec=(?P<curr>[-+\w.]{1,40})"
                       r"(?:, MemAllocated=(?P<mem>[\d.]{1,20})GB, MaxMemAllocated=(?P<max>[\d.]{1,20})GB)?")

    marker = "step="

    def __init__(self):
        super().__init__()
        self.loop = LoopFormat()
        self._reporting: set[int] = set()     # the workers that print the step lines

    def on_line(self, line: str, worker: int) -> list[LogPoint]:
        found = self._found(line)
        if found:
            if len(self._reporting) < MAX_WORKERS:
                self._reporting.add(worker)
            return [LogPoint(step=int(found["step"]), worker=worker, at=log_time(line),
                             metrics=numeric_fields({"skipped": found["skipped"], "lr": found["lr"]}))]
        found = self._RATE.search(line) if "SamplesPerSec=" in line else None
        if found:
            if worker not in self._reporting:
                return []
            metrics = numeric_fields({"samples_per_second": found["curr"], "running_avg_samples_per_second":
                                      found["avg"], "epoch": found["epoch"], "mem_allocated_gb": found["mem"],
                                      "max_mem_allocated_gb": found["max"]})
            return [LogPoint(step=int(found["step"]), worker=worker, metrics=metrics, at=log_time(line))]
        return self.loop.on_line(line, worker)


class LightningFormat(LogFormat):
    """Lightning-AI/pytorch-lightning's TQDMProgressBar: one bar per epoch, `Epoch E:
    45%|####5     | 45/100 [00:10<00:12, 4.30it/s, v_num=0, train_loss=0.123]` (its
    BAR_FORMAT; the postfix: v_num from the logger, the metrics logged with prog_bar=True).
    The count restarts each epoch: the step is the batches of the epochs before plus n.
    Each batch is drawn twice (the count, then the new postfix): the last draw of a step
    wins. Validation and sanity-check bars are progress."""

    name = "lightning"
    shape = "Epoch E: ...| n/total [..., v_num=0, train_loss=X] (Lightning's progress bar)"
    _EPOCH = re.compile(r"Epoch (?P<epoch>\d{1,9})\Z")
    _LOSSES = ("loss", "train_loss", "train_loss_step", "train/loss")

    def __init__(self):
        super().__init__()
        self._epochs: dict[int, tuple[int, int, Optional[int], int]] = {}  # worker -> epoch, n, total, offset
        self._drawn: dict[int, tuple[int, dict]] = {}                       # worker -> (step, postfix)

    def _continued(self, bar: Bar, worker: int) -> Bar:
        return bar        # on_bar carries the count across epochs by their number

    def is_metric_bar(self, bar: Bar) -> bool:
        return bool(self._EPOCH.match(bar.desc)) and (
            "v_num" in bar.postfix or any("loss" in key for key in bar.postfix))

    def on_bar(self, bar: Bar, worker: int) -> list[LogPoint]:
        found = self._EPOCH.match(bar.desc)
        if not found:
            # a validation or sanity-check bar: the run is alive, the step does not move
            return [LogPoint(step=bar.n, worker=worker, progress=True)]
        epoch = int(found["epoch"])
        before = self._epochs.get(worker)
        offset = 0
        if before is not None:
            offset = before[3]
            if epoch > before[0]:
                offset += before[2] if before[2] else before[1]
        self._epochs[worker] = (epoch, bar.n, bar.total, offset)
        step = offset + bar.n
        if self._drawn.get(worker) == (step, bar.postfix) or not bar.n:
            return []
        self._drawn[worker] = (step, bar.postfix)
        loss_key = next((k for k in self._LOSSES if k in bar.postfix), None) or next(
            (k for k in bar.postfix if "loss" in k and not k.startswith(("val", "test"))), None)
        metrics = numeric_fields(bar.postfix, skip=(loss_key, "v_num"))
        metrics["epoch"] = float(epoch)
        if bar.rate is not None:
            metrics["it_s"] = bar.rate
        return [LogPoint(step=step, worker=worker, loss=number(bar.postfix.get(loss_key)) if loss_key else None,
                         metrics=metrics)]


def _first(fields: dict, keys: Iterable[str]) -> Optional[float]:
    for key in keys:
        value = number(fields.get(key))
        if value is not None:
            return value
    return None


class AutoFormat(LogFormat):
    """The default: each line is offered to the known shapes, most specific first; the
    first that reads a step from one is the run's format from then on (the record and the
    live view say which). Until then bars are progress and every line is kept."""

    name = "auto"

    def __init__(self, logging_steps: Optional[int] = None):
        super().__init__()
        self.candidates: list[LogFormat] = [shape.make(logging_steps) for shape in SHAPES
                                            if shape.detected]
        self.picked: Optional[LogFormat] = None

    @property
    def shape(self) -> str:
        return self.picked.shape if self.picked else "any known shape"

    def describe(self) -> str:
        return f"auto: {self.picked.describe()}" if self.picked else "auto"

    def tried(self) -> str:
        return ", ".join(c.name for c in self.candidates) + " (and tqdm bars as progress)"

    def read(self, segment: Segment, default_worker: int = 0) -> tuple[Optional[str], list[LogPoint]]:
        if self.picked is not None:
            return self.picked.read(segment, default_worker)
        bars = find_bars(segment.text)
        text = _without_bars(segment.text, bars)
        rank0 = (segment.worker if segment.worker is not None else default_worker) == 0
        for candidate in self.candidates:
            if (text and candidate.is_metric_line(text)) or (
                    rank0 and any(candidate.is_metric_bar(bar) for bar in bars)):
                self.picked = candidate
                return candidate.read(segment, default_worker)
        line, points = super().read(segment, default_worker)
        for candidate in self.candidates:
            candidate.watch_progress(segment, points)
        return line, points

    def is_metric_line(self, line: str) -> bool:
        return bool(self.picked and self.picked.is_metric_line(line))

    def spacing(self) -> Optional[tuple[int, str]]:
        """The picked shape's steps between log points, where it numbers them (hf-trainer)."""
        return self.picked.spacing() if self.picked is not None and hasattr(self.picked, "spacing") else None

    def finish(self) -> list[LogPoint]:
        return self.picked.finish() if self.picked else []


def _without_bars(text: str, bars: list) -> str:
    if not bars:
        return text.strip()
    kept, last = [], 0
    for bar in bars:
        kept.append(text[last:bar.span[0]])
        last = bar.span[1]
    kept.append(text[last:])
    return "".join(kept).strip()


# The known shapes, most specific first: the order `format: auto` tries them in. A new shape is
# a LogFormat subclass listed here (docs/design/architecture.md, "A log format").
SHAPES: tuple[type[LogFormat], ...] = (OrchFormat, SpecForgeFormat, HfTrainerFormat, JsonlFormat,
                                       NanoGptFormat, TorchtitanFormat, MegatronFormat, DeepSpeedFormat,
                                       LightningFormat, KeyValueFormat, LoopFormat, TqdmFormat)

# What a playbook's `format` may say: auto (the default), regex (with metric_regex), a shape.
FORMATS = ("auto", "regex") + tuple(shape.name for shape in SHAPES)


def make_format(name: str, metric_regex: Optional[str] = None,
                logging_steps: Optional[int] = None) -> LogFormat:
    """The parser for a playbook's `format` (and its `metric_regex`, for `regex`)."""
    if name == "regex" or (name in ("orch", "auto") and metric_regex):
        if not metric_regex:
            raise ValueError("format regex needs a metric_regex")
        return RegexFormat(metric_regex)
    if name == "auto":
        return AutoFormat(logging_steps)
    for shape in SHAPES:
        if shape.name == name:
            return shape.make(logging_steps)
    raise ValueError(f"unknown log format {name!r}; known: {', '.join(FORMATS)}")


# ------------------------------------------------------------ what trainers write as data
class TrainerStateError(ValueError):
    """A trainer_state.json that is not one (the message says what is wrong)."""


def log_history_points(text: str, worker: int = 0) -> list[LogPoint]:
    """A Hugging Face trainer_state.json's `log_history` as points: each entry has its step,
    the loss and the other numbers (train_tokens_per_second as tok/s). Entries said at one
    step (the closing summary after the last log) are kept apart, as the log prints them."""
    try:
        state = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise TrainerStateError(f"not JSON: {error}") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise TrainerStateError("no log_history list in it")
    points = []
    for entry in history:
        step = number(entry.get("step")) if isinstance(entry, dict) else None
        if step is None:
            continue
        metrics = numeric_fields(entry, skip=("loss", "step", "total_flos"))
        points.append(LogPoint(step=int(step), worker=worker, loss=number(entry.get("loss")),
                               tok_s=metrics.pop("train_tokens_per_second", None), metrics=metrics))
    return points


def trainer_state_spacing(text: str) -> Optional[int]:
    """A trainer_state.json's `logging_steps` (TrainerState keeps the absolute one), if any."""
    try:
        state = json.loads(text)
    except (ValueError, RecursionError):
        return None
    every = state.get("logging_steps") if isinstance(state, dict) else None
    return every if isinstance(every, int) and not isinstance(every, bool) and every >= 1 else None


# What a launch's command line says that a log format needs: the flag, the setting, the
# smallest value that makes sense (HF TrainingArguments' --logging_steps when it is a count;
# Megatron's --seq-length, the tokens in one sample).
COMMAND_LINE_FACTS = (("--logging_steps", "logging_steps"), ("--logging-steps", "logging_steps"),
                      ("--seq-length", "tokens_per_sample"), ("--seq_length", "tokens_per_sample"))


def command_line_settings(argv) -> dict:
    """{setting: value} from a launch's argv: `--logging_steps 5`, `--logging_steps=5`, ...
    A value that is not a whole number of at least 1 (HF's logging_steps may be a ratio of
    max_steps) says nothing."""
    found: dict = {}
    args = [str(arg) for arg in (argv or [])][:4096]
    for index, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if not equals:
            value = args[index + 1] if index + 1 < len(args) else ""
        for name, setting in COMMAND_LINE_FACTS:
            if flag == name and value.isdigit() and int(value) >= 1:
                found[setting] = int(value)
    return found


# ----------------------------------------------------------------------- throughput
SAMPLE_RATES = ("perf/global_samples_per_second", "train_samples_per_second", "samples_per_second")


class DerivedThroughput:
    """tok/s for trainers that print none: the samples per second a trainer prints
    (SpecForge's perf/global_samples_per_second) x tokens_per_sample where both are known,
    else steps per second between a worker's logged points (by the log's own time where it
    has one, else by arrival) x tokens_per_step."""

    def __init__(self, tokens_per_step: Optional[float], tokens_per_sample: Optional[float] = None):
        self.tokens_per_step = tokens_per_step
        self.tokens_per_sample = tokens_per_sample
        self._last: dict[int, tuple[float, int]] = {}

    def fill(self, point: LogPoint, arrived: float) -> LogPoint:
        if point.progress or point.tok_s is not None:
            return point
        samples = next((point.metrics[k] for k in SAMPLE_RATES if k in point.metrics), None)
        if samples is not None and self.tokens_per_sample:
            point.tok_s = round(samples * float(self.tokens_per_sample), 1)
            point.derived, point.derived_from = True, "samples/s x tokens_per_sample"
            return point
        if not self.tokens_per_step:
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
MAX_WORKERS = 1024   # distinct worker ids one run's logs may name and orch tracks


class WorkerCap:
    """The worker ids a run's logs name (torchrun prefixes, a JSON line's rank, drafter=N,
    a rank log's path), the first MAX_WORKERS of them: a log naming a million ranks must not
    grow the per-worker state (formats, classifier) without bound. A line of a worker past
    the cap is kept as a line but not parsed, its points are dropped; `refused` counts them."""

    def __init__(self, limit: int = MAX_WORKERS):
        self.limit = limit
        self.ids: set = set()
        self.refused = 0

    def admit(self, worker: Optional[int]) -> bool:
        if worker is None or worker in self.ids:
            return True
        if len(self.ids) < self.limit:
            self.ids.add(worker)
            return True
        self.refused += 1
        return False

    def note(self, word: str) -> Optional[str]:
        """What the record says when the cap was reached."""
        if not self.refused:
            return None
        return (f"the log named more than {self.limit} {word}s: only the first {self.limit} are "
                f"tracked ({self.refused} lines or points of the others were not read)")


class LogParser:
    """A stream and a format together: bytes in, (stored lines, points) out. One WorkerCap
    for all of a run's parsers (and its classifier) bounds the workers they track."""

    def __init__(self, fmt: LogFormat, worker: Optional[int] = None,
                 workers: Optional[WorkerCap] = None, source: Optional[str] = None, rank_offset: int = 0):
        self.format = fmt
        self.stream = LogStream(worker, source, rank_offset)
        self.default_worker = worker if worker is not None else 0
        self.workers = workers if workers is not None else WorkerCap()

    def feed(self, text: str) -> tuple[list[str], list[LogPoint]]:
        return self._read(self.stream.feed(text))

    def finish(self) -> tuple[list[str], list[LogPoint]]:
        lines, points = self._read(self.stream.finish())
        return lines, points + self.format.finish()

    def _read(self, segments: list[Segment]) -> tuple[list[str], list[LogPoint]]:
        lines, points = [], []
        for segment in segments:
            if not self.workers.admit(segment.worker):
                if segment.ends_line:
                    lines.append(segment.text)   # still searched for failures, and shown
                continue
            text, found = self.format.read(segment, self.default_worker)
            if text is not None:
                lines.append(text)
            points.extend(point for point in found if self.workers.admit(point.worker))
        return lines, points


def parse_text(text: str, fmt: LogFormat, worker: Optional[int] = None) -> list[LogPoint]:
    """Every point in a whole log (tests, and reading a collected log again)."""
    parser = LogParser(fmt, worker)
    _, points = parser.feed(text)
    return points + parser.finish()[1]
