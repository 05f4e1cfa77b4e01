"""What every command over many targets shares (exec, inventory check, grep-torch and
grep-pkg, patch): --jobs and --progress, the progress line while it runs, and the failed
targets listed at its end, one line each (docs/guide/fleet.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import click

from orchestrator.config.concurrency import DEFAULT_JOBS, MAX_JOBS
from orchestrator.ground import console
from orchestrator.cli.screens.fanout import FanoutProgress, failure_lines, progress_wanted
from orchestrator.ground.lazy import lazy

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.targets.fleet import GroupResult, fan_out
else:
    fan_out = lazy("orchestrator.targets.fleet", "fan_out")  # no SSH code for --help

JOBS_OPTION = click.option(
    "-j", "--jobs", type=click.IntRange(1, MAX_JOBS), default=None, metavar="N",
    help=f"Work on at most N targets at once (default: the inventory's `defaults: {{jobs: N}}`, "
         f"else {DEFAULT_JOBS}); each host's own limits (max_sessions, connections) still hold.")
PROGRESS_OPTION = click.option(
    "--progress/--no-progress", default=None,
    help="How far a fan-out over many targets got, on stderr (default: on a terminal, "
         "not with --json).")


def fanout_options(command):
    return JOBS_OPTION(PROGRESS_OPTION(command))


class Fanout:
    """One command's fan-out over `targets`: its concurrency and its progress line."""

    def __init__(self, app, targets: list, jobs: Optional[int], progress: Optional[bool],
                 as_json: bool):
        self.targets = targets
        self.jobs = jobs or app.fleet.inventory.jobs
        stream = app.invocation.stderr
        self.progress = FanoutProgress(stream, len(targets),
                                       progress_wanted(progress, stream, as_json))

    def run(self, work: Callable, on_interrupt: Optional[Callable[[], None]] = None) -> GroupResult:
        with self.progress:
            return fan_out(self.targets, work, self.jobs, on_interrupt, on_done=self.progress.done)

    def each(self, run: Callable):
        """run(jobs, on_done): for the fan-outs that return their own rows (inventory check)."""
        with self.progress:
            return run(self.jobs, self.progress.done)


def report_failures(results: GroupResult) -> None:
    """The failed targets, one line each, after everything else the command printed."""
    if not results.failed:
        return
    lines = failure_lines([(item.name, error.message, error.hint)
                           for item, error in results.failed.items()], len(results.items))
    console.error(lines[0])
    for line in lines[1:]:
        console.err.print(console.escape(line))
