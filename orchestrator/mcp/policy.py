"""What an MCP server may do: read-only by default; changes only with an explicit allowance.

    orch mcp                          # read-only tools
    orch mcp --allow exec             # + exec
    orch mcp --allow write            # + fx_tls_apply/revert, run_start, run_stop
    orch mcp --allow exec --allow-target sb1-200   # changing tools on sb1-200 only
    orch mcp --policy mcp-policy.yaml # allow: [exec, write]; targets: [drafters]
    orch mcp --allow-host pve         # tools may also act on the Proxmox host pve itself
    orch mcp --allow-path /root/outputs   # read_file may also read under this folder
    orch mcp --allow write --allow-playbook playbooks   # run_start runs playbooks from there

A tool that is not allowed is not even listed: an agent cannot call what it cannot see.

Every tool acts in containers only. A target that is a host itself (a bare host name, or an
inventory entry without a vmid: a command there runs on the hypervisor, as its SSH user,
usually root) is refused, by read-only tools too, unless the allowance names that host
(`--allow-host NAME`, or `hosts: [NAME]` in the policy file).

read_file reads only under orch's run folders of the container (its state folder's runs/)
and under the folders the allowance adds (`--allow-path`, `paths:`); the payload checks the
real path (symlinks resolved) in the container, and the check here refuses what is plainly
outside before anything runs.

run_start runs only playbooks (.yaml/.yml files) inside the folders the server's owner names
(`--allow-playbook DIR`, `playbooks:`), by real path: a client never names a file of its
choice on the controller (an error about any other file would quote it). Its vars are data:
a value (or key) holding template syntax is refused before the playbook is read, so a
client cannot smuggle a template into the controller's renderer; and a client may set only
the vars the playbook lists under `mcp: vars:` (scalars unless the playbook says `list`),
so no client chooses what the controller itself acts on (a wheelhouse folder, the packages
its `pip download` fetches, an index, a file a push reads) unless the playbook lets it.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from orchestrator.config.schema import quoted
from orchestrator.config.yamlsrc import load_yaml
from orchestrator.ground.errors import ConfigError, OrchError
from orchestrator.playbook.model import CLIENT_VAR_KINDS, Playbook, client_value_fits

READ_TOOLS = ("list_targets", "inventory_check", "grep_source", "read_source", "read_file",
              "fx_tls_status", "fx_tls_diff", "verify_fx_race", "run_status", "run_log",
              "explain_run", "runs_list", "runs_compare")
ALLOWANCES = {"exec": ("exec",),
              "write": ("fx_tls_apply", "fx_tls_revert", "run_start", "run_stop")}
POLICY_KEYS = {"allow", "targets", "hosts", "paths", "playbooks"}
PLAYBOOK_SUFFIXES = (".yaml", ".yml")
TEMPLATE_MARKS = ("{{", "{%", "{#")


class PolicyRefused(OrchError):
    """A call the allowance does not cover: a changing tool on a target it does not name,
    a host itself, template syntax in run_start's vars. Audited as "refused"."""


def on_host(spec) -> bool:
    """Does this target run its commands on the host itself (no container)?"""
    return spec.vmid is None and not getattr(spec, "cluster", None)


@dataclass
class Policy:
    allow: frozenset = frozenset()            # names of ALLOWANCES
    targets: Optional[frozenset] = None       # container names; None: any target
    target_names: tuple = field(default=())   # as given (groups too), for messages
    hosts: frozenset = frozenset()            # hosts tools may act on themselves
    paths: tuple = ()                         # folders read_file may read besides run folders
    playbooks: tuple = ()                     # folders (real paths) run_start runs playbooks from

    def tools(self) -> list[str]:
        names = list(READ_TOOLS)
        for allowance in sorted(self.allow):
            names += ALLOWANCES[allowance]
        return names

    def changes(self, tool: str) -> bool:
        return any(tool in tools for tools in ALLOWANCES.values())

    def permits_place(self, spec) -> bool:
        return not on_host(spec) or spec.host in self.hosts

    def check(self, tool: str, specs: Iterable) -> None:
        """Refuse any tool on a host the allowance does not name, and a changing tool on a
        container outside the allowance's targets. specs: what the call would act on
        (ContainerSpec-like: name, host, vmid)."""
        specs = list(specs)
        for spec in specs:
            if not self.permits_place(spec):
                where = ("a host" if spec.name == spec.host
                         else f"a target on the host {spec.host!r} itself, in no container")
                raise PolicyRefused(
                    f"{tool} is not allowed on {spec.name}: that is {where}; MCP tools act in "
                    "containers only",
                    hint=f"name a container (list_targets) or HOST:VMID; the server's owner can "
                         f"allow the host itself with --allow-host {spec.host}")
        if not self.changes(tool) or self.targets is None:
            return
        outside = sorted({spec.name for spec in specs} - self.targets)
        if outside:
            raise PolicyRefused(
                f"{tool} is not allowed on {', '.join(outside)}: this server's allowance names "
                f"only {', '.join(self.target_names)}",
                hint="start the server with --allow-target for that container (or edit the policy file)")

    def describe(self) -> str:
        allowed = ", ".join(sorted(self.allow)) or "read-only"
        where = "any container" if self.targets is None else ", ".join(self.target_names)
        hosts = f"; hosts themselves: {', '.join(sorted(self.hosts))}" if self.hosts else ""
        paths = f"; read_file also under {', '.join(self.paths)}" if self.paths else ""
        books = f"; playbooks from {', '.join(self.playbooks)}" if self.playbooks else ""
        return f"{allowed} ({where}{hosts}{paths}{books})"

    def playbook(self, path: str) -> str:
        """The real path of the playbook run_start may run: a .yaml/.yml file inside one of
        the allowed folders (a relative name is the server's folder's, else looked up in
        them, in order). Anything else is refused with one message, whether or not the file
        exists."""
        if not isinstance(path, str) or "\0" in path or not self.playbooks:
            raise PolicyRefused(
                "run_start: this server runs no playbook: its owner named no folder of "
                "playbooks" if not self.playbooks else
                f"run_start: {quoted(path, 120)} is not a playbook path",
                hint="the server's owner can start it with --allow-playbook DIR (or "
                     "playbooks: [DIR] in the policy file)")
        candidates = [path] if os.path.isabs(path) else [
            os.path.abspath(path), *(os.path.join(folder, path) for folder in self.playbooks)]
        for candidate in candidates:
            real = os.path.realpath(candidate)
            inside = any(real.startswith(folder.rstrip("/") + "/") for folder in self.playbooks)
            if inside and real.endswith(PLAYBOOK_SUFFIXES) and os.path.isfile(real):
                return real
        raise PolicyRefused(f"run_start: {quoted(path, 120)} is not a playbook of the folders "
                            f"this server runs playbooks from ({', '.join(self.playbooks)})",
                            hint="name a .yaml file there (relative to the folder, or its "
                                 "absolute path); the server's owner can add a folder with "
                                 "--allow-playbook")


def refuse_outside(path: str, roots: Iterable[str]) -> None:
    """read_file's path must be absolute and, as written, inside one of roots (the payload
    checks the real path again in the container: a link cannot lead out)."""
    roots = list(roots)
    if not path.startswith("/") or "\0" in path:
        raise PolicyRefused(f"read_file: {path!r} is not an absolute path",
                            hint="give the file's absolute path in the container")
    normal = posixpath.normpath(path)
    if not any(normal == root or normal.startswith(root.rstrip("/") + "/") for root in roots):
        raise PolicyRefused(f"read_file: {path} is not inside the folders this client may "
                            f"read ({', '.join(roots)})",
                            hint="run folders are readable; the server's owner can add a "
                                 "folder with --allow-path (or paths: in the policy file)")


def refuse_templates(variables: Any, path: str = "vars") -> None:
    """run_start's vars are data: no key or string value may hold template syntax (the
    playbook renders its own templates with them; a template inside one would be rendered
    on the controller)."""
    if isinstance(variables, dict):
        for key, value in variables.items():
            refuse_templates(key, f"{path} key {key!r}")
            refuse_templates(value, f"{path}.{key}")
    elif isinstance(variables, list):
        for index, value in enumerate(variables):
            refuse_templates(value, f"{path}[{index}]")
    elif isinstance(variables, str) and any(mark in variables for mark in TEMPLATE_MARKS):
        raise PolicyRefused(f"run_start: {path} holds template syntax ({{{{, {{% or {{#}}); "
                            "vars are data and are never rendered",
                            hint="pass the plain value; templates belong in the playbook file")


def refuse_unlisted_vars(playbook: Playbook, variables: dict) -> None:
    """An MCP client sets only the vars the playbook lists under `mcp: vars:`, each of the
    kind listed (a scalar unless the playbook says otherwise)."""
    allowed = playbook.client_vars
    for name, value in variables.items():
        kind = allowed.get(name)
        if kind is None:
            listed = (f"it lets a client set {', '.join(sorted(allowed))}" if allowed else
                      "it lets a client set none (it has no `mcp: vars:` section)")
            raise PolicyRefused(f"run_start: the playbook {playbook.name!r} does not let an MCP "
                                f"client set {quoted(name)}: {listed}",
                                hint="the playbook's owner lists what a client may set under "
                                     "`mcp: vars:` in the playbook")
        if not client_value_fits(kind, value):
            raise PolicyRefused(f"run_start: vars.{name} must be {CLIENT_VAR_KINDS[kind][0]} "
                                f"(the playbook's `mcp: vars:` says {kind}), not "
                                f"{type(value).__name__ if value is not None else 'null'}",
                                hint="a list or a mapping is for a var the playbook declares "
                                     "`list`")


def build_policy(allow: Iterable[str] = (), targets: Iterable[str] = (),
                 policy_file: Optional[str] = None, inventory=None,
                 hosts: Iterable[str] = (), paths: Iterable[str] = (),
                 playbooks: Iterable[str] = ()) -> Policy:
    """The allowance from --allow/--allow-target/--allow-host/--allow-path/--allow-playbook
    and an optional policy file (merged)."""
    allow, targets, hosts, paths = list(allow), list(targets), list(hosts), list(paths)
    playbooks = list(playbooks)
    if policy_file:
        from_file = _read_policy_file(policy_file)
        allow += from_file.get("allow", [])
        targets += from_file.get("targets", [])
        hosts += from_file.get("hosts", [])
        paths += from_file.get("paths", [])
        # relative to the policy file, as a playbook's `extends:` is to the playbook
        playbooks += [os.path.join(os.path.dirname(os.path.abspath(policy_file)),
                                   os.path.expanduser(folder))
                      for folder in from_file.get("playbooks", [])]
    bad = [p for p in paths if not p.startswith("/") or not posixpath.normpath(p).strip("/")]
    if bad:
        raise ConfigError(f"--allow-path {bad[0]!r}: give an absolute folder other than /",
                          hint="e.g. --allow-path /root/outputs")
    unknown = sorted(set(allow) - set(ALLOWANCES))
    if unknown:
        raise ConfigError(f"unknown allowance {', '.join(map(repr, unknown))}",
                          hint="allowances: " + ", ".join(ALLOWANCES))
    if inventory is not None:
        strange = sorted(set(hosts) - set(inventory.hosts))
        if strange:
            raise ConfigError(f"--allow-host {strange[0]!r}: no such host in {inventory.path}",
                              hint="hosts: " + ", ".join(sorted(inventory.hosts)))
    policy = Policy(allow=frozenset(allow), hosts=frozenset(hosts),
                    paths=tuple(dict.fromkeys(posixpath.normpath(p) for p in paths)),
                    playbooks=_playbook_folders(playbooks))
    if not targets:
        return policy
    specs = inventory.resolve(targets) if inventory else []
    for spec in specs:
        if not policy.permits_place(spec):
            where = "is the host" if spec.name == spec.host else "runs on the host"
            raise ConfigError(f"--allow-target {spec.name!r} {where} {spec.host!r} itself, in no "
                              "container: MCP tools act in containers only",
                              hint=f"name containers, or add --allow-host {spec.host} to allow "
                                   "that host too")
    containers = {spec.name for spec in specs} if inventory else set(targets)
    policy.targets, policy.target_names = frozenset(containers), tuple(targets)
    return policy


def _playbook_folders(folders: list) -> tuple:
    """--allow-playbook folders as real paths (folders of this machine; / is refused)."""
    real = []
    for folder in folders:
        path = os.path.realpath(os.path.expanduser(folder))
        if not os.path.isdir(path) or path == "/":
            raise ConfigError(f"--allow-playbook {folder!r}: give a folder of playbooks here "
                              "(not /)", hint="e.g. --allow-playbook playbooks")
        real.append(path)
    return tuple(dict.fromkeys(real))


def _read_policy_file(path: str) -> dict:
    source = load_yaml(path)
    data = source.data
    if not isinstance(data, dict):
        raise source.error((), "a policy is a mapping with allow: and targets:")
    for key in data:
        if key not in POLICY_KEYS:
            raise source.error((key,), f"unknown key {quoted(key)} (known: allow, targets, "
                                       "hosts, paths, playbooks)", key=True)
    for key in POLICY_KEYS & set(data):
        value = data[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise source.error((key,), f"{key}: must be a list of names")
    for index, name in enumerate(data.get("allow", [])):
        if name not in ALLOWANCES:
            raise source.error(("allow", index), f"unknown allowance {name!r}",
                               hint="allowances: " + ", ".join(ALLOWANCES))
    return data
