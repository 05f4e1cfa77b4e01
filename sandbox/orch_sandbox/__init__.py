"""The Proxmox-like sandbox: N hosts on this machine, each a network namespace with a real
OpenSSH sshd and real LXC containers, plus emulated `pct` and `pvesh` on its PATH.

It is the test bed of orch's integration tests, and a place to try playbooks before a real
Proxmox host. It is a distribution of its own (sandbox/ in orch's repository, installed
with `pip install -e ./sandbox`), never part of the orch wheel; `orch sandbox ...` uses it
when it is installed. docs/design/sandbox.md has the facts and measurements behind each choice, and
paths.py the state directory's layout.

    import orch_sandbox as sandbox
    sb = sandbox.up()                  # 2 hosts (sb1, sb2), CTs 200, 201 running, 202 stopped
    sandbox.up(real_root=(201,))       # CT 201 on a real Debian 12 root of its own (roots.py)
    sb.inventory_path                  # /var/lib/orch-sandbox/inventory.yaml
    sandbox.link_down("sb1")           # helpers also work on the current sandbox by name
    sandbox.down()                     # nothing left behind but the keys and logs
"""

from __future__ import annotations

from pathlib import Path

from . import roots  # `orch sandbox build-root` builds and caches real container roots
from .core import down, install_tools, status, up, wait_until_reachable
from .handle import Sandbox, current
from .layout import ContainerSpec, HostSpec, Layout, LayoutError, build_layout
from .paths import DEFAULT_STATE_DIR, STATE_DIR_ENV, StatePaths
from .prereqs import (Missing, SandboxUnavailable, describe, missing_prerequisites,
                      recommended_missing, require)
from .system import SandboxError

__all__ = [
    "up", "down", "status", "current", "Sandbox", "SandboxError", "SandboxUnavailable",
    "Missing", "missing_prerequisites", "recommended_missing", "describe", "require",
    "Layout", "HostSpec", "ContainerSpec", "LayoutError", "build_layout", "StatePaths",
    "DEFAULT_STATE_DIR", "STATE_DIR_ENV", "install_tools", "wait_until_reachable",
    "link_down", "link_up", "run_on_host", "stop_container", "start_container",
    "regenerate_host_key", "restore_host_key", "roots",
]


# Module-level helpers for tests: the same as the Sandbox methods, on the current sandbox.

def link_down(host: str, state_dir: Path | str | None = None) -> None:
    current(state_dir).link_down(host)


def link_up(host: str, state_dir: Path | str | None = None) -> None:
    current(state_dir).link_up(host)


def run_on_host(host: str, argv: list[str], state_dir: Path | str | None = None, **kwargs):
    return current(state_dir).run_on_host(host, argv, **kwargs)


def stop_container(host: str, vmid: int, state_dir: Path | str | None = None) -> None:
    current(state_dir).stop_container(host, vmid)


def start_container(host: str, vmid: int, state_dir: Path | str | None = None) -> None:
    current(state_dir).start_container(host, vmid)


def regenerate_host_key(host: str, state_dir: Path | str | None = None) -> str:
    return current(state_dir).regenerate_host_key(host)


def restore_host_key(host: str, state_dir: Path | str | None = None) -> None:
    current(state_dir).restore_host_key(host)
