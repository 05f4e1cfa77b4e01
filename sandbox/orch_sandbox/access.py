"""How clients reach the sandbox: keys, known_hosts, an ssh_config and orch's inventory.

Keys are made once and kept across up/down (so known_hosts stays valid); the three client
files are rewritten by every `up` and removed by `down`.
"""

from __future__ import annotations

import json
from pathlib import Path

from .layout import Layout
from .paths import StatePaths
from .system import run

VENV = "/root/venv"


def ensure_key(path: Path, comment: str) -> None:
    """An ed25519 key pair at path (and path.pub), generated only if missing."""
    if path.exists() and path.with_name(path.name + ".pub").exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def public_key(path: Path) -> str:
    """'ssh-ed25519 AAAA...' of a key pair (the comment left out)."""
    key_type, blob = path.with_name(path.name + ".pub").read_text().split()[:2]
    return f"{key_type} {blob}"


def known_hosts_name(address: str, port: int) -> str:
    """The key paramiko and OpenSSH look a host up by: [address]:port unless port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def known_hosts_text(layout: Layout, paths: StatePaths) -> str:
    return "".join(f"{known_hosts_name(host.address, 22)} "
                   f"{public_key(paths.host_key(host.name))}\n"
                   for host in layout.hosts)


def ssh_config_text(layout: Layout, paths: StatePaths) -> str:
    """A config for plain OpenSSH: `ssh -F STATE/ssh_config sb1 "pct exec 200 -- true"`."""
    blocks = [f"# written by `orch sandbox up`; do not edit.\n"
              f"# usage: ssh -F {paths.ssh_config} {layout.hosts[0].name} 'pct list'\n"]
    for host in layout.hosts:
        blocks.append("\n".join([
            f"Host {host.name}",
            # ssh_config expands %-tokens in HostName: the scope's % must be written %%
            f"    HostName {host.address.replace('%', '%%')}",
            "    Port 22",
            "    User root",
            f"    IdentityFile {paths.client_key}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {paths.known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "    LogLevel ERROR",
            "",
        ]))
    return "\n".join(blocks)


def inventory_text(layout: Layout, paths: StatePaths) -> str:
    """orch's inventory for the sandbox, in the shape the inventory loader reads."""
    q = json.dumps  # a JSON string is a valid YAML double-quoted scalar
    lines = ["# written by `orch sandbox up`; do not edit", "hosts:"]
    for host in layout.hosts:
        lines.append(
            f"  {host.name}: {{address: {q(host.address)}, port: 22, user: root, "
            f"identity: {q(str(paths.client_key))}, known_hosts: {q(str(paths.known_hosts))}, "
            f"node: {host.name}, iface: {host.iface}}}")
    lines.append("containers:")
    running, stopped = [], []
    for host in layout.hosts:
        for ct in host.containers:
            name = f"{host.name}-{ct.vmid}"
            (running if ct.running else stopped).append(name)
            note = "" if ct.running else "   # stopped"
            if ct.real_root:
                note += f"   # own {ct.root} root: python3 only"
            # eth0 on the hosts' shared bridge: how the other containers reach this one
            lines.append(f"  {name}: {{host: {host.name}, vmid: {ct.vmid}, venv: {VENV}, "
                         f"address: {ct.address}}}{note}")
    lines.append("groups:")
    lines.append(f"  running: [{', '.join(running)}]")
    lines.append(f"  stopped: [{', '.join(stopped)}]")
    for host in layout.hosts:
        members = ", ".join(f"{host.name}-{ct.vmid}" for ct in host.containers)
        lines.append(f"  {host.name}: [{members}]")
    if layout.cluster:
        lines.append("clusters:")
        lines.append(f"  {layout.cluster}: [{', '.join(h.name for h in layout.hosts)}]")
    lines.append(f"default_target: {running[0] if running else stopped[0]}")
    return "\n".join(lines) + "\n"


def write_client_files(layout: Layout, paths: StatePaths) -> None:
    for path, text in ((paths.known_hosts, known_hosts_text(layout, paths)),
                       (paths.ssh_config, ssh_config_text(layout, paths)),
                       (paths.inventory, inventory_text(layout, paths))):
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(text)
        temporary.replace(path)  # readers never see a half-written file


def remove_client_files(paths: StatePaths) -> None:
    for path in (paths.known_hosts, paths.ssh_config, paths.inventory):
        path.unlink(missing_ok=True)
