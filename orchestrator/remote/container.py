"""A Target is where a step runs: a container (`pct exec VMID -- ...` on its host) or a host
itself. Commands stay argv lists; the host's transport does the only quoting.
"""

from __future__ import annotations

import ast
import functools
import re
from typing import Optional, Sequence

from orchestrator.errors import (CommandTimeout, ConnectionLost, ContainerNotRunning,
                                 NoSuchContainer, OrchError)
from orchestrator.remote.base import DEFAULT_TIMEOUT, Result, Transport, display_argv

# pct's own failures all exit 255 with one of these sentences on stderr.
_PCT_NO_CONFIG = re.compile(r"Configuration file '[^']*' does not exist")
_PCT_NOT_RUNNING = re.compile(r"container '?\d+'? not running")
_PCT_BAD_VMID = re.compile(r"value does not look like a valid VM ID")

# Small, constant shell programs: user data only ever arrives as "$1", "$2", never as code.
# The byte count is checked before the rename: a channel cut short (a timeout, a dropped
# link) ends cat's input early without an error, and must not leave a truncated file.
_PUT_SCRIPT = ('umask 077; cat > "$1.orch-part" && [ "$(wc -c < "$1.orch-part")" -eq "$3" ] '
               '&& chmod "$2" "$1.orch-part" && mv -f "$1.orch-part" "$1" '
               '|| { rm -f "$1.orch-part"; exit 1; }')
_HOME_SCRIPT = 'printf %s "$HOME"'
# The reaper needs the container's python3; a container without one still runs the
# command, only without the group kill. $0 is the reaper's source, "$@" the command.
_REAP_IF_PYTHON = ('if command -v python3 >/dev/null 2>&1; then exec python3 -c "$0" "$@"; fi; '
                   'exec "$@"')


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

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The argv the host runs: pct exec for a container, the command itself otherwise."""
        return ["pct", "exec", str(self.vmid), "--", *argv] if self.vmid else list(argv)

    def _run(self, argv, options) -> Result:
        inner = reaped(argv) if options.kill_on_close and self.vmid else argv
        try:
            result = self.host._run(self.wrap(inner), options)
        except (CommandTimeout, ConnectionLost) as error:
            raise self._restated(error, self.wrap(inner), argv) from None
        result.argv = list(argv)
        result.target = self.name
        if self.vmid and result.exit_code == 255:
            self._raise_pct_error(result)
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

    def _raise_pct_error(self, result: Result) -> None:
        message = result.error_text.strip()
        if _PCT_NO_CONFIG.search(message) or _PCT_BAD_VMID.search(message):
            raise NoSuchContainer(f"{self.describe()}: no such container: pct says: {message}",
                                  hint=f"`orch ct list {self.host.name}` lists the containers there")
        if _PCT_NOT_RUNNING.search(message):
            raise ContainerNotRunning(f"{self.describe()} is not running: pct says: {message}",
                                      hint=f"start it with `orch ct start {self.name}`")

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


def reaped(argv: Sequence[str]) -> list[str]:
    """argv run under the reaper payload: its own process group, killed when the channel
    closes (pct exec gives no signal to a command whose caller went away)."""
    return ["sh", "-c", _REAP_IF_PYTHON, _reaper_source(), *argv]


@functools.lru_cache(maxsize=1)
def _reaper_source() -> str:
    """The reaper without its docstring and comments: shorter in the container's `ps`."""
    from orchestrator.payloads import payload_source  # payloads import this module
    tree = ast.parse(payload_source("reaper").decode())
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        tree.body.pop(0)
    return ast.unparse(tree)


def require_vmid(target: Target) -> int:
    if not target.vmid:
        raise OrchError(f"{target.name} is not a container (no vmid in the inventory)")
    return target.vmid
