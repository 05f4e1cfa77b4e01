"""Where the sandbox keeps its files (the state directory) and what lives there.

    STATE/                          /var/lib/orch-sandbox, or $ORCH_SANDBOX_DIR
      id_ed25519, id_ed25519.pub    client key for root@every host      (kept by down)
      keys/HOST/ssh_host_ed25519_key[.pub]   each host's SSH host key   (kept by down)
      logs/                         sshd and LXC logs of the last up     (kept by down)
      inventory.yaml                orch inventory of the sandbox        (written by up)
      known_hosts                   host keys, keyed as paramiko looks them up
      ssh_config                    for plain OpenSSH: ssh -F STATE/ssh_config sb1 ...
      layout.json                   what up built: hosts, containers, PIDs
      bin/                          the emulated pct and pvesh (copied at each up)
      hosts/HOST/                   runtime of one host: its HOME, /var/lib/lxc, /etc/pve
      roots/DISTRO-HASH/            an unpacked real root (up --real-root; roots.py), the
                                    lower layer of those containers' overlays
      .lock                         serialises up and down
`down` removes everything but the keys and logs; `down --purge` removes STATE itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = Path("/var/lib/orch-sandbox")
STATE_DIR_ENV = "ORCH_SANDBOX_DIR"

# Inside a host these paths are replaced by private mounts, so a state directory below
# one of them would be invisible to the host's sshd and LXC.
SHADOWED_IN_HOSTS = ("/root", "/etc", "/var/lib/lxc", "/run/lxc", "/sys", "/proc", "/dev")


def default_state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def shadowing_mount(path: Path) -> str | None:
    """The host-private mount that would hide `path` inside a sandbox host, if any."""
    resolved = str(path.resolve())
    for shadowed in SHADOWED_IN_HOSTS:
        if resolved == shadowed or resolved.startswith(shadowed + "/"):
            return shadowed
    return None


def _in_state_dir(name: str) -> property:
    """A StatePaths property for one entry of the layout above: STATE/name."""
    return property(lambda self: self.root / name, doc=f"STATE/{name}")


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @classmethod
    def at(cls, root: Path | str | None = None) -> "StatePaths":
        return cls(Path(root) if root else default_state_dir())

    client_key = _in_state_dir("id_ed25519")
    known_hosts = _in_state_dir("known_hosts")
    ssh_config = _in_state_dir("ssh_config")
    inventory = _in_state_dir("inventory.yaml")
    layout_file = _in_state_dir("layout.json")
    lock_file = _in_state_dir(".lock")
    bin_dir = _in_state_dir("bin")
    logs = _in_state_dir("logs")
    hosts_dir = _in_state_dir("hosts")

    def host_dir(self, host: str) -> Path:
        return self.hosts_dir / host

    def host_key(self, host: str, variant: str = "ssh_host_ed25519_key") -> Path:
        return self.root / "keys" / host / variant

    def sshd_config(self, host: str) -> Path:
        return self.host_dir(host) / "sshd_config"

    def sshd_pid_file(self, host: str) -> Path:
        return self.host_dir(host) / "sshd.pid"

    def holder_pid_file(self, host: str) -> Path:
        return self.host_dir(host) / "holder.pid"

    def sshd_log(self, host: str) -> Path:
        return self.logs / f"{host}-sshd.log"

    def lxc_log(self, host: str, vmid: int) -> Path:
        return self.logs / f"{host}-ct{vmid}.log"
