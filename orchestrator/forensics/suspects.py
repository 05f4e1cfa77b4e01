"""The suspects of `orch explain`: the process-wide mutable state the failing frames read,
ranked by the evidence (each candidate says why), and the remedy for the leading ones, looked
up only after the ranking: orch's patch when the thread-safety patch set covers that state
(the fx_patch payload's own rows say which, with each state's file and names, and whether it
is already in), else the generic options. Nothing here knows a traceback by heart.

The facts come from the explain_frames payload (its result dict); the failures from
watch/tracebacks.py.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.ground.errors import OrchError
from orchestrator.remote import payload_api
from orchestrator.remote.container import Target
from orchestrator.watch import tracebacks
from orchestrator.watch.stacks import STDLIB

MAX_CANDIDATES = 40
PATCH_SET = "fx-threads"

# Evidence weights: the order the careful engineer would look in.
READ_IN_FRAME = 3             # the raising frame's own function reads it
READ_ON_STACK = 2             # an outer failing frame's function reads it
READ_BY_CHECK = 3             # a check the raising frame calls reads it
IN_FRAME_MODULE = 1           # only lives in a failing frame's module
WRITER_ON_STACK = 2           # its writer (or a closure of it) runs on a failing stack
SEVERAL_WORKERS = 1           # several workers fail in a function that reads it
THREAD_LOCAL = -5             # already per thread: shown, ranked last
STANDARD_LIBRARY = -2         # the interpreter's own machinery (threading's registries) sits
                              # on every thread's stack: seldom the cause, kept below
# Confidence: high when it is read where the error was raised (the raising frame, or a check
# it makes) and written on a failing stack (the race's two sides); medium with one of them;
# low otherwise (an outer frame reads it, or it only lives in a failing frame's module).
# Remedies go only to confident candidates: high and medium when the failure's words match a
# known race on shared state, high alone otherwise (threads ran, nothing more is known).
CONFIDENT = ("high", "medium")


@dataclass
class Candidate:
    module: str
    name: str
    kind: str                 # global | container | class attribute | thread-local
    defined: str              # relpath:line
    relpath: str
    thread_local: bool
    writes: list[dict]        # [{where, function, how}]
    read_by: list[dict]       # [{frame, function, workers, via}]
    score: int
    evidence: list[str]
    package: Optional[str] = None
    confidence: str = "low"   # high | medium | low (CONFIDENT)
    patched_since: bool = False   # read in the source that ran: orch's backup (its patch came later)

    @property
    def ref(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass
class Remedy:
    state: str                # module.name of the candidate it is for
    kind: str                 # patch | generic
    summary: str
    commands: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    patch_state: Optional[str] = None   # the patch set's row for that state (vulnerable, patched, ...)


def facts_by_frame(facts: dict) -> dict[tuple, dict]:
    return {(f.get("file"), f.get("line")): f for f in facts.get("frames", [])}


def rank(groups: list[tracebacks.Group], facts: dict) -> list[Candidate]:
    """Every mutable state the failing frames' modules hold, scored by the evidence."""
    by_frame, modules = facts_by_frame(facts), facts.get("modules", {})
    files = facts.get("files", {})
    stacks = _stacks(groups, by_frame, files)
    candidates: dict[tuple, Candidate] = {}
    frame_modules = {m for stack in stacks.values() for m, _, _ in stack}
    for module in frame_modules:
        report = modules.get(module) or {}
        for state in report.get("states", []):
            if state.get("writes") or state.get("thread_local"):
                candidates[(module, state["name"])] = _candidate(module, report, state, files)
    for g in groups:
        workers = g.workers or ["(unnamed)"]
        frames = g.traceback.frames
        for index, frame in enumerate(frames):
            seen = by_frame.get((frame.file, frame.line), {})
            for read in seen.get("reads", []):
                key = (read["module"], read["state"])
                if key not in candidates:
                    report = modules.get(read["module"]) or {}
                    state = next((s for s in report.get("states", []) if s["name"] == read["state"]), None)
                    if state is None:
                        continue
                    candidates[key] = _candidate(read["module"], report, state, files)
                _note_read(candidates[key], frame, seen, read, workers, index == len(frames) - 1)
    for candidate in candidates.values():
        _weigh(candidate, stacks, modules.get(candidate.module) or {}, groups)
    ordered = sorted(candidates.values(), key=lambda c: (-c.score, c.module, c.name))
    return ordered[:MAX_CANDIDATES]


def _stacks(groups, by_frame, files) -> dict[str, list[tuple]]:
    """worker -> [(module, qualname, frame)] of its failing stack."""
    stacks: dict[str, list[tuple]] = {}
    for g in groups:
        for worker in g.workers or ["(unnamed)"]:
            stack = stacks.setdefault(worker, [])
            for frame in g.traceback.frames:
                module = (files.get(frame.file) or {}).get("module")
                qualname = (by_frame.get((frame.file, frame.line)) or {}).get("qualname", "")
                if module:
                    stack.append((module, qualname, frame))
    return stacks


def _candidate(module: str, report: dict, state: dict, files: dict) -> Candidate:
    relpath = report.get("relpath", "")
    package = next((i.get("package") for i in files.values() if i.get("module") == module), None)
    writes = [{"where": f"{relpath}:{w['line']}", "function": w["function"], "how": w["how"],
               "text": w.get("text", "")} for w in state.get("writes", [])]
    return Candidate(module=module, name=state["name"], kind=state.get("kind", ""),
                     defined=f"{relpath}:{state.get('line', 0)}", relpath=relpath,
                     thread_local=bool(state.get("thread_local")), writes=writes, read_by=[],
                     score=0, evidence=[], package=package, patched_since=report.get("ran") == "backup")


def _note_read(candidate: Candidate, frame, seen: dict, read: dict, workers: list, innermost: bool):
    via = read.get("via")
    where = f"{frame.file}:{frame.line}"
    for entry in candidate.read_by:
        if entry["frame"] == where and entry["via"] == (via or {}).get("function"):
            entry["workers"] = sorted(set(entry["workers"]) | set(workers))
            return
    candidate.read_by.append({"frame": where, "function": seen.get("qualname") or frame.function,
                              "workers": sorted(workers), "via": (via or {}).get("function"),
                              # the checks in between: is_fx_symbolic_tracing -> _get_is_fx_tracing
                              "via_chain": (via or {}).get("chain", []) + ([via["function"]] if via else []),
                              "via_where": f"{via['relpath']}:{via['line']}" if via else None,
                              "via_source": (via or {}).get("source", []), "raising": innermost})


def _weigh(c: Candidate, stacks: dict, report: dict, groups) -> None:
    direct = [r for r in c.read_by if not r["via"]]
    checks = [r for r in c.read_by if r["via"]]
    if direct:
        c.score += READ_IN_FRAME if any(r["raising"] for r in direct) else READ_ON_STACK
        c.evidence.append("read in a failing frame's function: " + _list(
            f"{r['function']} ({_short(r['frame'])})" for r in direct))
    if checks:
        c.score += READ_BY_CHECK
        c.evidence.append("read by the check the failing frame makes: " + _list(
            f"{'() -> '.join(r['via_chain'])}() ({r['via_where']}), called in {r['function']} "
            f"({_short(r['frame'])})" for r in checks))
    if not c.read_by:
        c.score += IN_FRAME_MODULE
        c.evidence.append(f"in the module of a failing frame ({c.module})")
    writers = {w["function"] for w in c.writes}
    on_stack = sorted({worker for worker, stack in stacks.items() for module, qualname, _ in stack
                       if module == c.module and any(qualname == w or qualname.startswith(w + ".")
                                                     for w in writers)})
    if on_stack:
        c.score += WRITER_ON_STACK
        inside = sorted({qualname for stack in stacks.values() for module, qualname, _ in stack
                         if module == c.module and any(qualname == w or qualname.startswith(w + ".")
                                                       for w in writers)})
        readers = sorted({w for r in c.read_by for w in r["workers"]})
        others = [w for w in readers if w not in on_stack]
        c.evidence.append(f"its writer runs on the failing stacks of {_list(on_stack)} ({_list(inside)})"
                          + (f"; read on {_list(others)}'s" if others else ""))
    several = sorted({w for r in c.read_by for w in r["workers"]})
    if len(several) > 1:
        c.score += SEVERAL_WORKERS
        c.evidence.append(f"{len(several)} workers fail in functions that read it: {_list(several)}")
    if c.package == STDLIB:
        c.score += STANDARD_LIBRARY
        c.evidence.append("the standard library's own state (on every thread's stack)")
    if c.thread_local:
        c.score += THREAD_LOCAL
        c.evidence.append("already thread-local (threading.local / ContextVar)")
    elif c.writes:
        c.evidence.append(f"written at run time by {_list(sorted(writers))}, a process-global "
                          "(every thread sees the same one)")
    if c.writes and not on_stack and not c.thread_local:
        c.evidence.append("none of its writers is on a failing stack: nothing shows a write while "
                          "these frames read it")
    if c.patched_since:
        c.evidence.append(f"patched since: {c.relpath} is read as it ran (orch's backup); orch's "
                          "patch changed it after this run")
    where_raised = any(r["raising"] for r in c.read_by)
    c.confidence = ("low" if c.package == STDLIB else     # threading's registries: on every stack
                    "high" if where_raised and on_stack else
                    "medium" if where_raised or on_stack else "low")


def _short(where: str) -> str:
    file, _, line = where.rpartition(":")
    return f"{posixpath.basename(file)}:{line}"


def _list(items) -> str:
    items = list(items)
    return ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "")


# ------------------------------------------------------------------ remedies, after the analysis
def patch_rows(target: Target, candidates: list[Candidate]) -> Optional[list[dict]]:
    """The thread-safety patch set's rows for the target's torch, when a leading candidate
    is torch's; None when there is nothing to look up or the target has no torch."""
    if not any(c.package == "torch" and c.score > 0 for c in candidates):
        return None
    try:
        return payload_api.fx_patch(target, "status", PATCH_SET).get("states") or []
    except OrchError:
        return None


def remedies(candidates: list[Candidate], target: Target, rows: Optional[list[dict]],
             entry: str = "", confident: tuple = CONFIDENT) -> list[Remedy]:
    """For each leading candidate with enough evidence (CONFIDENT; the best score, and any as
    good): orch's patch when the patch set covers that state, else the generic options. A
    candidate that only lives in a failing frame's module gets none."""
    leading = [c for c in candidates if c.score > 0 and not c.thread_local and c.confidence in confident]
    if not leading:
        return []
    best = leading[0].score
    out = []
    for c in [c for c in leading if c.score == best][:3]:
        row = _covering_row(c, rows or [])
        out.append(_patch_remedy(c, row, target) if row else _generic_remedy(c, target, entry))
    return out


def applied_notes(candidates: list[Candidate], frame_files: set, rows: list[dict],
                  target: Target) -> list[str]:
    """A log older than orch's patch: the patch set's states are thread-local on the target
    now (patched, or upstream) in a file the failing frames pass or read through a check."""
    notes = []
    by_path: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("status") in ("patched", "upstream") and row.get("path"):
            by_path.setdefault(row["path"], []).append(row)
    for path, applied in by_path.items():
        holders = sorted({c.name for c in candidates if c.thread_local and c.read_by
                          and c.relpath == path})
        if not holders and path not in frame_files:
            continue
        how = sorted({"patched by orch" if r["status"] == "patched" else "upstream" for r in applied})
        notes.append(f"{', '.join(str(r.get('title')) for r in applied)} ({path}): thread-local on "
                     f"{target.name} now ({', '.join(how)})"
                     + (f"; the failing frames' checks read {', '.join(holders)}, thread-local"
                        if holders else "")
                     + f"; this log predates that: relaunch, and `orch verify {PATCH_SET} "
                       f"-t {target.name}` proves it")
    return notes


def _covering_row(c: Candidate, rows: list[dict]) -> Optional[dict]:
    for row in rows:
        if row.get("path") == c.relpath and c.name in (row.get("names") or []):
            return row
    return None


def _patch_remedy(c: Candidate, row: dict, target: Target) -> Remedy:
    status = row.get("status")
    t = f" -t {target.name}"
    commands = [f"orch patch {PATCH_SET} apply{t}", f"orch verify {PATCH_SET}{t}"]
    if status in ("patched", "upstream"):
        summary = (f"{c.ref} is one of the states orch's {PATCH_SET} patch set covers "
                   f"({row.get('title')}); "
                   f"on {target.name} it is thread-local now ({status}): this log predates that, "
                   "relaunch the run")
        commands = [f"orch patch {PATCH_SET} status{t}", f"orch verify {PATCH_SET}{t}"]
    else:
        summary = (f"{c.ref} is one of the states orch's {PATCH_SET} patch set makes "
                   f"thread-local ({row.get('title')}; {status} on {target.name})")
    return Remedy(c.ref, "patch", summary, commands, [], status)


def _generic_remedy(c: Candidate, target: Target, entry: str) -> Remedy:
    """entry: the run's own innermost frame, where a lock would go."""
    writers = sorted({w["function"] for w in c.writes})
    options = [f"make {c.name} thread-local: keep it in a threading.local() (or a ContextVar) "
               f"where it is defined ({c.defined}), so that {_list(writers) or 'its writers'} "
               "change only their own thread's copy",
               "serialise the callers' first step under one lock"
               + (f" (around {entry} in the run's own code)" if entry else "")
               + ": the first call that fills or flips the state runs in one thread at a time",
               f"look for a configuration switch of {c.package or c.module} that avoids the path "
               f"through {_list(sorted({r['function'] for r in c.read_by})) or c.module}"]
    return Remedy(c.ref, "generic", f"orch has no patch for {c.ref}; options:",
                  ["orch explain last  # after relaunching: no traceback left"], options)
