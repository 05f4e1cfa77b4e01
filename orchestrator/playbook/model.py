"""The playbook as data: what the loader produces and the steps, the engine and attach read.

It sits below everything else in playbook/ (it imports nothing of it), so a step kind can
name the playbook and its own spec without importing the loader that parses them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from orchestrator.config.yamlsrc import Loc

# Names every template can use, besides vars and registered results (the engine fills them
# in for each target; validation stands an Unknown in for each).
BUILTIN_NAMES = ("target", "run_id", "playbook_dir", "remote_dir", "state_dir", "inventory_dir")

# What a var a playbook lets an MCP client set (`mcp: vars:`) may hold. A scalar by default:
# a list (of scalars) only where the playbook says so. Nothing else: a mapping could carry
# anything a step reads.
SCALARS = (str, int, float, bool, type(None))
CLIENT_VAR_KINDS = {
    "scalar": ("a string, number, true/false or null", SCALARS),
    "string": ("a string", (str,)),
    "integer": ("an integer", (int,)),
    "number": ("a number", (int, float)),
    "boolean": ("true or false", (bool,)),
    "list": ("a list of strings, numbers or true/false", (list,)),
}


def client_value_fits(kind: str, value: Any) -> bool:
    """Does an MCP client's value fit the kind the playbook declared for its var?"""
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    if kind == "list":
        return isinstance(value, list) and all(isinstance(item, SCALARS) and item is not None
                                               for item in value)
    return isinstance(value, CLIENT_VAR_KINDS[kind][1])


@dataclass
class StepSpec:
    index: int
    kind: str
    name: str
    params: dict
    loc: Loc                             # the step mapping
    params_loc: Loc                      # the kind's own mapping
    when: Any = None
    register: Optional[str] = None
    retries: int = 0
    retry_delay: float = 2.0
    timeout: Optional[float] = None
    continue_on_error: bool = False
    always: bool = False

    def label(self) -> str:
        return self.name or self.kind


@dataclass
class Playbook:
    path: str
    name: str
    description: str
    targets: list[str]
    targets_loc: Optional[Loc]
    vars: dict
    var_locs: dict                       # name -> Loc of its value
    steps: list[StepSpec]
    sha256: str
    sources: list[str] = field(default_factory=list)   # this file and those it extends
    # the vars an MCP client may set (`mcp: vars:`), name -> a CLIENT_VAR_KINDS key; none
    # when the playbook has no such section
    client_vars: dict = field(default_factory=dict)

    @property
    def directory(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))
