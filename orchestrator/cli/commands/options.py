"""The click options that several commands share: one place for each option's flags, metavar
and parameter name, while each command words its help for what the option means there."""

from __future__ import annotations

import click


def targets_option(help: str):
    """-t/--target TARGET, repeatable, into the parameter `targets`: containers or groups (a
    command's help says which, and what it does without)."""
    return click.option("-t", "--target", "targets", multiple=True, metavar="TARGET", help=help)


def extra_vars_option(help: str):
    """-e/--extra-var KEY=VALUE, repeatable, into the parameter `extra_vars`: playbook variables."""
    return click.option("-e", "--extra-var", "extra_vars", multiple=True, metavar="KEY=VALUE",
                        help=help)
