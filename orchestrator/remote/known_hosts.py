"""known_hosts read and written as OpenSSH does, where paramiko's own reader falls short
(docs/design/security.md, "The controller"):

- `@revoked` lines: the key is refused for every host, even where another line lists it;
- `@cert-authority` lines: skipped (paramiko cannot check host certificates); a host known
  only through one is unknown, and the message says why;
- a line paramiko cannot parse (bad base64, a marker it does not know) is skipped, as
  OpenSSH skips it, instead of ending orch with a traceback;
- trust on first use writes the new line hashed when the file's lines are hashed or
  ~/.ssh/config says HashKnownHosts yes, and refuses to "record" into /dev/null or anything
  but a regular file: such a known_hosts knows no host, so an unknown key stays refused.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from orchestrator.remote.paramiko_lib import paramiko

HASHED_PREFIX = "|1|"


class UnknownKey(Exception):
    def __init__(self, hostname, key, why: str = ""):
        super().__init__(hostname)
        self.hostname, self.key, self.why = hostname, key, why


class RevokedKey(Exception):
    def __init__(self, hostname, key):
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


class KnownHosts:
    """One known_hosts file as read: its keys per host name, the revoked keys, how it is written."""

    def __init__(self, path: str, hash_new: bool = False):
        self.path = path
        self.entries: list = []          # paramiko HostKeyEntry, revoked keys left out
        self.revoked: set[bytes] = set()
        self.cert_authorities = 0
        self.hashed = hash_new           # ssh_config's HashKnownHosts, or the file's own lines
        if os.path.exists(path):
            self._read()

    def _read(self) -> None:
        entries = []
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                marker = None
                if line.startswith("@"):
                    marker, _, line = line.partition(" ")
                    line = line.strip()
                entry = _parse(line, number)
                if marker == "@revoked" and entry is not None:
                    self.revoked.add(entry.key.asbytes())
                elif marker == "@cert-authority":
                    self.cert_authorities += 1
                elif marker is None and entry is not None:
                    entries.append(entry)
                    self.hashed = self.hashed or entry.hostnames[0].startswith(HASHED_PREFIX)
        self.entries = [e for e in entries if e.key.asbytes() not in self.revoked]

    def install(self, client: paramiko.SSHClient, trust_on_first_use: bool) -> None:
        """Give client these keys and the policy for a host it does not find here."""
        keys = client.get_host_keys()
        # paramiko's public add(): a second line with the same name and key type replaces
        # the first (OpenSSH would take either); a refusal, never a wrong acceptance
        for entry in self.entries:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
        client.set_missing_host_key_policy(_Missing(self, trust_on_first_use))

    def is_revoked(self, key) -> bool:
        return key.asbytes() in self.revoked

    def record(self, hostname: str, key) -> None:
        """Trust on first use: append the key, hashed if the file's lines are (or HashKnownHosts)."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            info = None
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise UnknownKey(hostname, key, f"{self.path} is not a regular file, so orch cannot "
                                            "record a key in it: with it no host is known")
        name = paramiko.HostKeys.hash_host(hostname) if self.hashed else hostname
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="ascii") as handle:
            handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")

    def unknown_hint(self) -> Optional[str]:
        if self.cert_authorities:
            return (f"{self.path} has @cert-authority lines, which orch does not use (paramiko "
                    "cannot check host certificates): add the host's own key")
        return None


class _Missing(paramiko.MissingHostKeyPolicy):
    """For a host known_hosts has no line for: refuse, or (asked for explicitly) record it."""

    def __init__(self, known: KnownHosts, trust_on_first_use: bool):
        self.known, self.trust_on_first_use = known, trust_on_first_use

    def missing_host_key(self, client, hostname, key):
        if self.known.is_revoked(key):
            raise RevokedKey(hostname, key)
        if not self.trust_on_first_use:
            raise UnknownKey(hostname, key)
        self.known.record(hostname, key)


def _parse(line: str, number: int):
    """One host line as paramiko reads it; None where it cannot (OpenSSH skips such lines)."""
    try:
        return paramiko.hostkeys.HostKeyEntry.from_line(line, number)
    except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError):
        return None
