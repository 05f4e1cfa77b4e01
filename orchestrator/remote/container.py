"""A Target is where a step runs: a container (`pct exec VMID -- ...` on its host) or a host
itself. Commands stay argv lists; the host's transport does the only quoting.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from orchestrator.errors import (CommandTimeout, ConnectionLost, ContainerNotRunning,
                                 NoSuchContainer, OrchError)
from orchestrator.payloads import compact_source
from orchestrator.remote.base import DEFAULT_TIMEOUT, Result, Transport, display_argv, with_env

# pct's own failures before the command runs: one of these sentences ends stderr (perl's
# locale warnings may come first; usage lines follow a bad id) and stdout is empty. The exit code says
# nothing: perl's die exits with errno when one is set (2 for a missing config, anything
# for a stopped CT), else 255; a command in the container may exit with any of those.
_PCT_NO_CONFIG = re.compile(r"Configuration file 'nodes/[^/']+/lxc/(\d+)\.conf' does not exist")
_PCT_NOT_RUNNING = re.compile(r"container '(\d+)' not running!")
_PCT_BAD_VMID = re.compile(r"value does not look like a valid VM ID")
_KILLED = 128 + 9   # SIGKILL: what lxc-attach's command gets when its container stops

# pct sets PATH=/sbin:/bin:/usr/sbin:/usr/bin before it runs the command (pve-common's
# run_cli_handler), which leaves out /usr/local/bin where pip and users put tools. orch
# runs every container command under the PATH a root login shell of Debian gets, set
# through `env` so that it does not depend on pct or on the host; an inventory `env:`
# PATH replaces it.
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Small, constant shell programs: user data only ever arrives as "$1", "$2", never as code.
# The byte count is checked before the rename: a channel cut short (a timeout, a dropped
# link) ends cat's input early without an error, and must not leave a truncated file.
_PUT_SCRIPT = ('umask 077; cat > "$1.orch-part" && [ "$(wc -c < "$1.orch-part")" -eq "$3" ] '
               '&& chmod "$2" "$1.orch-part" && mv -f "$1.orch-part" "$1" '
               '|| { rm -f "$1.orch-part"; exit 1; }')
_HOME_SCRIPT = 'printf %s "$HOME"'
# The reaper needs the container's python3; a container without one still runs the
# command, only without the group kill. $0 is the reaper's source, "$@" the command.
# -I -S: the reaper is stdlib only, so it skips site (~4 ms) and ignores PYTHON* variables
# and the current folder, which are the command's (a PYTHONPATH with a select.py cannot
# break it); the command still gets the whole environment.
_REAP_IF_PYTHON = ('if command -v python3 >/dev/null 2>&1; then exec python3 -I -S -c "$0" "$@"; '
                   'fi; exec "$@"')


class Target(Transport):
    """A container on a host (vmid set) or the host itself (vmid None)."""

    def __init__(self, name: str, host: Transport, vmid: Optional[int] = None,
                 venv: Optional[str] = None, gpus: Sequence[int] = (), env: Optional[dict] = None):
        self.name = name
        self.host = host
        self.vmid = vmid
        self.venv = venv
        self.gpus = list(gpus)
        self.env = dict(env or {})
        self._home: Optional[str] = None

    def describe(self) -> str:
        where = f"CT {self.vmid} on host {self.host.name}" if self.vmid else f"host {self.host.name}"
        return f"{self.name} ({where})"

    def wrap(self, argv: Sequence[str], path: Optional[str] = None) -> list[str]:
        """The argv the host runs: pct exec for a container, the command itself otherwise."""
        if not self.vmid:
            return list(argv)
        path = path or self.env.get("PATH") or CONTAINER_PATH
        return ["pct", "exec", str(self.vmid), "--", *with_env([f"PATH={path}"], argv)]

    def _run(self, argv, options) -> Result:
        path = options.env.pop("PATH", None) if self.vmid else None  # pct would reset it
        inner = reaped(argv) if options.kill_on_close and self.vmid else argv
        try:
            result = self.host._run(self.wrap(inner, path), options)
        except (CommandTimeout, ConnectionLost) as error:
            raise self._restated(error, self.wrap(inner, path), argv) from None
        result.argv = list(argv)
        result.target = self.name
        if self.vmid and result.exit_code == _KILLED:
            self.raise_if_stopped(argv, result.duration)
        if self.vmid and result.exit_code != 0:
            # a caller that streams stderr has shown pct's sentence already: not twice
            self._raise_pct_error(result, shown=options.on_stderr is not None)
        return result

    def _restated(self, error, host_argv, argv):
        """The host's error about `pct exec ... ARGV`, said about ARGV in this target."""
        error.message = error.message.replace(
            f"{display_argv(host_argv)} on host {self.host.name}",
            f"{display_argv(argv)} in {self.describe()}").replace(
            f"while {display_argv(host_argv)} ran", f"while {display_argv(argv)} ran in {self.name}")
        if getattr(error, "result", None) is not None:
            error.result.argv, error.result.target = list(argv), self.name
        return error

    def spawn(self, argv):
        return self.host.spawn(self.wrap(argv))

    def raise_if_stopped(self, argv, duration: float) -> None:
        """A container that stops under a command kills it: the direct path sees exit 137,
        a warm session its channel closing. Either way, when `pct status` says "stopped",
        that is what orch says (asked only then: a command killed in a running container
        keeps its own result)."""
        try:
            stopped = self._pct_status() == "stopped"
        except OrchError:
            return   # the host cannot tell: the caller's own error stands
        if stopped:
            raise ContainerNotRunning(
                f"{self.describe()} stopped while {display_argv(argv)} ran (after "
                f"{duration:.1f} s): the command ended with it",
                hint=f"start it with `orch ct start {self.name}`")

    def _raise_pct_error(self, result: Result, shown: bool = False) -> None:
        """Raise when pct itself failed, not the command: its sentence ends the output, and
        `pct status` (asked only then) confirms it, so a command that prints the same
        sentence and exits 2 keeps its own result. shown: the caller printed it already."""
        message = pct_error_text(result, self.vmid)
        if message is None:
            return
        quoted = "" if shown else f": pct says: {message}"
        if _PCT_NOT_RUNNING.search(message):
            if self._pct_status() == "stopped":
                raise ContainerNotRunning(f"{self.describe()} is not running{quoted}",
                                          hint=f"start it with `orch ct start {self.name}`")
        elif self._pct_status() is None:
            raise NoSuchContainer(f"{self.describe()}: no such container{quoted}",
                                  hint=f"`orch ct list {self.host.name}` lists the containers there")

    def _pct_status(self) -> Optional[str]:
        """'running' or 'stopped' as `pct status` says; None when pct knows no such CT."""
        status = self.host.run(["pct", "status", str(self.vmid)], timeout=30)
        found = re.fullmatch(r"status: (\w+)\n?", status.text)
        return found.group(1) if status.exit_code == 0 and found else None

    # -- files, without pct push (which needs a path on the host) ----------------------
    def put(self, path: str, data: bytes, mode: int = 0o644, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Write data to path atomically (a temporary name, then rename)."""
        argv = ["sh", "-c", _PUT_SCRIPT, "orch-put", path, format(mode, "o"), str(len(data))]
        self.run(argv, stdin=data, timeout=timeout).check(f"writing {path} on {self.name}")

    def get(self, path: str, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        return self.run(["cat", "--", path], timeout=timeout).check(
            f"reading {path} on {self.name}").stdout

    def home(self) -> str:
        if self._home is None:
            self._home = self.run(["sh", "-c", _HOME_SCRIPT], timeout=30).check().text or "/root"
        return self._home

    def expand(self, path: str) -> str:
        """Expand a leading ~ the way the target's shell would, without a shell."""
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    def python(self) -> str:
        """The interpreter steps use: the venv's when the inventory names one."""
        if not self.venv:
            return "python3"
        return self.expand(self.venv).rstrip("/") + "/bin/python"


def pct_error_text(result: Result, vmid: Optional[int]) -> Optional[str]:
    """pct's own error sentence about this vmid when it ends an output with nothing on stdout."""
    if result.stdout.strip():
        return None
    lines = [line for line in result.error_text.splitlines() if line.strip()]
    if not lines:
        return None
    last = lines[-1].strip()
    # only the last line: a host without the client's locale has perl warn first
    for pattern in (_PCT_NO_CONFIG, _PCT_NOT_RUNNING):
        found = pattern.fullmatch(last)
        if found and found.group(1) == str(vmid):
            return last
    # a bad id: "400 Parameter verification failed." and usage lines around the sentence
    if lines[0].startswith("400 Parameter verification failed.") and any(
            _PCT_BAD_VMID.search(line) for line in lines):
        return " ".join(line.strip() for line in lines[:2])
    return None


def reaped(argv: Sequence[str]) -> list[str]:
    """argv run under the reaper payload: its own process group, killed when the channel
    closes (pct exec gives no signal to a command whose caller went away)."""
    return ["sh", "-c", _REAP_IF_PYTHON, compact_source("reaper"), *argv]


def require_vmid(target: Target) -> int:
    if not target.vmid:
        raise OrchError(f"{target.name} is not a container (no vmid in the inventory)")
    return target.vmid
