"""A Target is where a step runs: a container (`pct exec VMID -- ...` on its host) or a host
itself. Commands stay argv lists; the host's transport does the only quoting.
"""

from __future__ import annotations

import os
import re
import time
from typing import Optional, Sequence

from orchestrator.ground.errors import (CommandTimeout, ConnectionLost, ContainerNotRunning,
                                 NoSuchContainer, OrchError)
from orchestrator.payloads import compact_source
from orchestrator.payloads._statedir import STATE_DIR, USER_STATE_DIR
from orchestrator.remote.base import DEFAULT_TIMEOUT, Result, Transport, display_argv, with_env
from orchestrator.remote.local import LocalTransport

# pct's own failures before the command runs: one of these sentences ends stderr (perl's
# locale warnings may come first; usage lines follow a bad id) and stdout is empty. The exit code says
# nothing: perl's die exits with errno when one is set (2 for a missing config, anything
# for a stopped CT), else 255; a command in the container may exit with any of those.
_PCT_NO_CONFIG = re.compile(r"Configuration file 'nodes/[^/']+/lxc/(\d+)\.conf' does not exist")
_PCT_NOT_RUNNING = re.compile(r"container '(\d+)' not running!")
_PCT_BAD_VMID = re.compile(r"value does not look like a valid VM ID")
# pct before pve-container 5.0.9 (PVE 8.1) has no keep-env option: Getopt::Long warns,
# then pve-common's get_options dies "400 unable to parse option" (and the usage follows).
_PCT_NO_KEEP_ENV = re.compile(r"^Unknown option: keep-env$", re.MULTILINE)

# `pct exec` hands the container command the environment of the host's session
# (--keep-env defaults to 1 up to PVE 9 at least; pct's own FIXME says it can leak host
# secrets). orch gives a container command orch's PATH, the variables it was asked to set,
# and lxc's container=lxc; nothing of the host:
# - no variables: `pct exec VMID --keep-env 0` (lxc-attach --clear-env);
# - variables: their values must not go into lxc-attach's argv (it lives as long as the
#   command, and any account on the host can read an argv), so they reach pct through its
#   environment, emptied first: `sh -c 'exec env -i -- PATH="$PATH" "$@"' K=V... pct exec
#   VMID --keep-env 1` (sh and env exec at once, as `env K=V pct` did before).
# Hosts whose pct predates the option (before pve-container 5.0.9) are remembered here by
# name and get pct's default, keep-env; docs/design/proxmox-semantics.md has the details.
_NO_KEEP_ENV_HOSTS: set = set()
_CLEAN_HOST_ENV = 'exec env -i -- PATH="$PATH" "$@"'
_KILLED = 128 + 9   # SIGKILL: what lxc-attach's command gets when its container stops
STOP_SETTLE_S = 2.0   # how long a container that killed a command may take to read as stopped

# pct sets PATH=/sbin:/bin:/usr/sbin:/usr/bin before it runs the command (pve-common's
# run_cli_handler), which leaves out /usr/local/bin where pip and users put tools. orch
# runs every container command under the PATH a root login shell of Debian gets, set
# through `env` so that it does not depend on pct or on the host; an inventory `env:`
# PATH replaces it.
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Small, constant shell programs: user data only ever arrives as "$1", "$2", never as code.
# The byte count is checked before the rename: a channel cut short (a timeout, a dropped
# link) ends cat's input early without an error, and must not leave a truncated file.
# The temporary file is mktemp's (a random name, created O_EXCL, 0600): a fixed name beside
# the destination could be a link planted by another account, which root's cat would follow.
PUT_TEMP_MARK = ".orch-put-"
_PUT_SCRIPT = ('umask 077; t=$(mktemp "$1' + PUT_TEMP_MARK + 'XXXXXXXXXX") || exit 1; '
               'cat > "$t" && [ "$(wc -c < "$t")" -eq "$3" ] '
               '&& chmod "$2" "$t" && mv -f "$t" "$1" || { rm -f "$t"; exit 1; }')
_HOME_SCRIPT = 'printf %s "$HOME"'
# The reaper runs as `python3 -I -S -c SOURCE --limit=S ARGV...`, started by the `env` that
# sets orch's PATH: no shell in between, which would drop variables whose names are no
# shell identifiers and add a PWD of its own. -I -S: the reaper is stdlib only, so it skips
# site (~4 ms) and ignores PYTHON* variables and the current folder, which are the
# command's (a PYTHONPATH with a select.py cannot break it); the command gets the whole
# environment. A container without python3 (env's "No such file or directory", nothing
# ran) gets the command again without the reaper, only without the group kill.
_NO_PYTHON3 = re.compile(r"python3.*No such file or directory")
# The reaper's own limit is this much past orch's timeout: orch's closing of the channel
# normally comes first, and says "timeout" the way every transport does.
REAP_LIMIT_SLACK_S = 5.0


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

    def wrap(self, argv: Sequence[str], path: Optional[str] = None,
             env: Optional[dict] = None) -> list[str]:
        """The argv the host runs: pct exec for a container, the command itself otherwise.
        env: variables for the command, carried as described above _NO_KEEP_ENV_HOSTS."""
        if not self.vmid:
            return list(argv)
        path = path or self.env.get("PATH") or CONTAINER_PATH
        inner = ["--", *with_env([f"PATH={path}"], argv)]
        known = self.host.name not in _NO_KEEP_ENV_HOSTS
        if not env:
            return ["pct", "exec", str(self.vmid), *(["--keep-env", "0"] if known else []), *inner]
        return ["sh", "-c", _CLEAN_HOST_ENV, "orch-env", *(f"{k}={v}" for k, v in env.items()),
                "pct", "exec", str(self.vmid), *(["--keep-env", "1"] if known else []), *inner]

    def _run(self, argv, options) -> Result:
        env = {}
        if self.vmid:   # the variables travel in wrap's argv (see there), not the host's env
            env, options.env = options.env, {}
        path = env.pop("PATH", None)  # pct would reset it
        # Every container command is reaped: pct exec gives no signal to a command whose
        # caller went away, and a payload or step past its timeout must not run on
        inner = reaped(argv, options.timeout, options.in_python) if self.vmid else argv
        try:
            result = self.host._run(self.wrap(inner, path, env), options)
            if self.vmid and self._keep_env_refused(result):   # refused before anything ran
                result = self.host._run(self.wrap(inner, path, env), options)
            if self.vmid and no_python3(result):   # nothing ran: the command, unreaped
                inner = argv
                result = self.host._run(self.wrap(inner, path, env), options)
        except (CommandTimeout, ConnectionLost) as error:
            raise self._restated(error, self.wrap(inner, path, env), argv) from None
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

    def _keep_env_refused(self, result: Result) -> bool:
        """pct too old for --keep-env: its parameter check failed, the command never ran."""
        refused = (result.exit_code != 0 and not result.stdout.strip()
                   and self.host.name not in _NO_KEEP_ENV_HOSTS
                   and bool(_PCT_NO_KEEP_ENV.search(result.error_text[-2000:])))
        if refused:
            _NO_KEEP_ENV_HOSTS.add(self.host.name)
        return refused

    def spawn(self, argv):
        return self.host.spawn(self.wrap(argv))

    def raise_if_stopped(self, argv, duration: float) -> None:
        """A container that stops under a command kills it: the direct path sees exit 137,
        a warm session its channel closing. Either way, when `pct status` says "stopped",
        that is what orch says (asked only then: a command killed in a running container
        keeps its own result)."""
        if self._stops_within(STOP_SETTLE_S):
            raise ContainerNotRunning(
                f"{self.describe()} stopped while {display_argv(argv)} ran (after "
                f"{duration:.1f} s): the command ended with it",
                hint=f"start it with `orch ct start {self.name}`")

    def require_running(self) -> None:
        """Raise NoSuchContainer or ContainerNotRunning unless `pct status` says running
        (for commands on a pty, where pct's own error cannot be told from the output)."""
        status = self._pct_status()
        if status is None:
            raise NoSuchContainer(f"{self.describe()}: no such container",
                                  hint=f"`orch ct list {self.host.name}` lists the containers there")
        if status != "running":
            raise ContainerNotRunning(f"{self.describe()} is not running ({status})",
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

    def _stops_within(self, seconds: float) -> bool:
        """Whether `pct status` says "stopped" within `seconds`: the command's channel can
        close while LXC is still stopping the container, when pct says "running" a moment
        longer (seen under load). False when the host cannot tell."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                if self._pct_status() == "stopped":
                    return True
            except OrchError:
                return False   # the host cannot tell: the caller's own error stands
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

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

    def state_dir(self) -> str:
        """orch's own folder on this target (run folders, the wheelhouse, caches): STATE_DIR
        as root, which every container command is (pct exec), else the account's own
        USER_STATE_DIR; the launcher and bootstrap payloads check it (payloads/_statedir.py)."""
        return STATE_DIR if self._as_root() else self.expand(USER_STATE_DIR)

    def _as_root(self) -> bool:
        if self.vmid:
            return True
        if isinstance(self.host, LocalTransport):
            return os.geteuid() == 0   # this process's account
        settings = getattr(self.host, "settings", None)   # SSH: the account it logs in as
        return getattr(settings, "user", "root") == "root"

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


def reaped(argv: Sequence[str], timeout: Optional[float] = None,
           in_python: bool = False) -> list[str]:
    """argv run under the reaper payload: its own process group, killed when the channel
    closes (pct exec gives no signal to a command whose caller went away), or a little
    after `timeout` seconds in any case. in_python: a `python3 - ARGS` payload runs in the
    reaper's forked child, no second interpreter (RunOptions.in_python)."""
    limit = f"--limit={timeout + REAP_LIMIT_SLACK_S:g}" if timeout else "--limit=0"
    here = ["--in-python"] if in_python and runs_here(argv) else []
    return ["python3", "-I", "-S", "-c", compact_source("reaper"), *here, limit, *argv]


def runs_here(argv: Sequence[str]) -> bool:
    """argv is `python3 - ...`, which the reaper and the exec server can run in-process
    (payloads/_inproc.py says the same of the argv it gets)."""
    return len(argv) >= 2 and argv[0] == "python3" and argv[1] == "-"


def no_python3(result: Result) -> bool:
    """The reaper could not start: env found no python3 (exit 127, its one line, no output)."""
    lines = result.stderr_tail(2)
    return (result.exit_code == 127 and not result.stdout and len(lines) == 1
            and bool(_NO_PYTHON3.search(lines[0])))


def require_vmid(target: Target) -> int:
    if not target.vmid:
        raise OrchError(f"{target.name} is not a container (no vmid in the inventory)")
    return target.vmid
