"""The verbs of remote debugging: orch cp (files in and out of containers)."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

import click

from orchestrator.ground import console
from orchestrator.ground.errors import ExitCode
from orchestrator.ground.lazy import lazy

pass_app = click.pass_obj
# imported when first called: `orch cp --help` needs no SSH code
if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.remote.transfer import pull, push
    from orchestrator.targets.fleet import fan_out
else:
    fan_out = lazy("orchestrator.targets.fleet", "fan_out")
    push = lazy("orchestrator.remote.transfer", "push")
    pull = lazy("orchestrator.remote.transfer", "pull")

# TARGET:PATH as scp reads it: a colon before any slash. HOST:VMID:PATH names a container by
# its host and vmid; a local path with a colon is written ./name:x.
_HOST_VMID_PATH = re.compile(r"([^:/]+:\d+):(.*)", re.DOTALL)
_TARGET_PATH = re.compile(r"([^:/]+):(.*)", re.DOTALL)
PROGRESS_AFTER_S = 1.0   # a transfer shorter than this shows no progress line


@click.command("cp")
@click.option("-r", "--recursive", is_flag=True, help="Copy folders, with everything in them.")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Give up after this long (default: no limit; a dead link is noticed anyway).")
@click.option("--json", "as_json", is_flag=True, help="Print what was copied as JSON.")
@click.argument("source")
@click.argument("dest")
@pass_app
def cp_command(app, source, dest, recursive, timeout, as_json):
    """Copy files and folders into containers (a group: each of them) or out of one.

    SOURCE or DEST (one of them) is TARGET:PATH, where TARGET is a container, a group
    (pushes only), a host or HOST:VMID (then HOST:VMID:PATH); a relative PATH is in the
    target's home folder. As with cp and scp, a DEST that is a folder (or ends in /)
    receives the copy inside it, else DEST names the copy. A local path with a colon is
    written ./name:x.

    One stream over the command channel: no scp to the host, no `pct push`, nothing held in
    memory. Modes and modification times are kept (owners are the receiving account's);
    symbolic links are copied as links, never followed; every file's sha256 is computed on
    both sides as it streams and compared before anything gets its final name: an
    interrupted copy (Ctrl-C, a broken link) leaves no partial file under the final name.
    Paths travel as data, never through a shell. Progress goes to stderr on a terminal.
    Exit codes: 0 copied; for one target its error's own code: 1 the copy failed (a
    sha256 mismatch, a refused path), 2 a bad command line, 3 a host unreachable or the
    link lost, 4 no such container or not running, 5 --timeout; for a group, 1 when any
    copy failed.

    \b
    Examples:
      orch cp train.py drafters:/root/app/
      orch cp -r ./configs all-drafters:/root/app/configs
      orch cp drafters:/var/lib/orch/runs/RUN/launch/output.log .
      orch cp -r pve:200:/root/ckpt ./ckpt
    """
    remote_source, remote_dest = _remote(source), _remote(dest)
    if bool(remote_source) == bool(remote_dest):
        raise click.UsageError("one of SOURCE and DEST must be TARGET:PATH, the other a local "
                               "path (orch cp FILE TARGET:PATH, or orch cp TARGET:PATH FILE)")
    if remote_dest:
        name, path = remote_dest
        targets = app.fleet.targets([name])

        def work(target, progress):
            return push(target, source, path, recursive=recursive, timeout=timeout,
                        on_data=progress.add if progress else None,
                        on_size=progress.sized if progress else None)
    else:
        name, path = remote_source
        targets = app.fleet.targets([name])
        if len(targets) != 1:
            raise click.UsageError(f"{name!r} names {len(targets)} targets: copy out of one")

        def work(target, progress):
            return pull(target, path, dest, recursive=recursive, timeout=timeout,
                        on_data=progress.add if progress else None,
                        on_size=progress.sized if progress else None)
    outcomes = _each(app, targets, work, app.invocation.stderr if not as_json else None)
    _report(outcomes, as_json)
    return ExitCode.FAILED if any(not isinstance(o, dict) for _, o in outcomes) else ExitCode.OK


def _each(app, targets, work, progress_to):
    """[(target, result or OrchError)]. One target: its error is the command's, with its own
    exit code, and it shows progress; a group copies to all at once, without."""
    if len(targets) == 1:
        progress = _Progress(progress_to) if progress_to is not None else None
        try:
            return [(targets[0], work(targets[0], progress))]
        finally:
            if progress:
                progress.close()
    results = fan_out(targets, lambda target: work(target, None), on_interrupt=app.fleet.close)
    return [(t, results.succeeded[t] if t in results.succeeded else results.failed[t])
            for t in targets]


def _remote(argument: str):
    """(target name, path) when argument is TARGET:PATH, else None (a local path)."""
    if argument.startswith(("/", "./", "../", "~")):
        return None
    found = _HOST_VMID_PATH.fullmatch(argument) or _TARGET_PATH.fullmatch(argument)
    return (found.group(1), found.group(2)) if found else None


def _report(outcomes, as_json: bool) -> None:
    if as_json:
        console.print_json([{"target": t.name, **o} if isinstance(o, dict)
                            else {"target": t.name, "error": str(o)} for t, o in outcomes])
        return
    for target, outcome in outcomes:
        if not isinstance(outcome, dict):
            text = str(outcome)
            console.error(text if text.startswith(target.name) else f"{target.name}: {text}")
            continue
        console.info(f"{target.name}: {_counts(outcome)} -> {outcome['path']} "
                     f"(sha256 checked, {outcome['seconds']:.1f} s, {_rate(outcome)})")
        if outcome.get("skipped"):
            console.warn(f"{target.name}: left out (not files, folders or links): "
                         + ", ".join(outcome["skipped"][:5]))


def _counts(done: dict) -> str:
    parts = [f"{done['files']} file(s), {_size(done['bytes'])}"]
    if done["dirs"]:
        parts.append(f"{done['dirs']} folder(s)")
    if done["links"]:
        parts.append(f"{done['links']} link(s)")
    return ", ".join(parts)


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return ""


def _rate(done: dict) -> str:
    return f"{_size(done['bytes'] / max(done['seconds'], 1e-3))}/s"


class _Progress:
    """One line on stderr, rewritten at most 5 times a second, only on a terminal and only
    once a transfer has run for PROGRESS_AFTER_S."""

    def __init__(self, stream):
        self.stream = stream
        self.total = None
        self.done = 0
        self.started = self.shown = time.monotonic()
        self.active = stream.isatty()
        self.printed = False

    def sized(self, size: dict) -> None:
        self.total = size.get("bytes")

    def add(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if not self.active or now - self.started < PROGRESS_AFTER_S or now - self.shown < 0.2:
            return
        self.shown = now
        rate = self.done / max(now - self.started, 1e-3)
        of = f" of {_size(self.total)} ({100 * self.done / self.total:.0f} %)" if self.total else ""
        self.stream.write(f"\r\x1b[K{_size(self.done)}{of}, {_size(rate)}/s")
        self.stream.flush()
        self.printed = True

    def close(self) -> None:
        if self.printed:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
