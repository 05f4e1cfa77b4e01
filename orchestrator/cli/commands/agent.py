"""`orch agent start|stop|status`: the warm agent (docs/guide/agent.md)."""

from __future__ import annotations

import json

import click

from orchestrator.agent import client, protocol
from orchestrator.config import transports
from orchestrator.ground.errors import ExitCode, OrchError


@click.group("agent")
def agent():
    """The warm agent that runs the quick commands in milliseconds (docs/guide/agent.md).

    The quick commands (exec, grep-torch, grep-pkg, patch fx-tls status|diff, verify,
    inventory check, ct list|status) are handed to a per-user background process that keeps
    SSH connections open; it starts on first use and exits after 10 idle minutes
    ($ORCH_AGENT_IDLE seconds). Output, messages and exit codes are the same either way.
    `orch --no-agent ...` or ORCH_AGENT=off runs a command without it.

    \b
    Examples:
      orch agent status
      orch agent start --idle 3600
      orch agent stop
    """


@agent.command("start")
@click.option("--idle", "idle_s", type=click.FloatRange(min=1), metavar="SECONDS",
              help="Exit after this long without a command (default: $ORCH_AGENT_IDLE, else 600).")
def agent_start(idle_s):
    """Start the agent now (else the first quick command starts it).

    Exit code: 0 when it runs (or already ran), 1 when it did not start.

    \b
    Example:
      orch agent start --idle 3600
    """
    try:
        sock = client.connect()
        if sock is not None:
            sock.close()
            click.echo(f"orch: the agent already runs ({protocol.socket_path()})", err=True)
            return
        client.start_agent({"ORCH_AGENT_IDLE": str(idle_s)} if idle_s else None)
        sock = client.wait_for_agent()
    except OSError as error:   # an unsafe agent folder, another uid on the socket
        raise OrchError(f"cannot use the agent at {protocol.socket_path()}: {error}") from None
    if sock is None:
        raise OrchError(f"the agent did not start within {client.START_WAIT_S:g} s "
                        f"(its log: {protocol.agent_dir()})")
    sock.close()
    click.echo(f"orch: agent started ({protocol.socket_path()})", err=True)


@agent.command("stop")
def agent_stop():
    """Stop the agent: commands it runs end first; its connections close.

    \b
    Example:
      orch agent stop
    """
    reply = _ask({"type": "stop"})
    if reply is None:
        click.echo("orch: no agent runs", err=True)
        return
    click.echo(f"orch: agent {reply.get('pid')} stopping", err=True)


@agent.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def agent_status(as_json):
    """Show the agent: pid, idle time, commands running, and per inventory the hosts it
    holds connections to (connections, channels in use) and the warm command sessions in
    containers (idle, busy).

    Exit code: 0 when an agent runs, 1 when none does.

    \b
    Examples:
      orch agent status
      orch agent status --json
    """
    reply = _ask({"type": "status"})
    if as_json:
        click.echo(json.dumps(reply and {k: v for k, v in reply.items() if k != "type"},
                              indent=2, sort_keys=True))
    elif reply is None:
        click.echo(f"no agent runs (socket: {protocol.socket_path()})")
    else:
        _print_status(reply)
    return ExitCode.OK if reply else ExitCode.FAILED


def _print_status(reply: dict) -> None:
    click.echo(f"agent {reply['pid']} (orch {reply['version']}) on {reply['socket']}")
    click.echo(f"  up {reply['uptime_s']:.0f} s, idle {reply['idle_s']:.0f} s "
               f"(exits after {reply['idle_exit_s']:g} s idle), {reply['commands_served']} "
               "command(s) served")
    for running in reply["running"]:
        click.echo(f"  running for {running['running_s']:.1f} s: orch {' '.join(running['argv'])}")
    for fleet in reply["fleets"]:
        click.echo(f"  inventory {fleet['inventory']} (idle {fleet['idle_s']:.0f} s)")
        for name, host in sorted(fleet["hosts"].items()):
            if transports.TRANSPORTS.get(host.get("transport"), transports.LOCAL).over_ssh:
                click.echo(f"    {name}: {host['address']}, {host['connections']} connection(s), "
                           f"{host['channels_in_use']} channel(s) in use")
            else:
                click.echo(f"    {name}: local")
        for held in fleet.get("sessions", []):
            click.echo(f"    CT {held['vmid']} on {held['host']}: {held['idle']} idle, "
                       f"{held['busy']} busy command session(s)")


def _ask(message: dict, timeout: float = 10.0):
    """The agent's answer to a status or stop message; None when no agent listens."""
    try:
        sock = client.connect()
    except OSError as error:
        raise OrchError(f"cannot reach the agent at {protocol.socket_path()}: {error}") from None
    if sock is None:
        return None
    with sock:
        sock.settimeout(timeout)
        try:
            protocol.send(sock, message)
            reply, _ = protocol.Reader(sock).receive()
        except (OSError, ValueError) as error:   # a timeout too: a frozen (SIGSTOPped) agent
            raise OrchError(f"the agent at {protocol.socket_path()} did not answer within "
                            f"{timeout:g} s ({error or type(error).__name__})",
                            hint="it may be stopped (SIGSTOP) or stuck: its pid is in "
                                 f"{protocol.agent_dir()}/agent-{protocol.install_tag()}.lock; "
                                 "quick commands run without it meanwhile") from None
    if reply is None or reply.get("type") == "refused":
        return None
    return reply
