"""From inventory names to live Targets, with each host's SSH connections shared by all."""

from __future__ import annotations

import dataclasses
import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

from orchestrator.config import transports
from orchestrator.config.concurrency import DEFAULT_JOBS
from orchestrator.config.inventory import ContainerSpec, HostSpec, Inventory, load_inventory
from orchestrator.ground import invocation
from orchestrator.ground.errors import ConfigError, NoSuchContainer, OrchError
from orchestrator.ground.lazy import lazy
from orchestrator.remote import early
from orchestrator.remote.base import Transport
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.paramiko_lib import paramiko
from orchestrator.remote.session import SessionPool, SessionTarget
from orchestrator.remote.ssh import (DEFAULT_ALIVE_COUNT_MAX, DEFAULT_ALIVE_INTERVAL,
                                     DEFAULT_CONNECTIONS, DEFAULT_KNOWN_HOSTS,
                                     DEFAULT_MAX_SESSIONS, SshHost, SshSettings)

# The Proxmox API (proxmoxer, http.client: ~20 ms) is imported when a command first asks for
# it: `exec`, `grep-torch` and the patch commands reach containers without it.
if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.targets.proxmox import ProxmoxClient
    from orchestrator.targets.proxmox import ProxmoxClient as proxmox_client
    from orchestrator.targets.proxmox import api_backend
else:
    api_backend = lazy("orchestrator.targets.proxmox", "api_backend")
    proxmox_client = lazy("orchestrator.targets.proxmox", "ProxmoxClient")

T = TypeVar("T")
SSH_CONFIG = early.SSH_CONFIG


class Fleet:
    """Opens each host at most once, lazily, and closes them all at the end."""

    def __init__(self, inventory: Inventory, trust_on_first_use: bool = False,
                 ssh_config_path: str = SSH_CONFIG, sessions: Optional[SessionPool] = None,
                 cwd: Optional[str] = None):
        self.inventory = inventory
        # the caller's folder, for relative key and known_hosts paths (the agent runs in /);
        # None: the process's own, as on the direct path
        self.cwd = cwd
        self.depends_on_cwd = False   # a host's key or known_hosts path is relative
        # warm in-container sessions for the containers' commands (the agent, MCP); None:
        # every command on a channel of its own
        self.sessions = sessions
        self.trust_on_first_use = trust_on_first_use
        self._ssh_config = _read_ssh_config(ssh_config_path)
        self._default_ssh_config = ssh_config_path == SSH_CONFIG   # what the early index assumes
        self._hosts: dict[str, Transport] = {}
        self._clusters: dict[str, list[dict]] = {}
        self._lock = threading.Lock()
        self._early_index_written = False

    @classmethod
    def from_path(cls, path: Optional[str] = None, **kwargs) -> "Fleet":
        return cls(load_inventory(path), **kwargs)

    def host(self, name: str) -> Transport:
        with self._lock:
            if name not in self._hosts:
                spec = self.inventory.hosts[name]
                self._hosts[name] = self._ssh_host(spec) if spec.kind.over_ssh else LocalTransport(name)
            return self._hosts[name]

    def _ssh_host(self, spec: HostSpec) -> SshHost:
        settings = self.ssh_settings(spec)
        if self.cwd is None and self.sessions is None and self._default_ssh_config:
            self._write_early_index()   # the direct path (not the agent, not MCP)
        # the connection the entry point started, when it was made with these very settings
        return SshHost(settings, early=early.claim(settings))

    def _write_early_index(self) -> None:
        """Tell the next direct command which host each target is on, and its SSH settings,
        so that it can start the handshake before its imports (orchestrator/remote/early.py).
        Hosts behind a jump host are left out: their connection needs another first."""
        if self._early_index_written:
            return
        self._early_index_written = True
        hosts = {}
        for name, spec in self.inventory.hosts.items():
            if not spec.kind.over_ssh:
                continue
            try:
                settings = self.ssh_settings(spec)
            except OrchError:   # said when that host is used
                continue
            if settings.jump is None:
                hosts[name] = {**dataclasses.asdict(settings), "trust_on_first_use": False}
        targets = {name: name for name in hosts}
        targets.update({name: spec.host for name, spec in self.inventory.containers.items()
                        if spec.host in hosts})
        if self.inventory.default_target in targets:
            targets[early.DEFAULT_TARGET] = targets[self.inventory.default_target]
        early.remember(self.inventory.path, hosts, targets)

    def target(self, spec: ContainerSpec) -> Target:
        host = self.locate(spec.cluster, spec.vmid) if spec.cluster else spec.host
        if self.sessions is not None and spec.vmid:
            return SessionTarget(spec.name, self.host(host), spec.vmid, spec.venv, spec.gpus,
                                 spec.env, sessions=self.sessions)
        return Target(spec.name, self.host(host), spec.vmid, spec.venv, spec.gpus, spec.env)

    def locate(self, cluster: str, vmid: int) -> str:
        """The inventory host that is the node CT vmid of cluster runs on now."""
        items = self.cluster_containers(cluster)
        found = next((item for item in items if int(item["vmid"]) == vmid), None)
        members = self.inventory.clusters[cluster]
        if found is None:
            raise NoSuchContainer(f"CT {vmid} is on no node of cluster {cluster} "
                                  f"(hosts: {', '.join(members)})",
                                  hint=f"`orch ct list {cluster}` lists its containers")
        host = self.host_of_node(cluster, found["node"])
        if host is None:
            raise ConfigError(f"CT {vmid} of cluster {cluster} is on node {found['node']}, "
                              "which is no host of the cluster in the inventory",
                              hint=f"add that node to clusters: {cluster} (with node: "
                                   f"{found['node']} if its host name differs)")
        return host

    def host_of_node(self, cluster: str, node: str) -> Optional[str]:
        for member in self.inventory.clusters[cluster]:
            if (self.inventory.hosts[member].node or member) == node:
                return member
        return None

    def cluster_containers(self, cluster: str) -> list[dict]:
        """/cluster/resources' containers, asked once per fleet of the first node that
        answers (every node knows the whole cluster)."""
        with self._lock:
            if cluster in self._clusters:
                return self._clusters[cluster]
        problems = []
        for member in self.inventory.clusters[cluster]:
            try:
                items = self.proxmox(member).cluster_containers()
            except OrchError as error:
                problems.append(f"{member}: {error}")
                continue
            with self._lock:
                self._clusters[cluster] = items
            return items
        raise OrchError(f"no node of cluster {cluster} answered: " + "; ".join(problems))

    def proxmox(self, host_name: str, warn: Callable[[str], None] = lambda message: None) -> ProxmoxClient:
        """The Proxmox API of an inventory host (pvesh over its SSH connection, or HTTPS)."""
        spec = self.inventory.hosts[host_name]
        if not spec.kind.proxmox:
            raise OrchError(f"host {host_name} is {spec.transport}: it has no Proxmox API")
        # the https backend needs no SSH connection: open none
        ssh = self.host(host_name) if api_backend(spec) == "ssh" else None
        return proxmox_client(spec, ssh, warn=warn)

    def containers_of(self, name: str, warn: Callable[[str], None] = lambda message: None) -> list[dict]:
        """A host's containers, or a whole cluster's, each with its node and inventory host."""
        if name in self.inventory.clusters:
            return [{**item, "host": self.host_of_node(name, item["node"])}
                    for item in self.cluster_containers(name)]
        client = self.proxmox(name, warn)
        node = client.node()
        return [{**item, "node": node, "host": name} for item in client.containers()]

    def targets(self, names) -> list[Target]:
        return [self.target(spec) for spec in self.inventory.resolve(names)]

    def host_target(self, name: str) -> Target:
        """The host `name` itself as a target, also where a group has the same name (the
        sandbox's sb1), for what is explicitly about the host (`orch shell --host`)."""
        if name not in self.inventory.hosts:
            raise ConfigError(f"{name!r} is no host in {self.inventory.path}",
                              hint="hosts: " + ", ".join(self.inventory.hosts))
        return self.target(ContainerSpec(name=name, host=name))

    def ssh_settings(self, spec: HostSpec, seen: tuple = ()) -> SshSettings:
        """Inventory values win; ~/.ssh/config fills what the inventory leaves open."""
        if spec.name in seen:
            raise OrchError(f"jump hosts of {spec.name} form a loop: {' -> '.join(seen)}")
        found = self._ssh_config.lookup(spec.address) if self._ssh_config else {}
        jump_name = spec.jump or found.get("proxyjump")
        identity = spec.identity or found.get("identityfile", [])
        known_hosts = spec.known_hosts or _first(found.get("userknownhostsfile")) or DEFAULT_KNOWN_HOSTS
        self._note_relative([*identity, known_hosts])
        return SshSettings(
            name=spec.name,
            address=found.get("hostname", spec.address),
            port=spec.port or int(found.get("port", 22)),
            user=spec.user or found.get("user", "root"),
            identity=identity,
            known_hosts=known_hosts,
            folder=self.cwd,
            hash_known_hosts=str(found.get("hashknownhosts", "no")).lower() == "yes",
            jump=self._jump_settings(jump_name, seen + (spec.name,)) if jump_name else None,
            connect_timeout=spec.connect_timeout,
            trust_on_first_use=self.trust_on_first_use,
            max_sessions=spec.max_sessions or DEFAULT_MAX_SESSIONS,
            connections=spec.connections or DEFAULT_CONNECTIONS,
            alive_interval=spec.alive_interval or _positive(
                found.get("serveraliveinterval"), float, DEFAULT_ALIVE_INTERVAL),
            alive_count_max=spec.alive_count_max or _positive(
                found.get("serveralivecountmax"), int, DEFAULT_ALIVE_COUNT_MAX))

    def _note_relative(self, paths: list[str]) -> None:
        """Whether a path is relative (neither absolute nor ~): the caller's folder decides."""
        if any(not p.startswith("~") and not os.path.isabs(p) for p in paths):
            self.depends_on_cwd = True

    def _jump_settings(self, jump: str, seen: tuple) -> SshSettings:
        if jump in self.inventory.hosts:
            return self.ssh_settings(self.inventory.hosts[jump], seen)
        user, _, address = jump.rpartition("@")
        address, _, port = address.partition(":")
        return self.ssh_settings(HostSpec(name=jump, address=address, user=user or None,
                                          port=int(port) if port else None), seen)

    def forget_clusters(self) -> None:
        """Ask clusters again where their containers are (a warm fleet, between commands)."""
        with self._lock:
            self._clusters.clear()

    def open_hosts(self) -> dict:
        """What each host opened so far holds (`orch agent status`)."""
        with self._lock:
            hosts = dict(self._hosts)
        return {name: host.usage() if hasattr(host, "usage") else {"transport": transports.LOCAL.name}
                for name, host in hosts.items()}

    def close(self) -> None:
        if self.sessions is not None:
            self.sessions.close()
        for host in self._hosts.values():
            host.close()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _positive(text, kind, default):
    """A number from ~/.ssh/config, when it is a positive one (OpenSSH's 0 means "off": orch
    keeps its dead-link detection on and uses its default then)."""
    try:
        value = kind(_first(text)) if text else 0
    except ValueError:
        return default
    return value if value > 0 else default


def _first(value):
    if isinstance(value, list):
        return value[0] if value else None
    return value.split()[0] if value else None


def _read_ssh_config(path: str) -> Optional[paramiko.SSHConfig]:
    path = invocation.current().expanduser(path)
    if not os.path.exists(path):
        return None
    try:
        return paramiko.SSHConfig.from_path(path)
    except Exception as error:  # a broken ssh config should not stop orch; say so
        raise OrchError(f"{path}: cannot read the SSH config: {error}") from None


class GroupResult:
    """What one fan-out gave back, like Fabric's GroupResult: `succeeded` maps each input to
    its value, `failed` each input to the OrchError it raised, both ordered as the inputs."""

    def __init__(self, items: list, outcomes: list):
        self.items = list(items)
        self.succeeded: dict = {}
        self.failed: dict[object, OrchError] = {}
        for item, outcome in zip(self.items, outcomes):
            (self.failed if isinstance(outcome, OrchError) else self.succeeded)[item] = outcome

    @property
    def ok(self) -> bool:
        return not self.failed

    def first_error(self) -> Optional[OrchError]:
        """The error of the first input that failed (its exit code is the command's)."""
        return next(iter(self.failed.values()), None)

    def rows(self) -> list[dict]:
        """A fan-out over Targets as JSON rows, in input order: {"target": NAME, "error": ...},
        or {"target": NAME, **its payload result} less the payload protocol's "event" key."""
        return [{"target": item.name, "error": str(self.failed[item])} if item in self.failed else
                {"target": item.name, **{k: v for k, v in self.succeeded[item].items() if k != "event"}}
                for item in self.items]


def fan_out(items: list, work: Callable, jobs: int = DEFAULT_JOBS,
            on_interrupt: Optional[Callable[[], None]] = None,
            on_done: Optional[Callable[[object, object], None]] = None) -> GroupResult:
    """Run work(item) for every item, `jobs` at once (each_concurrently), sorted into
    succeeded and failed."""
    return GroupResult(items, each_concurrently(items, work, jobs, on_interrupt, on_done))


def each_concurrently(items: list, work: Callable, jobs: int = DEFAULT_JOBS,
                      on_interrupt: Optional[Callable[[], None]] = None,
                      on_done: Optional[Callable[[object, object], None]] = None) -> list:
    """Run work(item) for every item, at most `jobs` at once (a command's --jobs, the
    inventory's `defaults: {jobs: N}`); each outcome is a value or the OrchError raised, in
    the order of the items. Callers that judge the outcomes use fan_out: this is its list
    form. on_done(item, outcome) is told of each as it ends (a progress line).

    Items that are targets start host by host in turn (spread_by_host): with more targets
    than jobs, every host's connection is set up in the first wave, not one host's after
    another's, and no host gets more channels at once than its share.

    On an interrupt (Ctrl-C) the command's channels are closed (the running work ends now,
    its remote commands killed), what has not started never starts, and on_interrupt runs
    (the direct path closes its connections): the interrupt does not wait for every command
    to finish."""
    def guarded(item):
        try:
            outcome = work(item)
        except OrchError as error:
            outcome = error
        if on_done is not None:
            on_done(item, outcome)
        return outcome
    if len(items) <= 1:
        return [guarded(item) for item in items]
    outcomes: list = [None] * len(items)
    pool = ThreadPoolExecutor(max_workers=min(max(1, jobs), len(items)))
    # the workers print, read the environment and file their channels under the
    # interrupt of the command that started them
    bound = invocation.bind(guarded)
    futures: dict = {}
    try:
        for index in spread_by_host(items):
            futures[pool.submit(bound, items[index])] = index
        for future in as_completed(futures):
            outcomes[futures[future]] = future.result()
        return outcomes
    except BaseException:
        for future in futures:
            future.cancel()
        invocation.current().interrupt.close_filed()
        if on_interrupt is not None:
            on_interrupt()
        raise
    finally:
        pool.shutdown(wait=True)


def spread_by_host(items: list) -> list[int]:
    """The items' indexes, one host's first item, the next host's first, ..., then every
    host's second: the order a fan-out starts them in. Items without a host (names) keep
    their order."""
    queues: dict = {}
    for index, item in enumerate(items):
        host = getattr(getattr(item, "host", None), "name", None)
        queues.setdefault(host if host is not None else index, []).append(index)
    order = []
    for depth in range(max(map(len, queues.values()))):
        order += [queue[depth] for queue in queues.values() if depth < len(queue)]
    return order
