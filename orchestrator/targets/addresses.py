"""Where the other nodes of a multi-node run reach a container, and where `orch forward
--via direct` opens its channels: its address, and which source said so.

    container_address(fleet, target)                  # eth0's first IPv4, or the inventory's
    container_address(fleet, target, interface="ib0") # that interface's first IPv4
    locate(fleet, target)                             # Located(address, source, trusted)

Three sources, in this order:
1. the inventory: `address:` of the container (an IP literal or a DNS name), the user's
   word; it wins whatever interface is asked for, since it says where the node is reached;
2. the container's Proxmox config (GET /nodes/NODE/lxc/VMID/config): the `netN` whose
   `name=` is the interface, when its `ip=` is an address (`IPv4/CIDR`; not `dhcp` or
   `manual`): what the host's admin assigned (pve-container's netconf, PVE/LXC/Config.pm);
3. the container's own network namespace, through the Proxmox API: GET
   /nodes/NODE/lxc/VMID/interfaces (needs VM.Audit). Root in the container chooses what
   that says (`ip addr add` of any address), so it is not trusted: `orch forward` goes
   there directly only when asked to (--via direct), and says where the address came
   from. Both API calls go to the
   host the container runs on, over the host's existing SSH connection (pvesh) or the
   HTTPS API when the inventory's `api:` says so. Its answer is PVE::LXC::get_interfaces':
   `ip --json a` of the CT's network namespace, one object per interface with
   `ip-addresses: [{"ip-address", "ip-address-type", "prefix"}]`
   (docs/design/proxmox-semantics.md). The deprecated `inet` field holds only the LAST
   IPv4 address, so it is never read.
Neither giving one is an error that says what to add to the inventory.
"""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple, Optional

from orchestrator.ground.errors import ConfigError, OrchError
from orchestrator.remote.container import Target
from orchestrator.targets.fleet import Fleet

DEFAULT_INTERFACE = "eth0"   # a Proxmox CT's first network device (net0: name=eth0)
MAX_INTERFACES = 256         # a CT's answer is untrusted: bounded before it is read


NET_KEYS = tuple(f"net{index}" for index in range(10))   # pve-container's MAX_LXC_NETWORKS
FROM_INVENTORY = "the inventory"
FROM_NAMESPACE = "the container's own network (its root sets it)"


class NoAddress(ConfigError):
    """Neither the inventory nor the Proxmox API gives the container an address."""


class Located(NamedTuple):
    address: str
    source: str          # FROM_INVENTORY, "its Proxmox config (net0)", FROM_NAMESPACE
    trusted: bool        # not chosen by the container itself


def container_address(fleet: Fleet, target: Target, interface: Optional[str] = None) -> str:
    """The address other containers reach `target` at (see the module docstring)."""
    return locate(fleet, target, interface).address


def locate(fleet: Fleet, target: Target, interface: Optional[str] = None) -> Located:
    """The container's address and where it came from (see the module docstring)."""
    spec = fleet.inventory.containers.get(target.name)
    if spec is not None and spec.address:
        return Located(spec.address, FROM_INVENTORY, True)
    if not target.vmid:
        raise NoAddress(f"{target.describe()} is a host, not a container: it has no "
                        "container address", hint=_hint(fleet, target))
    wanted = interface or DEFAULT_INTERFACE
    client = fleet.proxmox(target.host.name)
    try:
        configured = configured_address(client.config(target.vmid), wanted)
        if configured is not None:
            return configured
        interfaces = client.interfaces(target.vmid)
    except OrchError as error:
        raise NoAddress(f"{target.describe()}: the Proxmox API could not tell its address: "
                        f"{error}", hint=_hint(fleet, target)) from None
    return Located(pick_address(interfaces, wanted, what=target.describe(),
                                hint=_hint(fleet, target)), FROM_NAMESPACE, False)


def configured_address(config, interface: str) -> Optional[Located]:
    """The static IPv4 the config's netN named `interface` assigns (ip=A.B.C.D/N), or None
    (no such netN, ip=dhcp or manual, anything malformed)."""
    if not isinstance(config, dict):
        return None
    for key in NET_KEYS:
        value = config.get(key)
        if not isinstance(value, str) or len(value) > 4096:
            continue
        fields = dict(part.partition("=")[::2] for part in value.split(",") if "=" in part)
        if fields.get("name") != interface:
            continue
        ip = re.fullmatch(r"(\d{1,3}(?:\.\d{1,3}){3})/\d{1,2}", fields.get("ip", ""))
        try:
            address = ipaddress.IPv4Address(ip.group(1)) if ip else None
        except ValueError:
            address = None
        return Located(str(address), f"its Proxmox config ({key})", True) if address else None
    return None


def pick_address(interfaces, interface: str, *, what: str, hint: Optional[str] = None) -> str:
    """The first non-loopback IPv4 address of `interface` in an interfaces answer."""
    if interfaces is None:
        raise NoAddress(f"{what}: the Proxmox API lists no interfaces (the container is not "
                        "running)", hint=hint)
    found = _by_name(interfaces)
    if interface not in found:
        listed = ", ".join(sorted(found)) or "none"
        raise NoAddress(f"{what} has no interface {interface!r} (the Proxmox API lists: "
                        f"{listed})", hint=hint)
    addresses = found[interface]
    for address in addresses:
        if address.version == 4 and not address.is_loopback:
            return str(address)
    shown = ", ".join(map(str, addresses)) or "no address at all"
    raise NoAddress(f"{what}: interface {interface} has no IPv4 address ({shown})", hint=hint)


def _by_name(interfaces) -> dict[str, list]:
    """name -> its addresses, from the answer's `ip-addresses` lists; anything malformed
    (not a list of objects, an address that does not parse) is left out."""
    found: dict[str, list] = {}
    if not isinstance(interfaces, list):
        return found
    for item in interfaces[:MAX_INTERFACES]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        entries = item.get("ip-addresses")
        addresses = []
        for entry in entries[:MAX_INTERFACES] if isinstance(entries, list) else ():
            text = entry.get("ip-address") if isinstance(entry, dict) else None
            if not isinstance(text, str):     # ip_address() would take a number too
                continue
            try:
                addresses.append(ipaddress.ip_address(text))
            except ValueError:
                continue
        found[item["name"]] = addresses
    return found


def _hint(fleet: Fleet, target: Target) -> str:
    inventory = fleet.inventory.path
    if target.name in fleet.inventory.containers:
        return (f"add `address: IP` (where the other nodes reach it) to container "
                f"{target.name} in {inventory}")
    return (f"name it in {inventory} under containers: with its address, e.g. "
            f"`{target.name.replace(':', '-')}: {{host: {target.host.name}, vmid: "
            f"{target.vmid}, address: IP}}`")
