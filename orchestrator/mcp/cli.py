"""`orch mcp` and `orch runs audit` (the SDK is imported only when the server starts)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from orchestrator.ground import console
from orchestrator.ground.errors import OrchError
from orchestrator.ground.lazy import lazy
from orchestrator.mcp.audit import AuditLog, audit_rows, new_session_id
from orchestrator.runs.store import RunStore

# imported when the server starts: `orch mcp --help` and `orch runs audit` need no SSH or engine
if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.mcp.policy import build_policy
    from orchestrator.mcp.tools import Tools
    from orchestrator.mcp.wire import serve_stdio
else:
    build_policy = lazy("orchestrator.mcp.policy", "build_policy")
    Tools = lazy("orchestrator.mcp.tools", "Tools")
    serve_stdio = lazy("orchestrator.mcp.wire", "serve_stdio")


@click.command("mcp")
@click.option("--allow", "allow", multiple=True, type=click.Choice(["exec", "write"]),
              help="Also list tools that change something: exec (run commands), write "
                   "(fx_tls_apply/revert, run_start, run_stop). Repeatable. Default: read-only.")
@click.option("--allow-target", "allow_targets", multiple=True, metavar="TARGET",
              help="The allowance covers only these containers or groups (repeatable).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="HOST",
              help="Let tools act on this Proxmox host itself, outside any container (as its "
                   "SSH user, usually root). Repeatable. Default: containers only.")
@click.option("--allow-path", "allow_paths", multiple=True, metavar="FOLDER",
              help="read_file may also read files under this absolute folder of a container "
                   "(repeatable). Default: run folders only.")
@click.option("--allow-playbook", "allow_playbooks", multiple=True, metavar="FOLDER",
              type=click.Path(file_okay=False),
              help="run_start may run the playbooks (.yaml) in this folder of this machine "
                   "(repeatable). Default: none.")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="A YAML policy: `allow: [exec, write]`, `targets: [NAME, ...]`, "
                   "`hosts: [HOST, ...]`, `paths: [FOLDER, ...]`, `playbooks: [FOLDER, ...]` "
                   "(relative to the file).")
@click.pass_obj
def mcp_command(app, allow, allow_targets, allow_hosts, allow_paths, allow_playbooks,
                policy_file):
    """Serve orch's tools to an AI agent over MCP (stdio): typed, capped, audited.

    An MCP host (Claude Desktop, VS Code, an agent framework) starts this command and talks
    JSON-RPC on its stdin/stdout. One SSH connection per host and one command session per
    container stay open for the server's life. Every tool call is recorded before it acts
    and after: `orch runs audit`. Tools act in containers only: a host's own name (or an
    inventory entry without a vmid) is refused unless --allow-host names it. run_start runs
    only the playbooks of the folders --allow-playbook names, and its vars are data: a
    client sets only the vars the playbook lists under `mcp: vars:` (scalars unless it
    says `list`), never with template syntax. read_file reads files of run folders only,
    and of the folders --allow-path names.

    Exit codes: 0 when the client closes the connection; 1 when the MCP SDK is missing;
    2 for a bad option, inventory or policy file (FILE:LINE:COL).

    \b
    Examples:
      orch -i inventory.yaml mcp                       # read-only: search, read, status, runs
      orch -i inventory.yaml mcp --allow exec --allow write --allow-target drafters \\
          --allow-playbook playbooks
      orch -i sandbox mcp --policy mcp-policy.yaml
      orch -i inventory.yaml mcp --allow exec --allow-host pve   # pve itself too
      orch -i inventory.yaml mcp --allow-path /root/outputs     # read_file there too
    """
    try:
        # server.py is built on the MCP SDK, an optional extra (orch[mcp]): imported here so
        # that a missing SDK is a clear error, and `orch --help` works without it.
        from orchestrator.mcp.server import build_server
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] in ("mcp", "pydantic"):
            raise OrchError("`orch mcp` needs the MCP SDK, which is not installed",
                            hint="pip install 'orch[mcp]' (or: pip install 'mcp>=2.3,<3')") from None
        raise
    fleet = app.fleet
    policy = build_policy(allow, allow_targets, policy_file, fleet.inventory, hosts=allow_hosts,
                          paths=allow_paths, playbooks=allow_playbooks)
    store = RunStore()
    tools = Tools(fleet, store, app.inventory_option)
    audit = AuditLog(store, new_session_id())
    console.info(f"orch mcp: serving on stdio; inventory {fleet.inventory.path}; allowed: "
                 f"{policy.describe()}; audit session {audit.session}")
    try:
        serve_stdio(build_server(tools, policy, audit))
    finally:
        tools.close()
        store.close()


@click.command("audit")
@click.option("--last", "-n", "last", type=click.IntRange(1), default=50, show_default=True,
              help="The N newest calls.")
@click.option("--tool", metavar="NAME", help="Only calls of this tool.")
@click.option("--session", metavar="ID", help="Only calls of this server session.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def audit_command(last, tool, session, as_json):
    """The audit trail of `orch mcp` tool calls, newest first: tool, target, arguments
    (secret values masked, stdin as its size), outcome, duration. OUTCOME started: the call
    was recorded before it acted and its end never was (the server was killed, or the
    second write failed).

    \b
    Examples:
      orch runs audit
      orch runs audit --tool exec --last 20 --json
    """
    with RunStore() as store:
        rows = audit_rows(store, last=last, tool=tool, session=session)
    if as_json:
        console.print_json(rows)
        return
    if not rows:
        console.info("no MCP tool calls recorded yet")
        return
    left_out = console.table(
        ["WHEN", "SESSION", "TOOL", "TARGET", "OUTCOME", "MS", "ARGUMENTS"],
        [[r["at"][:23].replace("T", " "), r["session"], r["tool"], r["target"],
          r["outcome"] + (f": {r['error'].splitlines()[0][:60]}" if r["error"] else ""),
          f"{r['duration_ms']:.1f}", _short(r["arguments"])] for r in rows],
        optional=["SESSION", "ARGUMENTS"])   # rather than every cell wrapping in 80 columns
    if left_out:
        console.info(f"({', '.join(left_out)} left out at this width: a wider terminal or "
                     "--json shows them)")


def _short(arguments: dict, width: int = 80) -> str:
    text = json.dumps({k: v for k, v in arguments.items() if k != "target"}, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."
