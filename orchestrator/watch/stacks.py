"""A hung run's threads: every thread's Python stack of the live process, as pystack prints
it (`pystack remote PID`, taken from outside the process), and the wait graph read from the
source: a frame stopped on a `with LOCK:` line waits for LOCK; a frame inside the body of a
`with LOCK:` block holds it. Pure functions over pystack's text and the explain_frames
payload's facts; no I/O.

pystack 1.7's words (checked on CPython 3.11):

    Traceback for thread 25594 (python) [] (most recent call last):
        (Python) File "/usr/lib/python3.11/threading.py", line 995, in _bootstrap
            self._bootstrap_inner()

A thread is "inside a compile" when a frame of its stack runs in torch.compile's machinery
(torch/_dynamo: the frame evaluation and the backend it calls; torch/_inductor: code
generation; torch/fx: symbolic tracing), known from the frames' files alone: a compile that
never ends, or one that died holding a lock, is the usual story behind a silent hang.

Bounded like tracebacks.py: lines cut by LogStream, at most MAX_THREADS threads of at most
tracebacks.MAX_FRAMES frames.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from orchestrator.watch import tracebacks
from orchestrator.watch.logformats import LogStream

MAX_THREADS = 512
STDLIB = "(standard library)"   # the explain_frames payload's package for those files
_THREAD = re.compile(r"Traceback for thread (?P<tid>\d{1,12}) \((?P<name>[^)\n]{0,200})\)")
_COMPILE = re.compile(r"(?:^|/)torch/(_dynamo|_inductor|fx)/")
_FRAME = re.compile(r'\((?P<kind>Python|C)\) File "(?P<file>[^"\n]{1,4096})", line (?P<line>\d{1,9})'
                    r"(?:, in (?P<function>[^\n]{1,400}))?")


@dataclass
class ThreadStack:
    tid: int
    name: str
    frames: list[tracebacks.Frame] = field(default_factory=list)   # outermost first

    @property
    def label(self) -> str:
        if not self.tid:                       # a thread that died: its log's name for it
            return f"{self.name or 'a thread'} (dead)"
        return f"thread {self.tid}" + (f" ({self.name})" if self.name else "")

    @property
    def compile(self) -> list[str]:
        return compile_parts(self.frames)


def compile_parts(frames: list[tracebacks.Frame]) -> list[str]:
    """The parts of torch's compiler a stack is inside, outermost first: ["torch._dynamo",
    "torch.fx"]; [] when it is in none."""
    parts: list[str] = []
    for frame in frames:
        found = _COMPILE.search(frame.file.replace("\\", "/"))
        if found and f"torch.{found.group(1)}" not in parts:
            parts.append(f"torch.{found.group(1)}")
    return parts


def compile_words(parts: list[str]) -> str:
    return f"inside a compile ({', '.join(parts)})" if parts else ""


def thread_names(threads: list[ThreadStack], pid: int) -> list[ThreadStack]:
    """Keep only the names that name a thread. pystack prints each thread's system name
    (/proc/PID/task/TID/comm, 15 bytes at most). CPython 3.14 and later set it to the
    Thread's name when the thread starts ("drafter-0"); before 3.14 every thread inherits
    the process's name ("python3"), which names no thread and is dropped (the main thread,
    whose tid is the pid, keeps it)."""
    process = next((t.name for t in threads if t.tid == pid), None)
    for thread in threads:
        if thread.tid != pid and thread.name == process:
            thread.name = ""
    return threads


def parse_pystack(text: str) -> list[ThreadStack]:
    threads: list[ThreadStack] = []
    stream = LogStream()
    for segment in stream.feed(text) + stream.finish():
        line = segment.text
        header = _THREAD.search(line)
        if header:
            if len(threads) >= MAX_THREADS:
                break
            threads.append(ThreadStack(int(header.group("tid")), header.group("name").strip()))
            continue
        frame = _FRAME.search(line)
        if frame and threads and frame.group("kind") == "Python":
            frames = threads[-1].frames
            frames.append(tracebacks.Frame(frame.group("file"), int(frame.group("line")),
                                           (frame.group("function") or "").strip()))
            if len(frames) > tracebacks.MAX_FRAMES:
                del frames[0]
        elif threads and threads[-1].frames and line.strip() and not threads[-1].frames[-1].code:
            threads[-1].frames[-1].code = line.strip()[:400]
    return threads


@dataclass
class Lock:
    key: str                  # relpath:expression, the name the source gives it
    holders: list[dict]       # [{thread, where, inside, compile, died}]: inside = its innermost
    #                           frame; died = "Exception: message" of a thread that died
    waiters: list[dict]       # [{thread, where, compile}]; compile: compile_parts of its stack

    def sentence(self) -> str:
        name = self.key
        parts = []
        for h in self.holders:
            if h.get("died"):     # the H200's story: "X died inside a compile holding L"
                parts.append(f"{h['thread']} died" + (f" {compile_words(h['compile'])}" if h.get("compile") else "")
                             + f" holding {name} ({h['where']}): {h['died']}")
                continue
            parts.append(f"{h['thread']} holds {name} ({h['where']}), now in {h['inside']}"
                         + (f", {compile_words(h['compile'])}" if h.get("compile") else ""))
        if self.waiters:
            who = ", ".join(w["thread"] + (f" [{compile_words(w['compile'])}]" if w.get("compile") else "")
                            for w in self.waiters)
            parts.append(f"{who} wait{'s' if len(self.waiters) == 1 else ''} on {name} "
                         f"({', '.join(sorted({w['where'] for w in self.waiters}))})"
                         + ("" if self.holders else ": no live thread holds it (its holder "
                                                    "died or released it elsewhere)"))
        return "; ".join(parts)


def wait_graph(threads: list[ThreadStack], facts: dict,
               dead: list[tracebacks.Traceback] = ()) -> list[Lock]:
    """The locks the stacks hold or wait for, from each frame's enclosing `with` blocks and
    un-released acquire() calls (the payload's `with` per frame). `dead`: the tracebacks of
    threads that died (the run's log): a lock one of them held is held by a dead thread."""
    by_frame = {(f.get("file"), f.get("line")): f for f in facts.get("frames", [])}
    files = facts.get("files", {})
    locks: dict[str, Lock] = {}
    died = [ThreadStack(0, tb.worker, list(tb.frames)) for tb in dead]
    for thread in list(threads) + died:
        innermost = thread.frames[-1] if thread.frames else None
        inside = (f"{innermost.function} ({posixpath.basename(innermost.file)}:{innermost.line})"
                  if innermost else "?")
        death = ""
        if thread in died:
            tb = dead[died.index(thread)]
            # one line: a message of several ("backend=... raised:" then the real error)
            # is joined with " "
            death = f"{tb.exception}: {' '.join(tb.message.split(chr(10)))[:240]}"
            inside = f"DIED there with {death}"
        for frame in thread.frames:
            seen = by_frame.get((frame.file, frame.line)) or {}
            info = files.get(frame.file) or {}
            if info.get("package") == STDLIB:
                continue    # threading's own locks (a join waits on one): not the run's
            relpath = info.get("relpath") or posixpath.basename(frame.file)
            for block in seen.get("with", []):
                key = f"{relpath}:{block['expr']}"
                lock = locks.setdefault(key, Lock(key, [], []))
                where = f"{posixpath.basename(frame.file)}:{block['line']}"
                if block["entering"] and frame is innermost:
                    lock.waiters.append({"thread": thread.label, "where": where,
                                         "compile": thread.compile})
                elif not block["entering"]:
                    lock.holders.append({"thread": thread.label, "where": where, "inside": inside,
                                         "compile": thread.compile, "died": death})
    return [lock for lock in locks.values() if lock.waiters]


def stack_frames(threads: list[ThreadStack], dead: list[tracebacks.Traceback] = ()) -> list[dict]:
    """Each distinct frame once, for the explain_frames payload."""
    seen: dict[tuple, dict] = {}
    for thread in list(threads) + [ThreadStack(0, tb.worker, tb.frames) for tb in dead]:
        for frame in thread.frames:
            seen.setdefault((frame.file, frame.line), {"file": frame.file, "line": frame.line,
                                                       "function": frame.function,
                                                       "innermost": False})
    return list(seen.values())
