"""Can the sandbox run on this machine? If not, say exactly what is missing and how to fix it.

Checked without side effects and in a few milliseconds, so that `orch sandbox status` and
the test fixture can ask every time.
"""

from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from orchestrator.ground.errors import ExitCode, OrchError

from .paths import StatePaths, shadowing_mount

# Debian package names; .ci/apt-packages.txt lists the same set.
REQUIRED_COMMANDS = {
    "lxc-start": "lxc", "lxc-attach": "lxc", "lxc-stop": "lxc", "lxc-info": "lxc",
    "sshd": "openssh-server", "ssh-keygen": "openssh-client", "ssh": "openssh-client",
    "ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux",
}
RECOMMENDED_COMMANDS = {"rg": "ripgrep", "nft": "nftables", "mmdebstrap": "mmdebstrap"}
LXC_INIT = "/usr/sbin/init.lxc.static"
SYSTEM_PYTHON = "/usr/bin/python3"
SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


@dataclass(frozen=True)
class Missing:
    what: str          # a sentence: what is missing and why it matters
    package: str | None = None   # the apt package that provides it, if one does

    def __str__(self) -> str:
        if self.package:
            return f"{self.what}: apt-get install -y {self.package}"
        return self.what


class SandboxUnavailable(OrchError):
    """The sandbox cannot run here; the message lists what is missing and the fix."""

    exit_code = ExitCode.USAGE

    def __init__(self, missing: list[Missing]):
        self.missing = missing
        super().__init__(describe(missing))


def describe(missing: list[Missing]) -> str:
    lines = ["orch sandbox cannot run on this machine:"]
    lines += [f"  - {item}" for item in missing]
    packages = sorted({item.package for item in missing if item.package})
    if packages:
        lines.append(f"Fix: apt-get update && apt-get install -y {' '.join(packages)}")
    return "\n".join(lines)


def find_command(name: str) -> str | None:
    """shutil.which, also looking in the sbin directories a non-root PATH may lack."""
    found = shutil.which(name)
    if found:
        return found
    for directory in SBIN_DIRS:
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def missing_prerequisites(paths: StatePaths | None = None) -> list[Missing]:
    """Everything that keeps the sandbox (state directory `paths`, default: the one
    ORCH_SANDBOX_DIR or /var/lib/orch-sandbox names) from running here."""
    paths = paths or StatePaths.at()
    missing: list[Missing] = []
    if os.geteuid() != 0:
        missing.append(Missing("not running as root (network namespaces, mounts and "
                               "privileged LXC containers need it): run it with sudo"))
    for command, package in REQUIRED_COMMANDS.items():
        if not find_command(command):
            missing.append(Missing(f"{command} not found", package))
    if not os.path.exists(LXC_INIT):
        missing.append(Missing(f"{LXC_INIT} not found (the containers' init)", "lxc"))
    missing += _python_problems()
    missing += _kernel_problems()
    missing += _state_dir_problems(paths)
    return _deduplicate(missing)


def recommended_missing() -> list[Missing]:
    """Not needed by the sandbox itself, but by what runs in it (grep steps, fault tests,
    real-root containers)."""
    return [Missing(f"{command} not found", package)
            for command, package in RECOMMENDED_COMMANDS.items() if not find_command(command)]


def require(paths: StatePaths | None = None) -> None:
    missing = missing_prerequisites(paths)
    if missing:
        raise SandboxUnavailable(missing)


def _python_problems() -> list[Missing]:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return [Missing(f"{SYSTEM_PYTHON} not found (the emulated pct/pvesh and the "
                        "containers' python)", "python3")]
    # Debian splits venv/ensurepip off; orch builds the containers' venvs with it.
    if not glob.glob("/usr/lib/python3*/venv/__init__.py") or not (
            glob.glob("/usr/share/python-wheels/pip-*.whl")
            or glob.glob("/usr/lib/python3*/ensurepip/_bundled/pip-*.whl")):
        return [Missing("python3 venv support with pip not found (containers build "
                        "their venvs with python3 -m venv)", "python3-venv")]
    return []


def _kernel_problems() -> list[Missing]:
    problems = []
    if not os.path.exists("/proc/self/ns/net") or not os.path.exists("/proc/self/ns/mnt"):
        problems.append(Missing("the kernel lacks network or mount namespaces "
                                "(CONFIG_NET_NS, CONFIG_NAMESPACES)"))
    if not _cgroup_mounted():
        problems.append(Missing("no cgroup filesystem is mounted under /sys/fs/cgroup (LXC "
                                "needs one): mount cgroup2 there, or install cgroupfs-mount",
                                "cgroupfs-mount"))
    return problems


def _cgroup_mounted() -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return False
    return any(line.split()[2] in ("cgroup", "cgroup2") and
               line.split()[1].startswith("/sys/fs/cgroup")
               for line in mounts.splitlines() if len(line.split()) > 2)


def _state_dir_problems(paths: StatePaths) -> list[Missing]:
    shadowed = shadowing_mount(paths.root)
    if shadowed:
        return [Missing(f"the state directory {paths.root} is below {shadowed}, which every "
                        "sandbox host replaces with a private mount: choose another "
                        "ORCH_SANDBOX_DIR (default /var/lib/orch-sandbox)")]
    return []


def _deduplicate(items: list[Missing]) -> list[Missing]:
    seen, unique = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            unique.append(item)
    return unique
