"""Small checks for YAML documents; every failure is a ConfigError at file:line:col."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from orchestrator.config.yamlsrc import Loc, Path, Source, describe_path


def is_template(value: Any) -> bool:
    """Whether a YAML value is a jinja2 template (rendered when the run knows its variables).
    A plain check, so that reading a config never imports jinja2."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
              list: "a list", dict: "a mapping"}


# An error quotes at most this much of a value: the value may be a file's content (a
# private key given as a playbook reads as one long string), never worth echoing whole.
QUOTED_CHARS = 40


def quoted(value: Any, width: int = QUOTED_CHARS) -> str:
    """A value as an error message shows it: its repr, cut to a short prefix."""
    text = "null" if value is None else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def type_name(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(TYPE_NAMES.get(t, t.__name__) for t in types)


def expect(source: Source, path: Path, value: Any, types, what: str | None = None) -> Any:
    types = types if isinstance(types, tuple) else (types,)
    # bool is an int in Python; a YAML `true` is never a valid port or count.
    wrong_bool = isinstance(value, bool) and bool not in types
    if wrong_bool or not isinstance(value, types):
        raise source.error(path, f"{what or describe_path(path)} must be {type_name(types)}, "
                                 f"not {quoted(value)}")
    return value


def check_keys(source: Source, path: Path, mapping: dict, allowed: Iterable[str],
               required: Iterable[str] = ()) -> None:
    allowed = list(allowed)
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            raise source.error(path + (key,), f"unknown key {quoted(key)} in {describe_path(path)}",
                               key=True, hint=hint)
    for key in required:
        if key not in mapping:
            raise source.error(path, f"{describe_path(path)} needs the key {key!r}")


def expect_list_of(source: Source, path: Path, value: Any, types, what: str | None = None) -> list:
    expect(source, path, value, list, what)
    for index, item in enumerate(value):
        expect(source, path + (index,), item, types)
    return value


@dataclass(frozen=True)
class Param:
    """One parameter of a step kind: its types, default, choices and what it is for."""

    types: tuple
    required: bool = False
    default: Any = None
    choices: tuple = ()
    items: Optional[tuple] = None      # for lists: the type of each item
    # for lists of strings: no item may start with "-" (they follow a command's options, and
    # one that is an option would change what the command does); the hint says where
    # options go instead
    plain_items: str = ""
    doc: str = ""


def check_value(name: str, param: Param, value: Any, loc: Loc) -> Any:
    """Type-check one parameter value (a literal at load time, a rendered one at run time)."""
    if value is None and not param.required:
        return value
    types = param.types
    if float in types and int not in types:
        types = types + (int,)
    wrong_bool = isinstance(value, bool) and bool not in types
    if wrong_bool or not isinstance(value, types):
        raise loc.error(f"{name} must be {type_name(param.types)}, not {quoted(value)}")
    if param.choices and value not in param.choices:
        raise loc.error(f"{name} must be one of {', '.join(map(str, param.choices))}, "
                        f"not {quoted(value)}")
    if isinstance(value, list) and param.items:
        for index, item in enumerate(value):
            if is_template(item):
                continue
            if isinstance(item, bool) and bool not in param.items or not isinstance(item, param.items):
                raise loc.child(index).error(
                    f"each item of {name} must be {type_name(param.items)}, not {quoted(item)}")
            if param.plain_items and isinstance(item, str) and item.lstrip().startswith("-"):
                raise loc.child(index).error(
                    f"each item of {name} is an argument, never an option: {quoted(item)} "
                    "starts with '-'", hint=param.plain_items)
    return value
