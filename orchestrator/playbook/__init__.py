"""Playbooks: YAML files of steps, templated with jinja2, checked with file:line:col errors."""

from __future__ import annotations

from orchestrator.playbook.loader import load_playbook, parse_extra_vars

__all__ = ["load_playbook", "parse_extra_vars"]
