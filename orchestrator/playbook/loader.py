"""Loading and checking a playbook: every mistake is a ConfigError at file:line:col.

    name: dflash
    extends: dflash.yaml          # optional: start from another playbook (vars and mcp
                                  # vars merge, targets and steps replace when given)
    targets: [drafters]
    vars: {steps: 200, hang_after: 120}
    mcp:                          # optional: what an MCP client (orch mcp's run_start) may
      vars: [steps, hang_after]   # set: these vars, each a scalar; or {steps: integer,
                                  # extra_args: list}; none without this section
    steps:
      - name: torch is patched
        patch: {action: apply}
        when: fx.state == 'vulnerable'
        register: patched
        retries: 1
        timeout: 600
        continue_on_error: false

One key of a step names its kind (ensure, bootstrap, grep, patch, verify, push, launch,
monitor, collect, shell); the others are the common options below.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from typing import Any, Iterable, Optional

import yaml

from orchestrator.config.schema import check_keys, expect, expect_list_of, quoted
from orchestrator.config.yamlsrc import Loc, Source, describe_path, load_yaml
from orchestrator.ground.errors import ConfigError
from orchestrator.playbook.model import BUILTIN_NAMES, CLIENT_VAR_KINDS, Playbook, StepSpec
from orchestrator.playbook.render import (Unknown, UnknownAtPlanTime, check_names, referenced_names,
                                          render, render_params)
from orchestrator.playbook.steps import STEP_KINDS

TOP_KEYS = ("name", "description", "extends", "targets", "vars", "mcp", "steps")
COMMON_KEYS = ("name", "when", "register", "retries", "retry_delay", "timeout",
               "continue_on_error", "always")
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def load_playbook(path: str, extra_vars: Optional[dict] = None) -> Playbook:
    """Load, merge `extends`, and check everything that can be checked before a run."""
    playbook = _load(path, seen=())
    check_playbook(playbook, extra_vars or {})
    return playbook


def _load(path: str, seen: tuple) -> Playbook:
    absolute = os.path.abspath(path)
    if absolute in seen:
        raise ConfigError(f"{path}: extends itself (through {' -> '.join(seen)})")
    source = load_yaml(path)
    data = source.data if source.data is not None else {}
    root = Loc(source, ())
    expect(source, (), data, dict, "a playbook")
    check_keys(source, (), data, TOP_KEYS, required=())
    parent: Optional[Playbook] = None
    if "extends" in data:
        base = expect(source, ("extends",), data["extends"], str)
        base_path = os.path.join(os.path.dirname(absolute), os.path.expanduser(base))
        if not os.path.exists(base_path):
            raise source.error(("extends",), f"extends {base!r}: no such file ({base_path})")
        parent = _load(base_path, seen + (absolute,))
    elif "steps" not in data:
        raise source.error((), "a playbook needs steps: (a list of steps)")

    name = data.get("name", parent.name if parent else os.path.splitext(os.path.basename(path))[0])
    expect(source, ("name",), name, str)
    description = data.get("description", parent.description if parent else "")
    expect(source, ("description",), description, str)

    targets, targets_loc = (parent.targets, parent.targets_loc) if parent else ([], None)
    if "targets" in data:
        raw = data["targets"]
        targets = [raw] if isinstance(raw, str) else expect_list_of(source, ("targets",), raw, str)
        targets_loc = root.child("targets")

    variables = dict(parent.vars) if parent else {}
    var_locs = dict(parent.var_locs) if parent else {}
    if "vars" in data:
        section = data["vars"] if data["vars"] is not None else {}
        expect(source, ("vars",), section, dict)
        for key, value in section.items():
            if not isinstance(key, str) or not NAME_PATTERN.fullmatch(key):
                raise source.error(("vars", key), f"{key!r} is not a valid variable name "
                                                  "(letters, digits, '_'; not first a digit)", key=True)
            if key in BUILTIN_NAMES:
                raise source.error(("vars", key), f"{key!r} is a built-in name; choose another",
                                   key=True)
            variables[key] = value
            var_locs[key] = root.child("vars").child(key)

    client_vars = dict(parent.client_vars) if parent else {}   # they merge, as vars do
    if "mcp" in data:
        client_vars.update(_client_vars(source, data, variables))

    if "steps" in data:
        steps = _steps(source, data["steps"])
    else:
        steps = parent.steps
    digest = hashlib.sha256()
    for text in ([*parent.sources] if parent else []):
        digest.update(text.encode())
    with open(absolute, "rb") as handle:
        raw_bytes = handle.read()
    digest.update(raw_bytes)
    sources = ([*parent.sources] if parent else []) + [raw_bytes.decode("utf-8", "replace")]
    return Playbook(path=path, name=name, description=description, targets=targets,
                    targets_loc=targets_loc, vars=variables, var_locs=var_locs, steps=steps,
                    sha256=digest.hexdigest(), sources=sources, client_vars=client_vars)


def _client_vars(source: Source, data: dict, variables: dict) -> dict:
    """`mcp: vars:` -> {name: kind}: a list of names (each a scalar), or a mapping of
    names to kinds (scalar, string, integer, number, boolean, list). Each must be a var of
    the playbook (its own or one it extends)."""
    section = data["mcp"] if data["mcp"] is not None else {}
    expect(source, ("mcp",), section, dict, "mcp")
    check_keys(source, ("mcp",), section, ("vars",))
    raw = section.get("vars")
    raw = [] if raw is None else raw
    if isinstance(raw, list):
        expect_list_of(source, ("mcp", "vars"), raw, str)
        declared = {name: ("scalar", ("mcp", "vars", index)) for index, name in enumerate(raw)}
    else:
        expect(source, ("mcp", "vars"), raw, dict, "mcp.vars (a list of names, or names: kinds)")
        declared = {}
        for name, kind in raw.items():
            where = ("mcp", "vars", name)
            kind = "scalar" if kind is None else kind
            if not isinstance(kind, str) or kind not in CLIENT_VAR_KINDS:
                raise source.error(where, f"mcp.vars.{name}: the kind must be one of "
                                          f"{', '.join(CLIENT_VAR_KINDS)}, not {quoted(kind)}")
            declared[name] = (kind, where)
    for name, (_, where) in declared.items():
        if name not in variables:
            close = difflib.get_close_matches(str(name), sorted(variables), n=1)
            raise source.error(where, f"mcp.vars names {quoted(name)}, which is not a var of "
                                      "this playbook (an MCP client may set only vars the "
                                      "playbook defines)", key=isinstance(raw, dict),
                               hint=f"did you mean {close[0]!r}?" if close else "define it under vars:")
    return {name: kind for name, (kind, _) in declared.items()}


def _steps(source: Source, raw: Any) -> list[StepSpec]:
    expect(source, ("steps",), raw, list)
    if not raw:
        raise source.error(("steps",), "steps: is empty; a playbook needs at least one step")
    return [_step(source, index, item) for index, item in enumerate(raw)]


def _step(source: Source, index: int, item: Any) -> StepSpec:
    path = ("steps", index)
    loc = Loc(source, path)
    expect(source, path, item, dict, f"step {index + 1}")
    kinds = [key for key in item if key in STEP_KINDS]
    if not kinds:
        unknown = [key for key in item if key not in COMMON_KEYS]
        allowed = list(STEP_KINDS) + list(COMMON_KEYS)
        if unknown:
            check_keys(source, path, {unknown[0]: None}, allowed)  # raises with "did you mean"
        raise loc.error(f"step {index + 1} has no kind: give one of {', '.join(STEP_KINDS)}")
    if len(kinds) > 1:
        raise loc.child(kinds[1]).error(
            f"step {index + 1} has two kinds ({kinds[0]} and {kinds[1]}); split it into two steps",
            key=True)
    kind = kinds[0]
    check_keys(source, path, item, list(COMMON_KEYS) + [kind])
    step_class = STEP_KINDS[kind]
    params_loc = loc.child(kind)
    raw_params = item[kind]
    if raw_params is None:
        raw_params = {}
    if not isinstance(raw_params, dict) and step_class.shorthand:
        raw_params = {step_class.shorthand: raw_params}
        _alias_marks(source, path + (kind,), step_class.shorthand)
    expect(source, path + (kind,), raw_params, dict, f"the {kind} step's settings")
    check_keys(source, path + (kind,), raw_params, list(step_class.params))

    name = item.get("name", "")
    expect(source, path + ("name",), name, str)
    register = item.get("register")
    if register is not None:
        expect(source, path + ("register",), register, str)
        if not NAME_PATTERN.fullmatch(register):
            raise source.error(path + ("register",), f"register {register!r} is not a valid "
                                                     "variable name")
        if register in BUILTIN_NAMES:
            raise source.error(path + ("register",), f"{register!r} is a built-in name")
    when = item.get("when")
    if when is not None:
        expect(source, path + ("when",), when, (str, bool))
    retries = item.get("retries", 0)
    expect(source, path + ("retries",), retries, int)
    if retries < 0:
        raise source.error(path + ("retries",), "retries must be 0 or more")
    retry_delay = item.get("retry_delay", 2.0)
    expect(source, path + ("retry_delay",), retry_delay, (int, float))
    timeout = item.get("timeout")
    if timeout is not None:
        expect(source, path + ("timeout",), timeout, (int, float))
        if timeout <= 0:
            raise source.error(path + ("timeout",), "timeout must be a positive number of seconds")
    continue_on_error = item.get("continue_on_error", False)
    expect(source, path + ("continue_on_error",), continue_on_error, bool)
    always = item.get("always", False)
    expect(source, path + ("always",), always, bool)
    return StepSpec(index=index, kind=kind, name=name, params=raw_params, loc=loc,
                    params_loc=params_loc, when=when, register=register, retries=retries,
                    retry_delay=float(retry_delay), timeout=float(timeout) if timeout else None,
                    continue_on_error=continue_on_error, always=always)


def _alias_marks(source: Source, base: tuple, key: str) -> None:
    """`- shell: [a, b]` means `- shell: {argv: [a, b]}`: give the implied argv the
    positions of the value written, so errors inside it still point at the right column."""
    for marks in (source.value_marks, source.key_marks):
        for path, mark in list(marks.items()):
            if path[:len(base)] == base:
                marks[base + (key,) + path[len(base):]] = mark


# ------------------------------------------------------------------ whole-playbook checks
def check_playbook(playbook: Playbook, extra_vars: dict) -> None:
    """Each step in the order a run meets it: its templates (syntax, undefined names), its
    settings (rendered where vars are enough, e.g. `-e hang_after=soon` fails now, at the
    value's position; what needs the target or a registered result waits for the run), then
    its kind's own checks."""
    known = set(BUILTIN_NAMES) | set(playbook.vars) | set(extra_vars)
    context = _validation_context(playbook, extra_vars)  # raises on cycles / unknown names
    for spec in playbook.steps:
        if spec.when is not None and not isinstance(spec.when, bool):
            check_names(spec.when, spec.loc.child("when"), known, expression=True)
        check_names(spec.params, spec.params_loc, known)
        step = STEP_KINDS[spec.kind]()
        render_params(step.params, spec, context, validating=True)
        step.check(spec.params, spec.params_loc)
        step.check_loaded(playbook, spec)
        if spec.register:
            known.add(spec.register)
            context[spec.register] = Unknown(spec.register)


def _validation_context(playbook: Playbook, extra_vars: dict) -> dict:
    """The vars rendered as far as they can be before a run: the built-ins, and a var that
    needs them, stand as Unknown."""
    context: dict = {name: Unknown(name) for name in BUILTIN_NAMES}
    merged = {**playbook.vars, **extra_vars}
    for name in order_vars(playbook.vars, playbook.var_locs, extra_vars):
        loc = playbook.var_locs.get(name) if name not in extra_vars else None
        try:
            context[name] = render(merged[name], context, loc or Loc(Source("-e " + name, None), ()))
        except (UnknownAtPlanTime, ConfigError):
            context[name] = Unknown(name)
    return context


def order_vars(variables: dict, locs: dict, extra_vars: dict) -> list[str]:
    """Vars may use each other; return an order that renders each after what it uses."""
    merged = {**variables, **extra_vars}
    uses: dict[str, set] = {}
    for name, value in merged.items():
        loc = locs.get(name) if name not in extra_vars else None
        if loc is None:
            loc = Loc(Source("-e " + name, value), ())
        names = {n for n, _, _ in referenced_names(value, loc)}
        unknown = sorted(n for n in names if n not in merged and n not in BUILTIN_NAMES)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(merged), n=1)
            raise loc.error(f"variable {name!r} uses {unknown[0]!r}, which is not defined",
                            hint=f"did you mean {close[0]!r}?" if close else None)
        uses[name] = {n for n in names if n in merged}  # itself included: a loop
    ordered: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: tuple) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = " -> ".join(chain[chain.index(name):] + (name,))
            loc = locs.get(name) or Loc(Source("-e " + name, None), ())
            raise loc.error(f"variables refer to each other in a loop: {cycle}")
        state[name] = "visiting"
        for used in sorted(uses[name]):
            visit(used, chain + (name,))
        state[name] = "done"
        ordered.append(name)

    for name in merged:
        visit(name, ())
    return ordered


def parse_extra_vars(items: Iterable[str]) -> dict:
    """-e key=value (value read as YAML: numbers, true/false, lists); -e @file.yaml too."""
    result: dict = {}
    for item in items:
        if item.startswith("@"):
            source = load_yaml(item[1:])
            expect(source, (), source.data, dict, f"the vars file {item[1:]}")
            for key in source.data:
                check_extra_name(key, f"{source.where((key,), key=True)}: the var")
            result.update(source.data)
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"-e {quoted(item, 80)}: expected NAME=VALUE (or @FILE.yaml)")
        check_extra_name(key, f"-e {quoted(item, 80)}:")
        try:
            parsed = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            parsed = value
        # A value YAML reads as a mapping by accident ("a: b") stays the string typed; a
        # mapping written as one ("{a: b}") is taken as one.
        accidental = isinstance(parsed, dict) and not value.lstrip().startswith("{")
        result[key] = value if accidental or parsed is None and value else parsed
    return result


def check_extra_name(name: Any, where: str) -> None:
    """The one check of an extra var's name, whatever brought it (-e NAME=, -e @FILE, an MCP
    client's vars): a valid name, and never a built-in one (remote_dir, state_dir, target,
    run_id, ...: the engine's own facts about the run, which no var may replace)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{where} {quoted(name)} is not a valid variable name (letters, "
                          "digits, '_'; not first a digit)")
    if name in BUILTIN_NAMES:
        raise ConfigError(f"{where} {name!r} is a built-in name (orch sets it for each run)",
                          hint="built-in names: " + ", ".join(BUILTIN_NAMES))


def normalize_extra_vars(extra_vars) -> dict:
    """-e values: a list of "k=v" as typed (values read as YAML), or a dict already parsed
    (an MCP client's vars, nightly's), its names checked as -e checks them."""
    if extra_vars is None:
        return {}
    if isinstance(extra_vars, dict):
        for key in extra_vars:
            check_extra_name(key, "extra var")
        return dict(extra_vars)
    return parse_extra_vars(list(extra_vars))


def describe_step(spec: StepSpec) -> str:
    return f"step {spec.index + 1} ({spec.label()}) at {spec.loc.where()}"


__all__ = ["load_playbook", "parse_extra_vars", "check_extra_name", "order_vars", "describe_path"]
