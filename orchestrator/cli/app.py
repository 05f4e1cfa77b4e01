"""The `orch` command line: each command parses options, calls one function, prints."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Optional

import click

from orchestrator import __version__

from orchestrator.ground import console, invocation, paths
from orchestrator.ground.errors import ExitCode, OrchError
from orchestrator.ground.invocation import Invocation
from orchestrator.ground.lazy import lazy

# SSH (paramiko) is imported when a command first needs a host: `orch --help` stays instant.
if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.targets.fleet import Fleet
    open_fleet = Fleet.from_path
else:
    open_fleet = lazy("orchestrator.targets.fleet", "Fleet.from_path")


class App:
    """What every command shares: the invocation (its streams, environment, folder and
    interrupt: ground/invocation.py), the chosen inventory and, once needed, the open hosts."""

    # Set inside the agent (orchestrator.agentd.server): it lends warm fleets, and a lent fleet's
    # close() closes only this command's channels. None: each command opens its own Fleet.
    fleet_lender = None

    def __init__(self, inventory: Optional[str], trust_on_first_use: bool,
                 invocation: Invocation):
        self.invocation = invocation
        self.inventory_option = inventory
        self.trust_on_first_use = trust_on_first_use
        self._fleet = None

    @property
    def fleet(self):
        if self._fleet is None and App.fleet_lender is not None:
            self._fleet = App.fleet_lender.lend(self.invocation, self.inventory_option,
                                                self.trust_on_first_use)
        if self._fleet is None:
            self._fleet = open_fleet(self.inventory_option,
                                     trust_on_first_use=self.trust_on_first_use)
        return self._fleet

    def close(self) -> None:
        if self._fleet is not None:
            self._fleet.close()


class OrchGroup(click.Group):
    """Runs the command under its invocation (the agent passes one as `obj`; the direct path
    is the process's own) and turns every OrchError into its message and documented exit
    code, never a traceback."""

    def invoke(self, ctx):
        given = ctx.obj if isinstance(ctx.obj, Invocation) else invocation.from_process()
        with invocation.using(given), given.ctrl_c_outside_locks():
            return self._invoke(ctx)

    def _invoke(self, ctx):
        """The command's exit code (what it returned, or its error's) becomes the exit
        status here, once: commands return codes, they never exit."""
        try:
            code = super().invoke(ctx)
            # an interrupt that closed nothing (the command was between commands, or in
            # an HTTPS call) still ends it as the signal would: at the latest, here
            invocation.current().interrupt.check()
        except OrchError as error:
            console.error(str(error))
            code = error.exit_code
            # exec and shell pass the remote code through: orch's own failures are 255, as
            # with ssh, but a bad command line (2) and a missing or stopped container (4)
            # keep theirs
            if ctx.invoked_subcommand in ("exec", "shell") and code not in (ExitCode.USAGE,
                                                                  ExitCode.NO_CONTAINER):
                code = ExitCode.EXEC_ORCH_ERROR
        except KeyboardInterrupt:
            console.error("interrupted")
            code = ExitCode.INTERRUPTED
        ctx.exit(int(code or 0))


# The commands, loaded only when one runs: `orch --help` and `orch CMD --help` import no SSH,
# no jinja2, no playbook or monitor code (tests/unit/test_cli_startup.py keeps it so). Each
# entry: name -> (module, attribute, the first paragraph of its help for `orch --help`);
# tests/unit/test_cli_startup.py checks those against the commands' own help.
LAZY_COMMANDS = {
    "attach": ("orchestrator.cli.commands.run", "attach_command",
               "Follow a launched run again: its log from the start, live progress, the verdict."),
    "agent": ("orchestrator.cli.commands.agent", "agent",
              "The warm agent that runs the quick commands in milliseconds (docs/guide/agent.md)."),
    "cp": ("orchestrator.cli.commands.debug", "cp_command",
           "Copy files and folders into containers (a group: each of them) or out of one."),
    "ct": ("orchestrator.cli.commands.core", "ct",
           "Proxmox containers through the Proxmox API (pvesh over SSH, or HTTPS with a token)."),
    "exec": ("orchestrator.cli.commands.core", "exec_command",
             "Run COMMAND in TARGET (a container, group, host or HOST:VMID), output live."),
    "explain": ("orchestrator.cli.commands.explain", "explain_command",
                "Explain a failed run: its cause first, what followed from it, and shared state on evidence."),
    "forward": ("orchestrator.cli.commands.debug", "forward_command",
                "Forward local TCP ports to ports inside a container, until Ctrl-C."),
    "grep-pkg": ("orchestrator.cli.commands.torch", "grep_pkg",
                 "Search any installed package's source (transformers, triton, ...) like grep-torch."),
    "grep-torch": ("orchestrator.cli.commands.torch", "grep_torch",
                   "Search the installed torch source in each target's venv (torch is never imported)."),
    "inventory": ("orchestrator.cli.commands.core", "inventory", "Inspect the inventory."),
    "mcp": ("orchestrator.mcp.cli", "mcp_command",
            "Serve orch's tools to an AI agent over MCP (stdio): typed, capped, audited."),
    "nightly": ("orchestrator.cli.commands.runs", "nightly_command",
                "Run PLAYBOOK once, unattended (for schedulers and scripts): lock, run, compare with "
                "the baseline (the pinned run, else the last ok run, of the same shape: targets, "
                "workers, devices, throughput variables), write report.html and report.md into the "
                "run's folder, notify, exit with the outcome."),
    "patch": ("orchestrator.cli.commands.torch", "patch",
              "Patches orch applies to the installed torch of a container."),
    "report": ("orchestrator.cli.commands.runs", "report",
               "Write a report of RUN (default: last): a self-contained HTML page (charts as inline "
               "SVG, no external assets) and/or Markdown for a ticket. With neither --html nor --md, "
               "writes report.html and report.md into the run's folder and prints their paths."),
    "run": ("orchestrator.cli.commands.run", "run_command",
            "Run PLAYBOOK: bootstrap, patch, launch detached, monitor, collect, record."),
    "runs": ("orchestrator.cli.commands.runs", "runs",
             "The run history: every `orch run` and `orch nightly`, in the run store."),
    "sandbox": ("orchestrator.cli.commands.sandbox", "sandbox",
                "A Proxmox-like test bed on this machine: hosts with real sshd and LXC containers."),
    "schedule": ("orchestrator.cli.commands.runs", "schedule",
                 "Schedule `orch nightly` with a real scheduler: a systemd timer + service (user "
                 "units by default, --system for /etc/systemd/system), or a crontab line where "
                 "systemd is not running (or with --cron)."),
    "stacks": ("orchestrator.cli.commands.explain", "stacks_command",
               "Every thread's Python stack of a hung run's live process, and who waits on whom."),
    "stop": ("orchestrator.cli.commands.run", "stop_command",
             "Stop a launched run: SIGTERM to its process group, SIGKILL after the grace period."),
    "shell": ("orchestrator.cli.commands.debug", "shell_command",
              "An interactive shell (or COMMAND) in a container, through a PTY end to end."),
    "validate": ("orchestrator.cli.commands.run", "validate_command",
                 "Check PLAYBOOK without running it: keys, types, step kinds, templates, targets."),
    "verify": ("orchestrator.cli.commands.torch", "verify",
               "Checks that run a reproducer inside the container."),
}
# Subcommands that live in another module than their group: group -> [(module, attribute)].
LAZY_SUBCOMMANDS = {"runs": [("orchestrator.mcp.cli", "audit_command")]}


def load_command(name: str) -> Optional[click.Command]:
    """The command NAME, its module imported now; None when orch has no such command or its
    module is not installed (the sandbox ships separately)."""
    if name not in LAZY_COMMANDS:
        return None
    module_name, attribute, _ = LAZY_COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        return None
    command = getattr(module, attribute)
    for sub_module, sub_attribute in LAZY_SUBCOMMANDS.get(name, []):
        sub = getattr(importlib.import_module(sub_module), sub_attribute)
        if sub.name not in command.commands:
            command.add_command(sub)
    return command


class LazyGroup(OrchGroup):
    """orch's top level: lists commands from LAZY_COMMANDS, imports one when it is used."""

    def list_commands(self, ctx):
        return sorted(set(LAZY_COMMANDS) | set(self.commands))

    def get_command(self, ctx, name):
        if name not in self.commands:
            command = load_command(name)
            if command is None:
                return None
            self.add_command(command, name)
        return self.commands[name]

    def format_commands(self, ctx, formatter):
        """As click's, from the table: listing the commands imports none of them."""
        names = [n for n in self.list_commands(ctx) if n in self.commands or _installed(n)]
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            loaded = self.commands.get(name)
            # a stand-in with the same first paragraph shortens it exactly as the command would
            shown = loaded or click.Command(name, help=LAZY_COMMANDS[name][2])
            rows.append((name, shown.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(LAZY_COMMANDS[name][0]) is not None
    except ModuleNotFoundError:
        return False


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-i", "--inventory", metavar="FILE",
              help="Inventory file (default: $ORCH_INVENTORY, ./inventory.yaml, "
                   "~/.config/orch/inventory.yaml). 'sandbox' means the sandbox's inventory.")
@click.option("--trust-new-host-keys", is_flag=True,
              help="Trust-on-first-use: accept and record host keys not yet in known_hosts. "
                   "A CHANGED key is always refused.")
@click.option("--no-agent", is_flag=True,
              help="Run in this process, not in the warm agent (also: ORCH_AGENT=off). "
                   "See `orch agent --help`.")
@click.version_option(__version__, prog_name="orch")
@click.pass_context
def main(ctx, inventory, trust_new_host_keys, no_agent):
    """orch: debug and run GPU training in Proxmox LXC containers, over SSH and `pct exec`.

    \b
    Examples:
      orch -i sandbox exec sb1-200 -- python3 -V
      orch inventory check
      orch grep-torch --def is_fx_symbolic_tracing --show
      orch run playbooks/dflash.yaml
      orch --no-agent exec sb1-200 -- true     # skip the warm agent (docs/guide/agent.md)
    """
    app = App(inventory, trust_new_host_keys, invocation.current())
    ctx.obj = app
    if ctx.invoked_subcommand != "sandbox":   # it builds container roots: their modes are theirs
        ctx.with_resource(paths.private_files())
    ctx.call_on_close(app.close)
