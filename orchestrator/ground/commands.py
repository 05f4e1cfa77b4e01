"""orch's commands, registered once: where each lives and whether the warm agent runs it.

The entry point (cli/main.py), the agent's thin client (agent/client.py), the click app
(cli/app.py, which lists and loads the commands) and the reference generator
(cli/reference.py) all read this table. A command's help is its own docstring: `orch --help`
reads the first paragraph from the module's source without importing it.

Standard library only, and nothing else: the thin client imports this before anything else
(tests/unit/cli/test_startup.py measures it), so no dataclasses or typing here.
"""

from __future__ import annotations

from collections import namedtuple

# name: what the user types; module and attribute: the click command, imported by cli/app.py
# when it runs (module under orchestrator/: a name here, not an import of the bottom layer's;
# tests/unit/project/test_import_graph.py checks that cli may import each);
# agent: what the warm agent runs of it: ALL, a frozenset of subcommands, or None (nothing);
# grafted: subcommands kept in other modules, as ((module, attribute), ...)
Command = namedtuple("Command", "name module attribute agent grafted", defaults=(None, ()))
ALL = "all"

COMMANDS = (
    Command("agent", "cli.commands.agent", "agent"),
    Command("attach", "cli.commands.run", "attach_command"),
    Command("cp", "cli.commands.debug", "cp_command", ALL),
    Command("ct", "cli.commands.core", "ct", frozenset({"list", "status"})),
    Command("exec", "cli.commands.core", "exec_command", ALL),
    Command("explain", "cli.commands.explain", "explain_command"),
    Command("forward", "cli.commands.debug", "forward_command"),
    Command("grep-pkg", "cli.commands.torch", "grep_pkg", ALL),
    Command("grep-torch", "cli.commands.torch", "grep_torch", ALL),
    Command("inventory", "cli.commands.core", "inventory", frozenset({"check"})),
    Command("mcp", "mcp.cli", "mcp_command"),
    Command("nightly", "cli.commands.runs", "nightly_command"),
    # patch's status and diff only (agent/client.py reads the action): apply/revert stay here
    Command("patch", "cli.commands.torch", "patch", frozenset({"fx-tls", "fx-threads"})),
    Command("report", "cli.commands.runs", "report"),
    Command("run", "cli.commands.run", "run_command"),
    Command("runs", "cli.commands.runs", "runs",
            grafted=(("mcp.cli", "audit_command"),)),
    Command("sandbox", "cli.commands.sandbox", "sandbox"),
    Command("schedule", "cli.commands.runs", "schedule"),
    Command("shell", "cli.commands.debug", "shell_command"),
    Command("stacks", "cli.commands.explain", "stacks_command"),
    Command("stop", "cli.commands.run", "stop_command"),
    Command("validate", "cli.commands.run", "validate_command"),
    Command("verify", "cli.commands.torch", "verify", ALL),
)
BY_NAME = {command.name: command for command in COMMANDS}


def agent_runs(name: str, subcommand: str | None) -> bool:
    """Whether the warm agent runs NAME (with its first word SUBCOMMAND, for a group)."""
    command = BY_NAME.get(name)
    if command is None or command.agent is None:
        return False
    return command.agent == ALL or subcommand in command.agent
