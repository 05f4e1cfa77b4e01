"""The `orch` command line: each command parses options, calls one function, prints."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
from typing import TYPE_CHECKING, Optional

import click

from orchestrator import __version__

from orchestrator.ground import commands, console, invocation, paths
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


# The commands (ground/commands.py, the one table), loaded only when one runs: `orch --help`
# and `orch CMD --help` import no SSH, no jinja2, no playbook or monitor code
# (tests/unit/cli/test_startup.py keeps it so).
def load_command(name: str) -> Optional[click.Command]:
    """The command NAME, its module imported now; None when orch has no such command or its
    module is not installed (the sandbox ships separately)."""
    entry = commands.BY_NAME.get(name)
    if entry is None:
        return None
    try:
        module = importlib.import_module(module_name(entry.module))
    except ModuleNotFoundError as error:
        if error.name != module_name(entry.module):
            raise
        return None
    command = getattr(module, entry.attribute)
    for sub_module, sub_attribute in entry.grafted:
        sub = getattr(importlib.import_module(module_name(sub_module)), sub_attribute)
        if sub.name not in command.commands:
            command.add_command(sub)
    return command


def module_name(name: str) -> str:
    """The table's module names are under orchestrator/ (ground/commands.py)."""
    return f"orchestrator.{name}"


@functools.lru_cache(maxsize=None)
def own_help(name: str) -> str:
    """The help of command NAME as its own docstring says it, read from its module's source
    without importing the module (`orch --help` lists every command and imports none)."""
    entry = commands.BY_NAME[name]
    with open(importlib.util.find_spec(module_name(entry.module)).origin, encoding="utf-8") as source:
        text = source.read()
    # only the function's own lines are parsed (the whole module would cost `orch --help`
    # twice its time): from its def to the next top-level line
    found = re.search(rf"^def {re.escape(entry.attribute)}\(.*?(?=^[^\s#)])", text + "\nEND", re.M | re.S)
    try:
        node = ast.parse(found.group(0)).body[0] if found else None
    except SyntaxError:
        node = None
    if isinstance(node, ast.FunctionDef):
        return ast.get_docstring(node) or ""
    command = load_command(name)   # not a plain def (built some other way): ask click
    return command.help or "" if command is not None else ""


class LazyGroup(OrchGroup):
    """orch's top level: lists commands from the table, imports one when it is used."""

    def list_commands(self, ctx):
        return sorted(set(commands.BY_NAME) | set(self.commands))

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
            # a stand-in with the same help shortens it exactly as the command would
            shown = loaded or click.Command(name, help=own_help(name))
            rows.append((name, shown.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name(commands.BY_NAME[name].module)) is not None
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
