"""Playbooks: YAML files of steps, templated with jinja2, checked with file:line:col errors."""

from __future__ import annotations


def load_playbook(path, extra_vars=None):
    from orchestrator.playbook.loader import load_playbook as load
    return load(path, extra_vars)


def parse_extra_vars(items):
    from orchestrator.playbook.loader import parse_extra_vars as parse
    return parse(items)
