"""What an MCP server may do: read-only by default; changes only with an explicit allowance.

    orch mcp                          # read-only tools
    orch mcp --allow exec             # + exec
    orch mcp --allow write            # + fx_tls_apply/revert, run_start, run_stop
    orch mcp --allow exec --allow-target sb1-200   # changing tools on sb1-200 only
    orch mcp --policy mcp-policy.yaml # allow: [exec, write]; targets: [drafters]

A tool that is not allowed is not even listed: an agent cannot call what it cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from orchestrator.config.yamlsrc import load_yaml
from orchestrator.errors import ConfigError, OrchError

READ_TOOLS = ("list_targets", "inventory_check", "grep_source", "read_source", "fx_tls_status",
              "fx_tls_diff", "verify_fx_race", "run_status", "run_log", "runs_list",
              "runs_compare")
ALLOWANCES = {"exec": ("exec",),
              "write": ("fx_tls_apply", "fx_tls_revert", "run_start", "run_stop")}
POLICY_KEYS = {"allow", "targets"}


class PolicyRefused(OrchError):
    """A changing tool was called for a target the allowance does not name."""


@dataclass
class Policy:
    allow: frozenset = frozenset()            # names of ALLOWANCES
    targets: Optional[frozenset] = None       # container names; None: any target
    target_names: tuple = field(default=())   # as given (groups too), for messages

    def tools(self) -> list[str]:
        names = list(READ_TOOLS)
        for allowance in sorted(self.allow):
            names += ALLOWANCES[allowance]
        return names

    def changes(self, tool: str) -> bool:
        return any(tool in tools for tools in ALLOWANCES.values())

    def check(self, tool: str, containers: Iterable[str]) -> None:
        """Refuse a changing tool on a container outside the allowance's targets."""
        if not self.changes(tool) or self.targets is None:
            return
        outside = sorted(set(containers) - self.targets)
        if outside:
            raise PolicyRefused(
                f"{tool} is not allowed on {', '.join(outside)}: this server's allowance names "
                f"only {', '.join(self.target_names)}",
                hint="start the server with --allow-target for that container (or edit the policy file)")

    def describe(self) -> str:
        allowed = ", ".join(sorted(self.allow)) or "read-only"
        where = "any target" if self.targets is None else ", ".join(self.target_names)
        return f"{allowed} ({where})"


def build_policy(allow: Iterable[str] = (), targets: Iterable[str] = (),
                 policy_file: Optional[str] = None, inventory=None) -> Policy:
    """The allowance from --allow/--allow-target and an optional policy file (merged)."""
    allow, targets = list(allow), list(targets)
    if policy_file:
        from_file = _read_policy_file(policy_file)
        allow += from_file.get("allow", [])
        targets += from_file.get("targets", [])
    unknown = sorted(set(allow) - set(ALLOWANCES))
    if unknown:
        raise ConfigError(f"unknown allowance {', '.join(map(repr, unknown))}",
                          hint="allowances: " + ", ".join(ALLOWANCES))
    if not targets:
        return Policy(allow=frozenset(allow))
    containers = {spec.name for spec in inventory.resolve(targets)} if inventory else set(targets)
    return Policy(allow=frozenset(allow), targets=frozenset(containers), target_names=tuple(targets))


def _read_policy_file(path: str) -> dict:
    source = load_yaml(path)
    data = source.data
    if not isinstance(data, dict):
        raise source.error((), "a policy is a mapping with allow: and targets:")
    for key in data:
        if key not in POLICY_KEYS:
            raise source.error((key,), f"unknown key {key!r} (known: allow, targets)", key=True)
    for key in POLICY_KEYS & set(data):
        value = data[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise source.error((key,), f"{key}: must be a list of names")
    for index, name in enumerate(data.get("allow", [])):
        if name not in ALLOWANCES:
            raise source.error(("allow", index), f"unknown allowance {name!r}",
                               hint="allowances: " + ", ".join(ALLOWANCES))
    return data
