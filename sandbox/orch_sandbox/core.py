"""`up`, `down` and `status` of the sandbox as a whole.

`up` converges: whatever is there (nothing, a healthy sandbox, the debris of a killed run,
or a host a test broke on purpose) ends as the requested layout, reusing what is healthy.
`down` removes everything it can find by name, not only what its records list.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from . import access, api, containers, faults, hosts, network, roots
from .handle import Sandbox
from .layout import CGROUP_ROOT, HostSpec, Layout, build_layout
from .paths import StatePaths
from .prereqs import require
from .system import SandboxError, cgroup_hierarchies, in_host, remove_empty_parents, run

TOOLS_DIR = Path(__file__).with_name("bin")
TOOLS = {"pct": 0o755, "pct.py": 0o644, "pvesh": 0o755, "pvelib.py": 0o644,
         "pvefiles.py": 0o644, "pvetasks.py": 0o644, "pveproxy": 0o755}
READY_MARK = "ready"
MAX_PARALLEL_HOSTS = 8


@contextmanager
def locked(paths: StatePaths):
    """Serialise up/down of one state directory (two test runs may start at once)."""
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --- up -----------------------------------------------------------------------------------------

def up(hosts_count: int = 2, containers_count: int = 3, stopped: int = 1, prefix: str = "sb",
       state_dir: Path | str | None = None, real_root: tuple[int, ...] = (),
       distribution: str = roots.DEFAULT_DISTRIBUTION, progress=None,
       cluster: str | None = None) -> Sandbox:
    """Build (or converge to) the layout; the CTs in `real_root` get their own
    `distribution` root (roots.py) instead of the machine's /usr and /etc; `cluster` makes
    the hosts one Proxmox cluster."""
    paths = StatePaths.at(state_dir)
    require(paths)
    layout = build_layout(hosts_count, containers_count, stopped, prefix, tuple(real_root),
                          distribution, cluster)
    with locked(paths):
        _prepare_roots(paths, layout, progress)
        previous = Layout.load(paths.layout_file)
        wanted = {host.name for host in layout.hosts}
        unwanted = _known_host_names(paths, previous, prefix) - wanted
        _in_parallel(lambda name: hosts.teardown(paths, name), sorted(unwanted))
        for stale in _known_prefixes(previous, prefix) - {prefix}:
            network.remove_switch(stale)
        _prepare_machine(paths)
        network.ensure_switch(prefix)
        paths.layout_file.write_text(layout.to_json())
        client_key = access.public_key(paths.client_key)
        _in_parallel(lambda spec: _ensure_host(paths, spec, client_key, layout),
                     layout.hosts)
        network.wait_until_carrying(prefix, layout.hosts)
        if layout.cluster:
            _announce_cluster_status(paths, layout)
        access.write_client_files(layout, paths)
    return Sandbox(paths, layout)


def _prepare_machine(paths: StatePaths) -> None:
    """What every host needs from the machine: keys, tools, and directories that must exist
    before a host can mount over them."""
    for directory in (paths.logs, paths.hosts_dir, Path("/run/lxc"), Path("/run/sshd")):
        directory.mkdir(parents=True, exist_ok=True)
    access.ensure_key(paths.client_key, "orch-sandbox-client")
    api.ensure_credentials(paths)
    install_tools(paths)


def _prepare_roots(paths: StatePaths, layout: Layout, progress) -> None:
    """The distribution roots the layout's containers need, unpacked in the state
    directory (the tarball is built once and cached)."""
    wanted = {ct.root for host in layout.hosts for ct in host.containers if ct.real_root}
    for distribution in sorted(wanted):
        roots.ensure_unpacked(paths, distribution, progress)


def install_tools(paths: StatePaths) -> None:
    """Copy the emulated pct/pvesh into the state directory (hosts cannot see /root, where
    a pyenv-installed orch would live); only changed files, atomically."""
    paths.bin_dir.mkdir(parents=True, exist_ok=True)
    for stale in paths.bin_dir.iterdir():
        if stale.is_file() and stale.name not in TOOLS:
            stale.unlink()
    for name, mode in TOOLS.items():
        source, target = TOOLS_DIR / name, paths.bin_dir / name
        if target.exists() and target.read_bytes() == source.read_bytes():
            continue
        temporary = target.with_name(f".{name}.tmp")
        shutil.copy2(source, temporary)
        os.chmod(temporary, mode)
        temporary.replace(target)


def _in_parallel(action, items) -> None:
    """Hosts are independent: build or remove them concurrently (the time goes into
    waiting for subprocesses and the disk)."""
    items = list(items)
    if not items:
        return
    with ThreadPoolExecutor(max_workers=min(len(items), MAX_PARALLEL_HOSTS)) as pool:
        futures = [pool.submit(action, item) for item in items]
    errors = [future.exception() for future in futures if future.exception()]
    if errors:
        raise errors[0]


def _ensure_host(paths: StatePaths, spec: HostSpec, client_key: str, layout: Layout) -> None:
    access.ensure_key(paths.host_key(spec.name), f"orch-sandbox-{spec.name}")
    health = hosts.health(paths, spec)
    ready = (paths.host_dir(spec.name) / READY_MARK).exists()
    if health.netns and health.holder and ready:
        _converge_host(paths, spec, client_key, health, layout)
    else:
        hosts.teardown(paths, spec.name)
        _create_host(paths, spec, client_key, layout)


def _announce_cluster_status(paths: StatePaths, layout: Layout) -> None:
    """Each node's emulated pvesh publishes its containers' states in the shared /etc/pve
    (as pvestatd broadcasts them), so /cluster/resources on any node knows all of them."""
    for spec in layout.hosts:
        holder = hosts.holder_pid(paths, spec)
        if holder is not None:
            run(in_host(holder, [str(paths.bin_dir / "pvesh"), "get", "/cluster/resources",
                                 "--output-format", "json"]))


def _create_host(paths: StatePaths, spec: HostSpec, client_key: str, layout: Layout) -> None:
    for log in (paths.sshd_log(spec.name), *(paths.lxc_log(spec.name, ct.vmid)
                                             for ct in spec.containers)):
        log.unlink(missing_ok=True)
    hosts.prepare_host_dir(paths, spec, client_key, layout.cluster)
    for ct in spec.containers:
        containers.write_container(paths, spec, ct)
    hosts.create_network(spec)
    network.connect_host(layout.prefix, spec)
    holder = hosts.start_holder(paths, spec)
    hosts.run_host_setup(paths, spec, holder)
    hosts.write_sshd_config(paths, spec)
    hosts.start_sshd(paths, spec, holder)
    api.start(paths, spec, holder)
    for ct in spec.containers:
        if ct.running:
            containers.start(holder, ct.vmid)
    (paths.host_dir(spec.name) / READY_MARK).write_text(f"{time.time():.3f}\n")


def _converge_host(paths: StatePaths, spec: HostSpec, client_key: str,
                   health: hosts.HostHealth, layout: Layout) -> None:
    """Reuse a live host, undoing what tests may have changed: link, firewall, sshd and its
    host key, its port on the switch, container states and configs."""
    holder = health.holder_pid
    hosts.prepare_host_dir(paths, spec, client_key, layout.cluster)
    hosts.repair_link(spec)
    network.connect_host(layout.prefix, spec)
    faults.clear_firewall(holder)
    if hosts.write_sshd_config(paths, spec) or not health.sshd:
        hosts.stop_sshd(paths, spec)
        hosts.start_sshd(paths, spec, holder)
    api.start(paths, spec, holder)
    running = containers.running_vmids(holder)
    for vmid in containers.configured_vmids(paths, spec) - {ct.vmid for ct in spec.containers}:
        containers.remove(paths, spec, holder, vmid, running=vmid in running)
    for ct in spec.containers:     # a container whose kind of root changed is made anew
        kind = containers.root_kind(paths, spec, ct.vmid)
        if kind is not None and kind != ct.root:
            containers.remove(paths, spec, holder, ct.vmid, running=ct.vmid in running)
            running.discard(ct.vmid)
    for ct in spec.containers:
        if containers.write_container(paths, spec, ct) and ct.vmid in running:
            containers.stop(holder, ct.vmid)     # started with an older config (no eth0)
            running.discard(ct.vmid)
        if ct.running and ct.vmid not in running:
            containers.start(holder, ct.vmid)
        elif not ct.running and ct.vmid in running:
            containers.stop(holder, ct.vmid)


# --- down ---------------------------------------------------------------------------------------

def down(purge: bool = False, state_dir: Path | str | None = None,
         prefix: str | None = None) -> list[str]:
    """Remove every host of this state directory; returns their names.

    Keeps the SSH keys (so known_hosts entries stay valid for the next up) and the logs;
    purge removes the whole state directory as well.
    """
    paths = StatePaths.at(state_dir)
    require(paths)
    with locked(paths):
        previous = Layout.load(paths.layout_file)
        names = sorted(_known_host_names(paths, previous, prefix))
        _in_parallel(lambda name: hosts.teardown(paths, name), names)
        for known in _known_prefixes(previous, prefix):
            network.remove_switch(known)
        access.remove_client_files(paths)
        for leftover in (paths.layout_file,):
            leftover.unlink(missing_ok=True)
        for directory in (paths.bin_dir, paths.hosts_dir, hosts.shared_pve_dir(paths)):
            hosts.remove_tree(directory)
        roots.remove_unpacked(paths)     # the tarball stays cached for the next up
        remove_empty_parents(f"{CGROUP_ROOT}/x")
        if purge:
            hosts.remove_tree(paths.root)
    return names


def _known_prefixes(layout: Layout | None, prefix: str | None) -> set[str]:
    """The host-name prefixes this sandbox uses or used: the one asked for, the records'."""
    return {p for p in (prefix, layout.prefix if layout else None) if p} or {"sb"}


def _known_host_names(paths: StatePaths, layout: Layout | None, prefix: str | None) -> set[str]:
    """Hosts of this sandbox, from its records and from what the machine shows by name."""
    names = {host.name for host in layout.hosts} if layout else set()
    if paths.hosts_dir.is_dir():
        names |= {entry.name for entry in paths.hosts_dir.iterdir() if entry.is_dir()}
    prefixes = _known_prefixes(layout, prefix)
    pattern = re.compile("^(" + "|".join(map(re.escape, prefixes)) + r")\d+$")
    candidates = set()
    if hosts.NETNS_DIR.is_dir():
        candidates |= {entry.name[5:] for entry in hosts.NETNS_DIR.iterdir()
                       if entry.name.startswith("orch-")}
    candidates |= {entry.name[5:] for entry in Path("/sys/class/net").iterdir()
                   if entry.name.startswith("orch-")}
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / CGROUP_ROOT
        if top.is_dir():
            candidates |= {entry.name for entry in top.iterdir() if entry.is_dir()}
    return names | {name for name in candidates if pattern.match(name)}


# --- status -------------------------------------------------------------------------------------

def status(state_dir: Path | str | None = None) -> dict:
    """What runs, as data: the CLI prints it, tests and `--json` readers consume it."""
    paths = StatePaths.at(state_dir)
    require(paths)
    layout = Layout.load(paths.layout_file)
    report = {"state_dir": str(paths.root), "inventory": str(paths.inventory),
              "ssh_config": str(paths.ssh_config), "up": False, "healthy": False, "hosts": []}
    if layout is None:
        return report
    for spec in layout.hosts:
        report["hosts"].append(_host_status(paths, spec))
    report["up"] = all(h["netns"] and h["holder_pid"] and h["sshd_pid"]
                       for h in report["hosts"])
    report["healthy"] = report["up"] and all(
        h["link_up"] and h["ssh_port_open"] and
        all(ct["state"] == ct["expected"] for ct in h["containers"])
        for h in report["hosts"])
    return report


def _host_status(paths: StatePaths, spec: HostSpec) -> dict:
    health = hosts.health(paths, spec)
    running = containers.running_vmids(health.holder_pid) if health.holder else set()
    return {
        "name": spec.name, "address": spec.address, "iface": spec.iface,
        "netns": health.netns, "holder_pid": health.holder_pid, "sshd_pid": health.sshd_pid,
        "api_pid": api.running_pid(paths, spec.name),
        "link_up": hosts.link_is_up(spec),
        "ssh_port_open": health.sshd and _port_open(spec.address, 22),
        "containers": [{"vmid": ct.vmid, "name": f"{spec.name}-{ct.vmid}", "root": ct.root,
                        "address": ct.address,
                        "state": "running" if ct.vmid in running else "stopped",
                        "expected": "running" if ct.running else "stopped"}
                       for ct in spec.containers],
    }


def _port_open(address: str, port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until_reachable(layout: Layout, timeout: float = 5.0) -> None:
    """Each host's sshd accepts connections: a link set back up (by a test, or by `up`
    repairing one) takes a moment to carry traffic again. Not called by `up` itself: its
    probe connection leaves a short-lived sshd child titled like the listener."""
    deadline = time.monotonic() + timeout
    for spec in layout.hosts:
        while not _port_open(spec.address, 22):
            if time.monotonic() > deadline:
                raise SandboxError(f"sandbox host {spec.name} ({spec.address}) does not "
                                   "accept SSH connections")
            time.sleep(0.02)
