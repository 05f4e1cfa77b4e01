"""orch runs list|show|compare|pin|unpin, orch report, orch nightly, orch schedule."""

from __future__ import annotations

import getpass
import os
import shlex
from typing import TYPE_CHECKING

import click
from rich.console import Console

from orchestrator.ground import console, paths
from orchestrator.cli.screens.run import ConsoleReporter
from orchestrator.ground.errors import ConfigError, ExitCode, OrchError
from orchestrator.cli.commands.options import extra_vars_option, targets_option
from orchestrator.ground.lazy import LazyModule, lazy
from orchestrator.ground.verdicts import RUNNING
from orchestrator.runs import acks as acks_mod
from orchestrator.runs import changes as changes_mod
from orchestrator.runs import controller
from orchestrator.runs.baseline import choose_baseline
from orchestrator.runs.compare import DEFAULT_THRESHOLD, compare, is_problem, throughput
from orchestrator.runs.model import now_iso
from orchestrator.runs.store import RunStore

# imported when first used: `orch runs --help` needs no engine, SSH or jinja2
if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.nightly import rerun as nightly_mod
    from orchestrator.nightly import schedule as sched
    from orchestrator.runs import history as history_mod
    from orchestrator.playbook.loader import parse_extra_vars
    from orchestrator.runs.report import render_html, render_markdown, write_reports
else:
    nightly_mod = LazyModule("orchestrator.nightly.rerun")
    sched = LazyModule("orchestrator.nightly.schedule")
    history_mod = LazyModule("orchestrator.runs.history")
    parse_extra_vars = lazy("orchestrator.playbook.loader", "parse_extra_vars")
    render_html = lazy("orchestrator.runs.report", "render_html")
    render_markdown = lazy("orchestrator.runs.report", "render_markdown")
    write_reports = lazy("orchestrator.runs.report", "write_reports")

pass_app = click.pass_obj
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
THRESHOLD_OPTION = click.option(
    "--threshold", metavar="FRACTION", default=None,
    help=f"Throughput drop that counts as a regression: 0.1 or 10% "
         f"(default {DEFAULT_THRESHOLD:.0%}, or nightly.yaml's threshold).")


def _store():
    return RunStore()


def _threshold(value) -> float:
    """--threshold, else nightly.yaml's, else 10 %: compare and report judge like nightly."""
    return nightly_mod.load_config().threshold if value is None else nightly_mod.parse_threshold(value)


def _wide():
    """The terminal's console, or when piped (grep, less) a 200-column one: rich would
    squeeze a table into 80 columns and cut the run ids."""
    if console.out.is_terminal:
        return console.out
    return Console(width=200, highlight=False, soft_wrap=True)


def _tok(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _torch(record) -> str:
    return ", ".join(sorted({t.torch_version for t in record.targets if t.torch_version})) or "-"


def _fx(record) -> str:
    return ", ".join(sorted({t.fx_tls_state for t in record.targets if t.fx_tls_state})) or "-"


# ---------------------------------------------------------------- orch runs ...
@click.group("runs")
def runs():
    """The run history: every `orch run` and `orch nightly`, in the run store.

    The store is SQLite at $ORCH_STORE, else $ORCH_DATA_DIR/runs.sqlite
    (default ~/.local/share/orch/runs.sqlite). A RUN is a run id, a unique prefix of one,
    `last`, or `last~N` (the Nth run before the last).

    \b
    Examples:
      orch runs list --last 10
      orch runs show last
      orch runs compare last~1 last
      orch runs changes playbooks/dflash.yaml
      orch runs pin 20261129-0215
      orch runs abandon last     # a run whose orch was killed
    """


@runs.command("list")
@click.option("--playbook", "-p", metavar="PLAYBOOK", help="Only runs of this playbook (path or name).")
@click.option("--last", "-n", "last", type=click.IntRange(1), metavar="N", help="Only the N newest runs.")
@JSON_OPTION
def runs_list(playbook, last, as_json):
    """List recorded runs, newest first.

    \b
    Examples:
      orch runs list
      orch runs list --playbook playbooks/dflash.yaml --last 7
      orch runs list --json | jq '.[0].verdict'
    """
    with _store() as store:
        records = store.list(playbook=playbook, last=last)
        pins = set(store.pins().values())
        # list() leaves the metric series out; throughput needs them unless the summary has it.
        rates = {r.run_id: throughput(r if r.summary.get("total_tok_s") else store.get(r.run_id))
                 for r in records}
    if as_json:
        console.print_json([_list_item(r, rates[r.run_id], r.run_id in pins) for r in records])
        return
    if not records:
        console.info("no runs recorded yet" + (f" for {playbook}" if playbook else "")
                     + f" (store {paths.store_path()})")
        return
    gone = {r.run_id: r for r in records if controller.controller_state(r) == controller.GONE}
    rows = [[r.run_id + (" *" if r.run_id in pins else ""),
             os.path.splitext(os.path.basename(r.playbook))[0],
             r.started_at[:16].replace("T", " "),
             r.verdict + (" (controller gone)" if r.run_id in gone else ""),
             _tok(rates[r.run_id]["total"]), _torch(r), _fx(r),
             ", ".join(sorted({f.signature for f in r.findings if is_problem(f.signature)})) or "-"]
            for r in records]
    # In 80 columns the least needed columns give way (the run id holds its start, UTC)
    # rather than every cell wrapping.
    left_out = console.table(LIST_COLUMNS, rows, out=_wide(), no_wrap=("RUN", "STARTED", "TOK/S"),
                             optional=("STARTED", "FINDINGS", "TORCH", "PLAYBOOK"))
    if left_out:
        console.info(f"({', '.join(left_out)} left out at this width: a wider terminal or "
                     "--json shows them)")
    if pins & {r.run_id for r in records}:
        console.info("* pinned baseline")
    for r in gone.values():
        console.warn(f"run {r.run_id}: its orch is gone; {controller.settle_hint(r)}")


LIST_COLUMNS = ["RUN", "PLAYBOOK", "STARTED", "VERDICT", "TOK/S", "TORCH", "FX-TLS", "FINDINGS"]


def _list_item(record, tp: dict, pinned: bool) -> dict:
    return {"run_id": record.run_id, "playbook": record.playbook, "name": record.name,
            "started_at": record.started_at, "ended_at": record.ended_at,
            "verdict": record.verdict, "exit_code": record.exit_code,
            "total_tok_s": tp["total"], "per_drafter_tok_s": tp["per_drafter"],
            "torch": {t.name: t.torch_version for t in record.targets},
            "fx_tls": {t.name: t.fx_tls_state for t in record.targets},
            "findings": sorted({f.signature for f in record.findings}),
            "problems": sorted({f.signature for f in record.findings if is_problem(f.signature)}),
            "artifacts_dir": record.artifacts_dir, "pinned": pinned,
            "controller_state": controller.controller_state(record)}


@runs.command("show")
@click.argument("run")
@click.option("--metrics", "with_metrics", is_flag=True, help="With --json: include the metric series.")
@JSON_OPTION
def runs_show(run, with_metrics, as_json):
    """Show one run: verdict, targets, steps, throughput, findings.

    \b
    Examples:
      orch runs show last
      orch runs show 20261129-0215 --json --metrics
    """
    with _store() as store:
        record = store.get(run)
        pinned = store.pinned(record.playbook) == record.run_id
    if as_json:
        data = record.to_dict()
        if not with_metrics:
            data.pop("metrics")
            data["metric_points"] = len(record.metrics)
        data["throughput"] = throughput(record)
        data["pinned"] = pinned
        data["controller_state"] = controller.controller_state(record)
        console.print_json(data)
        return
    out = console.out
    tp = throughput(record)
    out.print(f"[bold]run {record.run_id}[/]  {console.escape(record.playbook)}"
              + ("  [cyan](pinned baseline)[/]" if pinned else ""))
    out.print(f"verdict [bold]{record.verdict}[/]  exit code {record.exit_code}  "
              f"started {record.started_at}  ended {record.ended_at or '-'}")
    out.print(f"throughput {_tok(tp['total'])} tok/s total  "
              + "  ".join(f"{k} {_tok(v)}" for k, v in tp["per_drafter"].items()))
    if record.artifacts_dir:
        out.print(f"files {console.escape(record.artifacts_dir)}")
    step_logs = os.path.join(paths.run_dir(record.run_id), "steps")
    if os.path.isdir(step_logs):   # each step's whole output, kept by `orch run`'s console
        out.print(f"step output {console.escape(step_logs)}")
    if record.verdict == RUNNING:
        gone = controller.controller_state(record) == controller.GONE
        out.print(("[yellow]" if gone else "") + console.escape(controller.describe(record))
                  + ("[/]" if gone else ""))
    console.table(["TARGET", "HOST", "VMID", "TORCH", "FX-TLS", "PACKAGES"],
                  [[t.name, t.host, t.vmid, t.torch_version or "-", t.fx_tls_state or "-",
                    len(t.pip_freeze)] for t in record.targets], title="targets")
    _print_steps(record)
    for finding in record.findings:
        out.print(f"[red]{finding.signature}[/] on {finding.target}: {console.escape(finding.message)}")
        if finding.remediation:
            out.print(f"  fix: {console.escape(finding.remediation)}")


def _print_steps(record) -> None:
    """The steps table; where the messages would wrap it, each message below the table."""
    one_target = len({s.target for s in record.steps}) <= 1   # named in the targets table
    columns = ["#", "STEP", "KIND", "TARGET", "STATUS", "TIME", "MESSAGE"]
    rows = [[number, s.name, s.kind, s.target, s.status, f"{s.duration_s:.1f} s", s.message]
            for number, s in enumerate(record.steps, 1)]
    left_out = console.table(columns, rows, title="steps",
                             optional=(["TARGET"] if one_target else []) + ["MESSAGE"])
    if "MESSAGE" in left_out:
        for number, step in enumerate(record.steps, 1):
            if step.message:
                console.out.print(console.escape(f"  {number} {step.name}: {step.message}"))


@runs.command("abandon")
@click.argument("run")
@click.option("--force", is_flag=True,
              help="Also when its controller cannot be checked (it ran on another machine).")
def runs_abandon(run, force):
    """Record a running RUN whose orch (its controller) is gone as abandoned.

    For a record that says "running" although the orch that ran it was killed (kill -9, a
    crash, the machine went down). Processes it launched in containers are left as they
    are: `orch attach RUN` follows them to their end instead, `orch stop RUN` ends them.
    Refused while its controller still runs on this machine.
    Exit code: 0 recorded, 1 refused.

    \b
    Examples:
      orch runs abandon last
      orch runs abandon 20261129-0915 --force
    """
    with _store() as store:
        record = store.get(run)
        state = controller.controller_state(record)
        if state is None:
            raise OrchError(f"run {record.run_id} already ended as {record.verdict}")
        if state == controller.ALIVE or (state == controller.UNKNOWN and not force):
            raise OrchError(f"run {record.run_id} is not abandoned: {controller.describe(record)}",
                            hint=None if state == controller.ALIVE else
                            "if that orch is gone, rerun with --force")
        controller.mark_abandoned(store, record, controller.abandoned_because(record)
                                  + f"; marked with `orch runs abandon {record.run_id}`")
    console.info(f"run {record.run_id} recorded as abandoned")


@runs.command("compare")
@click.argument("base")
@click.argument("new")
@THRESHOLD_OPTION
@JSON_OPTION
def runs_compare(base, new, threshold, as_json):
    """Compare run NEW with run BASE: throughput per drafter and total, verdict, torch
    version, fx-tls patch state, package differences (pip freeze), regressions.

    Exit code: 0 no regression, 20 NEW regressed against BASE.

    \b
    Examples:
      orch runs compare last~1 last
      orch runs compare 20261128-0200 20261129-0200 --threshold 5%
      orch runs compare last~1 last --json | jq .regressions
    """
    with _store() as store:
        base_record, new_record = store.get(base), store.get(new)
    result = compare(base_record, new_record, _threshold(threshold))
    if as_json:
        console.print_json(result.to_dict())
    else:
        _print_comparison(result, base_record, new_record)
    return ExitCode.REGRESSION if result.regressed else ExitCode.OK


@runs.command("changes")
@click.argument("playbook")
@click.option("--nights", type=click.IntRange(changes_mod.MIN_NIGHTS, 365),
              default=changes_mod.HISTORY_NIGHTS, show_default=True, metavar="N",
              help="Analyse the newest N nights of the playbook's newest shape.")
@click.option("--all", "show_all", is_flag=True,
              help="Also the changes of spread and those no longer in effect.")
@JSON_OPTION
def runs_changes(playbook, nights, show_all, as_json):
    """The change points in PLAYBOOK's history: for the total tok/s and each worker, the
    night the level changed, by how much (with a 95 % interval), whether it is still in
    effect, and what changed in the environment between the nights either side of it
    (torch, packages, the FX patch's states, driver, CUDA, GPUs, container limits).

    A night is one run, or the runs of one `orch nightly --repeat N` (their mean); the
    change points are e-divisive means with a permutation test over the nights' levels,
    and the total's level since the last of them falling night by night is listed too, as a
    trend (docs/design/regressions.md).

    Exit code: 0 no slow-down in effect, 20 a level drop is in effect, 1 no run of PLAYBOOK.

    \b
    Examples:
      orch runs changes playbooks/dflash.yaml
      orch runs changes playbooks/dflash.yaml --nights 30 --all
      orch runs changes playbooks/dflash.yaml --json | jq '.change_points[].line'
    """
    with _store() as store:
        found = history_mod.playbook_history(store, playbook, nights=nights)
    shown = [c for c in found.change_points
             if show_all or (c.change.in_effect and c.change.kind != changes_mod.SPREAD)]
    in_effect = any(c.change.drop and c.change.in_effect for c in found.change_points)
    if as_json:
        console.print_json({**found.to_dict(), "slow_down_in_effect": in_effect})
    else:
        first, last = found.nights[0], found.nights[-1]
        console.out.print(f"{len(found.nights)} nights of {console.escape(playbook)}: "
                          f"{first.date} (night 1) to {last.date} (night {last.number})")
        for point in shown:
            style = "red" if point.change.drop and point.change.in_effect else "default"
            console.out.print(f"  [{style}]{console.escape(point.line())}[/]")
        hidden = len(found.change_points) - len(shown)
        if not shown:
            console.out.print("  no change of level in effect")
        if hidden:
            console.info(f"({hidden} change point(s) of spread or no longer in effect: --all)")
    return ExitCode.REGRESSION if in_effect else ExitCode.OK


def _print_comparison(result, base, new) -> None:
    out = console.out
    out.print(f"base [bold]{base.run_id}[/] ({base.verdict})  ->  new [bold]{new.run_id}[/] ({new.verdict})")
    rows = [[label, _tok(row["base"]), _tok(row["new"]),
             "-" if row["change"] is None else f"{row['change'] * 100:+.1f} %",
             "REGRESSION" if row["regressed"] else ""]
            for label, row in result.throughput["per_drafter"].items()]
    total = result.throughput["total"]
    rows.append(["total", _tok(total["base"]), _tok(total["new"]),
                 "-" if total["change"] is None else f"{total['change'] * 100:+.1f} %",
                 "REGRESSION" if total["regressed"] else ""])
    console.table(["DRAFTER", "BASE TOK/S", "NEW TOK/S", "CHANGE", ""], rows, title="throughput")
    targets = []
    for name, info in result.targets.items():
        diff = info["packages"] or {}
        targets.append([name, f"{info['torch']['base'] or '-'} -> {info['torch']['new'] or '-'}",
                        f"{info['fx_tls_state']['base'] or '-'} -> {info['fx_tls_state']['new'] or '-'}",
                        f"+{len(diff.get('added', {}))} -{len(diff.get('removed', {}))} "
                        f"~{len(diff.get('changed', {}))}" if diff else "-"])
    if targets:
        console.table(["TARGET", "TORCH", "FX-TLS", "PACKAGES"], targets, title="environment",
                      optional=["PACKAGES"])   # each package change is listed below
    for name, info in result.targets.items():
        diff = info["packages"] or {}
        for package, (old, new_version) in diff.get("changed", {}).items():
            out.print(f"  {name}: {package} {old} -> {new_version}")
        for package, version in diff.get("added", {}).items():
            out.print(f"  {name}: + {package} {version}")
        for package, version in diff.get("removed", {}).items():
            out.print(f"  {name}: - {package} {version}")
    for change in result.changes:
        style = {"regression": "bold red", "improvement": "green"}.get(change.severity, "dim")
        out.print(f"[{style}]{change.severity}[/]: {console.escape(change.message)}")
    if not result.regressed:
        out.print("[green]no regression[/]")


@runs.command("pin")
@click.argument("run")
def runs_pin(run):
    """Pin RUN as the baseline of its playbook (nightly compares with it instead of the
    last ok run, as long as a run has its shape). A new pin replaces the old one; `orch runs unpin PLAYBOOK` forgets it.

    \b
    Examples:
      orch runs pin last
      orch runs pin 20261129-0215
    """
    with _store() as store:
        record = store.pin(run)
    console.info(f"pinned run {record.run_id} ({record.verdict}) as the baseline of {record.playbook}")


@runs.command("unpin")
@click.argument("playbook")
def runs_unpin(playbook):
    """Forget the pinned baseline of PLAYBOOK (back to: the last ok run).

    \b
    Example:
      orch runs unpin playbooks/dflash.yaml
    """
    with _store() as store:
        had = store.unpin(playbook)
    console.info(f"unpinned the baseline of {playbook}" if had else f"{playbook} had no pinned run")


@runs.command("ack")
@click.argument("playbook")
@click.argument("metrics", nargs=-1, metavar="[METRIC]...")
@click.option("--reason", required=True, metavar="TEXT", help="Why the slow-down is accepted (recorded).")
@click.option("--expires", default=None, metavar="SPAN|DATE",
              help="When the acknowledgement ends: 14d, 2w, 12h or YYYY-MM-DD (default 30d).")
@click.option("--by", "by", default=None, metavar="NAME",
              help="Who acknowledges it (default: your user name).")
def runs_ack(playbook, metrics, reason, expires, by):
    """Acknowledge a known throughput slow-down of PLAYBOOK's last night: METRIC (total,
    d0, TARGET/d1, ...; none: every flagged one) stops alerting - `orch nightly` exits 0 for
    it and says "acknowledged" with who, why and until when in its reports and
    nightly.json - until it expires, the metric recovers, or the window's median has come
    down to it (the new level is the baseline). A night slower still alerts again.

    
    Examples:
      orch runs ack playbooks/dflash.yaml --reason "torch 2.14: slower compile, accepted"
      orch runs ack playbooks/dflash.yaml total d1 --reason "GPU shared with CI" --expires 2w
    """
    until = acks_mod.parse_expiry(expires or acks_mod.DEFAULT_EXPIRY)
    with _store() as store:
        night, judgement = nightly_mod.last_night(store, playbook)
        made = acks_mod.acknowledge(store, night[-1].playbook, judgement, night[-1].run_id,
                                    list(metrics), reason=reason, by=by or _user(), expires=until)
    for ack in made:
        console.info(f"{ack.metric}: {ack.level:,.0f} tok/s (usually {ack.centre:,.0f}) "
                     f"{ack.describe()}")


@runs.command("unack")
@click.argument("playbook")
@click.argument("metrics", nargs=-1, metavar="[METRIC]...")
def runs_unack(playbook, metrics):
    """Clear the acknowledgements of PLAYBOOK (of METRIC only, when given): the slow-down
    alerts again. They stay listed by `orch runs acks --all`.

    
    Example:
      orch runs unack playbooks/dflash.yaml total
    """
    with _store() as store:
        active = [a for a in store.acks(playbook) if not metrics or a["metric"] in metrics]
        for ack in active:
            store.clear_ack(ack["id"], f"removed by {_user()}", now_iso())
    if not active:
        console.info(f"{playbook} has no active acknowledgement"
                     + (f" of {', '.join(metrics)}" if metrics else ""))
    for ack in active:
        console.info(f"cleared the acknowledgement of {ack['metric']} ({ack['reason']})")


@runs.command("acks")
@click.argument("playbook", required=False)
@click.option("--all", "show_all", is_flag=True, help="Also the cleared ones, with why they cleared.")
@JSON_OPTION
def runs_acks(playbook, show_all, as_json):
    """The acknowledged slow-downs (of PLAYBOOK, or all): metric, level, who, why, until.

    
    Examples:
      orch runs acks
      orch runs acks playbooks/dflash.yaml --all --json
    """
    with _store() as store:
        rows = store.acks(playbook, cleared=show_all)
    if as_json:
        console.print_json(rows)
        return
    if not rows:
        console.info("no acknowledged slow-down" + (f" of {playbook}" if playbook else ""))
        return
    console.table(["PLAYBOOK", "METRIC", "TOK/S (USUAL)", "BY", "AT", "UNTIL", "REASON", "CLEARED"],
                  [(row["playbook"], row["metric"], f"{row['level']:,.0f} ({row['centre']:,.0f})",
                    row["by"], row["at"][:10], row["expires"][:10], row["reason"],
                    row["cleared"] or "-") for row in rows], out=_wide())


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):      # no passwd entry and no $USER (a bare container)
        return f"uid {os.getuid()}"


# ---------------------------------------------------------------- orch report
@click.command("report")
@click.argument("run", default="last")
@click.option("--html", "html_file", metavar="FILE", help="Write the HTML page here ('-' for stdout).")
@click.option("--md", "md_file", metavar="FILE", help="Write Markdown here ('-' for stdout).")
@click.option("--baseline", "baseline_ref", metavar="RUN",
              help="Compare with this run (default: the pinned or last ok run of the same shape: "
                   "targets, worker count, devices, throughput variables).")
@click.option("--no-baseline", is_flag=True, help="Leave the comparison out.")
@THRESHOLD_OPTION
def report(run, html_file, md_file, baseline_ref, no_baseline, threshold):
    """Write a report of RUN (default: last): a self-contained HTML page (charts as inline
    SVG, no external assets) and/or Markdown for a ticket. With neither --html nor --md,
    writes report.html and report.md into the run's folder and prints their paths.

    \b
    Examples:
      orch report last --html /tmp/run.html
      orch report 20261129-0215 --md - | xclip
      orch report last --baseline last~3
    """
    with _store() as store:
        record = store.get(run)
        baseline, reason = None, None
        if baseline_ref and not no_baseline:
            baseline, reason = store.get(baseline_ref), "given with --baseline"
        elif not no_baseline:
            choice = choose_baseline(store, record)
            baseline, reason = choice.record, choice.reason
        nights = nightly_mod.playbook_nights(store, record)
    kw = {"threshold": _threshold(threshold), "baseline_reason": reason, "history": nights}
    if not html_file and not md_file:
        written = write_reports(record, baseline, record.artifacts_dir or paths.run_dir(record.run_id), **kw)
        for path in written.values():
            click.echo(path)
        return
    for target, render in ((html_file, render_html), (md_file, render_markdown)):
        if not target:
            continue
        text = render(record, baseline, **kw)
        if target == "-":
            click.echo(text, nl=False)
        else:
            with open(target, "w", encoding="utf-8") as handle:
                handle.write(text)
            console.info(f"wrote {target}")


# ---------------------------------------------------------------- orch nightly
@click.command("nightly")
@click.argument("playbook", type=click.Path(dir_okay=False))
@targets_option("Container or group to run on (repeatable; default: the playbook's targets).")
@extra_vars_option("Set a playbook variable (repeatable).")
@THRESHOLD_OPTION
@click.option("--repeat", metavar="N", default=None,
              help="Run the playbook N times tonight and judge throughput on all N runs "
                   "(default 1, or nightly.yaml's repeat; at most 20).")
@click.option("--config", "config_file", metavar="FILE",
              help="Nightly config (default: $ORCH_DATA_DIR/nightly.yaml when it exists).")
@click.option("--prometheus-dir", metavar="DIR", default=None,
              help="Write the night's metrics to DIR/orch_nightly_KEY.prom for node_exporter's "
                   "textfile collector (default: nightly.yaml's prometheus_dir).")
@click.option("--notify-webhook", "webhooks", multiple=True, metavar="URL",
              help="POST a JSON summary here (repeatable; adds to the config's). Never printed.")
@click.option("--notify-command", "notify_command", metavar="ARGV", default=None,
              help="Run this command with the JSON summary on stdin; the value is split like a "
                   "shell would (shlex) into an argv, and never run through a shell.")
@click.option("--notify-on", type=click.Choice(["always", "problems", "never"]), default=None,
              help="When to notify (default always, or the config's).")
@JSON_OPTION
@pass_app
def nightly_command(app, playbook, targets, extra_vars, threshold, repeat, config_file,
                    prometheus_dir, webhooks, notify_command, notify_on, as_json):
    """Run PLAYBOOK once, unattended (for schedulers and scripts): lock, run, compare with
    the baseline (the pinned run, else the last ok run, of the same shape: targets, workers,
    devices, throughput variables), write report.html and report.md
    into the run's folder, notify, exit with the outcome.

    Throughput is judged against the measured noise of the last 20 ok runs of the same
    shape: one slow night is "suspected" (exit 0, said on one line), two slow nights in a
    row, or one far outside the noise, a regression (20). With fewer than 4 such runs
    the --threshold against the baseline judges. --repeat N runs the playbook N times in
    one night: the night's level is the mean of its runs, its samples all of theirs (a
    run that is not ok ends the night with its verdict).

    Only one nightly of a playbook runs at a time: a second exits at once with code 21.

    \b
    Exit codes:
      0   ok, or a suspected throughput drop (not yet confirmed)
      10  the run failed (FX race, traceback, OOM, non-zero exit, killed)
      11  the run hung       12  degraded throughput       13  a target was unreachable
      20  the run was ok but regressed (throughput below its noise two nights running
          or far below it, new failure signature, patch drift, torch version change)
      21  another `orch nightly` of this playbook is running

    \b
    Examples:
      orch nightly playbooks/dflash.yaml
      orch nightly playbooks/dflash.yaml -t drafters -e slow_ms=0 --threshold 5%
      orch nightly playbooks/dflash.yaml --repeat 3
      orch nightly playbooks/dflash.yaml --prometheus-dir /var/lib/node_exporter/textfile
      orch nightly playbooks/dflash.yaml --notify-command 'notify-send orch'
    """
    config = nightly_mod.load_config(config_file)
    if threshold is not None:
        config.threshold = nightly_mod.parse_threshold(threshold)
    if repeat is not None:
        config.repeat = nightly_mod.parse_repeat(repeat)
    if prometheus_dir is not None:
        config.prometheus_dir = nightly_mod.check_prometheus_dir(prometheus_dir)
    for url in webhooks:
        config.notify.webhooks.append(nightly_mod.check_webhook(url))
    if notify_command:
        argv = shlex.split(notify_command)
        if not argv:
            raise ConfigError("--notify-command is empty")
        config.notify.commands.append(argv)
    if notify_on:
        config.notify.when = notify_on
    if not os.path.isfile(playbook):
        raise ConfigError(f"no playbook {playbook}")
    outcome = nightly_mod.nightly(playbook, targets=list(targets),
                                  extra_vars=parse_extra_vars(extra_vars),
                                  inventory=app.inventory_option,
                                  trust_on_first_use=app.trust_on_first_use, config=config,
                                  # With --json, stdout carries only the summary: the run's
                                  # progress goes to stderr.
                                  reporter=ConsoleReporter(json_mode=as_json))
    summary = outcome.summary()
    if as_json:
        console.print_json({**summary, "notified": outcome.notified,
                            "prometheus_textfile": outcome.textfile})
    else:
        style = "green" if outcome.exit_code == 0 else "bold red"
        console.out.print(f"[{style}]{console.escape(summary['text'])}[/]")
        for message in summary["regressions"]:
            console.out.print(f"  [red]regression[/]: {console.escape(message)}")
        for message in summary["suspected"]:
            console.out.print(f"  [yellow]suspected[/]: {console.escape(message)}")
        for message in summary["acknowledged"]:
            console.out.print(f"  [cyan]acknowledged[/]: {console.escape(message)}")
        for line in summary["environment"]:
            console.out.print(f"  changed: {console.escape(line)}")
        console.out.print(("baseline: " + summary["baseline"] + ", " if summary["baseline"]
                           else "no baseline: ") + console.escape(summary["baseline_reason"] or ""))
        console.out.print(f"report: {summary['report_html']}")
        if outcome.textfile:
            console.out.print(f"metrics: {outcome.textfile}")
    return outcome.exit_code


# ---------------------------------------------------------------- orch schedule
@click.group("schedule")
def schedule():
    """Schedule `orch nightly` with a real scheduler: a systemd timer + service (user units
    by default, --system for /etc/systemd/system), or a crontab line where systemd is not
    running (or with --cron).

    \b
    Examples:
      orch schedule install playbooks/dflash.yaml --at 02:30
      orch schedule install playbooks/dflash.yaml --at 02:30 --cron
      orch schedule list
      orch schedule remove playbooks/dflash.yaml
    """


def _where_options(command):
    for option in reversed([
        click.option("--user", "scope", flag_value="user", default=True,
                     help="systemd user units (~/.config/systemd/user) [default]."),
        click.option("--system", "scope", flag_value="system",
                     help="systemd system units (/etc/systemd/system; needs root)."),
        click.option("--cron", is_flag=True, help="A crontab line instead of systemd units."),
        click.option("--dest", metavar="DIR",
                     help="Write/read the units in DIR instead of the systemd directory "
                          "(nothing is enabled; for review or tests)."),
        click.option("--crontab-file", metavar="FILE",
                     help="Edit FILE instead of the user's crontab (for review or tests)."),
    ]):
        command = option(command)
    return command


@schedule.command("install")
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option("--at", "at", required=True, metavar="HH:MM", help="Time of day (24 h, local time).")
@targets_option("Passed to orch nightly.")
@extra_vars_option("Passed to orch nightly.")
@click.option("--timeout", default="6h", show_default=True,
              help="systemd: stop a nightly still running after this long.")
@click.option("--no-enable", is_flag=True, help="systemd: write the units but do not enable the timer.")
@_where_options
@JSON_OPTION
@pass_app
def schedule_install(app, playbook, at, targets, extra_vars, timeout, no_enable, scope, cron,
                     dest, crontab_file, as_json):
    """Run `orch nightly PLAYBOOK` every day at HH:MM. Replaces an earlier schedule of
    the same playbook. The scheduled command uses this orch's Python, the current
    directory, the inventory given with -i, and ORCH_DATA_DIR/ORCH_STORE if set.

    \b
    Examples:
      orch schedule install playbooks/dflash.yaml --at 02:30
      orch -i inventory.yaml schedule install playbooks/dflash.yaml --at 02:30 -t drafters
      orch schedule install playbooks/dflash.yaml --at 02:30 --system
      orch schedule install playbooks/dflash.yaml --at 02:30 --dest /tmp/units
    """
    parse_extra_vars(extra_vars)      # fail now, not at 02:30
    sched.check_timeout(timeout)
    kind = sched.choose_kind(cron=cron or bool(crontab_file), system=scope == "system", dest=dest)
    if kind == "systemd-system":
        console.warn("the system units run `orch nightly` as root (they set no User=): with "
                     "root's SSH keys, known_hosts, inventory and run store; use the default "
                     "user units unless root is meant")
    entry = sched.make_entry(playbook, at, kind=kind, targets=list(targets),
                             extra_vars=list(extra_vars), inventory=app.inventory_option)
    entry = sched.install(entry, dest=dest, crontab_file=crontab_file, enable=not no_enable,
                          timeout=timeout)
    if as_json:
        console.print_json(entry.to_dict())
        return
    where = ", ".join(entry.files)
    console.out.print(f"scheduled `orch nightly {entry.playbook}` daily at {entry.at} "
                      f"({entry.kind}): {where}")
    if kind == "systemd-user":
        console.info("note: user timers run while you are logged in unless lingering is on: "
                     "loginctl enable-linger")


@schedule.command("list")
@click.option("--dest", metavar="DIR", help="Read units from DIR instead of the systemd directories.")
@click.option("--crontab-file", metavar="FILE", help="Read FILE instead of the user's crontab.")
@JSON_OPTION
def schedule_list(dest, crontab_file, as_json):
    """List orch's scheduled nightlies (systemd units and crontab lines).

    \b
    Examples:
      orch schedule list
      orch schedule list --json
    """
    entries = sched.list_entries(dest=dest, crontab_file=crontab_file)
    if as_json:
        console.print_json(entries)
        return
    if not entries:
        console.info("no orch schedules installed")
        return
    left_out = console.table(["PLAYBOOK", "AT", "KIND", "FILES"],
                             [[e.get("playbook"), e.get("at"), e.get("kind"),
                               ", ".join(e.get("files", []))] for e in entries],
                             optional=["FILES"])
    if left_out:   # the unit files' paths, rather than wrapped into the table
        for entry in entries:
            for path in entry.get("files", []):
                console.out.print(console.escape(f"  {entry.get('playbook')}: {path}"))


@schedule.command("remove")
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option("--dest", metavar="DIR", help="Remove units from DIR instead of the systemd directories.")
@click.option("--crontab-file", metavar="FILE", help="Edit FILE instead of the user's crontab.")
def schedule_remove(playbook, dest, crontab_file):
    """Remove the schedule(s) of PLAYBOOK (disables the timer first).

    \b
    Example:
      orch schedule remove playbooks/dflash.yaml
    """
    removed = sched.remove(playbook, dest=dest, crontab_file=crontab_file)
    if not removed:
        raise OrchError(f"no schedule of {playbook} found", hint="`orch schedule list` shows them")
    for path in removed:
        console.info(f"removed {path}")
