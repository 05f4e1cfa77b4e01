"""The containers' network: every host's vmbr0 plugged into one switch, as the hosts of a
Proxmox cluster share a physical network (docs/design/sandbox.md, "The containers' network").

    switch namespace orch-PREFIX-sw:  bridge br0, one port per host (named after the host)
    host namespace orch-HOST:         bridge vmbr0 10.88.0.H/16 (layout.bridge_address) with
                                      the port `uplink` (the other end of the host's switch
                                      port) and each running CT's veth{VMID}i0 (LXC plugs
                                      it in at start)
    container:                        eth0 10.88.H.V/16 (layout.container_address), lo

A host reaches its containers and the other hosts' (as a Proxmox node reaches its CTs on
the bridge it has an address on), which `orch forward`'s direct mode needs. The switch has
no address and there is no route anywhere, so the containers' private range never leaves
the sandbox's namespaces: the machine's root namespace has no interface in it.
Everything is made with `ip -n NETNS` from the machine: no process has to run in the
switch namespace.
"""

from __future__ import annotations

import json
import time

from .hosts import NETNS_DIR
from .layout import CONTAINER_PREFIX_LENGTH, HostSpec, switch_netns
from .system import SandboxError, run

SWITCH_BRIDGE = "br0"
HOST_BRIDGE = "vmbr0"     # Proxmox's default bridge, which CT configs name
UPLINK = "uplink"         # the host's end of its port on the switch


def ensure_switch(prefix: str) -> None:
    """The switch namespace with its bridge up (made if missing)."""
    netns = switch_netns(prefix)
    if not (NETNS_DIR / netns).exists():
        run(["ip", "netns", "add", netns])
    if SWITCH_BRIDGE not in link_names(netns):
        _batch(netns, [f"link add {SWITCH_BRIDGE} type bridge",
                       f"link set dev {SWITCH_BRIDGE} up"])


def connect_host(prefix: str, spec: HostSpec) -> None:
    """The host's vmbr0 with its address and its port on the switch, each made only if
    missing: a host whose switch was removed (a killed run cleaned up) gets a new port, a
    host made before bridges had an address gets it."""
    present = link_names(spec.netns)
    if HOST_BRIDGE not in present:
        _batch(spec.netns, [f"link add {HOST_BRIDGE} type bridge",
                            f"link set dev {HOST_BRIDGE} up"])
    if spec.bridge_address not in bridge_addresses(spec.netns):
        _batch(spec.netns, [f"addr add {spec.bridge_address}/{CONTAINER_PREFIX_LENGTH} "
                            f"dev {HOST_BRIDGE}"])
    if UPLINK not in present:
        switch = switch_netns(prefix)
        # a port left from an earlier host of this name (its peer died with that host)
        # is gone already: a veth pair is removed with either end's namespace
        _batch(switch, [f"link add {spec.name} type veth peer name {UPLINK} netns {spec.netns}",
                        f"link set dev {spec.name} master {SWITCH_BRIDGE} up"])
        _batch(spec.netns, [f"link set dev {UPLINK} master {HOST_BRIDGE} up"])


def wait_until_carrying(prefix: str, specs, timeout: float = 5.0) -> None:
    """Until every port of the switch and of each host's vmbr0 has its carrier: the kernel
    reports a new veth's carrier a little later (tens of ms), and a packet sent before is
    dropped: a connect right after `up` would lose its SYN and wait a second."""
    namespaces = [switch_netns(prefix), *(spec.netns for spec in specs)]
    deadline = time.monotonic() + timeout
    while True:
        waiting = [f"{netns}/{name}" for netns in namespaces for name in _ports_down(netns)]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"bridge ports without carrier after {timeout:g} s: "
                               + ", ".join(waiting))
        time.sleep(0.01)


def _ports_down(netns: str) -> list[str]:
    result = run(["ip", "-n", netns, "-j", "link", "show"])
    return [link.get("ifname", "?") for link in json.loads(result.stdout or b"[]")
            if link.get("master") and link.get("operstate") != "UP"]


def remove_switch(prefix: str) -> None:
    """The switch and every port on it (the ports' host ends go with them)."""
    netns = switch_netns(prefix)
    if (NETNS_DIR / netns).exists():
        run(["ip", "netns", "del", netns])


def switch_prefixes() -> set[str]:
    """Prefixes of the switches the machine shows (down cleans those of its prefixes)."""
    if not NETNS_DIR.is_dir():
        return set()
    return {entry.name[len("orch-"):-len("-sw")] for entry in NETNS_DIR.iterdir()
            if entry.name.startswith("orch-") and entry.name.endswith("-sw")}


def bridge_addresses(netns: str) -> set[str]:
    """The IPv4 addresses on the namespace's vmbr0."""
    result = run(["ip", "-n", netns, "-j", "-4", "addr", "show", "dev", HOST_BRIDGE])
    return {info.get("local", "") for link in json.loads(result.stdout or b"[]")
            for info in link.get("addr_info", [])}


def link_names(netns: str) -> set[str]:
    """The interfaces of a namespace, from `ip -o link` ("N: NAME[@PEER]: <FLAGS> ...")."""
    result = run(["ip", "-n", netns, "-o", "link", "show"])
    names = set()
    for line in result.stdout.decode(errors="replace").splitlines():
        parts = line.split(": ", 2)
        if len(parts) >= 2:
            names.add(parts[1].partition("@")[0])
    return names


def _batch(netns: str, commands: list[str]) -> None:
    result = run(["ip", "-n", netns, "-batch", "-"], input="\n".join(commands).encode() + b"\n",
                 check=False)
    if result.returncode != 0:
        raise SandboxError(f"network namespace {netns}: `{'; '.join(commands)}` failed: "
                           f"{result.stderr.decode(errors='replace').strip()}")
