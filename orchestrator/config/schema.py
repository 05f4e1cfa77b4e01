"""Small checks for YAML documents; every failure is a ConfigError at file:line:col."""

from __future__ import annotations

import difflib
from typing import Any, Iterable

from orchestrator.config.yamlsrc import Path, Source, describe_path

TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
              list: "a list", dict: "a mapping"}


def type_name(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(TYPE_NAMES.get(t, t.__name__) for t in types)


def expect(source: Source, path: Path, value: Any, types, what: str | None = None) -> Any:
    types = types if isinstance(types, tuple) else (types,)
    # bool is an int in Python; a YAML `true` is never a valid port or count.
    wrong_bool = isinstance(value, bool) and bool not in types
    if wrong_bool or not isinstance(value, types):
        shown = "null" if value is None else repr(value)
        raise source.error(path, f"{what or describe_path(path)} must be {type_name(types)}, "
                                 f"not {shown}")
    return value


def check_keys(source: Source, path: Path, mapping: dict, allowed: Iterable[str],
               required: Iterable[str] = ()) -> None:
    allowed = list(allowed)
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            raise source.error(path + (key,), f"unknown key {key!r} in {describe_path(path)}",
                               key=True, hint=hint)
    for key in required:
        if key not in mapping:
            raise source.error(path, f"{describe_path(path)} needs the key {key!r}")


def expect_list_of(source: Source, path: Path, value: Any, types, what: str | None = None) -> list:
    expect(source, path, value, list, what)
    for index, item in enumerate(value):
        expect(source, path + (index,), item, types)
    return value
