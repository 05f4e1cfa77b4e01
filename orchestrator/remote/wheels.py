"""Wheels carried from the controller into a target: pushed by sha256 into a wheelhouse
folder there (the bootstrap step's, and `orch stacks`' pystack), and, for a wheel with a
native extension, the check that it fits the target's python before anything is pushed.

The tags are packaging's (the library pip vendors): a wheel's file name says which
interpreters, ABIs and platforms it is for (`pystack-1.7.2-cp311-cp311-manylinux_2_17_x86_64
.whl`), and the target's python is described by the bootstrap payload's `platform` action
(implementation, version, machine, C library and its version), from which the tags that
python accepts are built the way pip builds them for itself.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from orchestrator.ground.errors import OrchError
from orchestrator.remote import payload_api, transfer
from orchestrator.remote.container import Target

if TYPE_CHECKING:  # pragma: no cover
    from packaging.tags import Tag

# manylinux's first names, and the glibc each stands for (PEP 600's aliases)
_LEGACY_MANYLINUX = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}


@dataclass(frozen=True)
class Platform:
    """A target's python, as the bootstrap payload's `platform` action reports it."""
    implementation: str        # "cpython"
    version: tuple[int, int]   # (3, 11)
    machine: str               # "x86_64", "aarch64"
    libc: str                  # "glibc", "musl" or "" (unknown)
    libc_version: tuple[int, int] = (0, 0)

    @classmethod
    def from_facts(cls, facts: dict) -> "Platform":
        def pair(value) -> tuple[int, int]:
            parts = [int(p) for p in str(value or "0.0").split(".")[:2] if p.isdigit()]
            return (parts + [0, 0])[0], (parts + [0, 0])[1]
        return cls(str(facts.get("implementation", "")), pair(facts.get("python")),
                   str(facts.get("machine", "")), str(facts.get("libc", "")),
                   pair(facts.get("libc_version")))

    def describe(self) -> str:
        libc = f", {self.libc} {self.libc_version[0]}.{self.libc_version[1]}" if self.libc else ""
        return f"{self.implementation} {self.version[0]}.{self.version[1]}, {self.machine}{libc}"

    def platforms(self) -> list[str]:
        """The platform tags this python accepts, best first (as pip lists them)."""
        arch = self.machine
        major, minor = self.libc_version
        tags = []
        if self.libc == "glibc" and major == 2:
            for glibc_minor in range(minor, 4, -1):
                tags.append(f"manylinux_2_{glibc_minor}_{arch}")
                legacy = _LEGACY_MANYLINUX.get((2, glibc_minor))
                if legacy:
                    tags.append(f"{legacy}_{arch}")
        elif self.libc == "musl" and major == 1:
            tags += [f"musllinux_1_{m}_{arch}" for m in range(minor, -1, -1)]
        return tags + [f"linux_{arch}"]

    def tags(self) -> set[Tag]:
        # packaging only when a wheel is matched: a torch venv running `orch stacks` from the
        # source tree (scripts/stacks_of_pid.py) may lack it
        from packaging.tags import compatible_tags, cpython_tags
        if self.implementation != "cpython":
            return set()       # a native CPython extension does not load elsewhere
        abis = [f"cp{self.version[0]}{self.version[1]}"]
        return set(cpython_tags(self.version, abis, self.platforms())) | set(
            compatible_tags(self.version, f"cp{self.version[0]}{self.version[1]}", self.platforms()))


def fitting_wheel(folder: str, project: str, platform: Platform) -> tuple[Optional[str], list[str]]:
    """The newest wheel of PROJECT in FOLDER that PLATFORM's python can load, and a line for
    each wheel of it that does not fit (what it is for), for the error when none does."""
    # packaging only here, as in Platform.tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    accepted = platform.tags()
    fits, misfits = [], []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".whl"):
            continue
        try:
            found, version, _build, tags = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        if found != project:
            continue
        if tags & accepted:
            fits.append((version, name))
        else:
            misfits.append(f"{name} is for {', '.join(sorted(str(t) for t in tags))}")
    if not fits:
        return None, misfits
    return os.path.join(folder, max(fits)[1]), misfits


def push_wheels(target: Target, local_dir: str, names: list[str], remote_dir: str,
                progress: Callable[[str], None], timeout: Callable[[float], float]) -> dict:
    """Push the wheels the target lacks into REMOTE_DIR (by sha256: a file of the same size
    proves nothing); returns {name: sha256} of them all, which the payload that reads them
    checks again first. timeout(seconds): the time one transfer may take, within the
    caller's own limit."""
    digests = {name: file_sha256(os.path.join(local_dir, name)) for name in names}
    sizes = {name: os.path.getsize(os.path.join(local_dir, name)) for name in names}
    present = payload_api.bootstrap(target, "list", timeout=timeout(600), dir=remote_dir,
                                    sizes=sizes).get("files", {})
    missing = [name for name in names if (present.get(name) or {}).get("sha256") != digests[name]]
    if not missing:
        progress(f"all {len(names)} wheels already in {remote_dir}")
        return digests
    for number, name in enumerate(missing, 1):
        size = sizes[name]
        progress(f"pushing wheel {number}/{len(missing)}: {name} ({size / 1e6:.1f} MB)")
        try:   # streamed and sha256-checked as orch cp sends (no wheel held in memory)
            transfer.push(target, os.path.join(local_dir, name), f"{remote_dir}/{name}",
                          timeout=timeout(120 + size / 5e6))
        except OrchError as error:
            raise OrchError(f"pushing {name} to {target.name} failed: {error}") from None
    return digests


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
