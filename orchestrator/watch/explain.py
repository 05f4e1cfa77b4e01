"""`orch explain`: from a failed run's log to the shared state behind its error.

1. The tracebacks of every worker, out of the run's logs (tracebacks.py), grouped: the same
   exception at the same raising frame in several workers is one failure.
2. Their frames, read in the target with its python (payloads/explain_frames.py): the source
   around each line, the installed version, whether the file is still the wheel's (RECORD),
   and the process-wide mutable state the frames' functions read, directly or through the
   checks they call.
3. The candidates ranked here, each with its evidence (`rank`).
4. Only then the remedy (`remedies`): the patch orch has when its thread-safety patch set
   covers that state (the fx_patch payload's own rows say which, and whether it is already
   applied), else the generic options. No table of known tracebacks: what is found is found
   by the analysis.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import asdict, dataclass, field
from typing import Optional

from orchestrator.ground import paths
from orchestrator.ground.errors import OrchError
from orchestrator.remote import payload_api
from orchestrator.remote.container import Target
from orchestrator.runs.model import RunRecord
from orchestrator.watch import tracebacks
from orchestrator.watch.torchrun import RANK_LOG_DIR

MAX_LOG_BYTES = 16 << 20      # the end of each log is read (where the errors are)
MAX_RANK_LOGS = 64
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
STDLIB = "(standard library)"  # the payload's package name for the standard library's files


@dataclass
class LogText:
    source: str               # where it came from: "TARGET:/path" or a local path
    text: str
    worker: str = ""          # whose log it is, when the file says (a rank's own log)


@dataclass
class FrameFacts:
    file: str
    line: int
    function: str
    qualname: str = ""
    code: str = ""
    available: bool = False
    reason: str = ""          # why there is no source, when there is none
    package: Optional[str] = None
    version: Optional[str] = None
    record: Optional[str] = None   # ok | mismatch (patched/drifted) | not-listed | None
    relpath: str = ""
    source: list[dict] = field(default_factory=list)   # [{line, text}]


@dataclass
class Failure:
    exception: str
    message: str
    workers: list[str]
    count: int
    frames: list[FrameFacts]
    dropped_frames: int = 0
    causes: list[str] = field(default_factory=list)    # "Type: message" of chained exceptions
    log: str = ""


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


@dataclass
class Explanation:
    target: str
    logs: list[dict]          # [{source, bytes, tracebacks}]
    failures: list[Failure]
    candidates: list[Candidate]
    remedies: list[Remedy]
    python: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ the logs of a run
def run_logs(record: RunRecord, target: Target) -> list[LogText]:
    """The logs of every launch of RECORD on TARGET, read from the target (each launch's
    output.log and its ranks' logs); the collected copy in the run's folder when the target
    has none left."""
    logs: list[LogText] = []
    launches = [step.data for step in record.steps
                if step.kind == "launch" and step.target == target.name and step.data.get("run_dir")]
    if not launches:   # a record whose launch step never ended (attach's case): the launch entry
        entry = ((record.launch or {}).get("targets") or {}).get(target.name) or {}
        launches = [entry] if entry.get("run_dir") else []
    for launch in launches:
        logs += _remote_logs(target, launch["run_dir"], bool(launch.get("ranks")))
    if not logs:
        local = os.path.join(paths.run_dir(record.run_id), target.name, "output.log")
        if os.path.isfile(local):
            logs.append(LogText(local, _read_local(local)))
    return logs


def _remote_logs(target: Target, run_dir: str, ranks: bool) -> list[LogText]:
    files = [posixpath.join(run_dir, "output.log")]
    if ranks:
        found = target.run(["find", posixpath.join(run_dir, RANK_LOG_DIR), "-type", "f",
                            "(", "-name", "*.log", "-o", "-name", "error.json", ")"], timeout=60)
        if found.ok:
            files += sorted(line for line in found.text.splitlines() if line.strip())[:MAX_RANK_LOGS]
    out = []
    for path in files:
        result = target.run(["tail", "-c", str(MAX_LOG_BYTES), "--", path], timeout=120)
        if not result.ok:
            continue
        text = result.stdout.decode("utf-8", "replace")
        if path.endswith(".json"):
            text = error_file_traceback(text)
        out.append(LogText(f"{target.name}:{path}", text, rank_of(path)))
    return out


def rank_of(path: str) -> str:
    """A rank's own files (RUN_DIR/ranks/<id>/attempt_<n>/<local rank>/...) carry no
    [rankN]: prefix: the folder says whose they are."""
    parts = path.split("/")
    if RANK_LOG_DIR in parts and len(parts) >= 2 and parts[-2].isdigit():
        return f"rank {int(parts[-2])}"
    return ""


def error_file_traceback(text: str) -> str:
    """The traceback a torchrun error file (torch.distributed.elastic's @record) holds:
    {"message": {"message": ..., "extraInfo": {"py_callstack": "Traceback ..."}}}."""
    try:
        data = json.loads(text)
    except ValueError:
        return ""
    message = data.get("message") if isinstance(data, dict) else None
    info = message.get("extraInfo") if isinstance(message, dict) else None
    stack = info.get("py_callstack") if isinstance(info, dict) else None
    return stack if isinstance(stack, str) else ""


def _read_local(path: str) -> str:
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(0, size - MAX_LOG_BYTES))
        return handle.read().decode("utf-8", "replace")


def read_log_file(path: str) -> LogText:
    """A log from elsewhere (`--log FILE`): a clear error when it cannot be read."""
    try:
        return LogText(path, _read_local(path))
    except OSError as error:
        raise OrchError(f"cannot read the log {path}: {error.strerror or error}") from None


# ------------------------------------------------------------------ the whole explanation
def explain(target: Target, logs: list[LogText], *, context: int = 3, roots: Optional[list] = None,
            look_up_patches: bool = True) -> Explanation:
    """roots: the folders of the run's own files (None: those of the log's scripts)."""
    parsed, summaries = [], []
    for log in logs:
        result = tracebacks.parse(log.text, source=log.source, worker=log.worker)
        parsed += result.tracebacks
        summaries.append({"source": log.source, "bytes": len(log.text),
                          "tracebacks": len(result.tracebacks), "dropped": result.dropped})
    groups = tracebacks.group(parsed)
    explanation = Explanation(target.name, summaries, [], [], [])
    if not groups:
        explanation.notes.append("no Python traceback in the log(s)")
        return explanation
    # The folders whose files the payload may read besides the installed packages: the
    # run's own (the caller's roots), else, for a log given by hand, its scripts' folders.
    facts = payload_api.explain_frames(target, frame_requests(groups),
                                       roots=script_roots(groups) if roots is None else list(roots),
                                       context=context)
    explanation.python = str(facts.get("python") or "")
    explanation.failures = [failure(g, facts) for g in groups]
    explanation.candidates = rank(groups, facts)
    rows = patch_rows(target, explanation.candidates) if look_up_patches else None
    explanation.remedies = remedies(explanation.candidates, target, rows, explanation.failures)
    explanation.notes += applied_notes(explanation.candidates, explanation.failures, rows or [], target)
    return explanation


def frame_requests(groups: list[tracebacks.Group]) -> list[dict]:
    """Each distinct frame once; `innermost` for the frame that raised."""
    seen: dict[tuple, dict] = {}
    for g in groups:
        frames = g.traceback.frames
        for index, frame in enumerate(frames):
            key = (frame.file, frame.line)
            entry = seen.setdefault(key, {"file": frame.file, "line": frame.line,
                                          "function": frame.function, "innermost": False})
            entry["innermost"] = entry["innermost"] or index == len(frames) - 1
    return list(seen.values())


def script_roots(groups: list[tracebacks.Group]) -> list[str]:
    """The folders of the run's own scripts (frames outside any site-packages), so the
    trainer's frames show their source too."""
    roots = []
    for g in groups:
        for frame in g.traceback.frames:
            if frame.file.endswith(".py") and frame.file.startswith("/") \
                    and "-packages/" not in frame.file and "/lib/python" not in frame.file:
                folder = posixpath.dirname(frame.file)
                if folder != "/" and folder not in roots:
                    roots.append(folder)
    return roots[:16]


def _facts_by_frame(facts: dict) -> dict[tuple, dict]:
    return {(f.get("file"), f.get("line")): f for f in facts.get("frames", [])}


def failure(g: tracebacks.Group, facts: dict) -> Failure:
    by_frame, files = _facts_by_frame(facts), facts.get("files", {})
    frames = []
    for frame in g.traceback.frames:
        seen = by_frame.get((frame.file, frame.line), {})
        info = files.get(frame.file, {})
        ok = info.get("status") == "ok" and bool(seen.get("source"))
        frames.append(FrameFacts(
            file=frame.file, line=frame.line, function=frame.function,
            qualname=seen.get("qualname", ""), code=frame.code, available=ok,
            reason="" if ok else (info.get("reason") or seen.get("note") or "source not available"),
            package=info.get("package"), version=info.get("version"), record=info.get("record"),
            relpath=info.get("relpath", ""), source=seen.get("source", []) if ok else []))
    tb = g.traceback
    return Failure(tb.exception, tb.message, sorted(g.workers, key=_natural), g.count, frames,
                   tb.dropped_frames,
                   [f"{c.exception}: {c.message}" for c in tb.causes], tb.source)


# ------------------------------------------------------------------ ranking
def rank(groups: list[tracebacks.Group], facts: dict) -> list[Candidate]:
    """Every mutable state the failing frames' modules hold, scored by the evidence."""
    by_frame, modules = _facts_by_frame(facts), facts.get("modules", {})
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
                     score=0, evidence=[], package=package)


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


def _natural(name: str) -> tuple:
    """drafter-2 before drafter-10."""
    head = name.rstrip("0123456789")
    return (head, int(name[len(head):]) if name[len(head):] else -1)


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
             failures: list[Failure]) -> list[Remedy]:
    """For each leading candidate (the best score, and any as good): orch's patch when the
    patch set covers that state, else the generic options."""
    leading = [c for c in candidates if c.score > 0 and not c.thread_local]
    if not leading:
        return []
    best = leading[0].score
    out = []
    for c in [c for c in leading if c.score == best][:3]:
        row = _covering_row(c, rows or [])
        out.append(_patch_remedy(c, row, target) if row else _generic_remedy(c, target, failures))
    return out


def applied_notes(candidates: list[Candidate], failures: list[Failure], rows: list[dict],
                  target: Target) -> list[str]:
    """A log older than orch's patch: the patch set's states are thread-local on the target
    now (patched, or upstream) in a file the failing frames pass or read through a check."""
    notes = []
    frame_files = {f.relpath for failure in failures for f in failure.frames}
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


def _generic_remedy(c: Candidate, target: Target, failures: list[Failure]) -> Remedy:
    writers = sorted({w["function"] for w in c.writes})
    entry = _own_entry(failures)
    options = [f"make {c.name} thread-local: keep it in a threading.local() (or a ContextVar) "
               f"where it is defined ({c.defined}), so that {_list(writers) or 'its writers'} "
               "change only their own thread's copy",
               "serialise the callers' first step under one lock"
               + (f" (around {entry} in the run's own code)" if entry else "")
               + ": the first call that fills or flips the state runs in one thread at a time",
               f"look for a configuration switch of {c.package or c.module} that avoids the path "
               f"through {_list(sorted({r['function'] for r in c.read_by})) or c.module}"]
    return Remedy(c.ref, "generic", f"orch has no patch for {c.ref}; options:",
                  [f"orch explain last  # after relaunching: no traceback left"], options)


def _own_entry(failures: list[Failure]) -> str:
    """The innermost frame of the run's own code (no package) that every failure passes."""
    for f in failures:
        own = [fr for fr in f.frames if fr.available and fr.package is None]
        if own:
            last = own[-1]
            return f"{last.qualname or last.function} ({posixpath.basename(last.file)}:{last.line})"
    return ""


# ------------------------------------------------------------------ a recorded run
def launched_targets(record: RunRecord) -> list[str]:
    """The targets a run launched something on, in the order it did."""
    names = []
    for step in record.steps:
        if step.kind == "launch" and step.data.get("run_dir") and step.target not in names:
            names.append(step.target)
    for name in ((record.launch or {}).get("targets") or {}):
        if name not in names:
            names.append(name)
    return names


def explain_record(record: RunRecord, targets: list[Target], **options) -> list[Explanation]:
    """Each target's explanation of a recorded run (targets: those it launched on)."""
    out = []
    for target in targets:
        logs = run_logs(record, target)
        if not logs:
            empty = Explanation(target.name, [], [], [], [])
            empty.notes.append(f"no log of run {record.run_id} on {target.name}: neither its launch "
                               "folder there nor a collected output.log here")
            out.append(empty)
            continue
        out.append(explain(target, logs, roots=own_roots(record, target.name), **options))
    return out


def own_roots(record: RunRecord, target: str) -> list[str]:
    """The run's own folders on TARGET: each launch's run folder and working directory, and
    the folders of the .py files its command names (the trainer). Only these, not any
    folder a log names: the log is the trainer's text, and may say anything."""
    roots: list[str] = []
    for step in record.steps:
        if step.kind != "launch" or step.target != target:
            continue
        data = step.data
        folders = [data.get("run_dir"), data.get("cwd")]
        folders += [posixpath.dirname(a) for a in data.get("argv") or []
                    if isinstance(a, str) and a.endswith(".py") and a.startswith("/")]
        roots += [f for f in folders if isinstance(f, str) and f.startswith("/") and f != "/"
                  and f not in roots]
    return roots
