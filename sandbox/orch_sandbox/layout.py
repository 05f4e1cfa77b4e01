"""What a sandbox consists of: hosts, their containers, and the names derived from them.

Every name a host leaves on the machine is derived from its name here, so that `down`
(and `up`, cleaning after a killed run) can find all of it again:
network namespace and root-side veth `orch-HOST`, cgroups `orch-sandbox/HOST/...` (`$ORCH_SANDBOX_CGROUP/HOST/...`),
and the sandbox's one switch namespace `orch-PREFIX-sw` (network.py).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.ground.errors import OrchError

FIRST_VMID = 200
HOST_ADDRESS = "fe80::2"   # the host's end of its veth; link-local, so scoped per veth
# Two sandboxes on one machine (two checkouts testing at once, each in its own network and
# mount namespace) need cgroup trees of their own.
CGROUP_ROOT = os.environ.get("ORCH_SANDBOX_CGROUP") or "orch-sandbox"
NAME_PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,5}$")  # orch-PREFIX99 fits IFNAMSIZ
MAX_HOSTS = 99
MAX_CONTAINERS = 50
# The containers' one private IPv4 network, shared by every host's vmbr0 through the
# switch (network.py). It exists only inside the sandbox's own namespaces: the machine's
# root namespace has no interface or route into it (docs/design/sandbox.md).
CONTAINER_NETWORK_PREFIX = "10.88"
CONTAINER_PREFIX_LENGTH = 16
# Proxmox's own OUI: `pct create` generates MACs BC:24:11:xx:xx:xx since PVE 8.1
PROXMOX_OUI = "bc:24:11"


def bridge_address(host_index: int) -> str:
    """The host's own address on its vmbr0, as a Proxmox node has one on its bridge:
    10.88.0.HOST. A container's third octet is its host's index (1..MAX_HOSTS), never 0,
    so the two never collide; sb1's bridge is 10.88.0.1."""
    return f"{CONTAINER_NETWORK_PREFIX}.0.{host_index}"


def container_address(host_index: int, vmid: int) -> str:
    """10.88.HOST.(VMID mod 256): a host's vmids are one run of at most 50, so they stay
    distinct; CT 200 of sb1 is 10.88.1.200."""
    return f"{CONTAINER_NETWORK_PREFIX}.{host_index}.{vmid % 256}"


class LayoutError(OrchError):
    exit_code = 2


@dataclass(frozen=True)
class ContainerSpec:
    vmid: int
    running: bool
    # "host": the machine's /usr and /etc bind-mounted (fast); else the name of a real
    # distribution root (roots.py), e.g. "debian-12"
    root: str = "host"
    # eth0's IPv4 address on the hosts' shared bridge (container_address); "" in a
    # layout.json written before containers had a network
    address: str = ""

    @property
    def real_root(self) -> bool:
        return self.root != "host"

    @property
    def hwaddr(self) -> str:
        """eth0's MAC, derived from the address so that it is as fixed as the address."""
        third, fourth = (int(part) for part in self.address.split(".")[2:])
        return f"{PROXMOX_OUI}:58:{third:02x}:{fourth:02x}"

    @property
    def veth_pair(self) -> str:
        """The host-side end of eth0, named as Proxmox names it (veth{VMID}i{N})."""
        return f"veth{self.vmid}i0"

    @property
    def hostname(self) -> str:
        return f"CT{self.vmid}"


@dataclass(frozen=True)
class HostSpec:
    name: str
    containers: tuple[ContainerSpec, ...]
    index: int = 0     # its place in the layout (1..), the third octet of its CTs' addresses

    @property
    def bridge_address(self) -> str:
        return bridge_address(self.index)

    @property
    def netns(self) -> str:
        return f"orch-{self.name}"

    @property
    def iface(self) -> str:
        """The root-namespace end of the host's veth (tests set it down to cut the link)."""
        return f"orch-{self.name}"

    @property
    def address(self) -> str:
        """How the machine reaches the host: its link-local address, scoped to the veth."""
        return f"{HOST_ADDRESS}%{self.iface}"

    @property
    def cgroup(self) -> str:
        return f"{CGROUP_ROOT}/{self.name}"

    def container(self, vmid: int) -> ContainerSpec:
        for spec in self.containers:
            if spec.vmid == vmid:
                return spec
        raise LayoutError(f"sandbox host {self.name} has no container {vmid}")


@dataclass(frozen=True)
class Layout:
    prefix: str
    hosts: tuple[HostSpec, ...]
    # the name of the cluster all hosts form (one shared /etc/pve, vmids unique across
    # hosts), or None for independent hosts
    cluster: str | None = None

    def host(self, name: str) -> HostSpec:
        for spec in self.hosts:
            if spec.name == name:
                return spec
        known = ", ".join(h.name for h in self.hosts)
        raise LayoutError(f"the sandbox has no host {name!r} (hosts: {known})")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Layout":
        data = json.loads(text)
        hosts = tuple(
            HostSpec(h["name"], tuple(ContainerSpec(c["vmid"], c["running"],
                                                    c.get("root", "host"), c.get("address", ""))
                                      for c in h["containers"]), position)
            for position, h in enumerate(data["hosts"], start=1))
        return cls(data["prefix"], hosts, data.get("cluster"))

    @classmethod
    def load(cls, path: Path) -> "Layout | None":
        try:
            return cls.from_json(path.read_text())
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # a half-written file of a killed run: down sweeps by name instead


def host_name(prefix: str, index: int) -> str:
    return f"{prefix}{index}"


def switch_netns(prefix: str) -> str:
    """The namespace holding the bridge all hosts' vmbr0 are plugged into; named after
    the prefix (not a host: `-` cannot be in one) so down finds it without records."""
    return f"orch-{prefix}-sw"


def build_layout(hosts: int = 2, containers: int = 3, stopped: int = 1,
                 prefix: str = "sb", real_root: tuple[int, ...] = (),
                 distribution: str = "debian-12", cluster: str | None = None) -> Layout:
    """N hosts named PREFIX1..PREFIXN, each with CTs 200.. of which the last `stopped` are
    created but not started (tests need a stopped container). The CTs in `real_root` get
    their own `distribution` root instead of the machine's /usr and /etc, on every host.
    As one cluster, vmids are unique cluster-wide as Proxmox wants: host N has CTs N00,
    N01, ... (200.. on host 2)."""
    if not NAME_PREFIX_PATTERN.match(prefix):
        raise LayoutError(f"sandbox host prefix {prefix!r} must be 1-6 lowercase letters or "
                          "digits, starting with a letter (interface names are 15 chars max)")
    if not 1 <= hosts <= MAX_HOSTS:
        raise LayoutError(f"--hosts must be between 1 and {MAX_HOSTS}, not {hosts}")
    if not 1 <= containers <= MAX_CONTAINERS:
        raise LayoutError(f"--containers must be between 1 and {MAX_CONTAINERS}, not {containers}")
    if not 0 <= stopped <= containers:
        raise LayoutError(f"--stopped must be between 0 and --containers ({containers})")
    if cluster is not None and not NAME_PREFIX_PATTERN.match(cluster):
        raise LayoutError(f"cluster name {cluster!r} must be 1-6 lowercase letters or digits")
    if cluster is not None and hosts > 8:
        raise LayoutError("a cluster sandbox has at most 8 hosts (vmids 100..899)")
    running_count = containers - stopped

    def vmids(index: int) -> list[int]:
        first = index * 100 if cluster else FIRST_VMID
        return [first + i for i in range(containers)]

    host_indexes = [i + 1 if cluster else i for i in range(1, hosts + 1)]
    every_vmid = sorted({vmid for index in host_indexes for vmid in vmids(index)})
    unknown = sorted(set(real_root) - set(every_vmid))
    if unknown:
        raise LayoutError(f"--real-root {','.join(map(str, unknown))}: the layout's containers "
                          f"are {', '.join(map(str, every_vmid))}")

    def cts(position: int, index: int) -> tuple[ContainerSpec, ...]:
        return tuple(ContainerSpec(vmid, i < running_count,
                                   distribution if vmid in real_root else "host",
                                   container_address(position, vmid))
                     for i, vmid in enumerate(vmids(index)))
    return Layout(prefix, tuple(HostSpec(host_name(prefix, i), cts(i, index), i)
                                for i, index in zip(range(1, hosts + 1), host_indexes)), cluster)
