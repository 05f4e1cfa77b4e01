"""Network faults inside a sandbox host, with nftables (docs/design/sandbox.md: "Faults a test
can inject"). Rules live in one table of the host's own network namespace, so they
never touch the machine's firewall and vanish with the host.
"""

from __future__ import annotations

from .prereqs import find_command
from .system import SandboxError, in_host, run

TABLE = "orch_fault"
BRIDGE_TABLE = "orch_fault_bridge"   # the containers' traffic, on the host's vmbr0
ACTIONS = {
    "drop": "tcp dport 22 drop",                    # connect() times out
    "reject": "tcp dport 22 reject with tcp reset",  # refused at once
}


def ssh_rule(mode: str, percent: int = 30) -> str:
    if mode == "loss":
        if not 0 < percent <= 100:
            raise SandboxError(f"packet loss must be 1-100 %, not {percent}")
        return f"tcp dport 22 numgen random mod 100 < {percent} drop"
    try:
        return ACTIONS[mode]
    except KeyError:
        raise SandboxError(f"unknown fault {mode!r}: use drop, reject or loss") from None


def block_ssh(holder_pid: int, mode: str = "drop", percent: int = 30) -> None:
    """Make the host's port 22 drop, reject, or lose `percent` % of packets."""
    nft = _nft()
    clear_firewall(holder_pid)
    ruleset = (f"table inet {TABLE} {{\n"
               "  chain input {\n"
               "    type filter hook input priority 0; policy accept;\n"
               f"    {ssh_rule(mode, percent)}\n"
               "  }\n"
               "}\n")
    run(in_host(holder_pid, [nft, "-f", "-"]), input=ruleset.encode())


def block_container_port(holder_pid: int, address: str, port: int) -> None:
    """Drop TCP to `address`:`port` on the host's bridge: a container on another host can
    no longer reach that port of the container (its own host's firewall, as a Proxmox
    firewall rule would). Bridged traffic crosses the bridge family's forward hook, not
    the inet table's input hook (block_ssh), so the two faults are independent."""
    nft = _nft()
    run(in_host(holder_pid, [nft, "delete", "table", "bridge", BRIDGE_TABLE]), check=False)
    ruleset = (f"table bridge {BRIDGE_TABLE} {{\n"
               "  chain forward {\n"
               "    type filter hook forward priority 0; policy accept;\n"
               f"    ip daddr {address} tcp dport {int(port)} drop\n"
               "  }\n"
               "}\n")
    run(in_host(holder_pid, [nft, "-f", "-"]), input=ruleset.encode())


def clear_firewall(holder_pid: int) -> None:
    nft = find_command("nft")
    if nft:
        run(in_host(holder_pid, [nft, "delete", "table", "inet", TABLE]), check=False)
        run(in_host(holder_pid, [nft, "delete", "table", "bridge", BRIDGE_TABLE]), check=False)


def _nft() -> str:
    nft = find_command("nft")
    if not nft:
        raise SandboxError("nft not found: apt-get install -y nftables")
    return nft
