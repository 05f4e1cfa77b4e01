"""The containers of a sandbox host: real, privileged LXC containers, as cheap as they come.

A container's rootfs is a skeleton directory; its config bind-mounts the machine's /usr
and /etc read-only (so Debian's python3 with venv, and rg, are in every container, at zero
download and zero disk) and keeps /root, /tmp, /var and /home private. Beside the LXC
config each container has a Proxmox config in the host's /etc/pve, which is what the
emulated `pct` and `pvesh` read.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import roots
from .hosts import remove_tree
from .layout import CONTAINER_PREFIX_LENGTH, ContainerSpec, HostSpec
from .network import HOST_BRIDGE
from .paths import StatePaths
from .system import SandboxError, in_host, run

LXC_PATH = "/var/lib/lxc"     # as seen inside a host (a private bind of hosts/HOST/lxc)
# few directories: each costs about a millisecond to create and to delete on this disk
PRIVATE_DIRS = ("root", "tmp", "var/tmp", "var/log", "home")
MOUNT_POINTS = ("proc", "sys", "dev", "etc", "usr", "run")
MERGED_USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib",
                    "lib64": "usr/lib64", "lib32": "usr/lib32", "libx32": "usr/libx32"}


def container_dir(paths: StatePaths, host: HostSpec, vmid: int) -> Path:
    return paths.host_dir(host.name) / "lxc" / str(vmid)


def pve_config_file(paths: StatePaths, host: HostSpec, vmid: int) -> Path:
    return paths.host_dir(host.name) / "pve" / "nodes" / host.name / "lxc" / f"{vmid}.conf"


def write_container(paths: StatePaths, host: HostSpec, ct: ContainerSpec) -> bool:
    """Create the container's rootfs skeleton if it has none, and bring its LXC and PVE
    configs up to date. True when the LXC config changed: a running container only reads
    it at its next start (core.py restarts it)."""
    directory = container_dir(paths, host, ct.vmid)
    if ct.real_root:
        changed = _write_real_root(paths, host, ct, directory)
    else:
        if not (directory / "rootfs" / "usr").is_dir():
            _make_rootfs(directory / "rootfs")
        write_if_changed(directory / "hostname", ct.hostname + "\n")
        write_if_changed(directory / "hosts", hosts_text(ct))
        write_if_changed(directory / "rootfs" / CT_INIT, CT_INIT_SCRIPT)
        changed = write_if_changed(directory / "config", lxc_config(paths, host, ct))
    pve_file = pve_config_file(paths, host, ct.vmid)
    pve_file.parent.mkdir(parents=True, exist_ok=True)
    write_if_changed(pve_file, pve_config(ct))
    return changed


# What a Proxmox CT's init does before anything else: bring the loopback up (an LXC netns
# starts with `lo` down; torchrun's ranks meet at 127.0.0.1). Then the container's command.
CT_INIT = "orch-ct-init"
CT_INIT_SCRIPT = """#!/bin/sh
# written by `orch sandbox up`: the loopback up, as a real CT's init has it, then "$@"
ip link set lo up 2>/dev/null || echo "orch-ct-init: could not bring lo up" >&2
exec "$@"
"""


def hosts_text(ct: ContainerSpec) -> str:
    """/etc/hosts as Proxmox writes it for a CT with a static IPv4 address (pve-container's
    PVE::LXC::Setup::Base update_etc_hosts): the CT's own name resolves to that address, not
    127.0.1.1. torchrun's c10d rendezvous depends on it: a node recognises itself as the
    endpoint's host by resolving its own hostname (docs/design/sandbox.md)."""
    return ("# --- BEGIN PVE ---\n"
            "127.0.0.1 localhost.localnet localhost\n"
            "::1 localhost.localnet localhost\n"
            f"{ct.address} {ct.hostname}\n"
            "# --- END PVE ---\n")


def root_kind_file(directory: Path) -> Path:
    return directory / "root-kind"


def root_kind(paths: StatePaths, host: HostSpec, vmid: int) -> str | None:
    """What the container on disk was made as ("host" or a distribution), None if unknown."""
    directory = container_dir(paths, host, vmid)
    try:
        return root_kind_file(directory).read_text().strip()
    except FileNotFoundError:
        return "host" if (directory / "rootfs" / "usr").is_dir() else None


def _write_real_root(paths: StatePaths, host: HostSpec, ct: ContainerSpec,
                     directory: Path) -> bool:
    """A container on its own distribution root: the unpacked root (shared, read-only) as
    the lower layer of an overlay, the container's changes in its own delta/."""
    base = roots.unpacked_root(paths, ct.root)
    delta = directory / "delta"
    delta.mkdir(parents=True, exist_ok=True)
    # what Proxmox writes into a container's /etc: written into the overlay's upper layer
    # before the first start (and never again while it may be mounted)
    etc = delta / "etc"
    etc.mkdir(exist_ok=True)
    for name, text in (("hostname", ct.hostname + "\n"), ("hosts", hosts_text(ct))):
        if not (etc / name).exists():
            (etc / name).write_text(text)
    write_if_changed(root_kind_file(directory), ct.root + "\n")
    return write_if_changed(directory / "config",
                            real_root_lxc_config(paths, host, ct, base, delta))


def network_lines(ct: ContainerSpec) -> list[str]:
    """eth0 on the host's vmbr0 with the layout's fixed address, up before init runs.

    Proxmox writes type, veth.pair, hwaddr and name the same way; it plugs the veth into
    the bridge with a hook script and sets the address from inside the CT's own network
    configuration. LXC does both itself here (link, ipv4.address): the same result
    without a hook or a network service in the CT. No gateway: nothing is routed out.
    """
    return [
        "lxc.net.0.type = veth",
        f"lxc.net.0.veth.pair = {ct.veth_pair}",
        f"lxc.net.0.hwaddr = {ct.hwaddr}",
        "lxc.net.0.name = eth0",
        f"lxc.net.0.link = {HOST_BRIDGE}",
        "lxc.net.0.flags = up",
        f"lxc.net.0.ipv4.address = {ct.address}/{CONTAINER_PREFIX_LENGTH}",
    ]


def _common_tail(paths: StatePaths, host: HostSpec, ct: ContainerSpec) -> list[str]:
    """The lines every sandbox container's config ends with."""
    return [
        "lxc.apparmor.profile = unconfined",
        # per-host cgroup paths: two hosts can both run a CT 200, and down finds them all
        f"lxc.cgroup.dir.monitor = {host.cgroup}/{ct.vmid}.monitor",
        f"lxc.cgroup.dir.container = {host.cgroup}/{ct.vmid}",
        f"lxc.log.file = {paths.lxc_log(host.name, ct.vmid)}",
        "lxc.log.level = WARN",
        "",
    ]


def real_root_lxc_config(paths: StatePaths, host: HostSpec, ct: ContainerSpec, base: Path,
                         delta: Path) -> str:
    """LXC config of a real-root container: its own /usr and /etc, the distribution's init
    (systemd) as PID 1, eth0 on the bridge as every container. The state directory is visible in the host as it is
    here, so base and delta need no translation."""
    return "\n".join([
        f"# written by `orch sandbox up`: CT {ct.vmid} of sandbox host {host.name}, "
        f"on a real {ct.root} root",
        f"lxc.uts.name = {ct.hostname}",
        f"lxc.rootfs.path = overlay:{base}:{delta}",
        "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,create=dir 0 0",
        "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed",
        "lxc.autodev = 1",
        "lxc.pty.max = 64",
        "lxc.tty.max = 2",
        *network_lines(ct),
        "lxc.init.cmd = /sbin/init",
        *_common_tail(paths, host, ct),
    ])


def write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def _make_rootfs(rootfs: Path) -> None:
    for name in MOUNT_POINTS + PRIVATE_DIRS:
        (rootfs / name).mkdir(parents=True, exist_ok=True)
    os.chmod(rootfs / "root", 0o700)
    for sticky in ("tmp", "var/tmp"):
        os.chmod(rootfs / sticky, 0o1777)
    for name, target in MERGED_USR_LINKS.items():
        link = rootfs / name
        if Path("/", target).exists() and not link.is_symlink():
            link.symlink_to(target)


def lxc_config(paths: StatePaths, host: HostSpec, ct: ContainerSpec) -> str:
    """LXC config, with paths as the host sees them (its /var/lib/lxc is private)."""
    here = f"{LXC_PATH}/{ct.vmid}"
    return "\n".join([
        f"# written by `orch sandbox up`: CT {ct.vmid} of sandbox host {host.name}",
        f"lxc.uts.name = {ct.hostname}",
        f"lxc.rootfs.path = dir:{here}/rootfs",
        "lxc.mount.entry = /usr usr none bind,ro 0 0",
        # non-recursive bind: the host's own mounts under /etc (its /etc/pve) stay out
        "lxc.mount.entry = /etc etc none bind,ro 0 0",
        f"lxc.mount.entry = {here}/hostname etc/hostname none bind,ro 0 0",
        f"lxc.mount.entry = {here}/hosts etc/hosts none bind,ro 0 0",
        "lxc.mount.entry = tmpfs run tmpfs rw,nosuid,nodev,mode=755 0 0",
        # torch's DataLoader workers and multiprocessing need a /dev/shm
        "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,create=dir 0 0",
        "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed",
        "lxc.autodev = 1",
        "lxc.pty.max = 64",
        *network_lines(ct),
        # without -n, init.lxc exits 1 silently (docs/design/sandbox.md)
        f"lxc.init.cmd = /usr/sbin/init.lxc.static -n {ct.vmid} -- /bin/sh /{CT_INIT} /bin/sleep infinity",
        *_common_tail(paths, host, ct),
    ])


def pve_config(ct: ContainerSpec) -> str:
    """A Proxmox CT config (/etc/pve/nodes/NODE/lxc/VMID.conf) as `pct create` writes it."""
    cores = min(os.cpu_count() or 1, 4)
    note = (f"#orch sandbox container on a real {ct.root} root" if ct.real_root
            else "#orch sandbox container (rootfs shares the machine's /usr and /etc read-only)")
    return "\n".join([
        note,
        "arch: amd64",
        f"cores: {cores}",
        "features: nesting=1",
        f"hostname: {ct.hostname}",
        "memory: 2048",
        # as `pct create --net0 name=eth0,bridge=vmbr0,ip=...` writes it (the MAC upper-case)
        f"net0: name=eth0,bridge={HOST_BRIDGE},hwaddr={ct.hwaddr.upper()},"
        f"ip={ct.address}/{CONTAINER_PREFIX_LENGTH},type=veth",
        "ostype: debian",
        f"rootfs: local:{ct.vmid}/vm-{ct.vmid}-disk-0.raw,size=8G",
        "swap: 512",
        "",
    ])


def running_vmids(holder_pid: int) -> set[int]:
    """Containers whose LXC monitor socket exists in the host's network namespace.

    /proc/PID/net/unix shows the sockets of PID's network namespace, so this needs no
    process inside the host (the emulated pct uses the same test).
    """
    prefix, suffix = f"@{LXC_PATH}/", "/command"
    running = set()
    try:
        text = Path(f"/proc/{holder_pid}/net/unix").read_text(errors="replace")
    except OSError:
        return running
    for line in text.splitlines():
        path = line.rpartition(" ")[2]
        if path.startswith(prefix) and path.endswith(suffix):
            name = path[len(prefix):-len(suffix)]
            if name.isdigit():
                running.add(int(name))
    return running


def start(holder_pid: int, vmid: int) -> None:
    result = run(in_host(holder_pid, ["lxc-start", "-n", str(vmid)]), check=False, timeout=60)
    if result.returncode != 0:
        raise SandboxError(f"CT {vmid} did not start: "
                           f"{result.stderr.decode(errors='replace').strip()} "
                           "(see the LXC log in the sandbox's logs/ directory)")


def stop(holder_pid: int, vmid: int) -> None:
    run(in_host(holder_pid, ["lxc-stop", "-n", str(vmid), "--kill"]), timeout=60)


def configured_vmids(paths: StatePaths, host: HostSpec) -> set[int]:
    directory = pve_config_file(paths, host, 0).parent
    if not directory.is_dir():
        return set()
    return {int(entry.name[:-5]) for entry in directory.iterdir()
            if entry.name.endswith(".conf") and entry.name[:-5].isdigit()}


def remove(paths: StatePaths, host: HostSpec, holder_pid: int, vmid: int, running: bool) -> None:
    """Delete a container the layout no longer has (after `up` with fewer --containers)."""
    if running:
        stop(holder_pid, vmid)
    pve_config_file(paths, host, vmid).unlink(missing_ok=True)
    remove_tree(container_dir(paths, host, vmid))
