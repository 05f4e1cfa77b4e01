"""Python tracebacks out of a run's log, every worker's, grouped. Pure functions, no I/O.

A log holds many writers at once: drafter threads of one process (the stand-in trainer says
`drafter=N ERROR Type: message` on stdout just before the traceback it prints on stderr),
Python's own `Exception in thread NAME:` header, and torchrun ranks whose lines carry
`[rankN]:` / `[defaultN]:` prefixes, interleaved line by line. Two writers can glue their
text into one line (no newline between a stdout event and a stderr traceback); the
traceback's markers are looked for anywhere in a line, not only at its start.

The text is untrusted: it is cut into lines by `logformats.LogStream` (each line bounded,
linear), every pattern here is anchored or starts with a literal and has bounded repeats,
and a traceback keeps at most MAX_FRAMES frames (its innermost ones), a log at most
MAX_TRACEBACKS tracebacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.watch import dflash
from orchestrator.watch.logformats import LogStream

MAX_FRAMES = 120          # innermost frames kept per traceback (where the error is)
MAX_TRACEBACKS = 400      # per log; more are counted, not kept
MAX_MESSAGE = 2000        # characters of an exception's message

HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'File "(?P<file>[^"\n]{1,4096})", line (?P<line>\d{1,9})(?:, in (?P<function>[^\n]{1,400}))?')
# `Type: message`, `pkg.mod.Type: message` or a bare `Type` (KeyboardInterrupt), at a line's start
_EXCEPTION = re.compile(r"(?P<type>[A-Za-z_]\w{0,200}(?:\.[A-Za-z_]\w{0,200}){0,20})(?P<colon>:)?")
# An exception line that ends in ":" announces more lines of its message (torch's
# `BackendCompilerFailed: backend='inductor' raised:` then `RuntimeError: ...`, the error
# that matters); they run to the next blank line, at most this many.
MAX_MESSAGE_LINES = 20
MAX_NOISE = 40            # other lines inside one traceback before it is given up as cut off
_CARET = re.compile(r"\s{0,400}[~^]{1,4000}\s{0,40}$")
_CHAINED = ("During handling of the above exception, another exception occurred:",
            "The above exception was the direct cause of the following exception:")
# Who is about to print a traceback: the stand-in trainer's error event (its words are
# dflash.py's), Python's thread hook.
_THREAD_HEADER = re.compile(r"Exception in thread (?P<name>[^\s:]{1,200})(?: \([^)]{0,200}\))?:")
# torchrun's failure table quotes an error file's traceback as a field (`traceback : Traceback
# ...`): distributed.py reads the table, its tracebacks come from there, not from here.
_TABLE_FIELD = re.compile(r"^\s{0,40}traceback\s{0,40}:\s{0,40}$")
# torch's ExceptionWrapper (a DataLoader worker's error, re-raised in the main process):
# `KeyError: Caught KeyError in DataLoader worker process 0.` then `Original Traceback (most
# recent call last):`, the worker's own traceback, which happened first.
ORIGINAL = "Original"
_CAUGHT_IN = re.compile(r"^Caught \w{1,200} in (?P<where>[^.\n]{1,200})\.")
# The kinds of worker a traceback belongs to: a thread of the process (its name), a torchrun
# rank (a process), another process (a DataLoader worker), or the log's own process.
THREAD, RANK, PROCESS = "thread", "rank", "process"


@dataclass
class Frame:
    file: str
    line: int
    function: str = ""
    code: str = ""            # the source line as the log shows it

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Traceback:
    worker: str               # "drafter-0", "rank 1", a thread's name, or "" when the log says not
    exception: str            # the exception's type as printed (RuntimeError, torch._dynamo.exc.X)
    message: str
    frames: list[Frame] = field(default_factory=list)
    dropped_frames: int = 0   # outer frames past MAX_FRAMES, not kept
    causes: list["Traceback"] = field(default_factory=list)   # chained before it, oldest first
    source: str = ""          # which log it came from
    line: int = 0             # the log line of its header
    kind: str = ""            # THREAD | RANK | PROCESS | "" (the log's own process, its main thread)
    reraised: bool = False    # an ExceptionWrapper's re-raise of another process's error
    original: bool = False    # ... and that other process's own traceback (it happened first)
    time: Optional[float] = None   # when it was raised, where the log says (an error file's timestamp)

    @property
    def innermost(self) -> Optional[Frame]:
        return self.frames[-1] if self.frames else None

    def signature(self) -> tuple:
        """The same failure in another worker: same exception, message and raising frame."""
        last = self.innermost
        return (self.exception, self.message[:300],
                (last.file, last.line, last.function) if last else None)


@dataclass
class Group:
    """One failure as several workers hit it."""
    traceback: Traceback      # the first worker's, as the representative
    workers: list[str]
    count: int                # tracebacks in the group (a worker may fail more than once)


@dataclass
class ParseResult:
    tracebacks: list[Traceback]
    dropped: int = 0          # tracebacks past MAX_TRACEBACKS


class _Reader:
    """One writer's state: the traceback it is printing, and who it said it is."""

    def __init__(self, worker: str, kind: str = ""):
        self.default_worker = worker
        self.default_kind = kind
        self.next_worker = ""       # named by the line just before a traceback
        self.next_kind = ""
        self.indent = 0             # the traceback's header was indented (torch's `[rankN]: ` prefix)
        self.current: Optional[Traceback] = None
        self.chained: list[Traceback] = []   # finished, with a chain line after them
        self.pending_chain = False
        self.last_done: Optional[Traceback] = None
        self.noise = 0
        self.message_lines = 0      # > 0: the lines after last_done's exception line are its message


class TracebackParser:
    """Feed a log's text in chunks, in order; `finish()` returns every traceback in it."""

    def __init__(self, source: str = "", worker: str = "", kind: str = "", time: Optional[float] = None):
        self.source = source
        self.stream = LogStream()
        self.worker = worker
        self.kind = kind or (RANK if worker.startswith("rank ") else "")
        self.time = time
        self.readers: dict[Optional[int], _Reader] = {}
        self.done: list[Traceback] = []
        self.dropped = 0
        self.lineno = 0

    def feed(self, text: str) -> None:
        for segment in self.stream.feed(text):
            self._segment(segment)

    def feed_line(self, text: str) -> None:
        """One line already cut (and its worker prefix taken off) by a LogStream: the
        monitor's, which feeds the classifier line by line."""
        self.lineno += 1
        reader = self.readers.get(None)
        if reader is None:
            reader = self.readers[None] = _Reader(self.worker, self.kind)
        self._line(reader, text)

    def finish(self) -> ParseResult:
        for segment in self.stream.finish():
            self._segment(segment)
        for reader in self.readers.values():
            self._close(reader)
        return ParseResult(self.done, self.dropped)

    # ------------------------------------------------------------------ one line
    def _segment(self, segment) -> None:
        if segment.ends_line:
            self.lineno += 1
        rank = segment.worker
        reader = self.readers.get(rank)
        if reader is None:
            reader = self.readers[rank] = (_Reader(f"rank {rank}", RANK) if rank is not None
                                           else _Reader(self.worker, self.kind))
        self._line(reader, segment.text)

    def _line(self, reader: _Reader, text: str) -> None:
        at = text.find(HEADER)
        if at >= 0:
            before = text[:at]
            if _TABLE_FIELD.match(before):
                return                       # torchrun's table quotes it: distributed.py reads it
            self._who(reader, before)        # glued: an event line, then the header
            self._start(reader, before)
            rest = text[at + len(HEADER):]
            if rest.strip():
                self._line(reader, rest)
            return
        if reader.indent and reader.current is not None and text[:reader.indent].isspace():
            text = text[reader.indent:]      # the header's own indent: frames, code, exception
        if reader.current is None:
            if reader.message_lines:
                self._message_line(reader, text)
            else:
                self._idle(reader, text)
            return
        stripped = text.strip()
        frame = _FRAME.search(text)
        if frame and stripped.startswith("File "):
            self._frame(reader.current, frame)
        elif frame:   # a frame glued after other text
            self._frame(reader.current, frame)
        elif text[:1].isspace() or not stripped:
            self._code(reader.current, stripped)
        else:
            self._exception(reader, stripped)

    def _idle(self, reader: _Reader, text: str) -> None:
        stripped = text.strip()
        if reader.pending_chain and not stripped:
            return
        if stripped in _CHAINED and reader.last_done is not None:
            reader.pending_chain = True
            return
        reader.pending_chain = False
        self._who(reader, text)

    def _message_line(self, reader: _Reader, text: str) -> None:
        stripped = text.strip()
        if not stripped or stripped in _CHAINED or reader.message_lines > MAX_MESSAGE_LINES:
            reader.message_lines = 0
            self._idle(reader, text)
            return
        tb = reader.last_done
        tb.message = (tb.message + "\n" + stripped)[:MAX_MESSAGE]
        reader.message_lines += 1

    def _who(self, reader: _Reader, text: str) -> None:
        """The worker the next traceback belongs to, if this line names one."""
        if "ERROR" not in text and "Exception in thread" not in text:
            return                           # the common line: no regex run on it
        trainer = dflash.ERROR_LINE.search(text)
        if trainer:
            # the stand-in trainer names its threads drafter-N, as here
            reader.next_worker = f"{dflash.WORD}-{int(trainer.group('drafter'))}"
            reader.next_kind = THREAD
            return
        thread = _THREAD_HEADER.search(text)
        if thread:
            reader.next_worker, reader.next_kind = thread.group("name"), THREAD

    def _start(self, reader: _Reader, before: str = "") -> None:
        if reader.current is not None:        # a header inside a traceback: the old one ended unseen
            self._close(reader)
        chain = reader.chained + [reader.last_done] if reader.pending_chain and reader.last_done else []
        if reader.pending_chain and reader.last_done is not None:
            self._unlist(reader.last_done)
        worker = reader.next_worker or (reader.last_done.worker if chain else reader.default_worker)
        kind = reader.next_kind or (reader.last_done.kind if chain else reader.default_kind)
        tb = Traceback(worker=worker, exception="", message="", source=self.source, line=self.lineno,
                       causes=[c for c in chain if c is not None], kind=kind, time=self.time)
        wrapper = reader.last_done
        caught = _CAUGHT_IN.match(wrapper.message) if wrapper is not None and before.strip() == ORIGINAL else None
        if caught:                            # the other process's own traceback, re-raised here
            wrapper.reraised = tb.original = True
            tb.worker, tb.kind = caught.group("where"), PROCESS
        reader.current = tb
        reader.indent = len(before) if before.isspace() else 0
        reader.next_worker, reader.next_kind, reader.pending_chain, reader.chained = "", "", False, []
        reader.noise = reader.message_lines = 0

    def _frame(self, tb: Traceback, match: re.Match) -> None:
        tb.frames.append(Frame(match.group("file"), int(match.group("line")),
                               (match.group("function") or "").strip()))
        if len(tb.frames) > MAX_FRAMES:
            del tb.frames[0]
            tb.dropped_frames += 1

    @staticmethod
    def _code(tb: Traceback, stripped: str) -> None:
        if tb.frames and not tb.frames[-1].code and stripped and not _CARET.match(stripped):
            tb.frames[-1].code = stripped[:400]

    def _exception(self, reader: _Reader, stripped: str) -> None:
        tb = reader.current
        match = _EXCEPTION.match(stripped)
        if match is None or not (match.group("colon") or match.end() == len(stripped)) \
                or not tb.frames:
            # another writer's line inside the traceback: skipped, within a bound
            reader.noise += 1
            if reader.noise > MAX_NOISE or not tb.frames:
                self._close(reader)
            return
        tb.exception = match.group("type")
        tb.message = stripped[match.end():].strip()[:MAX_MESSAGE]
        self._finish(reader)
        reader.message_lines = 1 if tb.message.endswith(":") else 0

    def _finish(self, reader: _Reader) -> None:
        tb, reader.current = reader.current, None
        reader.last_done = tb
        if len(self.done) >= MAX_TRACEBACKS:
            self.dropped += 1
            return
        self.done.append(tb)

    def _close(self, reader: _Reader) -> None:
        """A traceback the log cut off before its exception line (killed, truncated)."""
        if reader.current is not None and reader.current.frames:
            reader.current.exception = reader.current.exception or "(log ended)"
            self._finish(reader)
        reader.current = None

    def _unlist(self, tb: Traceback) -> None:
        """A traceback chained to the next one is kept as its cause, not on its own."""
        for index in range(len(self.done) - 1, -1, -1):
            if self.done[index] is tb:
                del self.done[index]
                return


def parse(text: str, source: str = "", worker: str = "", time: Optional[float] = None) -> ParseResult:
    parser = TracebackParser(source, worker, time=time)
    parser.feed(text)
    return parser.finish()


def group(tracebacks: list[Traceback]) -> list[Group]:
    """The same exception at the same raising frame, in several workers: one group each,
    in the order of their first appearance."""
    groups: dict[tuple, Group] = {}
    for tb in tracebacks:
        key = tb.signature()
        found = groups.get(key)
        if found is None:
            groups[key] = Group(tb, [tb.worker] if tb.worker else [], 1)
            continue
        found.count += 1
        if tb.worker and tb.worker not in found.workers:
            found.workers.append(tb.worker)
    return list(groups.values())
