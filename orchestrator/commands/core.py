"""orch exec, orch ct list|status|start, orch inventory check."""

from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import time

import click

from orchestrator import console, distro
from orchestrator.errors import ConfigError, ExitCode, OrchError, PayloadError
from orchestrator.lazy import lazy
from orchestrator.payloads import run_payload
from orchestrator.remote.base import LineSplitter, stdin_bytes
from orchestrator.remote.container import require_vmid

pass_app = click.pass_obj
# imported when first called: `orch exec --help` needs no SSH or Proxmox API code
each_concurrently = lazy("orchestrator.fleet", "each_concurrently")
ProxmoxClient = lazy("orchestrator.proxmox", "ProxmoxClient")
api_backend = lazy("orchestrator.proxmox", "api_backend")


# ---------------------------------------------------------------- orch exec
# After TARGET everything is the command's, as with ssh and docker exec: orch's own options
# go before TARGET (`orch exec --timeout 5 CT python3 x.py --timeout 1`).
@click.command("exec", context_settings={"ignore_unknown_options": True,
                                         "allow_interspersed_args": False})
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Kill the command (its whole process group) after this long "
                   "(default: no limit).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON when it ends.")
@click.argument("target")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_app
def exec_command(app, target, command, timeout, as_json):
    """Run COMMAND in TARGET (a container, group, host or HOST:VMID), output live.

    Options go before TARGET; everything after TARGET (an optional `--` first) is the
    command, passed exactly as typed: orch quotes once, no shell in between. Output and
    standard input (a pipe or a file) stream as they arrive. When the timeout fires or orch
    is interrupted (Ctrl-C, SIGTERM), the command's process group in the container is
    killed. orch exits with the command's exit code; its own errors exit 255, as ssh's do
    (a host unreachable, a connection lost mid-command, no such container).

    \b
    Examples:
      orch exec drafters -- nvidia-smi
      orch exec pve:200 python3 -c 'import sys; print(sys.argv)' 'a b' '$HOME'
      orch exec --timeout 60 all-drafters -- df -h /
    """
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise click.UsageError("no command given after the target")
    if command[0].startswith("-"):
        raise click.UsageError(f"the command starts with {command[0]!r}: orch's options go "
                               "before TARGET (orch exec --timeout 5 TARGET -- COMMAND...)")
    signal.signal(signal.SIGTERM, _terminated)
    targets = app.fleet.targets([target])
    try:
        if len(targets) == 1 and not as_json:
            _exec_streaming(targets[0], command, timeout)
        _exec_many(app, targets, command, timeout, as_json)
    except _OutputClosed:
        # like ssh under `| head`: the reader left, the remote command is stopped with us
        if threading.current_thread() is threading.main_thread():  # not in the agent
            sys.stdout = open(os.devnull, "w")
        sys.exit(128 + signal.SIGPIPE)


def _exec_streaming(target, command, timeout):
    result = target.run(command, stdin=_forwarded_stdin(), timeout=timeout, capture=False,
                        kill_on_close=True, on_stdout=_writer(sys.stdout),
                        on_stderr=_writer(sys.stderr))
    sys.exit(result.exit_code)


def _exec_many(app, targets, command, timeout, as_json):
    stdin = stdin_bytes(_forwarded_stdin())  # every target gets the same input
    results = each_concurrently(targets, lambda t: t.run(
        command, stdin=stdin, timeout=timeout, capture=as_json, kill_on_close=True,
        on_stdout=None if as_json else _prefixed(t.name, sys.stdout),
        on_stderr=None if as_json else _prefixed(t.name, sys.stderr)),
        on_interrupt=app.fleet.close)
    if as_json:
        console.print_json([_result_json(t, r) for t, r in zip(targets, results)])
    for t, r in zip(targets, results):
        if isinstance(r, OrchError):
            console.error(_naming(t.name, str(r)))
    codes = [ExitCode.EXEC_ORCH_ERROR if isinstance(r, OrchError) else r.exit_code for r in results]
    sys.exit(max(codes))


def _naming(name: str, message: str) -> str:
    """An error of one target of many, said with the target's name first (once)."""
    return message if message.startswith(name) else f"{name}: {message}"


def _terminated(number, frame):
    raise SystemExit(128 + number)  # unwinds like Ctrl-C: channels close, commands die


class _OutputClosed(Exception):
    """orch's own stdout or stderr was closed by its reader (`orch exec ... | head`)."""


def _forwarded_stdin():
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return None
    if stat.S_ISFIFO(mode) or stat.S_ISREG(mode):
        return sys.stdin.buffer
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


def _prefixed(name: str, stream):
    lock = threading.Lock()

    def line(text: str) -> None:
        with lock:
            try:
                stream.write(f"[{name}] {text}\n")
                stream.flush()
            except BrokenPipeError:
                raise _OutputClosed() from None
    splitter = LineSplitter(line)
    return splitter.feed


def _result_json(target, result) -> dict:
    if isinstance(result, OrchError):
        return {"target": target.name, "error": _naming(target.name, str(result)), "exit_code": None}
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
    names = list(hosts) or [n for n, h in inventory.hosts.items() if h.transport == "ssh"]
    for name in names:
        if name not in inventory.hosts and name not in inventory.clusters:
            raise ConfigError(f"unknown host or cluster {name!r}",
                              hint="hosts: " + ", ".join(inventory.hosts)
                                   + ("; clusters: " + ", ".join(inventory.clusters)
                                      if inventory.clusters else ""))
    known = {(c.cluster or c.host, c.vmid): c.name
             for c in inventory.containers.values() if c.vmid}
    outcomes = each_concurrently(names, lambda n: _containers_of(app, n))
    rows, failed = [], False
    for name, outcome in zip(names, outcomes):
        if isinstance(outcome, OrchError):
            failed = True
            rows.append({"host": name, "error": str(outcome)})
            continue
        for item in outcome:
            vmid = int(item["vmid"])
            rows.append({"host": item["host"], "node": item.get("node"), "vmid": vmid,
                         "name": item.get("name"), "status": item.get("status"),
                         "cpus": item.get("cpus", item.get("maxcpu")),
                         "inventory": known.get((name, vmid)) or known.get((item["host"], vmid))})
    if as_json:
        console.print_json(rows)
    else:
        console.table(["HOST", "NODE", "VMID", "NAME", "STATUS", "INVENTORY NAME"],
                      [[r["host"], r.get("node"), r.get("vmid"), r.get("name"),
                        r.get("status") or r.get("error"), r.get("inventory")] for r in rows])
    sys.exit(ExitCode.FAILED if failed else ExitCode.OK)


def _containers_of(app, name: str) -> list[dict]:
    """A host's containers, or a whole cluster's, each with its node and inventory host."""
    fleet = app.fleet
    if name in fleet.inventory.clusters:
        return [{**item, "host": fleet.host_of_node(name, item["node"])}
                for item in fleet.cluster_containers(name)]
    client = _client(app, name)
    node = client.node()
    return [{**item, "node": node, "host": name} for item in client.containers()]


def _client(app, host_name: str) -> "ProxmoxClient":
    spec = app.fleet.inventory.hosts[host_name]
    if spec.transport == "local":
        raise OrchError(f"host {host_name} is local: it has no Proxmox API")
    # the https backend needs no SSH connection: open none
    ssh = app.fleet.host(host_name) if api_backend(spec) == "ssh" else None
    return ProxmoxClient(spec, ssh, warn=console.warn)


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
    status = _client(app, container.host.name).status(container.vmid)
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
    client = _client(app, container.host.name)
    if client.status(container.vmid).get("status") == "running":
        console.info(f"{container.describe()} is already running")
        return
    deadline = time.monotonic() + wait_s
    client.start(container.vmid, wait_s)
    while client.status(container.vmid).get("status") != "running":
        if time.monotonic() > deadline:
            raise OrchError(f"{container.describe()}: its start task ended OK but it does "
                            f"not run after {wait_s:g} s")
        time.sleep(0.3)
    console.info(f"{container.describe()} is running")


# ---------------------------------------------------------------- orch inventory check
@click.group("inventory")
def inventory():
    """Inspect the inventory.

    \b
    Example:
      orch inventory check
    """


@inventory.command("check")
@click.option("-t", "--target", "targets", multiple=True, metavar="TARGET",
              help="Only these containers or groups (default: every container).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def inventory_check(app, targets, as_json):
    """Check every container at once: reachable, running, python, venv, GPUs.

    A container without python3 is reported with its distribution's install command
    (read from /etc/os-release), e.g. `orch exec CT -- apt-get install -y python3`.
    Exit code: 0 all ok, 1 a container has a problem.

    \b
    Example:
      orch inventory check --json
      orch inventory check -t drafters
    """
    fleet = app.fleet
    names = list(targets) or list(fleet.inventory.containers)
    chosen = fleet.targets(names)
    reports = each_concurrently(chosen, _check_one)
    rows = []
    for target, report in zip(chosen, reports):
        if isinstance(report, OrchError):
            rows.append({"target": target.name, "where": target.describe(), "ok": False,
                         "reachable": _reachable(report), "running": False, "error": str(report)})
        else:
            rows.append({"target": target.name, "where": target.describe(), **report})
    if as_json:
        console.print_json(rows)
    else:
        console.table(["TARGET", "WHERE", "OK", "PYTHON", "VENV", "GPUS", "PROBLEM"],
                      [_check_row(r) for r in rows])
    sys.exit(ExitCode.OK if all(r["ok"] for r in rows) else ExitCode.FAILED)


def _check_one(target) -> dict:
    try:
        probe = run_payload(target, "probe", {"venv": target.venv}, python="python3", timeout=60)
    except OrchError as error:
        if isinstance(error, PayloadError) or not distro.python_missing(target, "python3"):
            raise
        return _python_missing_report(target)
    venv = probe.get("venv")
    problems = []
    if venv is not None and not venv["present"]:
        problems.append(f"venv {venv['path']} missing")
    gpus = probe.get("gpus")
    if target.gpus and isinstance(gpus, list):
        seen = {gpu["index"] for gpu in gpus}
        missing = [g for g in target.gpus if g not in seen]
        if missing:
            problems.append(f"GPUs {missing} not seen by nvidia-smi")
    elif target.gpus and gpus is None:
        problems.append("no nvidia-smi in the container")
    return {"ok": not problems, "reachable": True, "running": True,
            "python_version": probe.get("python_version"), "venv": venv, "gpus": gpus,
            "ripgrep": probe.get("ripgrep"), "problems": problems}


def _python_missing_report(target) -> dict:
    """A container without python3: nothing of orch's runs there; say how to install it."""
    missing = distro.PythonMissing(target, "python3", distro.os_release(target))
    fix = "; ".join(missing.fix) or "install python3 (3.8 or newer) with its package manager"
    return {"ok": False, "reachable": True, "running": True, "python_version": None,
            "venv": None, "gpus": None, "ripgrep": None, "os": missing.release.pretty_name,
            "fix": missing.fix,
            "problems": [f"python3 is not installed ({missing.release.pretty_name}): {fix}"]}


def _reachable(error: OrchError) -> bool:
    from orchestrator.errors import ConnectionProblem
    return not isinstance(error, ConnectionProblem)


def _check_row(row: dict) -> list:
    venv = row.get("venv") or {}
    gpus = row.get("gpus")
    gpu_text = ("-" if gpus is None else
                gpus.get("error") if isinstance(gpus, dict) else ",".join(str(g["index"]) for g in gpus))
    problem = row.get("error") or "; ".join(row.get("problems", []))
    venv_text = (f"{venv.get('path')} ({'ok' if venv.get('present') else 'missing'})" if venv else "-")
    return [row["target"], row["where"], "yes" if row["ok"] else "NO",
            row.get("python_version") or "-", venv_text, gpu_text, problem]


COMMANDS = [exec_command, ct, inventory]
