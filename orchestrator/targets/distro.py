"""A container without python: which distribution it is, and how python3 gets in.

orch's payloads need the container's python3. When it is missing nothing of orch's can run
there, so this asks with plain `cat /etc/os-release` (no python) and turns the answer into
the distribution's own install command: shown to the user, or run when asked to (the
container must then reach its package sources).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from orchestrator.ground.errors import OrchError
from orchestrator.remote.base import LineSplitter
from orchestrator.remote.container import Target

NOT_FOUND_CODES = (126, 127)   # exec failed: no such file, or not executable

# (ID or an ID_LIKE word) -> the commands that install python3, as argv lists
INSTALLERS = {
    "debian": [["apt-get", "update"],
               ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y",
                "--no-install-recommends", "python3"]],
    "fedora": [["dnf", "install", "-y", "python3"]],
    "rhel": [["dnf", "install", "-y", "python3"]],
    "suse": [["zypper", "--non-interactive", "install", "python3"]],
    "alpine": [["apk", "add", "--no-cache", "python3"]],
    "arch": [["pacman", "-Sy", "--noconfirm", "python"]],
}
ALIASES = {"ubuntu": "debian", "centos": "rhel", "rocky": "rhel", "almalinux": "rhel",
           "opensuse": "suse", "opensuse-leap": "suse", "opensuse-tumbleweed": "suse",
           "sles": "suse", "archlinux": "arch"}


@dataclass(frozen=True)
class OsRelease:
    id: str
    like: tuple[str, ...]
    pretty_name: str

    @classmethod
    def parse(cls, text: str) -> "OsRelease":
        fields = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip().isidentifier():
                try:
                    words = shlex.split(value)
                except ValueError:
                    words = [value.strip("\"'")]
                fields[key.strip()] = words[0] if words else ""
        return cls(fields.get("ID", "").lower(), tuple(fields.get("ID_LIKE", "").lower().split()),
                   fields.get("PRETTY_NAME") or fields.get("NAME") or "an unknown Linux")

    def family(self) -> str | None:
        for name in (self.id, *self.like):
            name = ALIASES.get(name, name)
            if name in INSTALLERS:
                return name
        return None

    def install_python(self) -> list[list[str]] | None:
        family = self.family()
        return [list(argv) for argv in INSTALLERS[family]] if family else None


def os_release(target: Target) -> OsRelease:
    """The container's /etc/os-release (then /usr/lib/os-release), read with cat."""
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        result = target.run(["cat", "--", path], timeout=30)
        if result.ok:
            return OsRelease.parse(result.text)
    return OsRelease("", (), "an unknown Linux (no /etc/os-release)")


def python_missing(target: Target, python: str) -> bool:
    """True when `python` cannot be executed in the target at all."""
    result = target.run([python, "-c", "pass"], timeout=60)
    if result.exit_code in NOT_FOUND_CODES:
        return True
    return not result.ok and "No such file or directory" in result.error_text[:500]


def fix_commands(target: Target, release: OsRelease) -> list[str]:
    """What a user types to install python3 in the target, one `orch exec` line each."""
    commands = release.install_python()
    if commands is None:
        return []
    return [shlex.join(["orch", "exec", target.name, "--", *argv]) for argv in commands]


class PythonMissing(OrchError):
    """python3 is not installed in the container; the message says how to install it."""

    def __init__(self, target: Target, python: str, release: OsRelease):
        self.release = release
        self.fix = fix_commands(target, release)
        how = ("; ".join(self.fix) if self.fix else
               "install python3 (3.8 or newer) with the distribution's package manager")
        super().__init__(f"{target.name}: {python} is not installed in {target.describe()} "
                         f"({release.pretty_name}); orch needs it to run anything there",
                         hint=how)


def require_python(target: Target, python: str, install: bool = False, output=None) -> None:
    """Raise PythonMissing when `python` is missing, after installing it when `install`."""
    if not python_missing(target, python):
        return
    release = os_release(target)
    commands = release.install_python()
    if not install or commands is None:
        raise PythonMissing(target, python, release)
    for argv in commands:
        if output:
            output("$ " + shlex.join(argv))
        result = target.run(argv, timeout=1800,
                            on_stdout=_lines(output), on_stderr=_lines(output))
        if not result.ok:
            raise OrchError(
                f"{target.name}: `{shlex.join(argv)}` failed with exit code {result.exit_code} "
                f"({release.pretty_name}): " + " | ".join(result.stderr_tail(3)),
                hint="the container must reach its package sources to install python3; "
                     "without a route out, install python3 into its template or image")
    if python_missing(target, python):
        raise OrchError(f"{target.name}: {python} is still missing after "
                        + "; ".join(shlex.join(argv) for argv in commands)
                        + f" ({release.pretty_name})",
                        hint="the package manager may have used stale or no package lists: "
                             "the container must reach its package sources")


def _lines(output):
    if output is None:
        return None
    return LineSplitter(output).feed
