"""The verbs of remote debugging: orch cp (files in and out of containers), orch shell
(a terminal in one) and orch forward (local ports to ports inside one)."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import TYPE_CHECKING

import click

from orchestrator.cli.commands.core import exec_streaming
from orchestrator.ground import console
from orchestrator.ground.errors import ExitCode
from orchestrator.ground.lazy import LazyModule, lazy

pass_app = click.pass_obj
# imported when first called: `orch cp --help` and `orch shell --help` need no SSH code
if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.remote import forward
    from orchestrator.remote.terminal import open_shell, shell_argv
    from orchestrator.remote.transfer import pull, push
    from orchestrator.targets import addresses
    from orchestrator.targets.fleet import fan_out
else:
    fan_out = lazy("orchestrator.targets.fleet", "fan_out")
    push = lazy("orchestrator.remote.transfer", "push")
    pull = lazy("orchestrator.remote.transfer", "pull")
    open_shell = lazy("orchestrator.remote.terminal", "open_shell")
    shell_argv = lazy("orchestrator.remote.terminal", "shell_argv")
    forward = LazyModule("orchestrator.remote.forward")
    addresses = LazyModule("orchestrator.targets.addresses")

# TARGET:PATH as scp reads it: a colon before any slash. HOST:VMID:PATH names a container by
# its host and vmid; a local path with a colon is written ./name:x.
_HOST_VMID_PATH = re.compile(r"([^:/]+:\d+):(.*)", re.DOTALL)
_TARGET_PATH = re.compile(r"([^:/]+):(.*)", re.DOTALL)
PROGRESS_AFTER_S = 1.0   # a transfer shorter than this shows no progress line


@click.command("cp")
@click.option("-r", "--recursive", is_flag=True, help="Copy folders, with everything in them.")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Give up after this long (default: no limit; a dead link is noticed anyway).")
@click.option("--preserve-special", "special", is_flag=True,
              help="Keep setuid, setgid and sticky bits (dropped by default).")
@click.option("--json", "as_json", is_flag=True, help="Print what was copied as JSON.")
@click.argument("source")
@click.argument("dest")
@pass_app
def cp_command(app, source, dest, recursive, timeout, special, as_json):
    """Copy files and folders into containers (a group: each of them) or out of one.

    SOURCE or DEST (one of them) is TARGET:PATH, where TARGET is a container, a group
    (pushes only), a host or HOST:VMID (then HOST:VMID:PATH); a relative PATH is in the
    target's home folder. As with cp and scp, a DEST that is a folder (or ends in /)
    receives the copy inside it, else DEST names the copy. A local path with a colon is
    written ./name:x.

    One stream over the command channel: no scp to the host, no `pct push`, nothing held in
    memory. Modes and modification times are kept (owners are the receiving account's),
    without setuid, setgid and sticky bits unless --preserve-special; out of a container,
    modes are narrowed by your umask, only the entry asked for is written (the container
    cannot choose another name), and a folder copied into keeps its own mode. Symbolic
    links are copied as links, never followed; every file's sha256 is computed on
    both sides as it streams and compared before anything gets its final name: an
    interrupted copy (Ctrl-C, a broken link) leaves no partial file under the final name.
    Paths travel as data, never through a shell. Progress goes to stderr on a terminal.
    The copy runs in the warm agent, as exec does (`orch --no-agent cp` in this process).
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
        source = _local(app, source)

        def work(target, progress):
            return push(target, source, path, recursive=recursive, timeout=timeout,
                        special=special, on_data=progress.add if progress else None,
                        on_size=progress.sized if progress else None)
    else:
        name, path = remote_source
        targets = app.fleet.targets([name])
        if len(targets) != 1:
            raise click.UsageError(f"{name!r} names {len(targets)} targets: copy out of one")
        dest = _local(app, dest)

        def work(target, progress):
            return pull(target, path, dest, recursive=recursive, timeout=timeout,
                        special=special, on_data=progress.add if progress else None,
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


def _local(app, path: str) -> str:
    """A local path of the command line as the caller means it: `~` expanded, relative to
    the caller's folder (the warm agent, which may run the copy, has a folder of its own),
    a trailing / kept (it says "into this folder"); `.` components dropped, nothing else
    (`link/..` is the kernel's to resolve, as cp and scp leave it)."""
    joined = os.path.join(app.invocation.cwd, app.invocation.expanduser(path))
    if joined.endswith("/."):
        joined += "/"   # x/. is a folder, as x/ is
    return "/".join(part for part in joined.split("/") if part != ".") or "/"


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


# ---------------------------------------------------------------- orch shell
# As with exec, everything after TARGET is the command's: orch's options go before TARGET.
@click.command("shell", context_settings={"ignore_unknown_options": True,
                                          "allow_interspersed_args": False})
@click.option("--venv", "use_venv", is_flag=True,
              help="Put the inventory's venv of TARGET first on PATH (VIRTUAL_ENV set).")
@click.option("--host", "allow_host", is_flag=True,
              help="TARGET is a host of the inventory: a shell on the Proxmox node itself.")
@click.argument("target")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_app
def shell_command(app, target, command, use_venv, allow_host):
    """An interactive shell (or COMMAND) in a container, through a PTY end to end.

    With no COMMAND: the container account's login shell (root's, from its passwd), in its
    home folder, as `pct enter` gives; with `-- COMMAND...` that command on a terminal (top,
    python3, a debugger). Your terminal's size and TERM go along and a resize follows; keys
    go through raw, so Ctrl-C and Ctrl-Z reach the remote program and Ctrl-D ends the
    shell. Your terminal is put back as it was afterwards, also when the link drops.
    Without a terminal here (a pipe, a script), COMMAND is required and runs without one,
    as `orch exec` runs it. A host's own shell needs --host (TARGET is then the
    host's name in the inventory). Exit codes: the remote
    shell's or command's; orch's own errors 255 (a host unreachable, the link lost), as
    ssh's, except a bad command line (2) and a container that does not exist or is not
    running (4).

    \b
    Examples:
      orch shell drafters
      orch shell --venv drafters -- python3
      orch shell pve:200 -- top
      orch shell --host pve
    """
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if command and command[0].startswith("-"):
        raise click.UsageError(f"the command starts with {command[0]!r}: orch's options go "
                               "before TARGET (orch shell --venv TARGET -- COMMAND...)")
    chosen = _shell_target(app, target, allow_host)
    venv = _venv_of(chosen) if use_venv else None
    invocation = app.invocation
    # SIGTERM unwinds like Ctrl-C, so the terminal is restored on the way out
    with invocation.signal_handler(signal.SIGTERM, _terminated):
        if not _on_terminal(invocation):
            if not command:
                raise click.UsageError("not on a terminal: an interactive shell needs one "
                                       "(give -- COMMAND to run a command without one)")
            return exec_streaming(invocation, chosen, shell_argv(command, venv=venv), None)
        term = invocation.env.get("TERM") or "xterm"
        return open_shell(chosen, command, venv, invocation.stdin.fileno(),
                          invocation.stdout.fileno(), term)


def _shell_target(app, name: str, allow_host: bool):
    if allow_host:
        return app.fleet.host_target(name)
    targets = app.fleet.targets([name])
    if len(targets) != 1:
        raise click.UsageError(f"{name!r} names {len(targets)} targets: a shell is in one")
    target = targets[0]
    if not target.vmid:
        raise click.UsageError(f"{name!r} is a host, not a container: add --host for a shell "
                               "on the host itself")
    return target


def _venv_of(target) -> str:
    if not target.venv:
        raise click.UsageError(f"--venv: the inventory gives {target.name} no venv")
    return target.expand(target.venv)


def _on_terminal(invocation) -> bool:
    try:
        return invocation.stdin.isatty() and invocation.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _terminated(number, frame):
    raise SystemExit(128 + number)


# ---------------------------------------------------------------- orch forward
@click.command("forward")
@click.option("--bind", default="127.0.0.1", show_default=True, metavar="ADDRESS",
              help="The local address to listen on (0.0.0.0: every interface, reachable "
                   "from other machines).")
@click.option("--max-connections", type=click.IntRange(1, 1000), default=64, show_default=True,
              help="Connections at once; more are closed at once, each said on stderr.")
@click.option("--via", type=click.Choice(["auto", "direct", "relay"]), default="auto",
              show_default=True,
              help="direct: a direct-tcpip channel of the host's SSH connection to the "
                   "container's address (needs its address and a server bound to 0.0.0.0 or "
                   "it, and the host's sshd to allow TCP forwarding); relay: a python3 relay "
                   "in the container (always works); auto: direct when it can, else relay.")
@click.argument("target")
@click.argument("specs", nargs=-1, required=True, metavar="[LOCALPORT:]PORT...")
@pass_app
def forward_command(app, target, specs, bind, max_connections, via):
    """Forward local TCP ports to ports inside a container, until Ctrl-C.

    Each [LOCALPORT:]PORT listens on LOCALPORT here (the same number as PORT when left out,
    0 for any free port) and reaches 127.0.0.1:PORT inside TARGET (a container or
    HOST:VMID; a host: its own port): TensorBoard, a Jupyter, a debugpy listener. Each connection is relayed
    through the host's SSH connection: directly to the container's address when the host
    reaches it and the server there listens on it or 0.0.0.0 (--via auto, the default),
    else by a small python3 program in the container, so a server bound to 127.0.0.1 and a
    container without any network route from its host work too; which way each port goes
    is printed. Many connections at
    once, each on an SSH channel of its own (a host gives 10 per SSH connection and orch
    opens up to the inventory's `connections`; beyond that a connection waits for a free
    one). The local URL is printed; a port where nothing listens yet is said, and the
    forward stays (start the server later). Exit codes: 0 stopped (Ctrl-C or SIGTERM),
    2 a bad command line or a local port already taken, 3 the host unreachable or the
    link lost (the forward stops), 4 no such container or not running.

    \b
    Examples:
      orch forward drafters 6006                 # TensorBoard: http://127.0.0.1:6006
      orch forward drafters 16006:6006 8888      # two ports at once
      orch forward drafters 5678                 # a debugpy listener, for VS Code
      orch forward --bind 0.0.0.0 pve:200 8888   # reachable from other machines too
    """
    specs = [forward.parse_spec(spec, bind) for spec in specs]
    chosen = _forward_target(app, target)
    forwarder = forward.Forwarder(chosen, specs, max_connections=max_connections,
                                  say=lambda text: console.warn(f"{chosen.name}: {text}"))
    listening = forwarder.open()
    try:
        container = _container_address(app, chosen, via)
        for address, local, remote in listening:
            bound = forward.listeners(chosen, remote)
            if not bound and via != "direct":
                console.warn(f"{chosen.name}: nothing listens on port {remote} there yet: "
                             "connections fail until something does")
            way, why = forward.choose_way(via, remote, container, bound)
            if way == "direct":
                forwarder.direct[remote] = container.address
            console.info(f"{forward.url(address, local)} -> {chosen.name}:{remote} "
                         f"({way}: {why})")
        console.info("forwarding; Ctrl-C stops")
        with app.invocation.signal_handler(signal.SIGTERM, _terminated):
            forwarder.serve()
    except (KeyboardInterrupt, SystemExit):
        pass   # the way a forward ends
    finally:
        forwarder.close()
    stats = forwarder.stats
    console.info(f"{chosen.name}: forward stopped: {stats.accepted} connection(s), "
                 f"{_size(stats.bytes_in)} in, {_size(stats.bytes_out)} out")
    return ExitCode.OK


def _container_address(app, chosen, via: str):
    """The container's address for direct mode and its source (addresses.Located), or None
    (a host target, --via relay, or neither the inventory nor the Proxmox API gives one)."""
    if via == "relay" or chosen.vmid is None:
        return None
    try:
        return addresses.locate(app.fleet, chosen)
    except addresses.NoAddress:
        return None


def _forward_target(app, name: str):
    targets = app.fleet.targets([name])
    if len(targets) != 1:
        raise click.UsageError(f"{name!r} names {len(targets)} targets: a forward goes to one")
    return targets[0]
