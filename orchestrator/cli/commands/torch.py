"""orch grep-torch / grep-pkg, orch patch fx-tls, orch verify fx-race."""

from __future__ import annotations

import contextlib
import inspect
import signal
import threading
from typing import TYPE_CHECKING

import click

from orchestrator.ground import console, fx_states, invocation

from orchestrator.remote import payload_api
from orchestrator.ground.errors import ExitCode
from orchestrator.cli.commands.options import targets_option
from orchestrator.ground.lazy import lazy
from orchestrator.cli.commands.fanout import (JOBS_OPTION, PROGRESS_OPTION, Fanout,
                                              fanout_options, report_failures)

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.targets.fleet import GroupResult, fan_out
else:
    fan_out = lazy("orchestrator.targets.fleet", "fan_out")  # no SSH code for --help

pass_app = click.pass_obj
TARGET_OPTION = targets_option(
    "Container, group, host or HOST:VMID (repeatable; default: the inventory's default_target).")
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


# ---------------------------------------------------------------- grep-torch / grep-pkg
def _search_options(command):
    for option in reversed([
        TARGET_OPTION,
        click.option("-F", "--fixed-strings", "fixed", is_flag=True, help="PATTERN is a plain string."),
        click.option("-w", "--word", is_flag=True, help="Match whole words only."),
        click.option("-i", "--ignore-case", is_flag=True, help="Ignore case."),
        click.option("-C", "--context", type=click.IntRange(0, 50), default=0, metavar="N",
                     help="Show N lines around each hit."),
        click.option("--def", "definition", is_flag=True,
                     help="PATTERN is a name (or Class.method): find where it is defined."),
        click.option("--show", is_flag=True, help="With --def: print each definition's whole body."),
        click.option("--engine", type=click.Choice(["auto", "rg", "python"]), default="auto",
                     show_default=True, help="ripgrep when the container has it, else Python."),
        click.option("--max-hits", type=click.IntRange(1), default=200, show_default=True,
                     help="Stop after this many hits per target (the output says so)."),
        JSON_OPTION,
        JOBS_OPTION,
        PROGRESS_OPTION,
    ]):
        command = option(command)
    return command


@click.command("grep-torch")
@click.argument("pattern")
@_search_options
@pass_app
def grep_torch(app, pattern, **options):
    """Search the installed torch source in each target's venv (torch is never imported).

    PATTERN is a regular expression (Python syntax), or a plain string with -F; it is data,
    never shell. Hits print as torch/fx/_symbolic_trace.py:70:<line>.
    Exit code: 0 hits found, 1 none, other codes for errors (docs/reference/exit-codes.md).

    \b
    Examples:
      orch grep-torch _is_fx_tracing_flag
      orch grep-torch --def is_fx_symbolic_tracing --show
      orch grep-torch --def Tracer.trace --show -t drafters
      orch grep-torch -F 'config.error_on_nested_fx_trace' -C 2 -t all-drafters --json
    """
    return _search(app, "torch", pattern, **options)


@click.command("grep-pkg")
@click.argument("package")
@click.argument("pattern")
@_search_options
@pass_app
def grep_pkg(app, package, pattern, **options):
    """Search any installed package's source (transformers, triton, ...) like grep-torch.

    \b
    Examples:
      orch grep-pkg transformers 'flex_attention' -w
      orch grep-pkg triton --def autotune --show
    """
    return _search(app, package, pattern, **options)


def _search(app, package, pattern, *, targets, fixed, word, ignore_case, context, definition,
            show, engine, max_hits, as_json, jobs, progress):
    if show and not definition:
        raise click.UsageError("--show goes with --def (it prints a definition's body)")
    chosen = app.fleet.targets(targets)
    results = Fanout(app, chosen, jobs, progress, as_json).run(lambda target: payload_api.search(
        target, pattern, package=package, fixed=fixed, word=word, ignore_case=ignore_case,
        context=context, mode="def" if definition else "grep", show=show, engine=engine,
        max_hits=max_hits))
    _print_each(results, as_json, lambda target, outcome: _print_search(target, outcome, max_hits))
    return _search_exit_code(results)


def _print_each(results: GroupResult, as_json: bool, print_outcome) -> None:
    """One JSON list of every target's outcome, or each target's in turn; over several
    targets the failed ones are listed at the end, one line each (one target: its error)."""
    if as_json:
        console.print_json(results.rows())
        return
    for target in results.items:
        if target in results.succeeded:
            print_outcome(target, results.succeeded[target])
        elif len(results.items) == 1:
            console.target_error(target.name, results.failed[target])
    if len(results.items) > 1:
        report_failures(results)


def _print_search(target, outcome, max_hits) -> None:
    console.out.print(f"[bold]== {console.escape(target.describe())}[/]: "
                      f"{outcome.get('package', 'torch')} {outcome.get('version')} in "
                      f"{console.escape(str(outcome.get('site_packages')))} "
                      f"(engine: {outcome.get('engine')}"
                      f"{', ' + outcome['engine_reason'] if outcome.get('engine_reason') else ''})")
    for match in outcome["matches"]:
        if match["event"] == "def":
            _print_definition(match)
        else:
            _print_hit(match)
    if outcome.get("truncated"):
        console.warn(f"{target.name}: output cut at {max_hits} hits; narrow the pattern or raise --max-hits")
    elif not outcome["matches"]:
        console.info(f"{target.name}: no match")


def _print_hit(hit: dict) -> None:
    for line, text in hit.get("before", []):
        console.write(f"{hit['path']}-{line}-{text}\n")
    console.write(f"{hit['path']}:{hit['line']}:{hit['text']}\n")
    for line, text in hit.get("after", []):
        console.write(f"{hit['path']}-{line}-{text}\n")
    if hit.get("before") or hit.get("after"):
        console.write("--\n")


def _print_definition(found: dict) -> None:
    console.write(f"{found['path']}:{found['line']}: {found.get('kind')} {found.get('qualname')}\n")
    body = found.get("body")
    if body:
        for number, text in enumerate(body.splitlines(), start=found["line"]):
            console.write(f"{number:>6}  {text}\n")
        console.write("\n")
    console.flush()


def _search_exit_code(results: GroupResult) -> int:
    if not results.ok:
        return results.first_error().exit_code
    return ExitCode.OK if any(o["matches"] for o in results.succeeded.values()) else ExitCode.FAILED


# ---------------------------------------------------------------- patch fx-tls
@click.group("patch")
def patch():
    """Patches orch applies to the installed torch of a container.

    \b
    Example:
      orch patch fx-tls status
    """


@contextlib.contextmanager
def finish_before_interrupt(action: str):
    """While a patch apply/revert runs, the first Ctrl-C lets it finish instead of leaving it
    behind: the payload goes on in the target anyway (a channel closing does not stop it), so
    leaving at once would report "interrupted" for a change that then completes. Yields a
    list that is non-empty once Ctrl-C was pressed; a second Ctrl-C raises KeyboardInterrupt
    (the caller says the outcome is not known)."""
    pressed: list[float] = []

    def on_interrupt(number, frame):
        if pressed:
            raise KeyboardInterrupt
        pressed.append(1.0)
        console.warn(f"interrupted: letting the {action} in progress finish (it takes seconds "
                     "and leaves no half-patched file); Ctrl-C again to leave without knowing "
                     "its outcome")

    # only where the command owns the process's signals (the direct path): these commands
    # never run in the agent
    with invocation.current().signal_handler(signal.SIGINT, on_interrupt):
        yield pressed


PATCH_EXIT_CODES = """\b
Exit code: 0 when every target ended fine; 1 when one is vulnerable, drifted or unknown
(status, diff) or the action was refused; 21 when another orch patch action on that
torch held its lock past the payload's 15 s wait (readers share the lock: concurrent
status calls never refuse each other); other codes for errors (docs/reference/exit-codes.md)."""

STATUS_LINES = """\b
status  vulnerable, fixed-upstream, patched (when, which orch), drifted, or unknown;
        then one row per shared state: VULNERABLE, thread-local upstream, patched by
        orch, DRIFTED, not in this release, or UNKNOWN shape, with file:line and why
diff    what apply would change; changes nothing
apply   back up, rewrite atomically, check it compiles and imports, record it
revert  restore the original bytes, checked against the wheel's RECORD hashes"""


def _patch_command(patch_set: str, summary: str, examples: str):
    @click.argument("action", type=click.Choice(list(payload_api.PATCH_ACTIONS)))
    @TARGET_OPTION
    @JSON_OPTION
    @fanout_options
    @pass_app
    def command(app, action, targets, as_json, jobs, progress):
        return _run_patch(app, patch_set, action, targets, as_json, jobs, progress)

    parts = (summary, STATUS_LINES, PATCH_EXIT_CODES, examples)
    command.__doc__ = "\n\n".join(inspect.cleandoc(part) for part in parts)
    return patch.command(patch_set)(command)


fx_threads = _patch_command("fx-threads", """Make every FX state that concurrent compiles share thread-local: status | diff | apply | revert.

    The FX tracing flag (torch 2.1-2.13; upstream since 2.14), FX's node-meta state of
    torch/fx/traceback.py (current_meta and its flags; still shared in 2.14.1: `KeyError:
    'custom'` from annotate() in one thread while another leaves preserve_node_meta()),
    and FX's trace-time patching (nn.Module.__call__/__getattr__, math.* and
    CURRENT_PATCHER: made to act only in the tracing thread).
    Over a torch patched by `orch patch fx-tls`, apply adds the rest; revert undoes both.""",
    """\b
    Examples:
      orch patch fx-threads status -t all-drafters
      orch patch fx-threads diff -t drafters
      orch patch fx-threads apply -t drafters
      orch verify fx-threads -t drafters
      orch patch fx-threads revert -t drafters --json""")

fx_tls = _patch_command("fx-tls", """Make torch's FX tracing flag thread-local: status | diff | apply | revert.

    The flag alone (orch's first patch); `orch patch fx-threads` covers every FX state
    threads share, and status here names those the flag patch leaves shared.""",
    """\b
    Examples:
      orch patch fx-tls status -t all-drafters
      orch patch fx-tls diff -t drafters
      orch patch fx-tls apply -t drafters
      orch patch fx-tls revert -t drafters --json""")


def _run_patch(app, patch_set, action, targets, as_json, jobs=None, progress=None):
    chosen = app.fleet.targets(targets)
    changes = action in ("apply", "revert")
    fanout = Fanout(app, chosen, jobs, progress, as_json)
    with (finish_before_interrupt(action) if changes else contextlib.nullcontext()) as ctrl_c:
        try:
            results = fanout.run(lambda target: payload_api.fx_patch(
                target, action, patch_set=patch_set))
        except KeyboardInterrupt:
            # The second Ctrl-C: the payload goes on without us; say what is known.
            names = " ".join(f"-t {t.name}" for t in chosen)
            console.error(f"interrupted twice: left while the {action} was in progress; whether it "
                          f"completed is not known: `orch patch {patch_set} status {names}` tells")
            return ExitCode.INTERRUPTED
        # still under the handler: a Ctrl-C while the outcome is printed is "after it
        # finished", never Python's bare KeyboardInterrupt ("interrupted" for a done change)
        _print_each(results, as_json, lambda target, outcome: _print_patch(target, action, outcome))
        if changes and ctrl_c:
            done = [t.name for t in results.succeeded]
            console.warn(f"interrupted, after the {action} finished"
                         + (f" on {', '.join(done)} (its outcome is above)" if done else ""))
            return ExitCode.INTERRUPTED
        return _patch_exit_code(action, results)


def _print_patch(target, action, outcome) -> None:
    header = f"[bold]{console.escape(target.name)}[/] torch {outcome.get('torch_version')}: "
    console.out.print(header + fx_states.meaning(outcome.get("status")))
    _print_state_rows(outcome.get("states") or [])
    if action == "diff":
        console.write(outcome.get("diff") or "(no change)\n")
        return
    message = outcome.get("message")
    if message:
        console.out.print("  " + console.escape(message))
    for item in outcome.get("files", []) or []:
        details = [f"{key}={item[key]}" for key in ("state", "action", "dist_record") if key in item]
        console.out.print(f"  {console.escape(item.get('path', '?'))}  {' '.join(details)}")
        if item.get("why"):
            console.out.print(f"    why: {console.escape(item['why'])}")
    for key, words in (("leftover_temp_files", "left by a killed orch (apply/revert remove it)"),
                       ("orphan_backups", "a backup without a record (orch never deletes it)")):
        for path in outcome.get(key) or []:
            console.out.print(f"  {console.escape(path)}  {words}")


def _print_state_rows(rows) -> None:
    """One row per shared state: what it is, where it stands, where and why."""
    for row in rows:
        if not isinstance(row, dict):
            continue
        outside = "" if row.get("in_set", True) else "  (not in this patch set)"
        console.out.print(f"  {console.escape(str(row.get('title', row.get('state'))))}: "
                          f"{fx_states.row_meaning(row.get('status'))}  "
                          f"{console.escape(str(row.get('where', '')))}{outside}")
        if row.get("why"):
            console.out.print(f"    {console.escape(str(row['why']))}")


def _patch_exit_code(action, results: GroupResult) -> int:
    if not results.ok:
        return results.first_error().exit_code
    if action in ("status", "diff"):
        bad = [o for o in results.succeeded.values() if o.get("status") in fx_states.UNSAFE]
        return ExitCode.FAILED if bad else ExitCode.OK
    return ExitCode.OK


# ---------------------------------------------------------------- verify fx-race
@click.group("verify")
def verify():
    """Checks that run a reproducer inside the container.

    \b
    Example:
      orch verify fx-race
    """


@verify.command("fx-race")
@TARGET_OPTION
@click.option("--trials", type=click.IntRange(1, 100), default=10, show_default=True,
              help="Runs of the cross-thread reproducer and of its same-thread control.")
@JSON_OPTION
@pass_app
def fx_race(app, targets, trials, as_json):
    """Run the deterministic FX race reproducer with each target's venv python.

    Thread A holds an FX trace open; thread B calls a freshly compiled function. A vulnerable
    torch raises in every trial; a patched or upstream-fixed one in none, while the
    same-thread control must still raise (the guard is still on).
    Exit code: 0 when safe (fixed), 1 when vulnerable, the guard is off, or inconclusive.

    \b
    Examples:
      orch verify fx-race -t drafters
      orch verify fx-race -t all-drafters --trials 20 --json
    """
    return _reproduce_on_each(app, targets, trials, as_json, lambda event: (
        f"trial {event.get('index')}: cross-thread "
        f"{'RAISED' if event.get('cross_thread_raised') else 'ok'}, same-thread control "
        f"{'raised' if event.get('same_thread_raised') else 'DID NOT RAISE'}"),
        _print_race, "verdict")


def _reproduce_on_each(app, targets, trials, as_json, describe, print_outcome, verdict_key,
                       **payload_options) -> int:
    """What both verify commands do: the fx_race payload on every target side by side, each
    trial's event as a line (`describe`), each target's outcome printed (`print_outcome`), and
    the exit code from every outcome's verdict_key."""
    chosen = app.fleet.targets(targets)
    progress = _trial_progress(as_json, describe)
    results = fan_out(chosen, lambda target: payload_api.fx_race(
        target, trials, on_event=progress(target.name), **payload_options))
    _print_each(results, as_json, print_outcome)
    return _fixed_everywhere(results, verdict_key)


def _fixed_everywhere(results: GroupResult, verdict_key: str) -> int:
    """A reproducer's exit code: a target's error first; else 0 only when every target's
    outcome says "fixed" under verdict_key."""
    if not results.ok:
        return results.first_error().exit_code
    return (ExitCode.OK if all(o.get(verdict_key) == "fixed" for o in results.succeeded.values())
            else ExitCode.FAILED)


def _trial_progress(as_json: bool, describe):
    """progress(target name) -> the payload's on_event: each trial event as one line
    (`describe(event)`), one writer at a time (targets run side by side); nothing with --json."""
    lock = threading.Lock()

    def progress(name):
        def on_event(event):
            if not as_json and event.get("event") == "trial":
                with lock:
                    console.info(f"{name}: {describe(event)}")
        return on_event
    return progress


def _print_race(target, outcome) -> None:
    console.out.print(
        f"[bold]{console.escape(target.name)}[/] torch {outcome.get('torch_version')}: "
        f"cross-thread raised {outcome.get('cross_thread_raised')}/{outcome.get('trials')}, "
        f"same-thread control raised {outcome.get('same_thread_raised')}/"
        f"{outcome.get('same_thread_trials')} -> [bold]{outcome.get('verdict')}[/]")
    if outcome.get("cross_thread_other_fx_leak"):
        console.out.print(f"  {outcome['cross_thread_other_fx_leak']} cross-thread call(s) failed with "
                          "FX's other process-wide leak (its patched torch.nn.Module.__call__: "
                          "'module is not installed as a submodule'), not the flag")


RACE_TITLES = fx_states.STATE_TITLES


@verify.command("compile-deadlock")
@TARGET_OPTION
@click.option("--drafters", type=click.IntRange(2, 16), default=3, show_default=True,
              help="Threads compiling flex_attention side by side on one GPU.")
@click.option("--steps", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Forward + backward steps per thread.")
@click.option("--hang-after", "hang_seconds", type=click.IntRange(10, 3600), default=90, show_default=True,
              metavar="S", help="Seconds the unchanged run may take before it counts as hung (and is killed).")
@JSON_OPTION
@pass_app
def compile_deadlock(app, targets, drafters, steps, hang_seconds, as_json):
    """Reproduce the compile deadlock of threads on one GPU, then check its remedy.

    DRAFTERS threads each torch.compile(flex_attention) and run forward + backward on one
    GPU with a cold inductor cache: unchanged, a thread holding torch's compile_lock waits
    in the autograd engine for its CUDA device thread, which compiles another thread's
    backward and waits for compile_lock (it is killed after --hang-after S); then again
    with each thread calling torch.autograd.set_multithreading_enabled(False) first (its
    backward on its own thread), which must finish. On CPU backward runs on the calling
    thread, so the cycle cannot form: the check needs a GPU and says so.
    Exit code: 0 the remedied run finished (unchanged hung: reproduced; or it did not
    hang here), 1 the remedied run hung or failed, 7 no GPU on the target (nothing run).

    \b
    Examples:
      orch verify compile-deadlock -t gpu
      orch verify compile-deadlock -t gpu --drafters 3 --hang-after 60 --json
    """
    chosen = app.fleet.targets(targets)

    def progress(name):
        def on_event(event):
            if not as_json and event.get("event") == "trial":
                console.info(f"{name}: {event.get('mode')}: {event.get('outcome')} after {event.get('seconds')} s")
        return on_event

    results = fan_out(chosen, lambda target: payload_api.compile_deadlock(
        target, drafters, steps, hang_seconds, on_event=progress(target.name)))
    _print_each(results, as_json, _print_compile_deadlock)
    if not results.ok:
        return results.first_error().exit_code
    outcomes = list(results.succeeded.values())
    if any(o.get("verdict") == "remedy-failed" for o in outcomes):
        return ExitCode.FAILED
    if any(o.get("verdict") == "needs-gpu" for o in outcomes):
        return ExitCode.NEEDS_GPU
    return ExitCode.OK


COMPILE_DEADLOCK_WORDS = {
    "reproduced": "unchanged it deadlocked, with the remedy it finished",
    "not-reproduced": "unchanged it did not deadlock here (a warm cache? another torch?); with the remedy it finished",
    "remedy-failed": "with the remedy it did not finish",
}


def _print_compile_deadlock(target, outcome) -> None:
    head = f"[bold]{console.escape(target.name)}[/] torch {outcome.get('torch_version')}"
    if outcome.get("verdict") == "needs-gpu":
        console.out.print(f"{head}: [bold]needs-gpu[/]: {console.escape(outcome.get('why', ''))}")
        return
    runs = ", ".join(f"{mode} {(outcome.get(mode) or {}).get('outcome')} in {(outcome.get(mode) or {}).get('seconds')} s"
                     for mode in ("unchanged", "remedied"))
    console.out.print(f"{head}, {outcome.get('drafters')} threads on one GPU: {runs} -> "
                      f"[bold]{outcome.get('verdict')}[/]: {COMPILE_DEADLOCK_WORDS.get(outcome.get('verdict'), '')}")
    for mode in ("unchanged", "remedied"):
        errors = (outcome.get(mode) or {}).get("errors") or {}
        for index, error in list(errors.items())[:3]:
            console.out.print(f"  {mode} thread {index}: {console.escape(str(error))}")


@verify.command("fx-threads")
@TARGET_OPTION
@click.option("--trials", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Runs of each state's reproducer and of its same-thread control.")
@JSON_OPTION
@pass_app
def fx_threads_race(app, targets, trials, as_json):
    """Run a deterministic reproducer per FX state threads share, and its same-thread control.

    \b
    FX tracing flag: thread A holds an FX trace open, thread B calls a freshly compiled
      function (vulnerable: B raises); control: the same call inside a trace in one
      thread still raises.
    FX node-meta state: B enters preserve_node_meta(), A opens annotate(), B leaves, A
      leaves (vulnerable: KeyError 'custom' in A, and B sees A's annotation); control:
      nested preserve_node_meta()/annotate() in one thread restore what they saved.
    FX trace-time patching: A holds a symbolic_trace open, B calls a plain nn.Linear
      (vulnerable: NameError 'module is not installed as a submodule'); control: a trace
      in one thread still records its submodule calls.
    Each state is reported on its own line: vulnerable, fixed, not-applicable (this torch
    has no such state), inconclusive, or guard-disabled/control-failed.
    Exit code: 0 when every state is fixed (or not applicable), 1 otherwise.

    \b
    Examples:
      orch verify fx-threads -t drafters
      orch verify fx-threads -t all-drafters --trials 10 --json
    """
    return _reproduce_on_each(app, targets, trials, as_json, lambda event: (
        f"{RACE_TITLES.get(event.get('state', 'fx-tracing-flag'))} trial "
        f"{event.get('index')}/{event.get('trials')}"
        + (f": {event['problem']}" if event.get("problem") else "")),
        _print_state_races, "overall_verdict", states=list(fx_states.SHARED_STATES))


def _print_state_races(target, outcome) -> None:
    head = f"[bold]{console.escape(target.name)}[/] torch {outcome.get('torch_version')}"
    for row in outcome.get("states") or []:
        title = RACE_TITLES.get(row.get("state"), str(row.get("state")))
        if row.get("state") == "node-meta":
            figures = (f"KeyError 'custom' {row.get('raised')}/{row.get('trials')}, "
                       f"annotation leaked {row.get('leaked')}/{row.get('trials')}, "
                       f"same-thread control held {row.get('control_held')}/{row.get('trials')}")
        elif row.get("state") == "trace-patching":
            figures = (f"other thread's module call failed {row.get('raised')}/{row.get('trials')}, "
                       f"same-thread control held {row.get('control_held')}/{row.get('trials')}")
        else:
            figures = (f"cross-thread raised {row.get('raised')}/{row.get('trials')}, "
                       f"same-thread control raised {row.get('control_held')}/{row.get('trials')}")
        console.out.print(f"{head}: {title}: {figures} -> [bold]{row.get('verdict')}[/]")
        for problem in (row.get("problems") or [])[:3]:
            console.out.print(f"  {console.escape(str(problem))}")
