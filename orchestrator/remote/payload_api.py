"""The controller's side of the payloads: one function per payload.

Each function ships its payload (orchestrator/payloads/, one self-contained stdlib script) to
a Target, runs it with the container's python, reads its JSON lines and returns the final
result event, or raises a typed error:
- PayloadError: the payload reported an error it found (its `error` line; .kind says which);
- PayloadNoResult: it ended (crashed, was killed) without a result or error line;
- PythonUnavailable: the interpreter it needs cannot run (no venv, no python3).
Transport errors (unreachable host, stopped container, timeout) pass through as they are.
CLI commands, playbook steps and MCP tools all call these functions, so a step does exactly
what the command does.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Callable, Optional, Sequence, Union

from orchestrator import __version__
from orchestrator.ground.errors import PatchBusy, PayloadError, PayloadNoResult, PythonUnavailable
from orchestrator.payloads import compact_source, payload_source, with_args
from orchestrator.payloads._statedir import STATE_DIR
from orchestrator.remote.base import LineSplitter, Result
from orchestrator.remote.container import Target

EventCallback = Callable[[dict], None]

LOCATE_TIMEOUT = 60.0
SEARCH_TIMEOUT = 300.0
READ_TIMEOUT = 60.0
PATCH_TIMEOUT = 600.0
RACE_TIMEOUT = 900.0
PROBE_TIMEOUT = 60.0
PATCH_ACTIONS = ("status", "diff", "apply", "revert")
CPU_LIMIT_EXIT = 128 + 24          # SIGXCPU: the payload's RLIMIT_CPU ran out (Linux numbering)
SYSTEM_PYTHON = "python3"          # stdlib-only payloads: the container's own python is enough
REMOTE_ROOT = f"{STATE_DIR}/runs"  # where the launcher keeps a run's pid, exit and log files


# ------------------------------------------------------------------ running a payload
def run_payload(target: Target, name: str, args: dict, *, python: Optional[str] = None,
                timeout: float = 300.0, on_event: Optional[EventCallback] = None,
                args_on_stdin: bool = False, in_python: bool = False) -> dict:
    """Run payload `name` on target and return its result event.
    on_event gets every event before the last; args_on_stdin ships the arguments inside the
    script on stdin instead of in argv (for secrets; see payloads.with_args); in_python lets
    a container run it in a fork of a python3 already running there (RunOptions.in_python),
    for a short stdlib payload whose answers are the same without site (-I -S)."""
    python = python or target.python()
    events: list[dict] = []

    def on_line(line: str) -> None:
        event = parse_event(line)
        if event is None:
            return
        events.append(event)
        if on_event and event.get("event") not in ("result", "error"):
            on_event(event)

    splitter = LineSplitter(on_line)
    if args_on_stdin:
        argv, script = [python, "-"], with_args(payload_source(name), args)
    else:
        argv, script = [python, "-", json.dumps(args)], payload_source(name)
    result = target.run(argv, stdin=script, timeout=timeout, on_stdout=splitter.feed,
                        in_python=in_python)
    splitter.flush()
    return payload_outcome(target, name, python, events[-1] if events else None, result)


def payload_outcome(target: Target, name: str, python: str, final: Optional[dict],
                    result: Result) -> dict:
    """The result event of a payload that ended (final: its last event), or its typed error."""
    if final and final.get("event") == "result":
        return final
    if final and final.get("event") == "error":
        raise error_event(target, final)
    if result.exit_code == CPU_LIMIT_EXIT:
        raise PayloadError(f"{target.name}: payload {name} used up its CPU time limit and was "
                           "killed (a pattern that backtracks without end?)", kind="cpu-limit")
    if result.exit_code in (126, 127) or "No such file or directory" in result.error_text[:500]:
        raise PythonUnavailable(f"{target.name}: cannot run {python}: {result.stderr_tail(1)}",
                                hint="is the venv bootstrapped? (the venv: key of the inventory, "
                                     "or a bootstrap step in the playbook)")
    raise PayloadNoResult(f"{target.name}: payload {name} ended with exit code {result.exit_code} "
                          "and no result:\n" + "\n".join("  | " + l for l in result.stderr_tail()))


def parse_event(line: Union[str, bytes]) -> Optional[dict]:
    """One protocol line as an event; None for anything else (a library printing its own)."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def error_event(target: Target, event: dict) -> PayloadError:
    """The typed error for a payload's `error` line."""
    return PayloadError(f"{target.name}: {event.get('message', 'the payload failed')}",
                        kind=event.get("kind"))


# ------------------------------------------------------------------ torch forensics
def locate(target: Target, package: str = "torch") -> dict:
    """Where a package is installed (site-packages, version, dist-info), without importing it."""
    return run_payload(target, "torch_locate", {"package": package}, timeout=LOCATE_TIMEOUT)


def search(target: Target, pattern: str, *, package: str = "torch", fixed: bool = False,
           word: bool = False, ignore_case: bool = False, context: int = 0,
           mode: str = "grep", show: bool = False, engine: str = "auto",
           max_hits: int = 1000, on_event: Optional[EventCallback] = None,
           timeout: float = SEARCH_TIMEOUT) -> dict:
    """Search a package's installed Python source; returns the result with 'matches' added.
    The search may use `timeout` seconds of wall-clock time (the reaper kills it after) and
    as much CPU (RLIMIT_CPU in the container: a pattern that backtracks for ever)."""
    matches: list[dict] = []

    def collect(event: dict) -> None:
        if event.get("event") in ("hit", "def"):
            matches.append(event)
        if on_event:
            on_event(event)

    args = {"package": package, "pattern": pattern, "fixed": fixed, "word": word,
            "ignore_case": ignore_case, "context": context, "mode": mode, "show": show,
            "engine": engine, "max_hits": max_hits, "cpu_seconds": max(1, int(timeout))}
    result = run_payload(target, "source_search", args, timeout=timeout, on_event=collect)
    return {**result, "matches": matches}


def source_read(target: Target, package: str, path: str, start_line: int = 1,
                end_line: Optional[int] = None, max_bytes: int = 64 << 10) -> dict:
    """Lines of one file of a package's installed source."""
    return run_payload(target, "source_read", {
        "package": package, "path": path, "start_line": start_line, "end_line": end_line,
        "max_bytes": max_bytes}, timeout=READ_TIMEOUT)


def collect_files(target: Target, path: str, *, name_contains: str = "tfevents",
                  max_bytes: int = 16 << 20, max_files: int = 64,
                  timeout: float = READ_TIMEOUT) -> dict:
    """The files under PATH whose name contains name_contains (or PATH itself, a file), at
    most max_bytes of them in all: the result with "files", each {"path", "size", "read",
    "data": bytes} or {"path", "error"}, in order of path."""
    chunks: dict[int, list[bytes]] = {}
    files: list[dict] = []
    kept = [0]   # the container's output is not trusted to keep to max_bytes: we do

    def collect(event: dict) -> None:
        index = event.get("file")
        if event.get("event") == "chunk" and isinstance(index, int):
            try:
                piece = base64.b64decode(event.get("data") or "", validate=True)
            except (ValueError, TypeError):
                piece = b""   # the reader then finds the file cut or corrupt, and says so
            piece = piece[:max(0, max_bytes - kept[0])]
            kept[0] += len(piece)
            chunks.setdefault(index, []).append(piece)
        elif event.get("event") == "file" and isinstance(index, int) and len(files) < max_files:
            entry = {k: event[k] for k in ("path", "size", "read", "error") if k in event}
            if "error" not in entry:
                entry["data"] = b"".join(chunks.pop(index, []))
            files.append(entry)

    result = run_payload(target, "collect_files", {
        "path": path, "name_contains": name_contains, "max_bytes": max_bytes,
        "max_files": max_files}, python=SYSTEM_PYTHON, timeout=timeout, on_event=collect)
    return {**result, "files": files}


def file_read(target: Target, path: str, roots: list[str], offset: int = 0,
              length: int = 64 << 10, timeout: float = READ_TIMEOUT, tail: bool = False) -> dict:
    """Bytes [offset, offset+length) of one regular file of target whose real path is inside
    one of `roots` (checked there, on real paths: payloads/file_read.py); tail: its last
    `length` bytes. The result with
    "data": the bytes, at most `length` whatever the container sends, their sha256 checked
    against the one computed where they were read (PayloadError kind "hash-mismatch")."""
    pieces: list[bytes] = []
    kept = [0]   # the container's output is not trusted to keep to length: we do

    def collect(event: dict) -> None:
        if event.get("event") != "chunk":
            return
        try:
            piece = base64.b64decode(event.get("data") or "", validate=True)
        except (ValueError, TypeError):
            piece = b""   # the digest below then differs, and says so
        piece = piece[:max(0, length - kept[0])]
        kept[0] += len(piece)
        pieces.append(piece)

    result = run_payload(target, "file_read", {"path": path, "roots": list(roots),
                                               "offset": offset, "length": length, "tail": tail},
                         python=SYSTEM_PYTHON, timeout=timeout, on_event=collect)
    data = b"".join(pieces)
    if hashlib.sha256(data).hexdigest() != result.get("sha256"):
        raise PayloadError(f"{target.name}: the {len(data)} bytes read from {path} are not the "
                           "ones the container sent (their sha256 differs)", kind="hash-mismatch")
    return {**result, "data": data}


def explain_frames(target: Target, frames: list[dict], roots: Optional[list] = None,
                   context: int = 3, ran_at: Optional[float] = None,
                   python: Optional[str] = None) -> dict:
    """A traceback's frames against the source that ran: lines, package versions, RECORD
    checks, orch's backups of files its patch changed since RAN_AT, and the shared state
    they read (payloads/explain_frames.py), read with PYTHON (the one the run ran; default:
    the target's)."""
    # On stdin: a long traceback's frames can pass the kernel's limit on one argv string.
    return run_payload(target, "explain_frames", {"frames": frames, "roots": list(roots or []),
                                                  "context": context, "ran_at": ran_at},
                       python=python, timeout=READ_TIMEOUT, args_on_stdin=True)


def rank_processes(target: Target, pid: int) -> dict:
    """The torchrun rank workers below process PID (payloads/rank_procs.py): {alive, ranks}."""
    return run_payload(target, "rank_procs", {"pid": int(pid)}, python=SYSTEM_PYTHON,
                       timeout=READ_TIMEOUT)


def fx_patch(target: Target, action: str, patch_set: str = "fx-tls") -> dict:
    """An fx patch set (fx-tls: the FX tracing flag; fx-threads: every FX state threads share):
    status, diff, apply or revert. Raises PatchBusy when another action holds the tree."""
    if action not in PATCH_ACTIONS:
        raise ValueError(f"unknown {patch_set} action {action!r}")
    try:
        return run_payload(target, "fx_patch", {"action": action, "patch_set": patch_set,
                                                "orch_version": __version__},
                           timeout=PATCH_TIMEOUT)
    except PayloadError as exc:
        if exc.kind == "busy":
            raise PatchBusy(exc.message, kind=exc.kind,
                            hint="readers share the lock; an apply or revert holds it alone "
                                 "for seconds") from None
        raise


def fx_race(target: Target, trials: int = 5, on_event: Optional[EventCallback] = None,
            states: Optional[list] = None) -> dict:
    """The FX race reproducers, `trials` times each, with the target's torch: the tracing
    flag's (default), or each of `states` ("fx-tracing-flag", "node-meta")."""
    args = {"trials": trials, "timeout": 120}
    if states:
        args["states"] = list(states)
    return run_payload(target, "fx_race", args, timeout=RACE_TIMEOUT, on_event=on_event)


def compile_deadlock(target: Target, drafters: int = 3, steps: int = 3, hang_seconds: int = 90,
                     remedy_seconds: int = 240, on_event: Optional[EventCallback] = None) -> dict:
    """The compile-deadlock reproducer (payloads/compile_deadlock.py) with the target's
    torch: unchanged, bounded by HANG_SECONDS, then with the remedy."""
    args = {"drafters": drafters, "steps": steps, "hang_seconds": hang_seconds,
            "remedy_seconds": remedy_seconds}
    return run_payload(target, "compile_deadlock", args, on_event=on_event,
                       timeout=hang_seconds + remedy_seconds + 400)


# ------------------------------------------------------------------ containers and venvs
def probe(target: Target) -> dict:
    """What the container offers: python, the inventory's venv, GPUs, ripgrep. In a fork of
    the reaper's or the warm session's python3: its answers are that python3's (executable,
    version), the command environment's (PATH, CUDA_VISIBLE_DEVICES) and what it runs (the
    venv's python, nvidia-smi), none of which -I -S changes."""
    return run_payload(target, "probe", {"venv": target.venv}, python=SYSTEM_PYTHON,
                       timeout=PROBE_TIMEOUT, in_python=True)


def machine(target: Target) -> dict:
    """What a run runs on: GPU models, driver, CUDA, clocks; the container's cgroup limits."""
    return run_payload(target, "machine", {}, python=SYSTEM_PYTHON, timeout=PROBE_TIMEOUT)


def bootstrap(target: Target, action: str, *, python: str = SYSTEM_PYTHON, timeout: float = 300.0,
              on_event: Optional[EventCallback] = None, **args) -> dict:
    """The bootstrap payload: check or install a venv, or list a wheelhouse folder."""
    # On stdin: an index URL may hold credentials, and argv is visible in `ps`.
    return run_payload(target, "bootstrap", {"action": action, **args}, python=python,
                       timeout=timeout, on_event=on_event, args_on_stdin=True)


# ------------------------------------------------------------------ multi-node pre-flight
PREFLIGHT_TIMEOUT = 30.0


def preflight_listener(target: Target, host: str, port: int, token: str,
                       nonce_hashes: Sequence[str], seconds: float):
    """The pre-flight's listener on host:`port` (the rendezvous node), on a channel of its
    own: returns the process, whose stdout lines are events ("listening", then the result or
    error). A line written to its stdin, or closing it, makes it let go of the port. It
    counts only connections that send one of the nodes' nonces (given as their sha256: its
    argv gives none away)."""
    args = {"action": "listen", "host": host, "port": port, "token": token,
            "nonces": list(nonce_hashes), "seconds": seconds, "stop_on_stdin": True}
    # -c SOURCE: the payload must start without waiting for stdin's end
    return target.spawn([SYSTEM_PYTHON, "-u", "-c", compact_source("preflight"),
                         json.dumps(args)])


def preflight_check(target: Target, host: str, port: int, token: str, *, nonce: str,
                    connect_timeout: float = 3.0, gpus: Sequence[int] = (),
                    connect: bool = True) -> dict:
    """The pre-flight's measurements on one node: the endpoint reached (sending the node's
    nonce, answered with token) unless not `connect`, /dev/shm's size, the interfaces, the
    GPUs (the preflight payload's docstring). The nonce travels on stdin, not in an argv."""
    args = {"action": "check", "host": host, "port": port, "token": token, "nonce": nonce,
            "timeout": connect_timeout, "gpus": list(gpus), "connect": connect}
    return run_payload(target, "preflight", args, python=SYSTEM_PYTHON,
                       timeout=PREFLIGHT_TIMEOUT + connect_timeout, args_on_stdin=True)


# ------------------------------------------------------------------ detached runs
def free_port(target: Target) -> int:
    """A TCP port free in the container now (the default port of a rendezvous it hosts)."""
    return int(run_payload(target, "free_port", {}, python=SYSTEM_PYTHON, timeout=60)["port"])


def launcher(target: Target, action: str, run_dir: str, timeout: float = 60.0, **args) -> dict:
    """The launcher payload: start, status or stop a detached command (see its docstring)."""
    # The arguments travel on stdin: a start's env holds secrets (HF_TOKEN, ...), and the
    # supervisor it forks keeps this argv for the whole run.
    return run_payload(target, "launcher", {"action": action, "run_dir": run_dir, **args},
                       python=SYSTEM_PYTHON, timeout=timeout, args_on_stdin=True)


def stop_run(target: Target, run_dir: str, grace: float = 10.0, reason: str = "orch stop") -> dict:
    """SIGTERM to the run's process group, SIGKILL after grace seconds."""
    return launcher(target, "stop", run_dir, timeout=grace + 30.0, grace=grace, reason=reason)


def start_tail(target: Target, run_dir: str, **args):
    """A long-lived launcher `tail` on its own channel; returns the process, whose stdout lines
    are events (parse_event). The caller reads, reconnects and closes it (monitor.LogFollower)."""
    args = {"action": "tail", "run_dir": run_dir, **args}
    # -c SOURCE instead of `-`: the payload must start without waiting for stdin's end.
    return target.spawn([SYSTEM_PYTHON, "-u", "-c", payload_source("launcher").decode(),
                         json.dumps(args)])
