"""orch run, orch validate, orch attach, orch stop: playbooks and the runs they launch."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from orchestrator.ground import console
from orchestrator.cli.screens.run import ConsoleReporter
from orchestrator.ground.errors import ExitCode, OrchError
from orchestrator.cli.commands.options import extra_vars_option, targets_option
from orchestrator.ground.lazy import lazy

pass_app = click.pass_obj
# imported when first called: `orch run --help` needs no SSH, jinja2 or engine code
if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.config.inventory import inventory_path, load_inventory
    from orchestrator.playbook.attach import attach_run, stop_recorded_run
    from orchestrator.playbook.engine import check_node_steps, resolve_specs, run_playbook
    from orchestrator.playbook.loader import load_playbook, normalize_extra_vars
else:
    inventory_path = lazy("orchestrator.config.inventory", "inventory_path")
    load_inventory = lazy("orchestrator.config.inventory", "load_inventory")
    attach_run = lazy("orchestrator.playbook.attach", "attach_run")
    stop_recorded_run = lazy("orchestrator.playbook.attach", "stop_recorded_run")
    resolve_specs = lazy("orchestrator.playbook.engine", "resolve_specs")
    check_node_steps = lazy("orchestrator.playbook.engine", "check_node_steps")
    run_playbook = lazy("orchestrator.playbook.engine", "run_playbook")
    load_playbook = lazy("orchestrator.playbook.loader", "load_playbook")
    normalize_extra_vars = lazy("orchestrator.playbook.loader", "normalize_extra_vars")
ECHO_CHOICE = click.Choice(["auto", "all", "events", "none"])


def _reporter(as_json: bool, echo: str, verbose: bool = False):
    return ConsoleReporter(json_mode=as_json, echo=echo, verbose=verbose)


def _record_json(record) -> dict:
    data = record.to_dict()
    data.pop("metrics", None)  # `orch runs show RUN --json` has the series
    data["metric_points"] = len(record.metrics)
    return data


@click.command("run")
@click.argument("playbook", type=click.Path(dir_okay=False))
@targets_option("Run on this container or group instead of the playbook's targets (repeatable).")
@extra_vars_option("Set a playbook variable (VALUE read as YAML: 50, true, [a, b]); @FILE.yaml too.")
@click.option("--dry-run", is_flag=True, help="Print every step with its rendered commands; touch nothing.")
@click.option("--json", "as_json", is_flag=True, help="Progress on stderr, the run's record as JSON on stdout.")
@click.option("--echo", type=ECHO_CHOICE, default="auto", show_default=True,
              help="Log lines the monitor prints: all, events (not metric lines), none; auto: "
                   "events on a terminal (a live table shows the metrics), all otherwise.")
@click.option("-v", "--verbose", is_flag=True,
              help="Print every line of the steps' own output (pip's, a shell command's) as it "
                   "comes, instead of a progress line per step.")
@pass_app
def run_command(app, playbook, targets, extra_vars, dry_run, as_json, echo, verbose):
    """Run PLAYBOOK: bootstrap, patch, launch detached, monitor, collect, record.

    Every run is recorded (`orch runs list`). A launched training run is detached: it
    survives a dropped SSH link and orch's own exit; `orch attach RUN` follows it again.

    A step's own output is summarised in a line that says how far it got; all of it is
    kept in the run's folder (steps/N-KIND-TARGET.log, the path is shown when the step
    ends), and a failed step shows its last lines. -v prints every line instead.

    \b
    Exit codes:
      0   ok                        11  hang (stopped after hang_after)
      2   bad playbook or options   12  degraded throughput / recompile limit
      10  failed (FX race, traceback, OOM, NCCL, non-zero exit, killed, a failed step)
      13  a target was unreachable

    \b
    Examples:
      orch run playbooks/dflash.yaml
      orch run playbooks/dflash-demo.yaml                    # the whole story on this machine
      orch run playbooks/dflash-local.yaml -e race=true -e patch=false
      orch -i sandbox run playbooks/dflash-sandbox.yaml
      orch run playbooks/dflash.yaml -t drafters -e steps=500 -e hang_after=300
      orch run playbooks/dflash.yaml --dry-run
      orch run playbooks/dflash.yaml -v                      # pip's every line, as it comes
    """
    record = run_playbook(playbook, targets=list(targets), extra_vars=list(extra_vars),
                          inventory=app.inventory_option, trust_on_first_use=app.trust_on_first_use,
                          reporter=_reporter(as_json, echo, verbose), dry_run=dry_run)
    if as_json:
        console.print_json(_record_json(record) if not dry_run else {"dry_run": True, "run_id": record.run_id})
    return ExitCode.OK if dry_run else record.exit_code


@click.command("validate")
@click.argument("playbook", type=click.Path(dir_okay=False))
@targets_option("The targets the run would get with -t (checked instead of the playbook's).")
@extra_vars_option("Variables the run would get with -e (they count as defined).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def validate_command(app, playbook, targets, extra_vars, as_json):
    """Check PLAYBOOK without running it: keys, types, step kinds, templates, targets.

    Every mistake is reported as FILE:LINE:COL with what is wrong; exit code 2.
    With -t, the targets are checked as `orch run -t` would use them.

    \b
    Examples:
      orch validate playbooks/dflash.yaml
      orch validate playbooks/dflash.yaml -e race=true --json
      orch -i sandbox validate playbooks/ddp-two-nodes.yaml -t sb1-200 -t sb2-200
    """
    try:
        book = load_playbook(playbook, normalize_extra_vars(list(extra_vars)))
        warnings = _check_targets(app, book, list(targets))
    except OrchError as error:
        if as_json:
            console.print_json({"ok": False, "playbook": playbook, "error": str(error)})
            return error.exit_code
        raise
    steps = [{"index": s.index + 1, "kind": s.kind, "name": s.name, "where": s.loc.where()}
             for s in book.steps]
    if as_json:
        console.print_json({"ok": True, "playbook": playbook, "name": book.name,
                            "targets": list(targets) or book.targets, "vars": sorted(book.vars), "steps": steps,
                            "warnings": warnings, "sha256": book.sha256})
        return
    console.out.print(f"[green]ok[/]: {console.escape(playbook)}: {book.name}, {len(steps)} steps "
                      f"({', '.join(s['kind'] for s in steps)}); targets: "
                      f"{', '.join(targets or book.targets) or '(give -t)'}")
    for warning in warnings:
        console.warn(warning)


def _check_targets(app, book, targets: list[str]) -> list[str]:
    """TARGETS (-t), else the playbook's, against the inventory when there is one to check
    against (the engine's own resolution: an unknown name in the playbook is an error at its
    file:line:col), and the steps that span them (a job's nodes)."""
    if not (targets or book.targets):
        return ["the playbook names no targets: `orch run` will need -t TARGET"]
    path = inventory_path(app.inventory_option)
    if os.path.exists(path):
        specs = resolve_specs(book, load_inventory(path), targets)
        check_node_steps(book, [spec.name for spec in specs])
    elif targets:
        return [f"no inventory at {path}: the targets {', '.join(targets)} were not checked"]
    return []


@click.command("attach")
@click.argument("run", default="last")
@click.option("--json", "as_json", is_flag=True, help="Progress on stderr, the record as JSON on stdout.")
@click.option("--echo", type=ECHO_CHOICE, default="auto", show_default=True,
              help="Which log lines to print (see orch run --help).")
@pass_app
def attach_command(app, run, as_json, echo):
    """Follow a launched run again: its log from the start, live progress, the verdict.

    For a run whose orch was killed, interrupted or lost its link: the training went on in
    its container; attach monitors it to its end, runs the playbook's collect steps and
    records the verdict. RUN is a run id, a unique prefix, or 'last' (the default).
    A run whose orch was killed before it launched anything is recorded as abandoned.
    Exit codes as for `orch run` (abandoned: 10).

    \b
    Examples:
      orch attach last
      orch attach 20261129-0915
    """
    record = attach_run(run, inventory=app.inventory_option,
                        trust_on_first_use=app.trust_on_first_use, reporter=_reporter(as_json, echo))
    if as_json:
        console.print_json(_record_json(record))
    return record.exit_code if record.exit_code is not None else ExitCode.FAILED


@click.command("stop")
@click.argument("run", default="last")
@targets_option("Stop it on these targets only.")
@click.option("--grace", type=click.FloatRange(0, 3600), default=10.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def stop_command(app, run, targets, grace, as_json):
    """Stop a launched run: SIGTERM to its process group, SIGKILL after the grace period.

    The run's processes outside its group (torchrun's workers, each in a session of its
    own) are SIGKILLed once it ended. A run over many nodes is stopped on every node.
    A run whose orch was killed before it launched anything is recorded as abandoned.

    \b
    Examples:
      orch stop last
      orch stop 20261129-0915 --grace 30
    """
    record, results = stop_recorded_run(run, grace=grace, target_names=list(targets),
                                        inventory=app.inventory_option,
                                        trust_on_first_use=app.trust_on_first_use)
    if as_json:
        console.print_json({"run_id": record.run_id, "verdict": record.verdict, "targets": results})
    elif not results:
        console.info(f"run {record.run_id} launched nothing: recorded as {record.verdict}")
    else:
        for item in results:
            if "error" in item:
                console.target_error(item["target"], item["error"])
            elif item.get("already"):
                console.out.print(f"{item['target']}: not running ({item.get('state')}"
                                  + (f", exit {item.get('exit_code')}" if item.get("exit_code") is not None else "")
                                  + ")")
            else:
                console.out.print(f"{item['target']}: stopped with {item.get('sent')} "
                                  f"(exit {item.get('exit_code')}, signal {item.get('signal')})")
    return ExitCode.FAILED if any("error" in r for r in results) else ExitCode.OK
