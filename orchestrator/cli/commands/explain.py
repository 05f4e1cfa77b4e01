"""orch explain: a failed run's cause, what followed from it, its source as it ran, and the
shared state behind it when threads shared it (orchestrator/forensics/explain.py does the work)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from orchestrator.ground import console
from orchestrator.ground.errors import ExitCode, OrchError
from orchestrator.cli.commands.options import targets_option
from orchestrator.ground.lazy import lazy

pass_app = click.pass_obj
# the analysis, the run store and SSH only when the command runs: `--help` stays instant
if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.runs.store import RunStore
    from orchestrator.forensics.explain import (explain, explain_record, launched_pid, launched_targets,
                                            read_log_file, run_logs, stacks_of)
    from orchestrator.watch.stacks import compile_words
else:
    explain = lazy("orchestrator.forensics.explain", "explain")
    explain_record = lazy("orchestrator.forensics.explain", "explain_record")
    launched_targets = lazy("orchestrator.forensics.explain", "launched_targets")
    read_log_file = lazy("orchestrator.forensics.explain", "read_log_file")
    RunStore = lazy("orchestrator.runs.store", "RunStore")
    stacks_of = lazy("orchestrator.forensics.explain", "stacks_of")
    launched_pid = lazy("orchestrator.forensics.explain", "launched_pid")
    compile_words = lazy("orchestrator.watch.stacks", "compile_words")
    run_logs = lazy("orchestrator.forensics.explain", "run_logs")
SHOWN_FRAMES = 6          # innermost frames printed with their source; --json has them all
SHOWN_CANDIDATES = 5
KINDS = {"global": "module global, rebound under `global`",
         "container": "module-level container, mutated in place"}


@click.command("explain")
@click.argument("run", default="last")
@click.option("--log", "log_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="Explain this log file instead of a recorded run's (its frames are read in -t TARGET).")
@targets_option("With RUN: only these of its targets. With --log: the container whose installed "
                "packages the log's frames come from (default: the inventory's default_target).")
@click.option("-C", "--context", type=click.IntRange(0, 20), default=3, show_default=True,
              metavar="N", help="Source lines shown around each frame's line.")
@click.option("--all-frames", is_flag=True, help="Print every frame, not only the innermost ones.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (every frame, every candidate).")
@pass_app
def explain_command(app, run, log_file, targets, context, all_frames, as_json):
    """Explain a failed run: its cause first, what followed from it, and shared state on evidence.

    Reads the tracebacks of every worker in RUN's logs (default: the last run; every launch,
    every rank and node, torchrun's error files and failure table), and leads with the cause:
    the first failure in time, torchrun's ChildFailedError unwrapped to the worker's
    exception, a rank killed by a signal, or a hang (with its last lines); what follows from
    it (a lost peer, a collective timeout on the survivors, torchrun's SIGTERM) is listed
    under it. Each frame's source is read in the target with the python that ran, as it ran
    (orch's backup of a file its patch changed since: `patched since`), with the package
    version and whether the file still matches its wheel's RECORD. Only when threads shared
    the failing code (several failed, a named thread raised, a known race's words) does it
    rank the process-wide mutable state the failing frames read, each with its evidence and
    a confidence, and propose a remedy for those with enough evidence; otherwise it says that
    nothing points to shared state. Nothing is imported or changed in the target. Exit code:
    0 a failure was explained, 1 nothing in the logs, other codes for errors
    (docs/reference/exit-codes.md).

    \b
    Examples:
      orch explain                       # the last run
      orch explain 20261129-0915 -t drafters
      orch explain --log train.log -t drafters
      orch explain last --json | jq '.[0].candidates[0]'
    """
    if log_file:
        chosen = app.fleet.targets(targets)
        if len(chosen) != 1:
            raise click.UsageError(f"--log explains one log against one target; "
                                   f"{', '.join(targets)} names {len(chosen)}")
        results = [explain(chosen[0], [read_log_file(log_file)], context=context)]
    else:
        with RunStore() as store:
            record = store.get(run)
        names = launched_targets(record)
        if targets:
            names = [n for n in names if n in targets]
        if not names:
            raise OrchError(f"run {record.run_id} launched nothing"
                            + (f" on {', '.join(targets)}" if targets else "")
                            + ": there is no log to explain",
                            hint="`orch explain --log FILE -t TARGET` explains a log from elsewhere")
        results = explain_record(record, app.fleet.targets(names), context=context)
    if as_json:
        console.print_json([r.to_dict() for r in results])
    else:
        for result in results:
            _print(result, all_frames)
    return ExitCode.OK if any(r.failures or r.lead for r in results) else ExitCode.FAILED


# ------------------------------------------------------------------ for people
def _print(result, all_frames: bool) -> None:
    out, esc = console.out, console.escape
    out.print(f"[bold]== {esc(result.target)}[/]"
              + (f" ({esc(result.python)})" if result.python else "") + ": "
              + ", ".join(f"{esc(log['source'])}: {log['tracebacks']} traceback(s)" for log in result.logs))
    for note in result.notes:
        out.print(f"  {esc(note)}")
    lead = result.lead
    if lead is not None:
        _print_lead(result, lead, all_frames)
    others = [(n, f) for n, f in enumerate(result.failures) if lead is None or n != lead.failure]
    shown = [(n, f) for n, f in others if f.role == "own"]
    if shown:
        out.print("\n[bold]Other failures[/] (not following from the cause):" if lead is not None else "")
        for number, failure in shown:
            _print_failure(number + 1, failure, all_frames)
    _print_shared_state(result)


def _print_lead(result, lead, all_frames: bool) -> None:
    out, esc = console.out, console.escape
    where = f" on {esc(lead.node)}" if lead.node else ""
    if lead.consequence_of:
        out.print(f"\n[bold]On {esc(result.target)}[/]: {esc(lead.summary)}"
                  f"\n  follows from the run's cause, {esc(lead.consequence_of)}")
    else:
        out.print(f"\n[bold red]Cause{where}[/]: {esc(lead.summary)}")
    for why in lead.why:
        out.print(f"  [dim]{esc(why)}[/]")
    if lead.failure is not None:
        _print_failure(lead.failure + 1, result.failures[lead.failure], all_frames, heading=False)
    if lead.last_lines:
        out.print("  the logs' last lines:")
        for line in lead.last_lines:
            out.print(f"    {esc(line)}")
    if result.stacks:
        out.print("  the stacks orch took when it called the run hung (the run's record):")
        for taken in result.stacks:
            _print_recorded_stacks(taken)
    elif lead.kind == "hang":
        out.print("  no stacks in the run's record: while a run hangs, `orch stacks RUN` takes "
                  "every thread's stack (and who waits on whom)")
    if result.consequences:
        out.print("\n[bold]What followed from it[/]:")
        for item in result.consequences:
            out.print(f"  - {esc(item.what)}\n      {esc(item.because)}")


def _print_recorded_stacks(taken: dict) -> None:
    """One process's recorded stacks: its deadlocks first, then who waits on whom, then each
    thread's innermost frames."""
    out, esc = console.out, console.escape
    rank = f", rank {taken['rank']}" if taken.get("rank") is not None else ""
    out.print(f"    pid {taken.get('pid')}{rank}: {len(taken.get('threads') or [])} thread(s)")
    for cycle in taken.get("cycles") or []:
        out.print(f"    [bold red]{esc(cycle['line'])}[/]\n      {esc(cycle['words'])}")
        _print_remedy(cycle.get("remedy"), indent="      ")
    for lock in taken.get("locks") or []:
        out.print(f"      waits: {esc(lock['sentence'])}")
    for thread in taken.get("threads") or []:
        frame = (thread.get("frames") or [{}])[-1]
        out.print(f"      {esc(str(thread.get('label')))}: {esc(str(frame.get('function', '?')))} "
                  f"({esc(str(frame.get('file', '?')))}:{frame.get('line', '?')})")


def _print_shared_state(result) -> None:
    out, esc = console.out, console.escape
    state = result.shared_state
    if state is None:
        return
    if not state.concurrent:
        out.print(f"\n[bold]Shared state[/]: nothing points to shared state: {esc(state.why)}")
        raising = state.raising
        if raising:
            names = ", ".join(raising["locals"]) if raising["locals"] else (
                "(its source is not here)" if not raising["available"] else "none")
            out.print(f"  the frame that raised: {esc(raising['function'])} ({esc(raising['where'])}), "
                      f"its locals: {esc(names)}")
        return
    out.print("\n[bold]Shared state[/]: the failing code ran in several threads: "
              + esc("; ".join(state.evidence)))
    if result.candidates:
        out.print("[bold]Shared state the failing frames read[/] (most evidence first):")
        for candidate in result.candidates[:SHOWN_CANDIDATES]:
            _print_candidate(candidate)
        if len(result.candidates) > SHOWN_CANDIDATES:
            out.print(f"  ... {len(result.candidates) - SHOWN_CANDIDATES} more with less evidence (--json)")
    if state.answer == "nothing":
        out.print(f"  none with enough evidence for a remedy: {esc(state.why)}")
    for remedy in result.remedies:
        out.print(f"\n[bold]Remedy[/] for {esc(remedy.state)}: {esc(remedy.summary)}")
        for option in remedy.options:
            out.print(f"  - {esc(option)}")
        for command in remedy.commands:
            out.print(f"    [cyan]{esc(command)}[/]")


def _print_failure(number, failure, all_frames: bool, heading: bool = True) -> None:
    out, esc = console.out, console.escape
    who = ", ".join(failure.workers) or "one worker"
    if heading:
        # a message of several lines (torch's "backend=... raised:" then the real error) is
        # indented under its number
        message = esc(failure.message).replace("\n", "\n" + " " * (len(str(number)) + 2))
        out.print(f"\n[bold red]{number}. {esc(failure.exception)}[/]: {message}")
    elif "\n" in failure.message:
        out.print("   " + esc(failure.message).replace("\n", "\n   "))
    out.print(f"   in {len(failure.workers) or 1} worker(s): {esc(who)}"
              + (f" ({failure.count} tracebacks)" if failure.count > len(failure.workers) else ""))
    for cause in failure.causes:
        out.print(f"   chained after: {esc(cause)}")
    frames = failure.frames if all_frames else failure.frames[-SHOWN_FRAMES:]
    if len(frames) < len(failure.frames):
        out.print(f"   ... {len(failure.frames) - len(frames)} outer frame(s) (--all-frames)")
    for frame in frames:
        _print_frame(frame)


def _print_frame(frame) -> None:
    out, esc = console.out, console.escape
    package = ""
    if frame.package and frame.version:
        record = {"ok": "as installed", "mismatch": "CHANGED since install (patched or drifted)",
                  "not-listed": "not in its RECORD"}.get(frame.record or "", "")
        if frame.patched_since == "orch":
            record = ("patched since by orch; shown as it ran (orch's backup)" if frame.ran == "backup"
                      else "patched by orch (shown as it is now)")
        package = f"  [dim]{esc(frame.package)} {esc(frame.version)}{', ' + record if record else ''}[/]"
    elif frame.package:
        package = f"  [dim]{esc(frame.package)}[/]"
    out.print(f"   [bold]{esc(frame.relpath or frame.file)}:{frame.line}[/] in "
              f"{esc(frame.qualname or frame.function)}{package}")
    if not frame.available:
        out.print(f"      source not available: {esc(frame.reason)}"
                  + (f"\n      {esc(frame.code)}" if frame.code else ""))
        return
    for line in frame.source:
        mark = ">" if line["line"] == frame.line else " "
        out.print(f"    {mark}{line['line']:6d}  {esc(line['text'])}")
    if frame.code_matches is False:
        out.print(f"      [yellow]the log shows `{esc(frame.code)}` here: this file changed since the run[/]")


def _print_candidate(candidate) -> None:
    out, esc = console.out, console.escape
    local = "[green]thread-local[/]" if candidate.thread_local else "[red]process-global[/]"
    kind = KINDS.get(candidate.kind, candidate.kind)
    out.print(f"  [bold]{esc(candidate.name)}[/] in {esc(candidate.defined)} ({esc(kind)}, "
              f"{local}, score {candidate.score}, {esc(candidate.confidence)} confidence"
              + (", patched since" if candidate.patched_since else "") + ")")
    for write in candidate.writes[:4]:
        out.print(f"      written: {esc(write['where'])} in {esc(write['function'])} ({esc(write['how'])})"
                  + (f"\n          {esc(write['text'])}" if write.get("text") else ""))
    if len(candidate.writes) > 4:
        out.print(f"      ... {len(candidate.writes) - 4} more writes")
    for evidence in candidate.evidence:
        out.print(f"      - {esc(evidence)}")
    check = next((r for r in candidate.read_by if r.get("via_source")), None)
    if check:
        out.print(f"      the check, {esc(check['via_where'])}:")
        for line in check["via_source"]:
            out.print(f"        {line['line']:6d}  {esc(line['text'])}")




@click.command("stacks")
@click.argument("run", default="last")
@click.option("--pid", type=click.IntRange(1), help="This process instead of RUN's launched one.")
@targets_option("With RUN: only these of its targets. With --pid: the container it runs in "
                "(default: the inventory's default_target).")
@click.option("--rank", type=click.IntRange(0), metavar="N",
              help="Under torchrun: only rank N's worker (default: every rank's).")
@click.option("--wheelhouse", metavar="DIR", type=click.Path(file_okay=False),
              help="A folder of wheels here holding a pystack wheel for the target's python, "
                   "carried in when the target has no pystack (default: orch's cache, filled "
                   "with pip download).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def stacks_command(app, run, pid, targets, rank, wheelhouse, as_json):
    """Every thread's Python stack of a hung run's live process, and who waits on whom.

    Takes the stacks from outside the process with pystack (`python -m pystack remote PID`
    with the target's venv, else pystack on its PATH, else orch carries a pystack wheel that
    fits the target's python into its own folder there, /var/lib/orch/tools; it uses
    ptrace: root in the container), reads each frame's source with the target's python,
    and reads the wait graph from it: a thread stopped on a `with LOCK:` line waits for
    LOCK, a thread inside a `with LOCK:` block holds it, each lock the object its name
    resolves to through the module's imports (a context manager on the same line is no
    lock); a thread in autograd's engine waits for its CUDA device thread (pt_autograd_N),
    a Thread.join for the joined thread, a c10d collective for the peer ranks. A cycle is a
    deadlock and comes first: `DEADLOCK: A -> B -> A`, who holds and waits for what, and
    the remedy orch knows for it (--json: `cycles`, `waits`). A thread inside
    torch.compile, dynamo, inductor or FX tracing is labelled so. RUN's process is the one
    its last launch started; when that is torchrun, the stacks are its rank workers'
    (--rank N: one).
    Exit code: 0 stacks taken, 1 a deadlock or a thread waiting on a lock, 2 a
    --wheelhouse, --rank or wheel that does not fit, other codes for errors
    (docs/reference/exit-codes.md).

    \b
    Examples:
      orch stacks                       # the last run's process
      orch stacks 20261129-0915 -t drafters
      orch stacks --rank 1              # under torchrun: rank 1's worker only
      orch stacks --pid 4242 -t drafters --json
      orch stacks --wheelhouse ~/wheels   # a container with no pystack and no internet here
    """
    if pid:
        chosen = app.fleet.targets(targets)
        if len(chosen) != 1:
            raise click.UsageError("--pid names one process in one target")
        results = stacks_of(chosen[0], pid, rank=rank, wheelhouse=wheelhouse, progress=console.info)
    else:
        with RunStore() as store:
            record = store.get(run)
        names = [n for n in launched_targets(record) if not targets or n in targets]
        if not names:
            raise OrchError(f"run {record.run_id} launched nothing"
                            + (f" on {', '.join(targets)}" if targets else ""))
        # with the run's logs: a thread that died holding a lock is named as its holder
        results = [stacks for t in app.fleet.targets(names)
                   for stacks in stacks_of(t, launched_pid(record, t.name), run_logs(record, t),
                                           rank=rank, wheelhouse=wheelhouse, progress=console.info)]
    if as_json:
        console.print_json([{**vars(r)} for r in results])
    else:
        _print_deadlocks(results)
        for result in results:
            _print_stacks(result)
    return ExitCode.FAILED if any(r.locks or r.cycles for r in results) else ExitCode.OK


def _print_deadlocks(results) -> None:
    """First, one line per cycle of the wait graph (DEADLOCK: A -> B -> A), who holds what
    and waits for whom under it, and the remedy orch knows for it."""
    out, esc = console.out, console.escape
    for result in results:
        where = f"{result.target} pid {result.pid}" + (f" rank {result.rank}" if result.rank is not None else "")
        for cycle in result.cycles:
            out.print(f"[bold red]{esc(cycle['line'])}[/]" + (f"  [dim]({esc(where)})[/]" if len(results) > 1 else ""))
            out.print(f"  {esc(cycle['words'])}")
            _print_remedy(cycle.get("remedy"), indent="  ")


def _print_remedy(fix, indent: str) -> None:
    """A cycle's remedy: what breaks it, orch's switch, and the lines the run's own code needs."""
    if not fix:
        return
    out, esc = console.out, console.escape
    out.print(f"{indent}[bold]remedy[/]: {esc(fix['summary'])}; {esc(fix['switch'])}; in the run's own code:")
    for line in fix["lines"]:
        out.print(f"{indent}  [cyan]{esc(line)}[/]")


def _print_stacks(result) -> None:
    out, esc = console.out, console.escape
    rank = (f" (rank {result.rank}" + (f" of {result.world_size}" if result.world_size else "")
            + f", under torchrun pid {result.launcher_pid})") if result.rank is not None else ""
    out.print(f"[bold]== {esc(result.target)}[/] pid {result.pid}{rank}: {len(result.threads)} thread(s) "
              f"({esc(result.tool)})")
    for lock in result.locks:
        out.print(f"  [bold red]waits[/]: {esc(lock['sentence'])}")
    for wait in result.waits:
        if wait["how"] != "lock":
            out.print(f"  [bold red]waits[/]: {esc(wait['thread'])} {esc(wait['words'])}")
    for thread in result.threads:
        inside = f"  [magenta]{esc(compile_words(thread['compile']))}[/]" if thread["compile"] else ""
        out.print(f"\n  [bold]{esc(thread['label'])}[/]{inside}")
        for frame in thread["frames"][-SHOWN_FRAMES:]:
            out.print(f"    {esc(frame['file'])}:{frame['line']} in {esc(frame['function'])}"
                      + (f"\n        {esc(frame['code'])}" if frame["code"] else ""))
