"""Sandbox hosts: a network namespace with a real sshd, as a Proxmox VE node looks over SSH.

A host is held by one "holder" process (`sleep infinity`, renamed orch-sandbox-host:NAME)
that owns the host's mount and UTS namespaces and sits in its network namespace
/run/netns/orch-NAME. Everything else (host-setup.sh, sshd, lxc-start) is started inside
those namespaces with `nsenter -t HOLDER`. A veth pair links the machine (orch-NAME, a
kernel-made link-local address) with the host (eth0, fe80::2): link-local addresses only,
never a private IPv4 range outside the namespaces (the machine's rule, docs/design/sandbox.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import api
from .layout import CGROUP_ROOT, HostSpec
from .paths import StatePaths
from .system import (SandboxError, alive, cmdline, descendants, in_host, kill_and_wait,
                     mounts_below, move_to_cgroup, namespace_inode, pids_in_cgroup_tree,
                     pids_in_netns, read_pid, remove_cgroup_tree, run, wait_for)

NETNS_DIR = Path("/run/netns")
HOST_SETUP = Path(__file__).with_name("host-setup.sh")
HOLDER_TAG = "orch-sandbox-host:"
# bash reports its PID (already inside the new namespaces), lets go of our pipe and execs
# sleep under the name given as $0: no text of ours is ever parsed by a shell
HOLDER_SCRIPT = 'echo "$$"; exec -a "$0" sleep infinity </dev/null >/dev/null 2>&1'
SSHD = "/usr/sbin/sshd"
DEFAULT_HOST_KEY = "ssh_host_ed25519_key"
CHANGED_HOST_KEY = "changed_host_key"
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class HostHealth:
    netns: bool
    holder_pid: int | None
    sshd_pid: int | None

    @property
    def holder(self) -> bool:
        return self.holder_pid is not None

    @property
    def sshd(self) -> bool:
        return self.sshd_pid is not None


def netns_path(spec_or_name: HostSpec | str) -> Path:
    name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
    return NETNS_DIR / f"orch-{name}"


# --- state on disk: the host's HOME, /etc overlay, /etc/pve and /var/lib/lxc ---------------

def prepare_host_dir(paths: StatePaths, spec: HostSpec, client_public_key: str,
                     cluster: str | None = None) -> None:
    root = paths.host_dir(spec.name)
    root.mkdir(parents=True, exist_ok=True)
    _choose_pve_dir(paths, root / "pve", cluster)
    for sub in ("lxc", "etc-upper/pve", "etc-work", "cgroup-aside",
                f"pve/nodes/{spec.name}/lxc"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    # the overlay's upper layer may be mounted already: write only when it changes
    write_if_changed(root / "etc-upper" / "hostname", spec.name + "\n")
    if not cluster:
        # as on a real node; in a cluster pmxcfs makes these per node, which one shared
        # directory cannot: the emulation always uses nodes/NODE/ instead
        _link(root / "pve" / "lxc", f"nodes/{spec.name}/lxc")
        _link(root / "pve" / "local", f"nodes/{spec.name}")
    _write_home(root / "home", paths, client_public_key)
    prepare_pve_extras(paths, spec, root / "pve")


def prepare_pve_extras(paths: StatePaths, spec: HostSpec, pve_dir: Path) -> None:
    """What the HTTPS API and start tasks read: the node's certificate and the API token
    (api.py), and a `local` dir storage whose snippets/ holds hookscripts."""
    (paths.host_dir(spec.name) / "vz" / "snippets").mkdir(parents=True, exist_ok=True)
    if not pve_dir.is_symlink():    # a cluster's shared storage.cfg cannot name per-host paths
        write_if_changed(pve_dir / "storage.cfg",
                         f"dir: local\n\tpath {paths.host_dir(spec.name) / 'vz'}\n"
                         "\tcontent iso,vztmpl,backup,snippets\n")
    api.write_node_files(paths, spec, pve_dir)
    # the emulation's knobs (pvelib.knob) that tests set: `up` puts the defaults back
    shutil.rmtree(pve_dir / "nodes" / spec.name / ".orch-sandbox", ignore_errors=True)


def shared_pve_dir(paths: StatePaths) -> Path:
    """/etc/pve of every host of a cluster sandbox (pmxcfs: one file system for all)."""
    return paths.root / "cluster-pve"


def _choose_pve_dir(paths: StatePaths, pve: Path, cluster: str | None) -> None:
    """hosts/HOST/pve: the host's own directory, or a link to the cluster's shared one."""
    if cluster:
        shared = shared_pve_dir(paths)
        shared.mkdir(parents=True, exist_ok=True)
        if pve.is_symlink():
            return
        if pve.exists():
            raise SandboxError(f"{pve.parent.name} is a standalone sandbox host; take the "
                               "sandbox down before making it a cluster")
        pve.symlink_to(shared)
    elif pve.is_symlink():
        raise SandboxError(f"{pve.parent.name} is a cluster sandbox host; take the sandbox "
                           "down before making it standalone")


def write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def _link(link: Path, target: str) -> None:
    if not link.is_symlink():
        link.symlink_to(target)


def _write_home(home: Path, paths: StatePaths, client_public_key: str) -> None:
    """root's HOME on the host: sshd's StrictModes wants it and .ssh private."""
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    os.chmod(ssh_dir, 0o700)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(client_public_key.strip() + "\n")
    os.chmod(keys, 0o600)
    # Debian's bash sources ~/.bashrc for commands run by sshd: keep it to one line.
    (home / ".bashrc").write_text(
        "# orch sandbox host: minimal on purpose (no pyenv init on every SSH command)\n"
        f"export PATH={host_path(paths)}\n")
    (home / ".profile").write_text('[ -f ~/.bashrc ] && . ~/.bashrc\n')


def host_path(paths: StatePaths) -> str:
    """PATH on a host: the emulated pct and pvesh first, then the standard root PATH."""
    return f"{paths.bin_dir}:{STANDARD_PATH}"


# --- network namespace and veth --------------------------------------------------------------

def create_network(spec: HostSpec) -> None:
    """The host's namespace and a veth pair: eth0 inside (fe80::2, set by host-setup.sh),
    orch-HOST outside with a kernel-made link-local address.

    The outside address is left to the kernel on purpose: a link set down loses its
    link-local addresses (keep_addr_on_down spares only global ones), and the kernel makes
    a new one on every `ip link set IFACE up`. With DAD off it is usable at once, so a test
    that cuts the link with plain `ip link set IFACE down/up` gets a working host back.
    """
    run(["ip", "-batch", "-"], input=(
        f"netns add {spec.netns}\n"
        f"link add {spec.iface} type veth peer name eth0 netns {spec.netns}\n").encode())
    repair_link(spec)


def repair_link(spec: HostSpec) -> None:
    """Outside end: IPv6 on, no DAD, a link-local address made on every up; and up."""
    _set_ipv6_sysctl(spec.iface, "disable_ipv6", "0")
    _set_ipv6_sysctl(spec.iface, "accept_dad", "0")
    _set_ipv6_sysctl(spec.iface, "addr_gen_mode", "0")   # eui64
    if not link_is_up(spec):
        set_link(spec, up=True)


def _set_ipv6_sysctl(iface: str, name: str, value: str) -> None:
    path = Path("/proc/sys/net/ipv6/conf", iface, name)
    if path.exists():
        path.write_text(value)


def link_is_up(spec: HostSpec) -> bool:
    """Administratively up (IFF_UP), which is what link_down/link_up change."""
    try:
        return bool(int(Path(f"/sys/class/net/{spec.iface}/flags").read_text(), 16) & 0x1)
    except OSError:
        return False


def set_link(spec: HostSpec, up: bool) -> None:
    run(["ip", "link", "set", "dev", spec.iface, "up" if up else "down"])


# --- the holder and the host's own mounts ------------------------------------------------------

def start_holder(paths: StatePaths, spec: HostSpec) -> int:
    """Start the process that owns the host's namespaces; returns its PID once it is ready.

    `setsid --fork` detaches it from us (it outlives `orch sandbox up` and the test run
    that started it, and is nobody's child but init's). It reports its PID from inside
    the new namespaces, then becomes the renamed `sleep infinity`.
    """
    tag = HOLDER_TAG + spec.name
    log = paths.logs / f"{spec.name}-holder.log"
    argv = ["setsid", "--fork", "nsenter", f"--net={netns_path(spec)}",
            "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "/bin/bash", "-c", HOLDER_SCRIPT, tag]
    with open(log, "wb") as log_file:
        launcher = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=log_file, cwd="/", timeout=10, check=False)
    reported = launcher.stdout.decode(errors="replace").strip()
    if not reported.isdigit():
        raise SandboxError(f"host {spec.name}: could not create its namespaces: "
                           f"{log.read_text(errors='replace').strip() or reported}")
    pid = int(reported)
    # Only a process past unshare(2) may be entered: entering earlier would put the
    # host's mounts into the machine's own mount namespace.
    own_mnt = namespace_inode("self", "mnt")
    if not wait_for(lambda: cmdline(pid)[:1] == [tag]
                    and namespace_inode(pid, "mnt") not in (None, own_mnt), timeout=10):
        raise SandboxError(f"host {spec.name}: its namespaces did not come up within 10 s "
                           f"(see {log})")
    paths.holder_pid_file(spec.name).write_text(f"{pid}\n")
    move_to_cgroup(pid, f"{spec.cgroup}/host")
    return pid


def run_host_setup(paths: StatePaths, spec: HostSpec, holder: int) -> None:
    run(in_host(holder, ["/bin/bash", str(HOST_SETUP), spec.name,
                         str(paths.host_dir(spec.name))]))


def holder_pid(paths: StatePaths, spec_or_name: HostSpec | str) -> int | None:
    """The host's holder, if it runs and is really ours (PIDs get reused)."""
    name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
    pid = read_pid(paths.holder_pid_file(name))
    if not alive(pid) or cmdline(pid)[:1] != [HOLDER_TAG + name]:
        return None
    try:
        if namespace_inode(pid, "net") != os.stat(netns_path(name)).st_ino:
            return None
    except OSError:
        return None
    return pid


# --- sshd ------------------------------------------------------------------------------------

def sshd_config(paths: StatePaths, spec: HostSpec, host_key: str = DEFAULT_HOST_KEY) -> str:
    """Debian's stock sshd_config (as on a Proxmox node), plus only what the sandbox needs.

    Everything not written here keeps OpenSSH's compiled-in default, which is what a real
    node runs: MaxSessions 10 (channels per connection), MaxStartups 10:30:100, no
    PermitUserEnvironment. Never loosen these for a test: orch must live with them.
    """
    return "\n".join([
        f"# written by `orch sandbox up` for sandbox host {spec.name}",
        "# --- as in Debian 12's stock /etc/ssh/sshd_config ---",
        "KbdInteractiveAuthentication no",
        "PrintMotd no",
        "AcceptEnv LANG LC_*",
        "Subsystem sftp internal-sftp",
        "# --- sandbox deviations, each needed by the harness ---",
        "# one sshd per host namespace, with its own key and PID file under the state dir",
        "Port 22",
        f"HostKey {paths.host_key(spec.name, host_key)}",
        f"PidFile {paths.sshd_pid_file(spec.name)}",
        "# the client key is the only way in (no passwords exist in the sandbox)",
        "PermitRootLogin prohibit-password",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "PasswordAuthentication no",
        "# PAM would set up login sessions the host namespaces cannot give",
        "UsePAM no",
        "# the emulated pct and pvesh live in the state dir, not in /usr/sbin",
        f"SetEnv PATH={host_path(paths)}",
        "",
    ])


def write_sshd_config(paths: StatePaths, spec: HostSpec, host_key: str = DEFAULT_HOST_KEY) -> bool:
    """Write the host's sshd_config; True when it changed (sshd must then restart)."""
    return write_if_changed(paths.sshd_config(spec.name), sshd_config(paths, spec, host_key))


def start_sshd(paths: StatePaths, spec: HostSpec, holder: int) -> int:
    pid_file = paths.sshd_pid_file(spec.name)
    pid_file.unlink(missing_ok=True)
    # sshd checks its config, binds port 22, then daemonizes and writes its PID file
    run(in_host(holder, [SSHD, "-f", str(paths.sshd_config(spec.name)),
                         "-E", str(paths.sshd_log(spec.name))]))
    if not wait_for(lambda: read_pid(pid_file) is not None, timeout=10):
        raise SandboxError(f"host {spec.name}: sshd did not write {pid_file}; "
                           f"see {paths.sshd_log(spec.name)}")
    pid = read_pid(pid_file)
    move_to_cgroup(pid, f"{spec.cgroup}/host")
    return pid


def _is_listener(paths: StatePaths, name: str, pid: int | None) -> bool:
    # the listener retitles itself ("sshd: /usr/sbin/sshd -f CONFIG ... [listener] ..."),
    # so its config path is part of one string, not an argv element of its own; the
    # per-connection children's titles ("sshd: root@notty") do not name the config
    return alive(pid) and str(paths.sshd_config(name)) in " ".join(cmdline(pid))


def sshd_listeners(paths: StatePaths, name: str) -> set[int]:
    """Every listening sshd of the host, found without trusting the PID file."""
    return {pid for pid in pids_in_netns(netns_path(name)) if _is_listener(paths, name, pid)}


def sshd_pid(paths: StatePaths, spec_or_name: HostSpec | str) -> int | None:
    name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
    pid = read_pid(paths.sshd_pid_file(name))
    if _is_listener(paths, name, pid):
        return pid
    return min(sshd_listeners(paths, name), default=None)


def stop_sshd(paths: StatePaths, spec: HostSpec) -> None:
    """Stop the listening sshd only: sessions already open carry on, as they do when a
    real host's ssh service restarts (teardown sweeps them with the network namespace)."""
    kill_and_wait(sshd_listeners(paths, spec.name))
    paths.sshd_pid_file(spec.name).unlink(missing_ok=True)


def health(paths: StatePaths, spec: HostSpec) -> HostHealth:
    return HostHealth(netns=netns_path(spec).exists(), holder_pid=holder_pid(paths, spec),
                      sshd_pid=sshd_pid(paths, spec))


# --- teardown ----------------------------------------------------------------------------------

def teardown(paths: StatePaths, name: str) -> None:
    """Remove every trace of host `name`: processes, cgroups, veth, netns, its runtime dir.

    Works from what the machine shows, not only from our records, so that it also cleans
    after a run that was killed half-way (or whose state directory is gone).
    """
    cgroup = f"{CGROUP_ROOT}/{name}"
    suspects = pids_in_netns(netns_path(name)) | pids_in_cgroup_tree(cgroup)
    suspects |= {pid for pid in (holder_pid(paths, name), sshd_pid(paths, name)) if pid}
    survivors = kill_and_wait(descendants(suspects))
    if survivors:
        raise SandboxError(f"host {name}: processes {sorted(survivors)} did not die")
    leftovers = remove_cgroup_tree(cgroup)
    if leftovers:
        raise SandboxError(f"host {name}: could not remove cgroups {leftovers}")
    run(["ip", "link", "del", "dev", f"orch-{name}"], check=False)
    if netns_path(name).exists():
        run(["ip", "netns", "del", f"orch-{name}"])
    remove_tree(paths.host_dir(name))


def remove_tree(directory: Path) -> None:
    """rm -rf, but never through a mount point (a bind of the machine's /usr, say)."""
    if not directory.exists():
        return
    mounted = mounts_below(directory)
    if mounted:
        raise SandboxError(f"refusing to delete {directory}: still mounted there: "
                           + ", ".join(mounted))
    shutil.rmtree(directory)
