"""A running sandbox as tests see it: where its files are, and the faults they can cause.

    sb = orch_sandbox.up()                    # or orch_sandbox.current()
    sb.inventory_path                         # STATE/inventory.yaml
    sb.run_on_host("sb1", ["pct", "list"])    # a command on the host itself, no SSH
    sb.link_down("sb1"); ...; sb.link_up("sb1")
    sb.block_container_port("sb2", 200, 29500)  # other hosts' CTs cannot reach it
    sb.stop_container("sb1", 201); sb.start_container("sb1", 201)
    sb.set_knob("sb1", "perl-warning", "perl: warning: ...\n")   # the emulation's switches
    sb.set_hookscript("sb1", 202, "#!/bin/sh\nexit 1\n")       # a pre-start that fails
    sb.api_url("sb1"), sb.api_token_id, sb.api_token_secret()  # the HTTPS API on 8006
    with sb.changed_host_key("sb2"): ...      # the host presents a key known_hosts lacks
"""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import access, api, containers, faults, hosts
from .layout import HostSpec, Layout
from .paths import StatePaths
from .system import SandboxError, in_host


def _from_paths(name: str) -> property:
    """A Sandbox property that is one of its StatePaths (under the name the tests know it by)."""
    return property(lambda self: getattr(self.paths, name), doc=f"StatePaths.{name}")


@dataclass(frozen=True)
class Sandbox:
    paths: StatePaths
    layout: Layout

    # --- where things are -----------------------------------------------------------------

    state_dir = _from_paths("root")
    inventory_path = _from_paths("inventory")
    ssh_config = _from_paths("ssh_config")
    known_hosts = _from_paths("known_hosts")
    identity = _from_paths("client_key")

    @property
    def host_names(self) -> list[str]:
        return [spec.name for spec in self.layout.hosts]

    def host(self, name: str) -> HostSpec:
        return self.layout.host(name)

    def address(self, host: str) -> str:
        return self.host(host).address

    def iface(self, host: str) -> str:
        return self.host(host).iface

    def targets(self, running: bool | None = None) -> list[str]:
        """Inventory names (HOST-VMID) of the containers, optionally only running/stopped."""
        return [f"{spec.name}-{ct.vmid}" for spec in self.layout.hosts for ct in spec.containers
                if running is None or ct.running == running]

    def ssh_argv(self, host: str, *remote: str) -> list[str]:
        """Plain OpenSSH to a host (the "manual way"): the remote words go through the
        host's shell, as they would with any ssh."""
        return ["ssh", "-F", str(self.ssh_config), host, *remote]

    # --- commands on a host, without SSH ----------------------------------------------------

    def holder(self, host: str) -> int:
        pid = hosts.holder_pid(self.paths, self.host(host))
        if pid is None:
            raise SandboxError(f"sandbox host {host} is not running: orch sandbox up")
        return pid

    def run_on_host(self, host: str, argv: list[str], *, input: bytes | None = None,
                    timeout: float = 60.0, check: bool = False) -> subprocess.CompletedProcess:
        """Run argv inside the host's namespaces (as its sshd would, minus SSH)."""
        env = {"PATH": hosts.host_path(self.paths), "HOME": "/root", "LANG": "C.UTF-8",
               "USER": "root", "LOGNAME": "root"}
        return subprocess.run(in_host(self.holder(host), argv), input=input,
                              capture_output=True, timeout=timeout, check=check, env=env,
                              cwd="/")

    def pct(self, host: str, *args: str, input: bytes | None = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess:
        return self.run_on_host(host, ["pct", *args], input=input, timeout=timeout)

    # --- containers ---------------------------------------------------------------------------

    def container_running(self, host: str, vmid: int) -> bool:
        return vmid in containers.running_vmids(self.holder(host))

    def stop_container(self, host: str, vmid: int) -> None:
        self.host(host).container(vmid)
        if self.container_running(host, vmid):
            containers.stop(self.holder(host), vmid)

    def start_container(self, host: str, vmid: int) -> None:
        self.host(host).container(vmid)
        if not self.container_running(host, vmid):
            containers.start(self.holder(host), vmid)

    # --- network ----------------------------------------------------------------------------

    def link_down(self, host: str) -> None:
        """Cut the host off (its veth down): connections hang until the link is back."""
        hosts.set_link(self.host(host), up=False)

    def link_up(self, host: str) -> None:
        hosts.set_link(self.host(host), up=True)

    def link_is_up(self, host: str) -> bool:
        return hosts.link_is_up(self.host(host))

    def block_ssh(self, host: str, mode: str = "drop", percent: int = 30) -> None:
        """Firewall the host's port 22: "drop" (connect times out), "reject" (refused at
        once) or "loss" (percent % of packets dropped). Needs nftables."""
        faults.block_ssh(self.holder(host), mode, percent)

    def unblock_ssh(self, host: str) -> None:
        faults.clear_firewall(self.holder(host))

    def block_container_port(self, host: str, vmid: int, port: int) -> None:
        """Containers on other hosts can no longer reach TCP `port` of CT vmid (dropped on
        its host's bridge); `clear_firewall` or `up` clears it."""
        faults.block_container_port(self.holder(host), self.host(host).container(vmid).address,
                                    port)

    def clear_firewall(self, host: str) -> None:
        """Every fault rule of the host's firewall gone (block_ssh's, block_container_port's)."""
        faults.clear_firewall(self.holder(host))

    # --- sshd and its host key --------------------------------------------------------------

    def stop_sshd(self, host: str) -> None:
        """New connections are refused; sessions already open carry on (as on a real host)."""
        hosts.stop_sshd(self.paths, self.host(host))

    def start_sshd(self, host: str) -> None:
        spec = self.host(host)
        if hosts.sshd_pid(self.paths, spec) is None:
            hosts.start_sshd(self.paths, spec, self.holder(host))

    def regenerate_host_key(self, host: str) -> str:
        """Restart the host's sshd with a brand-new host key that known_hosts does not have
        (a reinstalled host, or a man in the middle). Returns the new public key.
        `restore_host_key` or the next `up` puts the original key back."""
        spec = self.host(host)
        key = self.paths.host_key(host, hosts.CHANGED_HOST_KEY)
        key.unlink(missing_ok=True)
        key.with_name(key.name + ".pub").unlink(missing_ok=True)
        access.ensure_key(key, f"orch-sandbox-{host}-changed")
        self._restart_sshd(spec, hosts.CHANGED_HOST_KEY)
        return access.public_key(key)

    def restore_host_key(self, host: str) -> None:
        self._restart_sshd(self.host(host), hosts.DEFAULT_HOST_KEY)

    @contextmanager
    def changed_host_key(self, host: str):
        new_key = self.regenerate_host_key(host)
        try:
            yield new_key
        finally:
            self.restore_host_key(host)

    def _restart_sshd(self, spec: HostSpec, host_key: str) -> None:
        hosts.write_sshd_config(self.paths, spec, host_key)
        hosts.stop_sshd(self.paths, spec)
        hosts.start_sshd(self.paths, spec, self.holder(spec.name))


    # --- the emulation's knobs, hookscripts and the HTTPS API ------------------------------

    def pve_dir(self, host: str) -> Path:
        """The host's /etc/pve as seen from the machine."""
        return self.paths.host_dir(host) / "pve"

    def set_knob(self, host: str, name: str, text: str | None) -> None:
        """Set (or with None clear) a switch of the emulated pct/pvesh/pveproxy on host
        (pvelib.knob): `perl-warning` (printed on stderr by every pct and pvesh, as Perl
        does when the client's locale is missing on the host) and
        `auth-failure-delay` (seconds before a 401). `up` clears them all."""
        knob = self.pve_dir(host) / "nodes" / host / ".orch-sandbox" / name
        if text is None:
            knob.unlink(missing_ok=True)
            return
        knob.parent.mkdir(parents=True, exist_ok=True)
        knob.write_text(text)

    def set_hookscript(self, host: str, vmid: int, script: str | None,
                       name: str = "orch-test-hook") -> None:
        """Give CT vmid a hookscript (local:snippets/NAME) with this text, or none.
        `up` rewrites the container's config without it."""
        config = containers.pve_config_file(self.paths, self.host(host), vmid)
        lines = [line for line in config.read_text().splitlines()
                 if not line.startswith("hookscript:")]
        if script is not None:
            snippet = self.paths.host_dir(host) / "vz" / "snippets" / name
            snippet.write_text(script)
            snippet.chmod(0o755)
            lines.append(f"hookscript: local:snippets/{name}")
        config.write_text("\n".join(lines) + "\n")

    def api_url(self, host: str) -> str:
        return api.url(self.host(host))

    @property
    def api_token_id(self) -> str:
        return api.TOKEN_ID

    def api_token_secret(self) -> str:
        return api.token_secret(self.paths)

    def api_ca_file(self, host: str) -> Path:
        """The cluster CA that signed the host's certificate (/etc/pve/pve-root-ca.pem)."""
        return self.pve_dir(host) / "pve-root-ca.pem"

    def api_fingerprint(self, host: str) -> str:
        return api.fingerprint(self.paths, self.host(host), self.pve_dir(host))


def current(state_dir: Path | str | None = None) -> Sandbox:
    """The sandbox that `up` built in state_dir, without changing anything."""
    paths = StatePaths.at(state_dir)
    layout = Layout.load(paths.layout_file)
    if layout is None:
        raise SandboxError(f"no sandbox in {paths.root}: run `orch sandbox up`")
    return Sandbox(paths, layout)
