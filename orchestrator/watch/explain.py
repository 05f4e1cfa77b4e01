"""`orch explain`: from a failed run's log to the shared state behind its error (the ranking
and the remedies are suspects.py).

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
from typing import Callable, Optional

from orchestrator.ground import paths
from orchestrator.ground.errors import BadArgument, OrchError
from orchestrator.remote import payload_api
from orchestrator.remote.container import Target
from orchestrator.runs.model import RunRecord
from orchestrator.watch import stacks, tracebacks
from orchestrator.watch.stacktool import stack_command
from orchestrator.watch.suspects import (Candidate, Remedy, applied_notes, facts_by_frame, patch_rows,
                                         rank, remedies)
from orchestrator.watch.torchrun import RANK_LOG_DIR

MAX_LOG_BYTES = 16 << 20      # the end of each log is read (where the errors are)
MAX_RANK_LOGS = 64


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
        try:   # inside the run's folder by real path: a log swapped for a link is not read
            found = payload_api.file_read(target, path, [run_dir], length=MAX_LOG_BYTES,
                                          timeout=120, tail=True)
        except OrchError:
            continue
        text = found["data"].decode("utf-8", "replace")
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
    explanation.remedies = remedies(explanation.candidates, target, rows, own_entry(explanation.failures))
    frame_files = {f.relpath for failure in explanation.failures for f in failure.frames}
    explanation.notes += applied_notes(explanation.candidates, frame_files, rows or [], target)
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
    """The folders of the log's own scripts (frames outside any site-packages), so that a
    log given by hand shows the trainer's frames too."""
    return _own_folders(frame.file for g in groups for frame in g.traceback.frames)


def _own_folders(files) -> list[str]:
    roots: list[str] = []
    for file in files:
        if file.endswith(".py") and file.startswith("/") and "-packages/" not in file \
                and "/lib/python" not in file:
            folder = posixpath.dirname(file)
            if folder != "/" and folder not in roots:
                roots.append(folder)
    return roots[:16]


def own_entry(failures: list[Failure]) -> str:
    """The innermost frame of the run's own code (no package) that every failure passes."""
    for f in failures:
        own = [fr for fr in f.frames if fr.available and fr.package is None]
        if own:
            last = own[-1]
            return f"{last.qualname or last.function} ({posixpath.basename(last.file)}:{last.line})"
    return ""


def _natural(name: str) -> tuple:
    """drafter-2 before drafter-10."""
    head = name.rstrip("0123456789")
    return (head, int(name[len(head):]) if name[len(head):] else -1)


def failure(g: tracebacks.Group, facts: dict) -> Failure:
    by_frame, files = facts_by_frame(facts), facts.get("files", {})
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


# ------------------------------------------------------------------ a hung run
@dataclass
class Stacks:
    target: str
    pid: int
    threads: list[dict]       # [{tid, name, label, compile, frames: [{file, line, function, code}]}]
    locks: list[dict]         # [{key, holders, waiters, sentence}]
    tool: str = ""
    rank: Optional[int] = None        # under torchrun: the worker's RANK (and its launcher)
    world_size: Optional[int] = None
    launcher_pid: Optional[int] = None


def stacks_of(target: Target, pid: int, logs: Optional[list[LogText]] = None,
              rank: Optional[int] = None, wheelhouse: Optional[str] = None,
              progress: Callable[[str], None] = lambda line: None) -> list[Stacks]:
    """PID's stacks; when PID is torchrun (its rank workers below it, payloads/rank_procs.py),
    each rank worker's instead, or only RANK's."""
    found = payload_api.rank_processes(target, pid)
    if not found.get("alive"):
        raise OrchError(f"{target.name}: process {pid} is not running (the run has ended?)",
                        hint="`orch runs show RUN` shows the run's state; `orch explain RUN` reads a dead run's logs")
    workers = found.get("ranks") or []
    if rank is not None:
        workers = [w for w in workers if w["rank"] == rank]
        if not workers:
            ranks = ", ".join(str(w["rank"]) for w in found.get("ranks") or []) or "none: it is no torchrun"
            raise BadArgument(f"{target.name}: process {pid} has no rank {rank} below it (its ranks: {ranks})")
    tool = stack_command(target, wheelhouse, progress)
    if not workers:
        return [take_stacks(target, pid, logs, tool=tool)]
    return [take_stacks(target, w["pid"], logs, tool=tool, worker=w, launcher_pid=pid) for w in workers]


def take_stacks(target: Target, pid: int, logs: Optional[list[LogText]] = None, *,
                tool: tuple[list[str], str], worker: Optional[dict] = None,
                launcher_pid: Optional[int] = None) -> Stacks:
    """Every thread's stack of process PID in TARGET, and who waits on whom; with the run's
    logs, the threads that died too (their tracebacks), as holders of what they left locked
    (a rank WORKER's: those of its own rank's log only). TOOL: stack_command's answer."""
    command, words = tool
    result = target.run([*command, "remote", str(int(pid))], timeout=120)
    if not result.ok:
        raise OrchError(f"{target.name}: {words}: remote {pid} failed: "
                        f"{' '.join(result.stderr_tail(2))}",
                        hint="it reads the process with ptrace: run as root (or with CAP_SYS_PTRACE) "
                             "in the process's own container, and the process must still be alive")
    threads = stacks.thread_names(stacks.parse_pystack(result.stdout.decode("utf-8", "replace")), pid)
    dead = [tb for log in logs or [] for tb in tracebacks.parse(log.text, log.source, log.worker).tracebacks]
    if worker is not None:
        # a rank's own log folder is its local rank's; torchrun's [rankN]: prefixes the same
        dead = [tb for tb in dead if tb.worker == f"rank {worker.get('local_rank')}"]
    frames = stacks.stack_frames(threads, dead)
    # the files the process runs itself may be read: they are on its own stacks
    roots = _own_folders(f["file"] for f in frames)
    facts = payload_api.explain_frames(target, frames, roots=roots, context=0) if threads else {}
    locks = stacks.wait_graph(threads, facts, dead)
    return Stacks(target.name, int(pid),
                  [{"tid": t.tid, "name": t.name, "label": t.label, "compile": t.compile,
                    "frames": [asdict(f) for f in t.frames]} for t in threads],
                  [dict(asdict(lock), sentence=lock.sentence()) for lock in locks], words,
                  rank=(worker or {}).get("rank"), world_size=(worker or {}).get("world_size"),
                  launcher_pid=launcher_pid)


def launched_pid(record: RunRecord, target: str) -> int:
    """The process the run's last launch on TARGET started."""
    for step in reversed(record.steps):
        if step.kind == "launch" and step.target == target and step.data.get("pid"):
            return int(step.data["pid"])
    entry = ((record.launch or {}).get("targets") or {}).get(target) or {}
    if entry.get("pid"):
        return int(entry["pid"])
    raise OrchError(f"run {record.run_id} has no launched process on {target}")
