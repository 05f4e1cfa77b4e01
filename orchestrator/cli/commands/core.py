"""orch exec, orch ct list|status|start, orch inventory list|check."""

from __future__ import annotations

import os
import signal
import stat
import threading
from typing import TYPE_CHECKING

import click

from orchestrator.ground import console
from orchestrator.ground.errors import ConfigError, ExitCode
from orchestrator.cli.commands.options import targets_option
from orchestrator.ground.lazy import lazy
from orchestrator.remote.base import LineSplitter, stdin_bytes
from orchestrator.cli.commands.fanout import Fanout, fanout_options, report_failures
from orchestrator.remote.container import require_vmid

# imported when first called: `orch exec --help` needs no SSH code
if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.config.inventory import inventory_path, load_inventory
    from orchestrator.targets.fleet import GroupResult, fan_out
    from orchestrator.targets.inventory_check import check_targets, row_texts
else:
    inventory_path = lazy("orchestrator.config.inventory", "inventory_path")
    load_inventory = lazy("orchestrator.config.inventory", "load_inventory")
    fan_out = lazy("orchestrator.targets.fleet", "fan_out")
    check_targets = lazy("orchestrator.targets.inventory_check", "check_targets")
    row_texts = lazy("orchestrator.targets.inventory_check", "row_texts")

pass_app = click.pass_obj


# ---------------------------------------------------------------- orch exec
# After TARGET everything is the command's, as with ssh and docker exec: orch's own options
# go before TARGET (`orch exec --timeout 5 CT python3 x.py --timeout 1`).
@click.command("exec", context_settings={"ignore_unknown_options": True,
                                         "allow_interspersed_args": False})
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Kill the command (its whole process group) after this long "
                   "(default: no limit).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON when it ends.")
@fanout_options
@click.argument("target")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_app
def exec_command(app, target, command, timeout, as_json, jobs, progress):
    """Run COMMAND in TARGET (a container, group, host or HOST:VMID), output live.

    Options go before TARGET; everything after TARGET (an optional `--` first) is the
    command, passed exactly as typed: orch quotes once, no shell in between. Output and
    standard input (a pipe or a file) stream as they arrive. When the timeout fires or orch
    is interrupted (Ctrl-C, SIGTERM), the command's process group in the container is
    killed. orch exits with the command's exit code; its own errors exit 255, as ssh's do
    (a host unreachable, a connection lost mid-command or a dead link, a timeout), except a
    bad command line (2) and a container that does not exist or is not running (4).
    Over a group, every container's lines are prefixed [NAME], at most --jobs run at once,
    and the containers orch could not run the command in are listed at the end, one line
    each with its fix (docs/guide/fleet.md).

    \b
    Examples:
      orch exec drafters -- nvidia-smi
      orch exec pve:200 python3 -c 'import sys; print(sys.argv)' 'a b' '$HOME'
      orch exec --timeout 60 all-drafters -- df -h /
      orch exec --jobs 8 --progress all-drafters -- nvidia-smi -L
    """
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise click.UsageError("no command given after the target")
    if command[0].startswith("-"):
        raise click.UsageError(f"the command starts with {command[0]!r}: orch's options go "
                               "before TARGET (orch exec --timeout 5 TARGET -- COMMAND...)")
    # SIGTERM unwinds like Ctrl-C; in the agent the client's SIGTERM comes as the interrupt
    with app.invocation.signal_handler(signal.SIGTERM, _terminated):
        return _exec(app, target, command, timeout, as_json, jobs, progress)


def _exec(app, target, command, timeout, as_json, jobs=None, progress=None):
    targets = app.fleet.targets([target])
    try:
        if len(targets) == 1 and not as_json:
            return exec_streaming(app.invocation, targets[0], command, timeout)
        return _exec_many(app, Fanout(app, targets, jobs, progress, as_json), command, timeout,
                          as_json)
    except _OutputClosed:
        # like ssh under `| head`: the reader left, the remote command is stopped with us
        app.invocation.discard_stdout()
        return 128 + signal.SIGPIPE


def exec_streaming(invocation, target, command, timeout):
    """command in one target, its output and input streamed (no pty); its exit code."""
    result = target.run(command, stdin=_forwarded_stdin(invocation.stdin), timeout=timeout,
                        capture=False, kill_on_close=True, on_stdout=_writer(invocation.stdout),
                        on_stderr=_writer(invocation.stderr))
    return result.exit_code


def _exec_many(app, fanout, command, timeout, as_json):
    invocation, targets = app.invocation, fanout.targets
    stdin = stdin_bytes(_forwarded_stdin(invocation.stdin))  # every target gets the same input

    def run_one(target):
        if as_json:
            return target.run(command, stdin=stdin, timeout=timeout, capture=True,
                              kill_on_close=True)
        out = _prefixed(target.name, invocation.stdout, fanout.progress.printing)
        err = _prefixed(target.name, invocation.stderr, fanout.progress.printing)
        try:
            return target.run(command, stdin=stdin, timeout=timeout, capture=False,
                              kill_on_close=True, on_stdout=out.feed, on_stderr=err.feed)
        finally:   # a last line without a newline is a line too
            out.flush()
            err.flush()
    results = fanout.run(run_one, on_interrupt=app.fleet.close)
    if as_json:
        console.print_json([_result_json(t, results) for t in targets])
    report_failures(results)
    codes = [ExitCode.EXEC_ORCH_ERROR if t in results.failed else results.succeeded[t].exit_code
             for t in targets]
    return max(codes)


def _naming(name: str, message: str) -> str:
    """An error of one target of many, said with the target's name first (once)."""
    return message if message.startswith(name) else f"{name}: {message}"


def _terminated(number, frame):
    raise SystemExit(128 + number)  # unwinds like Ctrl-C: channels close, commands die


class _OutputClosed(Exception):
    """orch's own stdout or stderr was closed by its reader (`orch exec ... | head`)."""


def _forwarded_stdin(stdin):
    try:
        mode = os.fstat(stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return None
    if stat.S_ISFIFO(mode) or stat.S_ISREG(mode):
        return stdin.buffer
    return None


def _writer(stream):
    lock = threading.Lock()

    def write(chunk: bytes) -> None:
        with lock:
            try:
                stream.buffer.write(chunk)
                stream.flush()
            except BrokenPipeError:
                raise _OutputClosed() from None
    return write


def _prefixed(name: str, stream, printing) -> LineSplitter:
    """A target's output as `[NAME] line` lines on stream; printing() is held while one is
    written (it takes the progress line away: cli/screens/fanout.py)."""
    def line(text: str) -> None:
        with printing():
            try:
                stream.write(f"[{name}] {text}\n")
                stream.flush()
            except BrokenPipeError:
                raise _OutputClosed() from None
    return LineSplitter(line)


def _result_json(target, results: GroupResult) -> dict:
    if target in results.failed:
        return {"target": target.name, "error": _naming(target.name, str(results.failed[target])),
                "exit_code": None}
    result = results.succeeded[target]
    return {"target": target.name, "argv": result.argv, "exit_code": result.exit_code,
            "stdout": result.text, "stderr": result.error_text, "duration_s": round(result.duration, 4)}


# ---------------------------------------------------------------- orch ct ...
@click.group("ct")
def ct():
    """Proxmox containers through the Proxmox API (pvesh over SSH, or HTTPS with a token).

    \b
    Examples:
      orch ct list pve
      orch ct status drafters --json
      orch ct start drafters
    """


@ct.command("list")
@click.argument("hosts", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def ct_list(app, hosts, as_json):
    """List the containers of HOSTS or CLUSTERS (default: every SSH host of the
    inventory), with the node each one is on. A cluster is asked once, through the first
    of its hosts that answers (/cluster/resources).

    \b
    Examples:
      orch ct list pve --json
      orch ct list lab
    """
    inventory = app.fleet.inventory
    names = list(hosts) or [n for n, h in inventory.hosts.items() if h.kind.proxmox]
    for name in names:
        if name not in inventory.hosts and name not in inventory.clusters:
            raise ConfigError(f"unknown host or cluster {name!r}",
                              hint="hosts: " + ", ".join(inventory.hosts)
                                   + ("; clusters: " + ", ".join(inventory.clusters)
                                      if inventory.clusters else ""))
    known = {(c.cluster or c.host, c.vmid): c.name
             for c in inventory.containers.values() if c.vmid}
    results = fan_out(names, lambda n: app.fleet.containers_of(n, warn=console.warn))
    rows = []
    for name in names:
        if name in results.failed:
            rows.append({"host": name, "error": str(results.failed[name])})
            continue
        for item in results.succeeded[name]:
            vmid = int(item["vmid"])
            rows.append({"host": item["host"], "node": item.get("node"), "vmid": vmid,
                         "name": item.get("name"), "status": item.get("status"),
                         "cpus": item.get("cpus", item.get("maxcpu")),
                         "inventory": known.get((name, vmid)) or known.get((item["host"], vmid))})
    if as_json:
        console.print_json(rows)
    else:
        # an unreachable host's error is a sentence: below the table, not wrapped in a cell
        console.table(["HOST", "NODE", "VMID", "NAME", "STATUS", "INVENTORY NAME"],
                      [[r["host"], r.get("node"), r.get("vmid"), r.get("name"),
                        r.get("status") or ("error" if "error" in r else None),
                        r.get("inventory")] for r in rows])
        for row in rows:
            if "error" in row:
                console.out.print(console.escape(f"{row['host']}: {row['error']}"))
    return ExitCode.OK if results.ok else ExitCode.FAILED


def _single_container(app, name: str):
    targets = app.fleet.targets([name])
    if len(targets) != 1:
        raise ConfigError(f"{name!r} names {len(targets)} containers; name one")
    require_vmid(targets[0])
    return targets[0]


@ct.command("status")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def ct_status(app, target, as_json):
    """Show the status of one container.

    \b
    Example:
      orch ct status drafters
    """
    container = _single_container(app, target)
    status = app.fleet.proxmox(container.host.name, warn=console.warn).status(container.vmid)
    if as_json:
        console.print_json(status)
    else:
        console.out.print(f"{container.describe()}: {status.get('status')}"
                          + (f" (uptime {status.get('uptime')} s)" if status.get("uptime") else ""))


@ct.command("start")
@click.argument("target")
@click.option("--wait", "wait_s", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the start task and until it runs.")
@pass_app
def ct_start(app, target, wait_s):
    """Start one container: follow Proxmox's start task to its end (its error is
    reported as soon as it fails), then wait until the container runs.

    \b
    Example:
      orch ct start drafters --wait 120
    """
    container = _single_container(app, target)
    client = app.fleet.proxmox(container.host.name, warn=console.warn)
    started = client.ensure_running(container.vmid, wait_s, label=container.describe())
    console.info(f"{container.describe()} is {'running' if started else 'already running'}")


# ---------------------------------------------------------------- orch inventory list|check
@click.group("inventory")
def inventory():
    """Inspect the inventory.

    \b
    Examples:
      orch inventory list
      orch inventory check
    """


@inventory.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def inventory_list(app, as_json):
    """Every name -t takes, as the inventory resolves it: containers, groups, hosts, clusters.

    Reads the inventory file only (no host is contacted): a container's host and CT, a
    group's containers, a host's address. Secrets stay out (an API token, a container's
    env values: only the env's names are shown).

    \b
    Examples:
      orch inventory list
      orch -i sandbox inventory list --json
    """
    listed = inventory_rows(load_inventory(inventory_path(app.inventory_option)))
    if as_json:
        console.print_json(listed)
        return ExitCode.OK
    console.table(["TARGET", "KIND", "RESOLVES TO"],
                  [[row["name"], row["kind"], row["resolves_to"]] for row in listed["targets"]])
    console.out.print("hosts: " + ", ".join(f"{h['name']} ({h['transport']} {h['address'] or h['name']})"
                                            for h in listed["hosts"]), markup=False, highlight=False)
    return ExitCode.OK


def inventory_rows(inventory) -> dict:
    """The inventory as `orch inventory list` shows it: one row per target name (the kind
    that name resolves as: a host named like a group is that group) and its details."""
    rows = []
    for name in inventory.target_names():
        if name in inventory.containers:
            spec = inventory.containers[name]
            where = f"{spec.cluster}:{spec.vmid}" if spec.cluster else f"{spec.host}:{spec.vmid or '-'}"
            rows.append({"name": name, "kind": "container", "resolves_to": where, "host": spec.host,
                         "vmid": spec.vmid, "cluster": spec.cluster, "venv": spec.venv,
                         "gpus": spec.gpus, "address": spec.address, "env_names": sorted(spec.env)})
        elif name in inventory.groups:
            members = [spec.name for spec in inventory.resolve([name])]
            rows.append({"name": name, "kind": "group", "resolves_to": ", ".join(members),
                         "containers": members})
        elif name in inventory.hosts:
            host = _host_row(inventory.hosts[name])
            rows.append({**host, "kind": "host", "resolves_to": f"{host['transport']} {host['address'] or name}"})
        else:
            nodes = inventory.clusters[name]
            rows.append({"name": name, "kind": "cluster", "resolves_to": ", ".join(nodes),
                         "nodes": nodes})
    return {"inventory": inventory.path, "default_target": inventory.default_target, "targets": rows,
            "hosts": [_host_row(host) for host in inventory.hosts.values()]}


def _host_row(host) -> dict:
    """A host's row: how orch reaches it; of its API settings only whether it has them."""
    return {"name": host.name, "transport": host.transport, "address": host.address, "user": host.user,
            "port": host.port, "node": host.node, "api": bool(host.api)}


@inventory.command("check")
@targets_option("Only these containers or groups (default: every container).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@fanout_options
@pass_app
def inventory_check(app, targets, as_json, jobs, progress):
    """Check every container at once: reachable, running, python, venv, GPUs.

    A container without python3 is reported with its distribution's install command
    (read from /etc/os-release), e.g. `orch exec CT -- apt-get install -y python3`.
    At most --jobs containers are checked at once; the table has a row per container and
    what is wrong follows it, one line per container with its fix.
    Exit code: 0 all ok, 1 a container has a problem.

    \b
    Example:
      orch inventory check --json
      orch inventory check -t drafters
      orch inventory check --jobs 64 --progress
    """
    fleet = app.fleet
    chosen = fleet.targets(list(targets) or list(fleet.inventory.containers))
    fanout = Fanout(app, chosen, jobs, progress, as_json)
    rows = fanout.each(lambda jobs, on_done: check_targets(chosen, jobs, on_done))
    if as_json:
        console.print_json(rows)
    else:
        _print_check(chosen, rows)
    return ExitCode.OK if all(r["ok"] for r in rows) else ExitCode.FAILED


def _print_check(targets, rows: list[dict]) -> None:
    """A short row per container, so the table fits an 80-column terminal; what is wrong
    below it, a sentence per problem (--json has every detail)."""
    texts = [row_texts(row) for row in rows]
    console.table(["TARGET", "HOST", "CT", "OK", "PYTHON", "VENV", "GPUS"],
                  [[row["target"], target.host.name, target.vmid or "-",
                    "yes" if row["ok"] else "NO", text["python"], text["venv"], text["gpus"]]
                   for target, row, text in zip(targets, rows, texts)])
    for row, text in zip(rows, texts):
        for problem in text["problems"]:
            # an error names its target already ("sb1-202 (CT 202 on host sb1) is not running")
            named = problem.startswith(row["target"])
            console.out.print(console.escape(problem if named else f"{row['target']}: {problem}"))
