"""The `orch` entry point. A quick command (exec, grep-torch, ...) goes to the warm agent
when it can; anything else, or when the agent cannot take it, runs here as always.

This module imports neither click nor paramiko: handing a command to the agent costs a
Python start and a few stdlib imports (docs/guide/agent.md). The CLI is imported by name only when
the command runs here.
"""

from __future__ import annotations

import importlib
import os
import sys

from orchestrator.agent import protocol
from orchestrator.agent.client import ENV_SWITCH, OFF_VALUES, is_fast_command, run_in_agent


def main() -> None:
    """The console script `orch`."""
    args = sys.argv[1:]
    mode = os.environ.get(ENV_SWITCH, "on").strip().lower()
    if mode not in OFF_VALUES and is_fast_command(args):
        code = run_in_agent(args)
        if code is not None:
            sys.exit(code)
        if mode == "require":
            sys.stderr.write("orch: error: ORCH_AGENT=require, but the agent could not take "
                             "the command\n")
            sys.exit(protocol.EXIT_AGENT_LOST)
    run_here()


def run_here() -> None:
    """The direct path: the whole click command line, in this process. The SSH connection
    of a command that needs one known host starts first, so that the host's waits overlap
    the imports (orchestrator/remote/early.py; imported here: a command the agent runs needs
    none of it)."""
    importlib.import_module("orchestrator.remote.early").start(sys.argv[1:])
    cli = importlib.import_module("orchestrator.cli.app")
    cli.main(prog_name="orch")
