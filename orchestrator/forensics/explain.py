"""`orch explain`: from a failed run's logs to its cause, what followed from it, and the
shared state behind it when threads shared the failing code (the ranking and the remedies
are suspects.py).

1. The tracebacks of every worker, out of the run's logs (tracebacks.py), and torchrun's
   failure tables (distributed.py), grouped: the same exception at the same raising frame in
   several workers is one failure.
2. The cause first (causes.py): the first failure in time across workers, ranks and nodes,
   torchrun's wrappers unwrapped to the worker's exception; what follows from it (a lost
   peer, a collective that timed out, torchrun's SIGTERM, its ChildFailedError) listed under
   it. A hung run says so, with its logs' last lines (and the stacks its record keeps).
3. Their frames, read in the target with its python (payloads/explain_frames.py): the source
   around each line as it ran (orch's backup of a file its patch changed since), the
   installed version, whether the file is still the wheel's (RECORD), and the process-wide
   mutable state the frames' functions read, directly or through the checks they call.
4. Shared state only on evidence of concurrency (several threads failed, a named thread
   raised, a known race's words): then the candidates, each with its evidence and a
   confidence (`rank`), and only then the remedy (`remedies`) for the leading ones with
   enough evidence. Otherwise the answer is that nothing points to shared state, with the
   raising frame and its locals.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from orchestrator.ground import paths
from orchestrator.ground.errors import BadArgument, OrchError, PythonUnavailable
from orchestrator.remote import payload_api

from orchestrator.remote.container import Target
from orchestrator.runs.model import RunRecord
from orchestrator.watch import causes, stacks, tracebacks
from orchestrator.watch.causes import OWN, Consequence, Lead, RunHints
from orchestrator.watch.distributed import ChildFailedReader, RankFailure
from orchestrator.forensics.stacktool import stack_command
from orchestrator.forensics.suspects import (CONFIDENT, Candidate, Remedy, applied_notes, facts_by_frame,
                                         patch_rows, rank, remedies)
from orchestrator.watch.torchrun import RANK_LOG_DIR

MAX_LOG_BYTES = 16 << 20      # the end of each log is read (where the errors are)
MAX_RANK_LOGS = 64
MAX_RUN_BYTES = 64 << 20      # and of a launch's logs together: its ranks' share it
LAST_LINES = 6                # a hung run's last lines shown, per log
TABLE = "ChildFailedError"    # torchrun's failure table follows its last mention
# faulthandler's dump_traceback_later: `Timeout (0:00:05)!` then every thread's stack
_FAULTHANDLER_TIMEOUT = re.compile(r"(?m)^Timeout \(\d{1,4}:\d\d:\d\d(?:\.\d{1,6})?\)!\s*$")


@dataclass
class LogText:
    source: str               # where it came from: "TARGET:/path" or a local path
    text: str
    worker: str = ""          # whose log it is, when the file says (a rank's own log)
    time: Optional[float] = None   # an error file's timestamp: when its worker raised


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
    code_matches: Optional[bool] = None   # the log's code line is the source's line there
    ran: str = "file"         # file | backup: the source shown is orch's backup (patched since)
    patched_since: str = ""   # "orch": orch's fx patch changed the file since it was installed
    locals: list[str] = field(default_factory=list)   # the raising frame's local names


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
    role: str = OWN           # own, or how it follows from another's failure (causes.py)


@dataclass
class SharedState:
    """Whether shared state is in question, and why (or why not)."""

    concurrent: bool          # evidence that several threads ran the failing code
    evidence: list[str] = field(default_factory=list)
    known_race: bool = False  # the failure's words match a known race on shared state
    answer: str = "nothing"   # candidates | nothing
    why: str = ""             # nothing points to shared state: why
    raising: Optional[dict] = None   # the raising frame: {where, function, locals}


@dataclass
class Explanation:
    target: str
    logs: list[dict]          # [{source, bytes, tracebacks}]
    failures: list[Failure]
    candidates: list[Candidate]
    remedies: list[Remedy]
    python: str = ""
    notes: list[str] = field(default_factory=list)
    lead: Optional[Lead] = None
    consequences: list[Consequence] = field(default_factory=list)
    shared_state: Optional[SharedState] = None
    torchrun: list[dict] = field(default_factory=list)   # the failure tables' entries
    stacks: list[dict] = field(default_factory=list)     # a hung run's stacks, from its record

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ the logs of a run
def run_logs(record: RunRecord, target: Target) -> list[LogText]:
    """The logs of every launch of RECORD on TARGET, read from the target (each launch's
    output.log, its ranks' logs and error files); the collected copy in the run's folder when
    the target has none left."""
    files: list[tuple[str, str]] = []
    launches = [step.data for step in record.steps
                if step.kind == "launch" and step.target == target.name and step.data.get("run_dir")]
    if not launches:   # a record whose launch step never ended (attach's case): the launch entry
        entry = record.launches().get(target.name) or {}
        launches = [entry] if entry.get("run_dir") else []
    for launch in launches:
        files += _remote_files(target, launch["run_dir"], bool(launch.get("ranks")))
    if files:
        return logs_from_files(target.name, files, rank_offset(record, target.name))
    local = os.path.join(paths.run_dir(record.run_id), target.name, "output.log")
    return [LogText(local, _read_local(local))] if os.path.isfile(local) else []


def launch_logs(target: Target, launch: dict) -> list[LogText]:
    """One launch's logs as they are now in TARGET (a live run's: its monitor's hang path)."""
    return logs_from_files(target.name, _remote_files(target, launch["run_dir"], bool(launch.get("ranks"))))


def _remote_files(target: Target, run_dir: str, ranks: bool) -> list[tuple[str, str]]:
    names = [posixpath.join(run_dir, "output.log")]
    if ranks:
        found = target.run(["find", posixpath.join(run_dir, RANK_LOG_DIR), "-type", "f",
                            "(", "-name", "*.log", "-o", "-name", "error.json", ")"], timeout=60)
        if found.ok:
            names += sorted(line for line in found.text.splitlines() if line.strip())[:MAX_RANK_LOGS]
    out = []
    each = min(MAX_LOG_BYTES, MAX_RUN_BYTES // len(names))
    for path in names:
        try:   # inside the run's folder by real path: a log swapped for a link is not read
            found = payload_api.file_read(target, path, [run_dir], length=each,
                                          timeout=120, tail=True)
        except OrchError:
            continue
        out.append((path, found["data"].decode("utf-8", "replace")))
    return out


def logs_from_files(target: str, files: list[tuple[str, str]], offset: int = 0) -> list[LogText]:
    """A launch's files, (path in the target, text), as explain reads them: whose each is (a
    rank's own folder), an error file's traceback and when it was written."""
    out = []
    for path, text in files:
        when = None
        if path.endswith(".json"):
            text, when = error_file(text)
        out.append(LogText(f"{target}:{path}", text, rank_of(path, offset), when))
    return out


def rank_of(path: str, offset: int = 0) -> str:
    """A rank's own files (RUN_DIR/ranks/<id>/attempt_<n>/<local rank>/...) carry no
    [rankN]: prefix: the folder says whose they are (its local rank; OFFSET: the node's first
    global rank, on a node of a job over several)."""
    parts = path.split("/")
    if RANK_LOG_DIR in parts and len(parts) >= 2 and parts[-2].isdigit():
        return f"rank {int(parts[-2]) + offset}"
    return ""


def rank_offset(record: RunRecord, target: str) -> int:
    """The node's first global rank: its node rank times its ranks (torchrun numbers the
    ranks of a job over several nodes node by node)."""
    for step in record.steps:
        if step.kind == "launch" and step.target == target and step.data.get("node_rank") is not None:
            return int(step.data.get("node_rank") or 0) * int(step.data.get("ranks") or 1)
    return 0


def error_file(text: str) -> tuple[str, Optional[float]]:
    """The traceback a torchrun error file (torch.distributed.elastic's @record) holds, and
    when it was written: {"message": {"message": ..., "extraInfo": {"py_callstack":
    "Traceback ...", "timestamp": "1796302434"}}}."""
    try:
        data = json.loads(text)
    except ValueError:
        return "", None
    message = data.get("message") if isinstance(data, dict) else None
    info = message.get("extraInfo") if isinstance(message, dict) else None
    stack = info.get("py_callstack") if isinstance(info, dict) else None
    try:
        when = float(info.get("timestamp")) if isinstance(info, dict) else None
    except (TypeError, ValueError):
        when = None
    return (stack if isinstance(stack, str) else ""), when


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
            look_up_patches: bool = True, hints: Optional[RunHints] = None,
            ran_at: Optional[float] = None, python: Optional[str] = None) -> Explanation:
    """roots: the folders of the run's own files (None: those of the log's scripts); hints:
    what the run's record says of its end; ran_at: when it was launched and python: the
    python it ran (the source that ran; default: the target's)."""
    reading = read_logs(logs, hints)
    groups, lead = reading.groups, reading.lead
    explanation = Explanation(target.name, reading.summaries, [], [], [], lead=lead,
                              consequences=reading.consequences,
                              torchrun=[asdict(f) for f in reading.torchrun])
    if not groups:
        explanation.notes.append("no Python traceback in the log(s)" + (
            f"; what the logs say instead leads ({lead.kind})" if lead is not None else ""))
        return explanation
    # The folders whose files the payload may read besides the installed packages: the
    # run's own (the caller's roots), else, for a log given by hand, its scripts' folders.
    facts = read_frames(explanation, target, groups, roots, context, ran_at, python)
    explanation.python = str(facts.get("python") or "")
    explanation.failures = [failure(g, facts) for g in groups]
    if facts.get("ran_before_patch"):
        explanation.notes.append("files orch's fx patch changed since this run are read as they ran "
                                 "(orch's backups): marked `patched since`")
    judge_shared_state(explanation, groups, facts, target, look_up_patches)
    return explanation


def read_frames(explanation: Explanation, target: Target, groups: list[tracebacks.Group],
                roots: Optional[list], context: int, ran_at: Optional[float],
                python: Optional[str]) -> dict:
    """The frames' facts, read with the python the run ran, else the target's; when neither
    can run (the venv removed since), none: the cause is the logs' and still said."""
    requests, folders = frame_requests(groups), script_roots(groups) if roots is None else list(roots)
    for choice in ([python, None] if python else [None]):
        try:
            return payload_api.explain_frames(target, requests, roots=folders, context=context,
                                              ran_at=ran_at, python=choice)
        except PythonUnavailable as error:
            explanation.notes.append(f"{error.message}: " + ("trying the target's own" if choice else
                                                             "the frames' source is not read"))
        except OrchError as error:     # the local transport's word for a missing program
            if choice is None:
                raise
            explanation.notes.append(f"the run's python {choice} could not be used "
                                     f"({error.message[:200]}): trying the target's own")
    return {}


@dataclass
class Reading:
    """What the logs themselves say, before any source is read: the failures, torchrun's
    tables, the lead and what follows from it."""

    groups: list[tracebacks.Group]
    torchrun: list[RankFailure]
    lead: Optional[Lead]
    consequences: list[Consequence]
    summaries: list[dict]


def read_logs(logs: list[LogText], hints: Optional[RunHints] = None) -> Reading:
    """Every traceback of the logs (torchrun's table's too), grouped, and the lead (pure)."""
    parsed, summaries, torchrun = [], [], []
    for log in logs:
        result = tracebacks.parse(log.text, source=log.source, worker=log.worker, time=log.time)
        table = failure_table(log.text)
        torchrun += table
        parsed += result.tracebacks + table_tracebacks(table, log.source)
        summaries.append({"source": log.source, "bytes": len(log.text),
                          "tracebacks": len(result.tracebacks), "dropped": result.dropped})
    groups = tracebacks.group(parsed)
    hung = any(_FAULTHANDLER_TIMEOUT.search(log.text) for log in logs)
    lead, consequences = causes.find_lead(groups, torchrun, hints, hang_in_log=hung)
    if lead is not None and lead.failure is None:
        lead.last_lines = last_lines(logs)
    return Reading(groups, torchrun, lead, consequences, summaries)


def judge_shared_state(explanation: Explanation, groups: list[tracebacks.Group], facts: dict,
                       target: Target, look_up_patches: bool) -> None:
    """Shared state only on evidence that threads shared the failing code: then the ranked
    candidates and the remedies for those with enough evidence; else why not, and the frame
    that raised with its locals."""
    own = [g for g, f in zip(groups, explanation.failures) if f.role == OWN]
    evidence, known_race = causes.concurrency(own)
    lead = explanation.lead
    raising = _raising(explanation.failures[lead.failure] if lead is not None and lead.failure is not None
                       else explanation.failures[0])
    if not evidence:
        explanation.shared_state = SharedState(False, why=causes.not_concurrent(own or groups), raising=raising)
        return
    confident = CONFIDENT if known_race else CONFIDENT[:1]
    explanation.candidates = rank(own, facts)
    rows = patch_rows(target, explanation.candidates) if look_up_patches else None
    explanation.remedies = remedies(explanation.candidates, target, rows,
                                    own_entry(explanation.failures), confident)
    frame_files = {f.relpath for failure in explanation.failures for f in failure.frames}
    explanation.notes += applied_notes(explanation.candidates, frame_files, rows or [], target)
    found = any(c.confidence in confident and c.score > 0 and not c.thread_local
                for c in explanation.candidates)
    explanation.shared_state = SharedState(
        True, evidence, known_race, "candidates" if found else "nothing", raising=raising,
        why="" if found else "threads ran, but no state the failing frames read has the evidence "
                             f"of a race ({' or '.join(confident)} confidence: read where it raised "
                             "and written on a failing stack)")


def _raising(failure: "Failure") -> Optional[dict]:
    frame = failure.frames[-1] if failure.frames else None
    if frame is None:
        return None
    return {"where": f"{frame.relpath or frame.file}:{frame.line}", "function": frame.qualname or frame.function,
            "locals": frame.locals, "available": frame.available}


def failure_table(text: str) -> list[RankFailure]:
    """torchrun's last failure table in a log (its ChildFailedError summary)."""
    at = text.rfind(TABLE)
    if at < 0:
        return []
    reader = ChildFailedReader()
    for line in text[text.rfind("\n", 0, at) + 1:].splitlines():
        reader.feed(line)
    return reader.failures


def table_tracebacks(table: list[RankFailure], source: str) -> list[tracebacks.Traceback]:
    """The tracebacks torchrun's table quotes from its workers' error files (@record)."""
    out = []
    for failure in table:
        if failure.traceback.startswith(tracebacks.HEADER) and failure.rank is not None:
            first, _, rest = failure.traceback.partition("\n")
            text = first + "\n" + textwrap.dedent(rest)
            out += tracebacks.parse(text, source=f"{source} (torchrun's failure table)",
                                    worker=f"rank {failure.rank}").tracebacks
    return out


def last_lines(logs: list[LogText]) -> list[str]:
    """What each log said last (a hung run's only evidence besides its stacks)."""
    out = []
    for log in logs:
        lines = [line.strip() for line in log.text[-8192:].replace("\r", "\n").splitlines() if line.strip()]
        out += [f"{log.source}: {line[:300]}" for line in lines[-LAST_LINES:]]
    return out


def frame_requests(groups: list[tracebacks.Group]) -> list[dict]:
    """Each distinct frame once; `innermost` for the frame that raised."""
    seen: dict[tuple, dict] = {}
    for g in groups:
        frames = g.traceback.frames
        for index, frame in enumerate(frames):
            key = (frame.file, frame.line)
            entry = seen.setdefault(key, {"file": frame.file, "line": frame.line,
                                          "function": frame.function, "innermost": False,
                                          "code": frame.code})
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
            relpath=info.get("relpath", ""), source=seen.get("source", []) if ok else [],
            code_matches=seen.get("code_matches"), ran=info.get("ran", "file"),
            patched_since=info.get("patched_since", ""), locals=seen.get("locals", [])))
    tb = g.traceback
    return Failure(tb.exception, tb.message, sorted(g.workers, key=causes.natural), g.count, frames,
                   tb.dropped_frames,
                   [f"{c.exception}: {c.message}" for c in tb.causes], tb.source, causes.role(g))


# ------------------------------------------------------------------ a recorded run
def launched_targets(record: RunRecord) -> list[str]:
    """The targets a run launched something on, in the order it did."""
    names = []
    for step in record.steps:
        if step.kind == "launch" and step.data.get("run_dir") and step.target not in names:
            names.append(step.target)
    for name in record.launches():
        if name not in names:
            names.append(name)
    return names


def explain_record(record: RunRecord, targets: list[Target], **options) -> list[Explanation]:
    """Each target's explanation of a recorded run (targets: those it launched on)."""
    return explain_logs(record, [(target, run_logs(record, target)) for target in targets], **options)


def explain_logs(record: RunRecord, logs: list[tuple[Target, list[LogText]]], **options) -> list[Explanation]:
    """A recorded run's explanations, one per target, from each target's logs: its record says
    how each ended (orch stopped it as hung, a signal) and when it started; over several nodes
    the node whose failure came first leads, the others' follow from it."""
    out = []
    for target, texts in logs:
        if not texts:
            empty = Explanation(target.name, [], [], [], [])
            empty.notes.append(f"no log of run {record.run_id} on {target.name}: neither its launch "
                               "folder there nor a collected output.log here")
            out.append(empty)
            continue
        explained = explain(target, texts, roots=own_roots(record, target.name),
                            hints=run_hints(record, target.name), ran_at=launched_at(record, target.name),
                            python=launched_python(record, target.name), **options)
        # the stacks the monitor took when it called the run hung: whatever the cause (a
        # drafter that raised first leaves the others waiting on its lock), they show who waits
        explained.stacks = recorded_stacks(record, target.name)
        out.append(explained)
    return first_node_first(out, record)


def first_node_first(explanations: list[Explanation], record: RunRecord) -> list[Explanation]:
    """Over several nodes: the node whose lead explains most (an exception of its own before
    a lost peer), then orch's record of the node that failed first, leads; every other node's
    lead follows from it."""
    led = [e for e in explanations if e.lead is not None]
    if len(led) < 2:
        return explanations
    first = (first_failure(record) or {}).get("node")
    order = sorted(led, key=lambda e: (-e.lead.strength, e.target != first))
    cause = order[0]
    for other in order[1:]:
        other.lead.node = other.target
        other.lead.consequence_of = f"{cause.target}: {cause.lead.summary}"
    cause.lead.node = cause.target
    return [cause] + [e for e in explanations if e is not cause]


def first_failure(record: RunRecord) -> Optional[dict]:
    """orch's record of the node that failed first (a job over several nodes)."""
    return next((s.data.get("first_failure") for s in record.steps
                 if s.kind == "monitor" and (s.data or {}).get("first_failure")), None)


def run_hints(record: RunRecord, target: str) -> RunHints:
    """How the run ended on TARGET, as its monitor step recorded it."""
    for step in reversed(record.steps):
        if step.kind != "monitor" or not step.data:
            continue
        node = (step.data.get("nodes") or {}).get(target) or (step.data if step.target == target else None)
        summary = (node or {}).get("summary") or {}
        if summary:
            return RunHints(stopped_for=summary.get("stopped_for"), signal=summary.get("signal"),
                            exit_code=summary.get("exit_code"))
    return RunHints()


def launched_at(record: RunRecord, target: str) -> Optional[float]:
    """When the run's first launch on TARGET started (epoch seconds)."""
    for step in record.steps:
        if step.kind == "launch" and step.target == target and step.data.get("started_at"):
            return float(step.data["started_at"])
    return None


def launched_python(record: RunRecord, target: str) -> Optional[str]:
    """The python the run's launch on TARGET ran (its command's first word, a python's
    absolute path: torchrun's too), so its frames are read in the venv that ran them; None:
    the target's own."""
    for step in record.steps:
        argv = step.data.get("argv") if step.kind == "launch" and step.target == target else None
        if argv and isinstance(argv[0], str) and argv[0].startswith("/") \
                and posixpath.basename(argv[0]).startswith(("python", "pypy")):
            return argv[0]
    return None


def recorded_stacks(record: RunRecord, target: str) -> list[dict]:
    """The stacks a hung run's record keeps for TARGET: those its monitor took when it called
    the run hung, before it stopped it (each process's: every rank's under torchrun), with
    their locks, waits and cycles; [] when it took none."""
    for step in reversed(record.steps):
        if step.kind != "monitor" or not isinstance(step.data, dict):
            continue
        # a job over several nodes keeps each node's monitor data under "nodes" (a launch
        # step's "nodes" is a list of another shape: only the monitor's are read)
        nodes = step.data.get("nodes")
        data = (nodes.get(target) or {}) if isinstance(nodes, dict) else \
            (step.data if step.target == target else {})
        if data.get("hang_stacks"):
            taken = data["hang_stacks"]
            return [dict(result, taken_at=taken.get("taken_at")) for result in taken.get("results") or []]
    return []


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
    locks: list[dict]         # [{key, name, kind, holders, waiters, sentence}]
    tool: str = ""
    rank: Optional[int] = None        # under torchrun: the worker's RANK (and its launcher)
    world_size: Optional[int] = None
    launcher_pid: Optional[int] = None
    waits: list[dict] = field(default_factory=list)    # every edge: [{thread, waits_for, how, words}]
    # the deadlocks: [{line: "DEADLOCK: A -> B -> A", words, waits, remedy}]
    cycles: list[dict] = field(default_factory=list)


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
    # --locals: the Thread objects' addresses, which say whom a join waits for
    result = target.run([*command, "remote", "--locals", str(int(pid))], timeout=120)
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
    locks, waits, found = stacks.analyse(threads, facts, dead)
    return Stacks(target.name, int(pid),
                  [{"tid": t.tid, "name": t.name, "label": t.label, "compile": t.compile,
                    "frames": [asdict(f) for f in t.frames]} for t in threads],
                  [dict(asdict(lock), sentence=lock.sentence()) for lock in locks], words,
                  rank=(worker or {}).get("rank"), world_size=(worker or {}).get("world_size"),
                  launcher_pid=launcher_pid, waits=[asdict(w) for w in waits],
                  cycles=[cycle_entry(c) for c in found])


def cycle_entry(cycle: list[stacks.Wait]) -> dict:
    return {"line": stacks.cycle_line(cycle), "words": stacks.cycle_words(cycle),
            "waits": [asdict(w) for w in cycle], "remedy": stacks.remedy(cycle)}


def launched_pid(record: RunRecord, target: str) -> int:
    """The process the run's last launch on TARGET started."""
    for step in reversed(record.steps):
        if step.kind == "launch" and step.target == target and step.data.get("pid"):
            return int(step.data["pid"])
    entry = record.launches().get(target) or {}
    if entry.get("pid"):
        return int(entry["pid"])
    raise OrchError(f"run {record.run_id} has no launched process on {target}")
