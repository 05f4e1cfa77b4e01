"""How orch reaches a host of the inventory (its `transport:`), and what each way can do.

The one table of transports: the inventory validates `transport:` against it, and every
room asks a transport's capabilities here instead of comparing its name, so a new way in
(say a Proxmox host reached by the API alone) is one row and the places that must decide
about it are the capabilities it answers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransportKind:
    name: str
    summary: str
    # reached through an SSH connection: it needs an address, the warm agent keeps its
    # connections, the early handshake and `orch agent status` count its channels
    over_ssh: bool
    # a Proxmox node: containers by vmid (`pct exec`), the Proxmox API, a cluster's node
    proxmox: bool


SSH = TransportKind("ssh", "a Proxmox host over SSH (pct exec, pvesh)", over_ssh=True, proxmox=True)
LOCAL = TransportKind("local", "this machine: commands run here, no containers", over_ssh=False, proxmox=False)

TRANSPORTS = {transport.name: transport for transport in (SSH, LOCAL)}
DEFAULT = SSH


def transport(name: str) -> TransportKind:
    """The transport NAME; KeyError for a name the table lacks (the inventory refuses it first)."""
    return TRANSPORTS[name]


def choices() -> str:
    """The names, as an error message lists them: 'ssh' or 'local'."""
    return " or ".join(repr(name) for name in TRANSPORTS)
