"""The inventory: which Proxmox hosts exist, which containers run on them, and groups.

    hosts:
      pve:   {address: 10.1.2.6, user: root}
      here:  {transport: local}
    containers:
      drafters: {host: pve, vmid: 200, venv: /root/venv, gpus: [5, 6, 7]}
    trainer2: {host: pve2, vmid: 200, address: 10.1.3.20}   # where other nodes reach it
    groups:
      all-drafters: [drafters]
    clusters:
      lab: [pve, pve2]          # hosts that are nodes of one Proxmox cluster
    default_target: drafters

A container of a cluster can be named by cluster instead of host (`{cluster: lab, vmid:
200}`, or the target `lab:200`): orch asks the cluster where it runs (/cluster/resources)
before it runs anything there, so a migrated container is still found.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from orchestrator.config import transports
from orchestrator.config.concurrency import DEFAULT_JOBS, MAX_JOBS
from orchestrator.config.inventory_file import inventory_path
from orchestrator.config.schema import check_keys, expect, expect_list_of
from orchestrator.config.yamlsrc import Source, load_yaml
from orchestrator.ground import invocation
from orchestrator.ground.errors import ConfigError

HOST_KEYS = ("transport", "address", "user", "port", "identity", "jump", "known_hosts", "node",
             "connect_timeout", "timeout", "iface", "api", "description", "max_sessions",
             "connections", "alive_interval", "alive_count_max")
CONTAINER_KEYS = ("host", "cluster", "vmid", "venv", "gpus", "env", "description", "address")
API_KEYS = ("url", "token_id", "token_secret_env", "verify_ssl", "backend", "ca_file",
            "fingerprint")
TOP_KEYS = ("hosts", "containers", "groups", "clusters", "default_target", "defaults")
DEFAULTS_KEYS = ("jobs",)   # defaults: {jobs: N}, a fan-out's concurrency (config/concurrency.py)
VMID_PATTERN = re.compile(r"^[1-9][0-9]{2,8}$")  # the ids pct accepts
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# a DNS name (RFC 1123 labels); a container's address may be one instead of an IP literal
DNS_NAME_PATTERN = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                              r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


@dataclass
class HostSpec:
    name: str
    transport: str = transports.DEFAULT.name   # a name of config/transports.py's table
    address: Optional[str] = None
    user: Optional[str] = None
    port: Optional[int] = None
    identity: list[str] = field(default_factory=list)
    jump: Optional[str] = None
    known_hosts: Optional[str] = None
    node: Optional[str] = None
    connect_timeout: float = 10.0
    timeout: float = 120.0
    iface: Optional[str] = None
    api: dict = field(default_factory=dict)
    description: str = ""
    max_sessions: Optional[int] = None   # sshd's MaxSessions there (default 10, OpenSSH's)
    connections: Optional[int] = None    # SSH connections orch may open to it at once
    alive_interval: Optional[float] = None   # OpenSSH's ServerAliveInterval (docs/design/transport.md)
    alive_count_max: Optional[int] = None    # OpenSSH's ServerAliveCountMax

    @property
    def kind(self) -> transports.TransportKind:
        """What this host's transport can do (config/transports.py)."""
        return transports.transport(self.transport)


@dataclass
class ContainerSpec:
    name: str
    host: str
    vmid: Optional[int] = None
    venv: Optional[str] = None
    gpus: list[int] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
    cluster: Optional[str] = None   # found on whichever node of this cluster runs it
    # where the other containers of a multi-node run reach this one (targets/addresses.py);
    # None: asked of the Proxmox API
    address: Optional[str] = None


@dataclass
class Inventory:
    path: str
    hosts: dict[str, HostSpec]
    containers: dict[str, ContainerSpec]
    groups: dict[str, list[str]]
    default_target: Optional[str] = None
    clusters: dict[str, list[str]] = field(default_factory=dict)
    jobs: int = DEFAULT_JOBS   # defaults: {jobs: N}, a fan-out's concurrency

    def resolve(self, names: list[str] | tuple[str, ...]) -> list[ContainerSpec]:
        """Targets by name: containers, groups, hosts (the host itself) or HOST:VMID."""
        names = list(names) or [self._default_name()]
        resolved: list[ContainerSpec] = []
        for name in names:
            for spec in self._resolve_one(name, seen=()):
                if spec.name not in {r.name for r in resolved}:
                    resolved.append(spec)
        return resolved

    def _default_name(self) -> str:
        if self.default_target:
            return self.default_target
        if len(self.containers) == 1:
            return next(iter(self.containers))
        raise ConfigError(f"{self.path}: no target given and no default_target in the inventory",
                          hint="pass -t TARGET, or set default_target: in the inventory")

    def _resolve_one(self, name: str, seen: tuple) -> list[ContainerSpec]:
        if name in self.containers:
            return [self.containers[name]]
        if name in self.groups:
            if name in seen:
                raise ConfigError(f"{self.path}: group {name!r} contains itself")
            return [spec for member in self.groups[name]
                    for spec in self._resolve_one(member, seen + (name,))]
        host, _, vmid = name.partition(":")
        if host in self.hosts and (not vmid or VMID_PATTERN.fullmatch(vmid)):
            return [ContainerSpec(name=name, host=host, vmid=int(vmid) if vmid else None)]
        if host in self.clusters:
            if not VMID_PATTERN.fullmatch(vmid):
                raise ConfigError(f"{name!r}: {host} is a cluster; name a container of it as "
                                  f"{host}:VMID")
            return [ContainerSpec(name=name, host="", vmid=int(vmid), cluster=host)]
        raise ConfigError(f"unknown target {name!r} in {self.path}",
                          hint="known targets: " + ", ".join(self.target_names()) + " (or HOST:VMID)")

    def target_names(self) -> list[str]:
        """Every name -t takes, once each: containers, groups, then hosts and clusters (a
        host that shares its name with a group is that group as a target)."""
        names: list[str] = []
        for kind in (self.containers, self.groups, self.hosts, self.clusters):
            names += [name for name in sorted(kind) if name not in names]
        return names


def load_inventory(path: Optional[str] = None) -> Inventory:
    source = load_yaml(inventory_path(path), folder=invocation.current().cwd)
    data = source.data if source.data is not None else {}
    expect(source, (), data, dict, "the inventory")
    check_keys(source, (), data, TOP_KEYS)
    hosts = {name: _host(source, name, spec) for name, spec in _section(source, data, "hosts").items()}
    containers = {name: _container(source, name, spec, hosts)
                  for name, spec in _section(source, data, "containers").items()}
    clusters = _clusters(source, data, hosts)
    for name, spec in containers.items():
        if spec.cluster and spec.cluster not in clusters:
            raise source.error(("containers", name, "cluster"),
                               f"container {name!r} is in cluster {spec.cluster!r}, which is "
                               "not in clusters")
    groups = _groups(source, data, hosts, containers)
    for name, host in hosts.items():
        if host.jump and host.jump not in hosts:
            raise source.error(("hosts", name, "jump"), f"jump host {host.jump!r} is not in hosts")
    default = data.get("default_target")
    if default is not None:
        expect(source, ("default_target",), default, str)
        if default not in containers and default not in groups and default not in hosts:
            raise source.error(("default_target",), f"default_target {default!r} names no container, "
                                                   "group or host")
    return Inventory(source.filename, hosts, containers, groups, default, clusters,
                     jobs=_defaults(source, data).get("jobs", DEFAULT_JOBS))


def _defaults(source: Source, data: dict) -> dict:
    """The `defaults:` section: what every command uses unless its options say otherwise."""
    section = data.get("defaults") or {}
    expect(source, ("defaults",), section, dict)
    check_keys(source, ("defaults",), section, DEFAULTS_KEYS)
    if "jobs" in section:
        jobs = expect(source, ("defaults", "jobs"), section["jobs"], int)
        if not 1 <= jobs <= MAX_JOBS:
            raise source.error(("defaults", "jobs"), f"jobs must be between 1 and {MAX_JOBS}, "
                                                     f"not {jobs}")
    return section


def _section(source: Source, data: dict, key: str) -> dict:
    section = data.get(key) or {}
    expect(source, (key,), section, dict)
    for name in section:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise source.error((key, name), f"{name!r} is not a valid name (letters, digits, "
                                            "'_', '.', '-')", key=True)
    return section


def _host(source: Source, name: str, spec) -> HostSpec:
    path = ("hosts", name)
    expect(source, path, spec, dict, f"host {name!r}")
    check_keys(source, path, spec, HOST_KEYS)
    transport = expect(source, path + ("transport",), spec.get("transport", transports.DEFAULT.name), str)
    if transport not in transports.TRANSPORTS:
        raise source.error(path + ("transport",), f"transport must be {transports.choices()}, not {transport!r}")
    if transports.transport(transport).over_ssh and "address" not in spec:
        raise source.error(path, f"host {name!r} needs an address (or transport: local)")
    host = HostSpec(name=name, transport=transport)
    for key in ("address", "user", "jump", "known_hosts", "node", "iface", "description"):
        if key in spec:
            setattr(host, key, str(expect(source, path + (key,), spec[key], (str, int))))
    if "port" in spec:
        host.port = expect(source, path + ("port",), spec["port"], int)
        if not 0 < host.port < 65536:
            raise source.error(path + ("port",), f"port {host.port} is out of range 1..65535")
    for key in ("connect_timeout", "timeout", "alive_interval"):
        if key in spec:
            value = expect(source, path + (key,), spec[key], (int, float))
            if value <= 0:
                raise source.error(path + (key,), f"{key} must be positive")
            setattr(host, key, float(value))
    for key in ("max_sessions", "connections", "alive_count_max"):
        if key in spec:
            value = expect(source, path + (key,), spec[key], int)
            if not 1 <= value <= 1000:
                raise source.error(path + (key,), f"{key} must be between 1 and 1000, not {value}")
            setattr(host, key, value)
    identity = spec.get("identity", [])
    host.identity = [identity] if isinstance(identity, str) else expect_list_of(
        source, path + ("identity",), identity, str)
    if "api" in spec:
        expect(source, path + ("api",), spec["api"], dict)
        check_keys(source, path + ("api",), spec["api"], API_KEYS)
        host.api = dict(spec["api"])
    return host


def _container(source: Source, name: str, spec, hosts: dict) -> ContainerSpec:
    path = ("containers", name)
    expect(source, path, spec, dict, f"container {name!r}")
    if isinstance(spec, dict) and "cluster" in spec and "host" not in spec:
        return _cluster_container(source, name, spec)
    check_keys(source, path, spec, CONTAINER_KEYS, required=("host",))
    if "cluster" in spec:
        raise source.error(path + ("cluster",), f"container {name!r}: give host or cluster, "
                                                "not both")
    host = expect(source, path + ("host",), spec["host"], str)
    if host not in hosts:
        raise source.error(path + ("host",), f"container {name!r} is on host {host!r}, "
                                             "which is not in hosts")
    container = ContainerSpec(name=name, host=host)
    if "vmid" in spec:
        vmid = expect(source, path + ("vmid",), spec["vmid"], int)
        if not VMID_PATTERN.fullmatch(str(vmid)):
            raise source.error(path + ("vmid",), f"vmid {vmid} is not a valid Proxmox id (100..999999999)")
        if not hosts[host].kind.proxmox:
            raise source.error(path + ("vmid",), f"host {host!r} is {hosts[host].transport}: it has no "
                                                 "containers (remove vmid)")
        container.vmid = vmid
    return _container_details(source, path, spec, container)


def _container_details(source: Source, path: tuple, spec: dict,
                       container: ContainerSpec) -> ContainerSpec:
    """venv, gpus, env and description, the same for a container on a host or a cluster."""
    if "venv" in spec:
        container.venv = expect(source, path + ("venv",), spec["venv"], str)
    if "gpus" in spec:
        container.gpus = expect_list_of(source, path + ("gpus",), spec["gpus"], int)
    if "env" in spec:
        env = expect(source, path + ("env",), spec["env"], dict)
        for key, value in env.items():
            expect(source, path + ("env", key), value, (str, int, float))
        container.env = {str(k): str(v) for k, v in env.items()}
    container.description = str(spec.get("description", ""))
    if "address" in spec:
        container.address = _container_address(source, path + ("address",), spec["address"])
    return container


def _container_address(source: Source, path: tuple, value) -> str:
    text = str(expect(source, path, value, str, "address"))
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    if not DNS_NAME_PATTERN.fullmatch(text) or text.replace(".", "").isdigit():
        raise source.error(path, f"address {text!r} is not an IP address or a host name")
    return text


def _cluster_container(source: Source, name: str, spec: dict) -> ContainerSpec:
    """A container named by cluster and vmid: its host is looked up when it is used."""
    path = ("containers", name)
    check_keys(source, path, spec, CONTAINER_KEYS, required=("cluster", "vmid"))
    cluster = expect(source, path + ("cluster",), spec["cluster"], str)
    vmid = expect(source, path + ("vmid",), spec["vmid"], int)
    if not VMID_PATTERN.fullmatch(str(vmid)):
        raise source.error(path + ("vmid",), f"vmid {vmid} is not a valid Proxmox id (100..999999999)")
    container = ContainerSpec(name=name, host="", vmid=vmid, cluster=cluster)
    return _container_details(source, path, spec, container)


def _clusters(source: Source, data: dict, hosts: dict) -> dict[str, list[str]]:
    def problem(name: str, member: str) -> Optional[str]:
        if member not in hosts:
            return f"cluster {name!r} names {member!r}, which is not in hosts"
        if not hosts[member].kind.proxmox:
            return f"host {member!r} is {hosts[member].transport}: it cannot be a cluster node"
        return None
    return _named_lists(source, data, "clusters", taken=hosts, taken_kind="host", member_problem=problem,
                        empty=lambda name: f"cluster {name!r} names no host")


def _groups(source: Source, data: dict, hosts: dict, containers: dict) -> dict[str, list[str]]:
    groups = data.get("groups") or {}

    def problem(name: str, member: str) -> Optional[str]:
        if member not in containers and member not in groups and member not in hosts:
            return f"group {name!r} names {member!r}, which is no container, group or host"
        return None
    return _named_lists(source, data, "groups", taken=containers, taken_kind="container",
                        member_problem=problem)


def _named_lists(source: Source, data: dict, key: str, *, taken: dict, taken_kind: str,
                 member_problem: Callable[[str, str], Optional[str]],
                 empty: Optional[Callable[[str], str]] = None) -> dict[str, list[str]]:
    """A section of named lists of names (clusters: hosts; groups: members), each checked
    where it stands: its name free, a list of strings, not empty (when `empty` says why),
    every member known."""
    section = _section(source, data, key)
    kind = key.rstrip("s")
    for name, members in section.items():
        path = (key, name)
        if name in taken:
            raise source.error(path, f"{kind} {name!r} has the name of a {taken_kind}", key=True)
        expect_list_of(source, path, members, str, f"{kind} {name!r}")
        if empty is not None and not members:
            raise source.error(path, empty(name))
        for index, member in enumerate(members):
            problem = member_problem(name, member)
            if problem:
                raise source.error(path + (index,), problem)
    return {name: list(members) for name, members in section.items()}
