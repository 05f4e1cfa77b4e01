"""Small machine-level helpers for the sandbox: commands, processes, namespaces, cgroups.

Every command is an argv list; nothing here ever goes through a shell.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

from orchestrator.ground.errors import OrchError

CGROUP_BASE = Path("/sys/fs/cgroup")


class SandboxError(OrchError):
    """Something failed while building, inspecting or removing the sandbox."""


def run(argv: list[str], *, input: bytes | None = None, check: bool = True,
        timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run argv, capture its output; a failure (if check) raises SandboxError with stderr."""
    try:
        result = subprocess.run(argv, input=input, capture_output=True, timeout=timeout,
                                check=False, cwd="/")
    except subprocess.TimeoutExpired:
        raise SandboxError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from None
    except FileNotFoundError:
        raise SandboxError(f"`{argv[0]}` is not installed") from None
    if check and result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip() or "(no error output)"
        raise SandboxError(f"`{' '.join(argv)}` failed with exit code {result.returncode}: "
                           f"{detail}")
    return result


def in_host(holder_pid: int, argv: list[str]) -> list[str]:
    """argv that runs `argv` inside a host's network, mount and UTS namespaces."""
    return ["nsenter", "-t", str(holder_pid), "-m", "-u", "-n", "--", *argv]


# --- processes ------------------------------------------------------------------------------

def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def alive(pid: int | None) -> bool:
    """True when pid runs (a zombie counts as gone)."""
    if not pid:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def namespace_inode(pid: int | str, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def pids_in_netns(netns_path: Path) -> set[int]:
    """Processes whose network namespace is the one bound at netns_path (`ip netns pids`)."""
    try:
        inode = os.stat(netns_path).st_ino
    except OSError:
        return set()
    return {pid for pid in all_pids() if namespace_inode(pid, "net") == inode}


def descendants(roots: set[int]) -> set[int]:
    """roots and every process below them (containers hang below their LXC monitor)."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def kill_and_wait(pids: set[int], timeout: float = 30.0) -> set[int]:
    """SIGKILL pids and wait until they are gone; returns the ones that outlived timeout.

    A killed process is gone within milliseconds on an idle machine, but one that still has
    to hand back a large address space (a python that imported torch) took over 5 s on a
    loaded 2-core machine: the wait is generous, since it ends as soon as they are gone."""
    own = os.getpid()
    pids = {pid for pid in pids if pid != own}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    remaining = set(pids)
    while remaining and time.monotonic() < deadline:
        for pid in list(remaining):
            _reap_if_child(pid)
            if not alive(pid):
                remaining.discard(pid)
        if remaining:
            time.sleep(0.005)
    return remaining


def _reap_if_child(pid: int) -> None:
    """Collect a killed child of ours (the host holders are) so it leaves no zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_for(predicate, timeout: float, interval: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# --- cgroups ----------------------------------------------------------------------------------

def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers and/or the v2 tree)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        if fields[separator + 1] in ("cgroup", "cgroup2"):
            found.append(Path(fields[4]))
    return found


def tagging_hierarchy() -> Path | None:
    """The hierarchy used to tag a host's processes: v1 `pids`, else the v2 tree."""
    hierarchies = cgroup_hierarchies()
    for path in hierarchies:
        if path.name == "pids":
            return path
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] == "cgroup2":
            return Path(fields[4])
    return None


def move_to_cgroup(pid: int, relative: str) -> None:
    """Put pid into cgroup `relative` of the tagging hierarchy; its children follow it."""
    hierarchy = tagging_hierarchy()
    if hierarchy is None:
        return
    directory = hierarchy / relative
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup.procs").write_text(str(pid))
    except OSError as error:   # e.g. a hierarchy that mountinfo lists but a mount hides
        raise SandboxError(f"cannot put process {pid} into cgroup {directory}: "
                           f"{error.strerror or error} (is {hierarchy} mounted and writable?)")


def pids_in_cgroup_tree(relative: str) -> set[int]:
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / relative
        if not top.is_dir():
            continue
        for directory, _, _ in os.walk(top):
            try:
                text = Path(directory, "cgroup.procs").read_text()
            except OSError:
                continue
            pids.update(int(line) for line in text.split())
    return pids


def remove_cgroup_tree(relative: str, timeout: float = 5.0) -> list[Path]:
    """rmdir `relative` and everything below it in every hierarchy; returns what stayed."""
    leftovers = []
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / relative
        if not top.is_dir():
            continue
        for directory, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
            if not _rmdir_when_empty(Path(directory), timeout):
                leftovers.append(Path(directory))
    return leftovers


def _rmdir_when_empty(directory: Path, timeout: float) -> bool:
    """A cgroup can be removed once its last task has fully exited: retry on EBUSY."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def remove_empty_parents(relative: str) -> None:
    """Remove `relative`'s parents (e.g. orch-sandbox/) where nothing else is left in them."""
    parts = Path(relative).parts
    for depth in range(len(parts) - 1, 0, -1):
        for hierarchy in cgroup_hierarchies():
            try:
                (hierarchy.joinpath(*parts[:depth])).rmdir()
            except OSError:
                pass


# --- mounts -------------------------------------------------------------------------------------

def mounts_below(directory: Path) -> list[str]:
    """Mount points (in our mount namespace) at or below directory, deepest first."""
    prefix = str(directory.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)
