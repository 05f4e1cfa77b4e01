"""A hung run's threads: every thread's Python stack of the live process, as pystack prints
it (`pystack remote --locals PID`, taken from outside the process), and the wait graph:

- a frame stopped on a `with LOCK:` line waits for LOCK; a frame inside the body of a
  `with LOCK:` block holds it; each lock is the object the payload resolved (one RLock
  imported under two names is one lock; a context manager on the same line is none);
- a thread in autograd's engine waits for its CUDA device threads (pt_autograd_N), a
  Thread.join for the joined thread (by the Thread object's address), a c10d collective
  for the peer ranks;
- a cycle among those waits (Tarjan's strongly connected components) is a deadlock:
  `DEADLOCK: A -> B -> A` (docs/design/deadlocks.md).

Pure functions over pystack's text and the explain_frames payload's facts; no I/O.

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

import collections
import posixpath
import re
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.ground import graphs
from orchestrator.watch import tracebacks
from orchestrator.watch.logformats import LogStream

MAX_THREADS = 512
PEERS = "peer ranks"        # what a c10d collective waits for: the other ranks' processes
_DEVICE_THREAD = re.compile(r"pt_autograd_\d{1,3}")   # autograd's device threads (c10::setThreadName)
_ENGINE_FUNCTIONS = ("_engine_run_backward", "run_backward")
_LOCKISH = re.compile(r"(?i)(lock|mutex|sem|semaphore|cond|condition|_cv)$")
STDLIB = "(standard library)"   # the explain_frames payload's package for those files
_THREAD = re.compile(r"\s{0,4}Traceback for thread (?P<tid>\d{1,12}) \((?P<name>[^)\n]{0,200})\)")
_COMPILE = re.compile(r"(?:^|/)torch/(_dynamo|_inductor|fx)/")
_FRAME = re.compile(r'\s{0,8}\((?P<kind>Python|C)\) File "(?P<file>[^"\n]{1,4096})", line (?P<line>\d{1,9})'
                    r"(?:, in (?P<function>[^\n]{1,400}))?")
_SECTION = re.compile(r"\s{4,12}(Arguments|Locals):\s*$")          # pystack --locals
_SELF = re.compile(r"\s{6,16}self: <\w{1,80} at (?P<addr>0x[0-9a-f]{1,16})>\s*$")


@dataclass
class ThreadStack:
    tid: int
    name: str
    frames: list[tracebacks.Frame] = field(default_factory=list)   # outermost first
    obj: str = ""             # its threading.Thread's address (pystack --locals), if any
    joins: str = ""           # the address of the Thread its join() waits for

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
    """pystack's text (with --locals or without) as threads. Of the locals only `self` of
    threading.py's own frames is kept: the Thread object a thread runs (its _bootstrap
    frame) and the one a join waits for, by address ("<Thread at 0x7f..>")."""
    threads: list[ThreadStack] = []
    stream = LogStream()
    in_locals = False
    for segment in stream.feed(text) + stream.finish():
        line = segment.text
        header = _THREAD.match(line)
        if header:
            if len(threads) >= MAX_THREADS:
                break
            threads.append(ThreadStack(int(header.group("tid")), header.group("name").strip()))
            in_locals = False
            continue
        frame = _FRAME.match(line)
        if frame:
            in_locals = False
            if threads and frame.group("kind") == "Python":
                _add_frame(threads[-1], tracebacks.Frame(frame.group("file"), int(frame.group("line")),
                                                         (frame.group("function") or "").strip()))
            continue
        if _SECTION.match(line):
            in_locals = True
        elif in_locals:
            _keep_thread_object(threads, line)
        elif threads and threads[-1].frames and line.strip() and not threads[-1].frames[-1].code:
            threads[-1].frames[-1].code = line.strip()[:400]
    return threads


def _add_frame(thread: ThreadStack, frame: tracebacks.Frame) -> None:
    thread.frames.append(frame)
    if len(thread.frames) > tracebacks.MAX_FRAMES:
        del thread.frames[0]


def _keep_thread_object(threads: list[ThreadStack], line: str) -> None:
    """`self: <Thread at 0x..>` in threading.py's _bootstrap (the thread's own object) or
    join (the object of the thread it joins)."""
    found = _SELF.match(line)
    thread = threads[-1] if threads else None
    if not found or thread is None or not thread.frames:
        return
    frame = thread.frames[-1]
    if not frame.file.replace("\\", "/").endswith("/threading.py"):
        return
    if frame.function in ("_bootstrap", "_bootstrap_inner") and not thread.obj:
        thread.obj = found.group("addr")
    elif frame.function == "join":
        thread.joins = found.group("addr")


@dataclass
class Lock:
    key: str                  # where the lock is made, "relpath:name" (the payload's identity);
    #                           relpath:expression for one it could not follow
    holders: list[dict]       # [{thread, where, inside, compile, died}]: inside = its innermost
    #                           frame; died = "Exception: message" of a thread that died
    waiters: list[dict]       # [{thread, where, compile}]; compile: compile_parts of its stack
    name: str = ""            # its short name (compile_lock)
    kind: str = ""            # Lock, RLock, Condition, ... ("" when not known)

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
    un-released acquire() calls (the payload's `with` per frame), each lock once by the
    object it is (the payload's lock identity: one RLock imported under two names is one),
    and only what is a lock: a context manager on the same `with` line is none. `dead`: the
    tracebacks of threads that died (the run's log): a lock one of them held is held by a
    dead thread."""
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
                identity = lock_identity(block, relpath)
                if identity is None:
                    continue
                key, name, kind = identity
                lock = locks.setdefault(key, Lock(key, [], [], name=name, kind=kind))
                where = f"{posixpath.basename(frame.file)}:{block['line']}"
                if block["entering"] and frame is innermost:
                    lock.waiters.append({"thread": thread.label, "where": where,
                                         "compile": thread.compile})
                elif not block["entering"]:
                    lock.holders.append({"thread": thread.label, "where": where, "inside": inside,
                                         "compile": thread.compile, "died": death,
                                         "how": block.get("how", "with")})
    for lock in locks.values():
        _not_held_by_its_waiters(lock)
        _reentered(lock)
    return [lock for lock in locks.values() if lock.waiters]


def lock_identity(block: dict, relpath: str) -> Optional[tuple[str, str, str]]:
    """(key, name, kind) of the lock a `with` item names, or None when it names none. The
    payload resolved it: a lock's key is where it is made; an expression it could not
    follow (a function's argument) counts only when its name says lock; anything else (a
    call's result, an object made by another call) is no lock. Facts of an older payload,
    with no resolution, are taken by spelling as before."""
    found = block.get("lock")
    if found:
        return found["id"], found.get("name") or found["id"], found.get("kind") or ""
    if block.get("not_lock"):
        return None
    expr = str(block.get("expr") or "")
    if "unresolved" in block and not _LOCKISH.search(expr):
        return None
    return f"{relpath}:{expr}", expr.rsplit(".", 1)[-1], ""


def _not_held_by_its_waiters(lock: Lock) -> None:
    """An acquire() earlier in a function is read as holding its lock, though it may sit in a
    branch that never ran (`if k == me: lock.acquire()`); a thread that waits for the lock
    shows it does not hold it that way. A `with` body it stands in is certain."""
    waiting = {w["thread"] for w in lock.waiters}
    lock.holders = [h for h in lock.holders if not (h.get("how") == "acquire" and h["thread"] in waiting)]


def _reentered(lock: Lock) -> None:
    """A thread that holds an RLock (or a Condition, an RLock by default) and enters it again
    does not wait: it takes it again. A plain Lock entered twice by one thread waits on
    itself, and stays a waiter."""
    if lock.kind not in ("RLock", "Condition"):
        return
    holding = {h["thread"] for h in lock.holders if not h.get("died")}
    lock.waiters = [w for w in lock.waiters if w["thread"] not in holding]


# ------------------------------------------------------------------ waits without a lock
@dataclass
class Wait:
    """One edge of the wait graph: THREAD waits for WAITS_FOR (a thread's label, or PEERS)."""
    thread: str
    waits_for: str
    how: str                  # lock | autograd | join | collective
    words: str                # "waits for compile_lock (compile_fx.py:2418)"
    lock: str = ""            # a lock's key (how == lock)
    held_where: str = ""      # where WAITS_FOR entered that lock


def native_waits(threads: list[ThreadStack]) -> list[Wait]:
    """Waits the stacks show without a `with`: inside autograd's engine, a thread whose
    backward has CUDA work waits for the engine's device threads (C++ threads named
    pt_autograd_N, one per CUDA device; on CPU backward runs on the calling thread and
    there is none); a Thread.join waits for the thread it joins (by the Thread object's
    address, pystack --locals); a c10d collective waits for the peer ranks."""
    found: list[Wait] = []
    by_object = {t.obj: t for t in threads if t.obj}
    devices = [t for t in threads if _DEVICE_THREAD.fullmatch(t.name or "")]
    for thread in threads:
        if not thread.frames:
            continue
        innermost = thread.frames[-1]
        where = f"{posixpath.basename(innermost.file)}:{innermost.line}"
        if _in_autograd_engine(innermost):
            found += [Wait(thread.label, d.label, "autograd",
                           f"waits in the autograd engine for {d.name} ({where})")
                      for d in devices if d is not thread]
        joined = by_object.get(thread.joins) if thread.joins else None
        if joined is not None and joined is not thread:
            found.append(Wait(thread.label, joined.label, "join",
                              f"waits in Thread.join for {joined.label} ({_caller_of_join(thread)})"))
        collective = _collective(thread)
        if collective:
            found.append(Wait(thread.label, PEERS, "collective",
                              f"waits in the c10d collective {collective} for the peer ranks"))
    return found


def _in_autograd_engine(frame: tracebacks.Frame) -> bool:
    return (frame.function in _ENGINE_FUNCTIONS
            or "_execution_engine.run_backward" in frame.code)


def _caller_of_join(thread: ThreadStack) -> str:
    """Where the run's own code called join(): the frame just outside threading.py."""
    for frame in reversed(thread.frames):
        if not frame.file.endswith("/threading.py"):
            return f"{posixpath.basename(frame.file)}:{frame.line}"
    return "?"


def _collective(thread: ThreadStack) -> str:
    """The c10d function (all_reduce, barrier, ...) a thread's innermost frames stand in."""
    for frame in thread.frames[-3:]:
        if frame.file.replace("\\", "/").endswith("torch/distributed/distributed_c10d.py"):
            return f"{frame.function} (distributed_c10d.py:{frame.line})"
    return ""


def lock_waits(locks: list[Lock]) -> list[Wait]:
    """Each waiter of a lock waits for each live thread holding it."""
    found = []
    for lock in locks:
        for waiter in lock.waiters:
            for holder in lock.holders:
                if holder.get("died"):
                    continue
                found.append(Wait(waiter["thread"], holder["thread"], "lock",
                                  f"waits for {lock.name} ({waiter['where']})", lock.key,
                                  holder["where"]))
    return found


# ------------------------------------------------------------------ cycles
def cycles(waits: list[Wait]) -> list[list[Wait]]:
    """The deadlocks: one cycle of each strongly connected part of the wait graph that has
    one (Tarjan's algorithm; a thread waiting on a plain Lock it holds is a cycle of one)."""
    graph: dict[str, list[Wait]] = {}
    for wait in waits:
        graph.setdefault(wait.thread, []).append(wait)
        graph.setdefault(wait.waits_for, [])
    found = []
    order = {node: n for n, node in enumerate(graph)}     # a cycle starts at its first thread
    for part in strongly_connected(graph):
        members = set(part)
        if len(part) > 1 or any(w.waits_for == part[0] for w in graph[part[0]]):
            cycle = _cycle_in(graph, members, min(part, key=order.__getitem__))
            if cycle:
                found.append(_from_a_holder(cycle))
    return found


def _from_a_holder(cycle: list[Wait]) -> list[Wait]:
    """The cycle told from the first thread that holds a lock another in it waits for: "A
    holds L, waits for ...; B waits for L" reads as it happened."""
    for n in range(len(cycle)):
        if cycle[n - 1].how == "lock":
            return cycle[n:] + cycle[:n]
    return cycle


def strongly_connected(graph: dict[str, list[Wait]]) -> list[list[str]]:
    """The wait graph's strongly connected parts (ground/graphs.py: Tarjan's, iterative)."""
    return graphs.strongly_connected(
        {thread: [wait.waits_for for wait in waits] for thread, waits in graph.items()})


def _cycle_in(graph: dict[str, list[Wait]], members: set[str], start: str) -> list[Wait]:
    """A shortest cycle through START inside one strongly connected part (breadth first)."""
    paths: dict[str, list[Wait]] = {start: []}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for wait in graph[node]:
            if wait.waits_for == start:
                return paths[node] + [wait]
            if wait.waits_for in members and wait.waits_for not in paths:
                paths[wait.waits_for] = paths[node] + [wait]
                queue.append(wait.waits_for)
    return []


def cycle_line(cycle: list[Wait]) -> str:
    """DEADLOCK: A -> B -> A"""
    return "DEADLOCK: " + " -> ".join([w.thread for w in cycle] + [cycle[0].thread])


def cycle_words(cycle: list[Wait]) -> str:
    """Who holds what and waits for whom, around the cycle: "A holds compile_lock
    (convert_frame.py:2314), waits in the autograd engine for pt_autograd_0; B waits for
    compile_lock (compile_fx.py:2418)"."""
    parts = []
    for n, wait in enumerate(cycle):
        before = cycle[n - 1]      # the wait that ends at this thread
        holds = (f" holds {_short(before.lock)} ({before.held_where}),"
                 if before.how == "lock" and before.waits_for == wait.thread else "")
        parts.append(f"{wait.thread}{holds} {wait.words}")
    return "; ".join(parts)


def _short(key: str) -> str:
    return key.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def remedy(cycle: list[Wait]) -> Optional[dict]:
    """What breaks a cycle orch knows: a compile lock held across the autograd engine's wait
    for its device thread, which compiles another thread's backward and wants that lock.
    Backward on the calling thread (set_multithreading_enabled is thread-local) leaves the
    device thread out of it."""
    hows = {w.how for w in cycle}
    if "autograd" not in hows or "lock" not in hows:
        return None
    return {"summary": "run each thread's backward on the thread itself: the autograd device thread "
                       "then never waits for a lock a thread holds while it waits for it",
            "lines": ["import torch",
                      "torch.autograd.set_multithreading_enabled(False)   # first, in each thread's "
                      "function (thread-local: that thread only)"],
            "switch": "the stand-in trainer: --backward-in-thread (the DFlash playbooks' "
                      "backward_in_thread var, on by default); the compiles then overlap, so the FX "
                      "state threads share must be thread-local too: orch patch fx-threads apply "
                      "(on an H200 an unpatched torch then raised the FX race)"}


def hang_words(taken: Optional[dict]) -> tuple[str, str]:
    """What the stacks taken of a hung run add to its finding: (". DEADLOCK: A -> B -> A:
    who holds and waits for what", the remedy for that cycle with the lines the run's own
    code needs, or ""); without a cycle, who waits on whom; ("", "") without stacks."""
    if not taken:
        return "", ""
    if taken.get("error") and not taken.get("results"):
        return f"; its stacks could not be taken: {taken['error']}", ""
    results = taken.get("results") or []
    for result in results:
        for cycle in result.get("cycles") or []:
            where = _process_words(result, len(results))
            fix = cycle.get("remedy")
            remedy_text = (f"{fix['summary']}: {fix['switch']}; in the run's own code, "
                           + " then ".join(f"`{line.split('#')[0].strip()}`" for line in fix["lines"])
                           + " at the start of each thread's function") if fix else ""
            return f". {cycle['line']}{where}: {cycle['words']}", remedy_text
    for result in results:
        for lock in result.get("locks") or []:
            return f". The stacks{_process_words(result, len(results))}: {lock['sentence']}", ""
    return "", ""


def _process_words(result: dict, count: int) -> str:
    if count < 2 and result.get("rank") is None:
        return ""
    return f" (pid {result.get('pid')}" + (f", rank {result['rank']}" if result.get("rank") is not None else "") + ")"


def analyse(threads: list[ThreadStack], facts: dict,
            dead: list[tracebacks.Traceback] = ()) -> tuple[list[Lock], list[Wait], list[list[Wait]]]:
    """The locks, every wait (a lock's, the native ones) and the cycles among them."""
    locks = wait_graph(threads, facts, dead)
    waits = lock_waits(locks) + native_waits(threads)
    return locks, waits, cycles(waits)


def stack_frames(threads: list[ThreadStack], dead: list[tracebacks.Traceback] = ()) -> list[dict]:
    """Each distinct frame once, for the explain_frames payload."""
    seen: dict[tuple, dict] = {}
    for thread in list(threads) + [ThreadStack(0, tb.worker, tb.frames) for tb in dead]:
        for frame in thread.frames:
            seen.setdefault((frame.file, frame.line), {"file": frame.file, "line": frame.line,
                                                       "function": frame.function,
                                                       "innermost": False})
    return list(seen.values())
