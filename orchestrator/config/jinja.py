"""The jinja2 environments playbook values and pushed template files are rendered with:
undefined names are errors (StrictUndefined), plus the `quote` and `join_argv` filters."""

from __future__ import annotations

import shlex

import jinja2
from jinja2.nativetypes import NativeEnvironment


def _make_env(cls) -> jinja2.Environment:
    env = cls(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    env.filters["quote"] = lambda value: shlex.quote(str(value))
    env.filters["join_argv"] = lambda value: shlex.join(str(v) for v in value)
    return env


ENV = _make_env(jinja2.Environment)
NATIVE_ENV = _make_env(NativeEnvironment)

