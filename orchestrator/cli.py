"""The `orch` command line: each command parses options, calls one function, prints."""

from __future__ import annotations

import sys
from typing import Optional

import click

from orchestrator import __version__, console
from orchestrator.errors import ExitCode, OrchError


class App:
    """What every command shares: the chosen inventory and, once needed, the open hosts."""

    def __init__(self, inventory: Optional[str], trust_on_first_use: bool):
        self.inventory_option = inventory
        self.trust_on_first_use = trust_on_first_use
        self._fleet = None

    @property
    def fleet(self):
        if self._fleet is None:
            from orchestrator.fleet import Fleet
            self._fleet = Fleet.from_path(self.inventory_option,
                                          trust_on_first_use=self.trust_on_first_use)
        return self._fleet

    def close(self) -> None:
        if self._fleet is not None:
            self._fleet.close()


class OrchGroup(click.Group):
    """Turns every OrchError into its message and documented exit code, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OrchError as error:
            console.error(str(error))
            code = error.exit_code
            # exec passes the remote code through: orch's own failures are 255, as with ssh,
            # but a bad command line (2) and a missing or stopped container (4) keep theirs
            if ctx.invoked_subcommand == "exec" and code not in (ExitCode.USAGE,
                                                                  ExitCode.NO_CONTAINER):
                code = ExitCode.EXEC_ORCH_ERROR
            sys.exit(code)
        except KeyboardInterrupt:
            console.error("interrupted")
            sys.exit(130)


@click.group(cls=OrchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-i", "--inventory", metavar="FILE",
              help="Inventory file (default: $ORCH_INVENTORY, ./inventory.yaml, "
                   "~/.config/orch/inventory.yaml). 'sandbox' means the sandbox's inventory.")
@click.option("--trust-new-host-keys", is_flag=True,
              help="Trust-on-first-use: accept and record host keys not yet in known_hosts. "
                   "A CHANGED key is always refused.")
@click.version_option(__version__, prog_name="orch")
@click.pass_context
def main(ctx, inventory, trust_new_host_keys):
    """orch: debug and run GPU training in Proxmox LXC containers, over SSH and `pct exec`.

    \b
    Examples:
      orch -i sandbox exec sb1-200 -- python3 -V
      orch inventory check
      orch grep-torch --def is_fx_symbolic_tracing --show
      orch run playbooks/dflash.yaml
    """
    app = App(inventory, trust_new_host_keys)
    ctx.obj = app
    ctx.call_on_close(app.close)


def _register() -> None:
    from orchestrator.commands import core
    for command in core.COMMANDS:
        main.add_command(command)
    for module_name in ("sandbox", "torch", "run", "runs"):
        try:
            module = __import__(f"orchestrator.commands.{module_name}", fromlist=["COMMANDS"])
        except ModuleNotFoundError as error:
            if error.name != f"orchestrator.commands.{module_name}":
                raise
            continue
        for command in getattr(module, "COMMANDS", []):
            main.add_command(command)
    from orchestrator.mcp.cli import audit_command, mcp_command  # click only: no SDK import
    main.add_command(mcp_command)
    if isinstance(main.commands.get("runs"), click.Group):
        main.commands["runs"].add_command(audit_command)


_register()
