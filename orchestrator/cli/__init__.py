"""The command line: main (the `orch` entry point, light: it may hand a command to the agent),
app (the click group, imported only when a command runs here) and commands/ (one module per
family of commands).

Kept import-free: `orchestrator.cli.main` must not import click.
"""
