"""The jinja2 environments playbook values and pushed template files are rendered with:
undefined names are errors (StrictUndefined), plus the `quote` and `join_argv` filters.

Both are jinja2's immutable sandbox. Templates reach orch from places its user does not
always write: `-e` values pasted from a chat, an MCP client's `run_start` vars, a pushed
file from someone's repository. Plain jinja2 lets any of them run Python on the controller
(`{{ lipsum.__globals__['os'].system(...) }}`), which holds root SSH keys to every host; the
sandbox refuses attributes starting with `_`, the internals of functions and frames, and
(immutable) any method that changes a list, dict or set in place. A refused access is a
`jinja2.exceptions.SecurityError` (see is_security_error).
"""

from __future__ import annotations

import shlex

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.nativetypes import NativeCodeGenerator, NativeTemplate, native_concat
from jinja2.sandbox import ImmutableSandboxedEnvironment


class NativeSandboxedEnvironment(ImmutableSandboxedEnvironment):
    """jinja2.nativetypes.NativeEnvironment's behaviour (a single expression keeps its type:
    a list stays a list) inside the immutable sandbox. NativeEnvironment is an Environment
    with its own code generator and concat; the sandbox does its checks at run time
    (getattr, call), so the two combine by taking the former's two pieces."""

    code_generator_class = NativeCodeGenerator
    concat = staticmethod(native_concat)


class NativeSandboxedTemplate(NativeTemplate):
    environment_class = NativeSandboxedEnvironment


NativeSandboxedEnvironment.template_class = NativeSandboxedTemplate


def _make_env(cls) -> jinja2.Environment:
    env = cls(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    env.filters["quote"] = lambda value: shlex.quote(str(value))
    env.filters["join_argv"] = lambda value: shlex.join(str(v) for v in value)
    return env


SANDBOX_HINT = ("templates run in jinja2's sandbox: no attributes starting with '_', "
                "no methods that change a value in place")


def is_security_error(error: BaseException) -> bool:
    return isinstance(error, SecurityError)


ENV = _make_env(ImmutableSandboxedEnvironment)
NATIVE_ENV = _make_env(NativeSandboxedEnvironment)
