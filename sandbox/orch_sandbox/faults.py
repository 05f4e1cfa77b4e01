"""Network faults inside a sandbox host, with nftables (docs/design/sandbox.md: "Faults a test
can inject"). Rules live in one table of the host's own network namespace, so they
never touch the machine's firewall and vanish with the host.
"""

from __future__ import annotations

from .prereqs import find_command
from .system import SandboxError, in_host, run

TABLE = "orch_fault"
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


def clear_firewall(holder_pid: int) -> None:
    nft = find_command("nft")
    if nft:
        run(in_host(holder_pid, [nft, "delete", "table", "inet", TABLE]), check=False)


def _nft() -> str:
    nft = find_command("nft")
    if not nft:
        raise SandboxError("nft not found: apt-get install -y nftables")
    return nft
