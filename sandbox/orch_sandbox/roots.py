"""Real distribution roots for sandbox containers: their own /usr and /etc, systemd as PID 1.

Most sandbox containers bind-mount the machine's /usr and /etc (fast, zero disk), so each
one has whatever the machine has: python3-venv, ripgrep, pip. A container made from a
Proxmox template has its own root and little in it. A "real root" container is that:

    ~/.cache/orch/sandbox-roots/debian-12-HASH.tar   mmdebstrap's output, built once (~25 s)
    STATE/roots/debian-12-HASH/                       the tarball unpacked (~6 s per `up`)
    hosts/HOST/lxc/VMID/delta/                        the container's own changes (overlay)

The root is built by mmdebstrap from this machine's own apt sources (nothing here names a
mirror): Debian 12, variant minbase, python3 and systemd-sysv and nothing else (no
python3-venv, no pip, no ripgrep, no network tools). Debian 11 (bullseye: glibc 2.31,
Python 3.9, what an older fleet runs) the same way, from the same mirrors: when the
machine's sources carry another release only, its suites are renamed for this one
(bookworm, bookworm-updates, bookworm-security -> bullseye, ...) in copies of them. Its /etc/hostname is removed, or every
container would call itself by the build machine's name. The container has no network
device but loopback: nothing in it can reach a package source or the internet.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .hosts import remove_tree
from .paths import StatePaths
from .prereqs import find_command
from .system import SandboxError, run

HOST_ROOT = "host"               # a container sharing the machine's /usr and /etc
DEFAULT_DISTRIBUTION = "debian-12"
CACHE_ENV = "ORCH_ROOT_CACHE"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
BUILD_TIMEOUT = 900.0
UNPACKED_MARK = ".orch-unpacked"


@dataclass(frozen=True)
class Recipe:
    """How mmdebstrap builds one distribution's root."""
    name: str
    suite: str
    packages: tuple[str, ...]
    variant: str = "minbase"

    def argv(self, target: Path, sources: list[Path]) -> list[str]:
        return ["mmdebstrap", f"--variant={self.variant}",
                f"--include={','.join(self.packages)}",
                # a fixed hook of ours (mmdebstrap runs it with sh), not user input
                '--customize-hook=rm -f "$1/etc/hostname"',
                self.suite, str(target), *map(str, sources)]


RECIPES = {
    "debian-12": Recipe("debian-12", "bookworm", ("python3", "systemd-sysv")),
    "debian-11": Recipe("debian-11", "bullseye", ("python3", "systemd-sysv")),
}
SUITES_LINE = re.compile(r"^(Suites:|deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?\S+)(.*)$", re.MULTILINE)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/orch/sandbox-roots").expanduser()


def recipe(distribution: str) -> Recipe:
    try:
        return RECIPES[distribution]
    except KeyError:
        raise SandboxError(f"unknown root distribution {distribution!r} "
                           f"(known: {', '.join(sorted(RECIPES))})") from None


def machine_sources() -> list[Path]:
    """This machine's apt source files (one-line and deb822), in apt's reading order."""
    main, directory = APT_SOURCES
    found = [main] if main.is_file() and _has_entries(main) else []
    if directory.is_dir():
        found += sorted(p for p in directory.iterdir()
                        if p.suffix in (".list", ".sources") and p.is_file() and _has_entries(p))
    return found


def sources_for(chosen: Recipe) -> list[Path]:
    """The apt sources mmdebstrap builds `chosen` from: the machine's own when they carry its
    suite; else copies with the machine's release renamed to it (cached beside the roots)."""
    sources = machine_sources()
    if not sources or any(_carries(p.read_text(errors="replace"), chosen.suite) for p in sources):
        return sources
    copies = cache_dir() / f"sources-{chosen.suite}"
    copies.mkdir(parents=True, exist_ok=True)
    derived = []
    for source in sources:
        text = source.read_text(errors="replace")
        release = _release(text)
        if release is None:
            continue
        copy = copies / source.name
        renamed = SUITES_LINE.sub(lambda m: m.group(1) + re.sub(
            rf"\b{re.escape(release)}(?=[-\s]|$)", chosen.suite, m.group(2)), text)
        if not copy.is_file() or copy.read_text() != renamed:
            copy.write_text(renamed)
        derived.append(copy)
    return derived


def _carries(text: str, suite: str) -> bool:
    return any(re.search(rf"(^|\s){re.escape(suite)}(\s|$)", m.group(2))
               for m in SUITES_LINE.finditer(text))


def _release(text: str):
    """The release a sources file names (its first suite without a -updates/-security)."""
    for match in SUITES_LINE.finditer(text):
        for suite in match.group(2).split():
            if "-" not in suite and suite.isalpha():
                return suite
    return None


def _has_entries(path: Path) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#")
               for line in path.read_text(errors="replace").splitlines())


def tarball_path(distribution: str) -> Path:
    """Where the root of `distribution` is cached: named after the recipe and the machine's
    apt sources, so a change of either builds a new one."""
    chosen = recipe(distribution)
    sources = sources_for(chosen)
    key = json.dumps({"argv": chosen.argv(Path("ROOT"), []),
                      "sources": [p.read_text(errors="replace") for p in sources]})
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / f"{chosen.name}-{digest}.tar"


def ensure_tarball(distribution: str = DEFAULT_DISTRIBUTION, progress=None) -> Path:
    """The cached root tarball of `distribution`, built with mmdebstrap when missing."""
    target = tarball_path(distribution)
    if target.is_file():
        return target
    chosen = recipe(distribution)
    sources = sources_for(chosen)
    if not sources:
        raise SandboxError("this machine has no apt sources (/etc/apt/sources.list[.d]) to "
                           f"build the {distribution} root from")
    if not any(_carries(p.read_text(errors="replace"), chosen.suite) for p in sources):
        raise SandboxError(f"this machine's apt sources ({', '.join(map(str, sources))}) do not "
                           f"carry {chosen.suite}: the {distribution} root is built from them")
    if not _which("mmdebstrap"):
        raise SandboxError("mmdebstrap is not installed (it builds the real container roots): "
                           "apt-get install -y mmdebstrap")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_suffix(".lock")):
        if target.is_file():       # another `up` built it while we waited
            return target
        partial = target.with_name(target.stem + ".part.tar")
        partial.unlink(missing_ok=True)
        if progress:
            progress(f"building the {distribution} root with mmdebstrap (once; about 30 s)")
        started = time.monotonic()
        run(chosen.argv(partial, sources), timeout=BUILD_TIMEOUT)
        partial.replace(target)
        (target.with_suffix(".json")).write_text(json.dumps({
            "distribution": distribution, "seconds": round(time.monotonic() - started, 1),
            "bytes": target.stat().st_size, "sources": list(map(str, sources))}) + "\n")
    return target


def _which(name: str) -> bool:
    return find_command(name) is not None


class _locked:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.handle = open(self.path, "w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def roots_dir(paths: StatePaths) -> Path:
    return paths.root / "roots"


def unpacked_root(paths: StatePaths, distribution: str) -> Path:
    """Where the containers of this state directory find `distribution`'s root (read-only
    lower layer of their overlays)."""
    return roots_dir(paths) / tarball_path(distribution).stem


def ensure_unpacked(paths: StatePaths, distribution: str, progress=None) -> Path:
    """Unpack the cached tarball into the state directory (once per `up` after a `down`)."""
    tarball = ensure_tarball(distribution, progress)
    root = unpacked_root(paths, distribution)
    mark = root.with_name(root.name + UNPACKED_MARK)
    if root.is_dir() and mark.exists():
        return root
    remove_tree(root)
    mark.unlink(missing_ok=True)
    root.mkdir(parents=True)
    run(["tar", "-x", "--numeric-owner", "-f", str(tarball), "-C", str(root)], timeout=300)
    mark.write_text(f"{tarball}\n")
    return root


def remove_unpacked(paths: StatePaths) -> None:
    remove_tree(roots_dir(paths))
