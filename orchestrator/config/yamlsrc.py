"""YAML that remembers where each value came from, so every error names file:line:col.

load_yaml() returns plain dicts and lists (easy to use) plus a table from each value's path
(a tuple of keys and indexes) to its position in the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import yaml

from orchestrator.ground.errors import ConfigError

Path = tuple
# libyaml's parser where PyYAML was built with it (its wheels are): the same nodes, marks and
# tags (the resolver is PyYAML's own either way), about 15 times faster than the pure-Python
# one (2.5 ms of every command that reads the sandbox's inventory, more for a playbook).
FAST_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class Source:
    """A loaded YAML document and the positions of its values and keys (1-based)."""

    filename: str
    data: Any
    value_marks: dict = field(default_factory=dict)
    key_marks: dict = field(default_factory=dict)

    def where(self, path: Path, key: bool = False) -> str:
        marks = self.key_marks if key and path in self.key_marks else self.value_marks
        probe = tuple(path)
        while probe not in marks and probe:
            probe = probe[:-1]  # fall back to the nearest enclosing value
        line, col = marks.get(probe, (1, 1))
        return f"{self.filename}:{line}:{col}"

    def error(self, path: Path, message: str, key: bool = False, hint: str | None = None) -> ConfigError:
        return ConfigError(f"{self.where(path, key)}: {message}", hint=hint)


@dataclass(frozen=True)
class Loc:
    """Where a value came from: a loaded YAML source and the value's path in it."""

    source: Any                          # a Source, or an OptionSource for -e values
    path: tuple

    def where(self, key: bool = False) -> str:
        return self.source.where(self.path, key=key)

    def error(self, message: str, hint: Optional[str] = None, key: bool = False) -> ConfigError:
        return ConfigError(f"{self.where(key)}: {message}", hint=hint)

    def child(self, part) -> "Loc":
        return Loc(self.source, self.path + (part,))


class OptionSource:
    """Stands in for a YAML source for a value given on the command line (-e NAME=...):
    its errors name the option, not a file:line:col."""

    def __init__(self, name: str, value: Any):
        self.filename = name
        self.data = value

    def where(self, path, key=False) -> str:
        return self.filename

    def error(self, path, message, key=False, hint=None):
        return ConfigError(f"{self.filename}: {message}", hint=hint)


def describe_path(path: Iterable) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def load_yaml(filename: str, text: str | None = None, folder: str | None = None) -> Source:
    """The YAML file `filename` (relative to `folder`, when given; messages name it as given)."""
    try:
        if text is None:
            with open(os.path.join(folder, filename) if folder else filename,
                      encoding="utf-8") as handle:
                text = handle.read()
    except FileNotFoundError:
        raise ConfigError(f"{filename}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{filename}: cannot read: {error}") from None
    try:
        node = _compose(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        raise ConfigError(f"{where}: invalid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{filename}: invalid YAML: {error}") from None
    source = Source(filename, None)
    source.data = _convert(node, (), source) if node is not None else {}
    return source


def _compose(text: str):
    try:
        return yaml.compose(text, Loader=FAST_COMPOSER)
    except yaml.YAMLError:
        # the pure-Python parser says it better ("found character '\t' that cannot start
        # any token", "found undefined alias 'y'"); its verdict stands either way
        return yaml.compose(text, Loader=yaml.SafeLoader)


def _mark(node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _convert(node, path: Path, source: Source) -> Any:
    source.value_marks[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        return _convert_mapping(node, path, source)
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, path + (index,), source) for index, item in enumerate(node.value)]
    try:
        return yaml.SafeLoader(" ").construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as error:
        raise source.error(path, f"cannot read this value: {error.problem}") from None


def _convert_mapping(node, path: Path, source: Source) -> dict:
    result: dict = {}
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise source.error(path, "YAML merge keys (<<) are not supported here")
        key = _convert(key_node, path + ("<key>",), source)
        if not isinstance(key, (str, int)):
            raise source.error(path, f"a key must be a string, not {type(key).__name__}")
        child = path + (key,)
        if key in result:
            line, col = _mark(key_node)
            raise ConfigError(f"{source.filename}:{line}:{col}: duplicate key {key!r} "
                              f"(first at {source.where(child, key=True)})")
        source.key_marks[child] = _mark(key_node)
        result[key] = _convert(value_node, child, source)
    return result
