"""Warm fleets: the inventory and its open SSH connections, lent to one command at a time
and kept between commands while nothing they rest on changes (docs/guide/agent.md)."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Optional

from orchestrator.agentd.requests import Request
from orchestrator.config.inventory import inventory_path
from orchestrator.ground import invocation
from orchestrator.ground.invocation import Invocation
from orchestrator.ground.errors import OrchError
from orchestrator.targets.fleet import SSH_CONFIG, Fleet
from orchestrator.remote.session import SessionPool

def _file_stamp(path: str):
    """A file as the direct path would read it: its content's hash. Size, mtime and inode
    are not enough: `cp -p` of an edited copy keeps all three. These files are small (an
    inventory, ssh_config, known_hosts, keys): hashing them costs microseconds a command."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


class _Pooled:
    def __init__(self, key, fleet: Fleet, stamp):
        self.key, self.fleet, self.stamp = key, fleet, stamp
        self.leases = 0
        self.retired = False
        self.last_used = time.time()


class LentFleet:
    """A warm fleet as one command sees it: closing it closes only that command's channels
    (each_concurrently closes the fleet on Ctrl-C; others share the connections)."""

    def __init__(self, pooled: _Pooled, command: Invocation):
        self._pooled = pooled
        self._command = command

    def close(self) -> None:
        self._command.interrupt.close_filed()

    def __getattr__(self, name):
        return getattr(self._pooled.fleet, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FleetPool:
    """Fleets kept open between commands, one per (inventory file, trust flag, HOME,
    SSH_AUTH_SOCK, and the caller's folder where a host's key or known_hosts path is
    relative); one whose inventory, ssh_config, known_hosts or identity files changed is
    retired (closed once no command uses it) and the next command opens a new one."""

    def __init__(self):
        self._pooled: dict[tuple, _Pooled] = {}
        self._lock = threading.Lock()
        self._opening = threading.Lock()
        self._per_folder: set[tuple] = set()   # keys whose inventory has relative paths
        self._lent: dict[int, list[_Pooled]] = {}   # id of a running command's invocation

    def lend(self, command: Invocation, inventory_option: Optional[str],
             trust_on_first_use: bool) -> LentFleet:
        """A warm fleet for the command (its environment and folder choose which)."""
        # the inventory's path is the client's (its environment, relative to its folder)
        path = command.path(inventory_path(inventory_option))
        key = (path, trust_on_first_use, command.env.get("HOME"), command.env.get("SSH_AUTH_SOCK"))
        with self._opening:   # one fleet per key, when two requests ask at once
            if key in self._per_folder:
                key += (command.cwd,)
            pooled = self._usable(key)
            if pooled is None:
                fleet = Fleet.from_path(inventory_option, trust_on_first_use=trust_on_first_use,
                                        sessions=SessionPool(), cwd=command.cwd)
                stamp = _stamp(fleet, path)   # resolves every host's paths
                if fleet.depends_on_cwd and len(key) == 4:
                    # relative key or known_hosts paths: one fleet per caller's folder
                    self._per_folder.add(key)
                    key += (command.cwd,)
                pooled = _Pooled(key, fleet, stamp)
                with self._lock:
                    self._pooled[key] = pooled
            with self._lock:
                pooled.leases += 1
                pooled.last_used = time.time()
                self._lent.setdefault(id(command), []).append(pooled)
        # the cluster cache lives for one command, as on the direct path (a container may
        # have moved to another node since the last command)
        pooled.fleet.forget_clusters()
        return LentFleet(pooled, command)

    def _usable(self, key) -> Optional[_Pooled]:
        with self._lock:
            pooled = self._pooled.get(key)
        if pooled is None:
            return None
        if _stamp(pooled.fleet, key[0]) == pooled.stamp:
            return pooled
        self._retire(pooled)
        return None

    def _retire(self, pooled: _Pooled) -> None:
        with self._lock:
            if self._pooled.get(pooled.key) is pooled:
                del self._pooled[pooled.key]
            pooled.retired = True
            close = pooled.leases == 0
        if close:
            pooled.fleet.close()

    def give_back(self, request: Request) -> None:
        """The fleets lent to the request's command, once it ended."""
        with self._lock:
            lent = self._lent.pop(id(request.invocation), []) if request.invocation else []
        for pooled in lent:
            with self._lock:
                pooled.leases -= 1
                pooled.last_used = time.time()
                close = pooled.retired and pooled.leases == 0
            if close:
                pooled.fleet.close()

    def close_all(self) -> None:
        with self._lock:
            pooled = list(self._pooled.values())
            self._pooled.clear()
        for entry in pooled:
            entry.fleet.close()

    def describe(self) -> list[dict]:
        with self._lock:
            pooled = list(self._pooled.values())
        return [{"inventory": p.key[0], "trust_new_host_keys": p.key[1], "commands_running": p.leases,
                 "idle_s": round(time.time() - p.last_used, 1), "hosts": p.fleet.open_hosts(),
                 "sessions": p.fleet.sessions.describe()}
                for p in pooled]


def _stamp(fleet: Fleet, inventory_file: str) -> tuple:
    """What the direct path reads to open the fleet's connections, as (file, content hash):
    the inventory, ~/.ssh/config, each host's known_hosts and identity files."""
    files = [inventory_file, invocation.current().expanduser(SSH_CONFIG)]
    for spec in fleet.inventory.hosts.values():
        if not spec.kind.over_ssh:
            continue
        try:
            settings = fleet.ssh_settings(spec)
        except OrchError:
            continue
        while settings is not None:
            files.append(settings.local_path(settings.known_hosts))
            files.extend(settings.local_path(p) for p in settings.identity)
            settings = settings.jump
    return tuple((f, _file_stamp(f)) for f in files)
