"""The direct path's SSH connection, started before click and orch's commands are imported.

A direct `orch exec CT -- CMD` (no agent) spends about 100 ms importing and then waits
about 75 ms for the host: its banner, its half of the key exchange and of the
authentication, and some 45 ms of sshd's own work after authentication (its session
set-up), before the first channel opens. The entry point (`orchestrator/cli/main.py`) can
overlap those waits with its imports when it knows the host before the inventory is read:
it looks the target up in a small index that an earlier direct command wrote
(`early-hosts.json` in orch's data folder: each inventory's SSH settings per host and the
host of each container, valid while the inventory file and ~/.ssh/config are unchanged).
Then a thread opens the TCP connection at once and, as soon as paramiko is imported, makes
the SSH handshake with the very code the fleet uses (`SshHost.open_client`: known_hosts,
identities, timeouts), while the main thread imports the CLI.

The index is only a guess. The fleet adopts the connection only when the settings it
computes from the inventory and ~/.ssh/config, as always, are equal to the ones the
connection was made with (`claim`); any other connection is closed. A wrong or stale guess
costs a closed connection, never a wrong host: every host key is checked against
known_hosts exactly as on the normal path, and nothing is trusted on first use here.

No click, paramiko or yaml at import: the entry point imports this before them.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import socket
import threading

from orchestrator.config.inventory_file import inventory_path
from orchestrator.ground import invocation, paths
from orchestrator.remote.tcp import tcp_connect

INDEX_NAME = "early-hosts.json"
INDEX_VERSION = 1
INDEX_INVENTORIES = 8       # the index keeps the most recently used inventories only
SSH_CONFIG = "~/.ssh/config"
DEFAULT_TARGET = ""   # the key of the inventory's default_target in an entry's targets
_lock = threading.Lock()
_pending: "EarlyConnection | None" = None


# ------------------------------------------------------------------ the entry point's side
def start(args: list[str]) -> None:
    """Start the connection for this command line, when the index knows its host."""
    global _pending
    fields = guess(args)
    if fields is None:
        return
    try:
        early = EarlyConnection(fields)
    except (KeyError, TypeError, ValueError):   # an entry orch did not write: no guess
        return
    # Imported here, in the main thread, before the CLI: paramiko is what the handshake
    # needs first, and only one thread imports at a time (no contention on import locks).
    ssh = importlib.import_module("orchestrator.remote.ssh")
    try:
        # never trust on first use here, whatever the index says: that needs the user's option
        settings = ssh.SshSettings(**{**fields, "trust_on_first_use": False})
    except TypeError:
        early.discard()
        return
    early.go(ssh.SshHost(settings))
    with _lock:
        previous, _pending = _pending, early
    if previous is not None:
        previous.discard()


def guess(args: list[str]) -> dict | None:
    """The SSH settings (SshSettings' fields) of the host this command line will open first,
    from the index; None when the command needs none, or no valid entry names its host."""
    words = _inventory_and_target(args)
    if words is None:
        return None
    inventory_file, target = inventory_path(words[0]), words[1]
    entry = _read_index().get(_index_key(inventory_file))
    if not entry or entry.get("signature") is None or entry["signature"] != signature(inventory_file):
        return None
    targets, hosts = entry.get("targets"), entry.get("hosts")
    if not isinstance(targets, dict) or not isinstance(hosts, dict):
        return None
    host = targets.get(target)
    if host is None and ":" in target:   # HOST:VMID
        host = targets.get(target.partition(":")[0])
    fields = hosts.get(host) if isinstance(host, str) else None
    return fields if isinstance(fields, dict) else None


def _inventory_and_target(args: list[str]) -> tuple[str | None, str] | None:
    """(-i value, TARGET) of `orch [-i FILE] [--no-agent] exec [--timeout S] [--json] TARGET
    ...` or `orch [...] grep-torch|grep-pkg ... [-t TARGET]` (DEFAULT_TARGET without -t),
    else None. A guess (click parses the line for real): a wrong one costs only a
    connection that is closed unused."""
    inventory, index = None, 0
    while index < len(args) and args[index].startswith("-"):
        word = args[index]
        if word in ("-i", "--inventory") and index + 1 < len(args):
            inventory, index = args[index + 1], index + 2
        elif word.startswith("--inventory="):
            inventory, index = word.partition("=")[2], index + 1
        elif word.startswith("-i") and not word.startswith("--") and len(word) > 2:
            inventory, index = word[2:], index + 1
        elif word == "--no-agent":
            index += 1
        else:   # --trust-new-host-keys (never early: it may write known_hosts), --help, ...
            return None
    command, rest = args[index:index + 1], args[index + 1:]
    target = (_exec_target(rest) if command == ["exec"] else
              _option_target(rest) if command in (["grep-torch"], ["grep-pkg"]) else None)
    return None if target is None else (inventory, target)


def _exec_target(rest: list[str]) -> str | None:
    index = 0
    while index < len(rest) and rest[index].startswith("-"):   # exec's options (cli/commands/core.py)
        if rest[index] == "--timeout":
            index += 2
        elif rest[index] == "--json" or rest[index].startswith("--timeout="):
            index += 1
        else:   # --help, or an option exec does not have
            return None
    return rest[index] if index < len(rest) else None


def _option_target(rest: list[str]) -> str | None:
    """The one -t/--target of a command line (DEFAULT_TARGET when there is none); None for
    several (they may be on several hosts) or --help."""
    if "--help" in rest or "-h" in rest:
        return None
    found = [rest[i + 1] for i in range(len(rest) - 1) if rest[i] in ("-t", "--target")]
    found += [word.partition("=")[2] for word in rest if word.startswith("--target=")]
    if len(found) > 1:
        return None
    return found[0] if found else DEFAULT_TARGET


# ------------------------------------------------------------------ the fleet's side
def claim(settings) -> "EarlyConnection | None":
    """The early connection, when it was made with exactly these settings (the fleet's, from
    the inventory); any other is closed. Once per process: the first host asked decides."""
    global _pending
    with _lock:
        early, _pending = _pending, None
    if early is None:
        return None
    if early.settings == settings:
        return early
    early.discard()
    return None


def remember(inventory_file: str, hosts: dict[str, dict], targets: dict[str, str]) -> None:
    """Write the index entry of one inventory (hosts: SshSettings' fields by host name;
    targets: the host of each container and host name), when it changed."""
    key = _index_key(inventory_file)
    entry = {"signature": signature(inventory_file), "hosts": hosts, "targets": targets}
    if entry["signature"] is None:
        return
    index = _read_index()
    if index.get(key) == entry:
        return
    index.pop(key, None)
    index[key] = entry   # last: the most recently written inventory is kept longest
    kept = dict(list(index.items())[-INDEX_INVENTORIES:])
    _write_index(kept)


def signature(inventory_file: str) -> list | None:
    """What an index entry is valid for: the inventory file and ~/.ssh/config as they are
    (stat: size, mtime, inode), and $HOME (~ in paths, ~/.ssh/config itself)."""
    command = invocation.current()
    try:
        found = os.stat(command.path(inventory_file))
    except OSError:
        return None
    return [_stat_key(found), _stat_key(_stat_or_none(command.expanduser(SSH_CONFIG))),
            command.expanduser("~")]


def _stat_or_none(path: str):
    try:
        return os.stat(path)
    except OSError:
        return None


def _stat_key(found) -> list | None:
    return None if found is None else [found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns]


def _index_key(inventory_file: str) -> str:
    return os.path.realpath(invocation.current().path(inventory_file))


def _index_path() -> str:
    return os.path.join(paths.data_dir(), INDEX_NAME)


def _read_index() -> dict:
    try:
        with open(_index_path(), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != INDEX_VERSION:
        return {}
    inventories = data.get("inventories")
    return inventories if isinstance(inventories, dict) else {}


def _write_index(inventories: dict) -> None:
    """Atomically (a private temporary file renamed over the old one); a failure to write
    (a read-only home) only means no early connection next time."""
    path = _index_path()
    scratch = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({"version": INDEX_VERSION, "inventories": inventories}, handle)
        os.replace(scratch, path)
    except OSError:
        try:
            os.unlink(scratch)
        except OSError:
            pass


def _discard_unclaimed() -> None:
    global _pending
    with _lock:
        early, _pending = _pending, None
    if early is not None:
        early.discard()


atexit.register(_discard_unclaimed)   # what no fleet claimed is closed at exit, not dropped


# ------------------------------------------------------------------ the connection
class EarlyConnection:
    """One SSH connection opened in a thread: TCP at once, the handshake after `go`."""

    def __init__(self, fields: dict):
        self.settings = None          # SshSettings, given with go()
        self._host = None
        self._address = (fields["address"], int(fields["port"]), float(fields["connect_timeout"]))
        self._go = threading.Event()
        self._discarded = False
        self._sock: socket.socket | None = None
        self._client = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="orch-early-ssh", daemon=True)
        self._thread.start()

    def go(self, host) -> None:
        """paramiko is imported: make the handshake as this SshHost makes it."""
        self._host = host
        self.settings = host.settings
        self._go.set()

    def client(self):
        """The authenticated paramiko client, or the OrchError its opening raised (the one the
        fleet's own attempt would have raised: the same code made it)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._client

    def discard(self) -> None:
        """Close it, unused (a wrong guess, or a command that opened no host). It waits for
        nothing: a handshake under way fails on the shut socket, and what the thread still
        makes it closes itself (a connect to a host that does not answer dies with us)."""
        self._discarded = True
        self._go.set()
        sock = self._sock
        if sock is not None:
            _quietly(lambda: sock.shutdown(socket.SHUT_RDWR))
        if self._client is not None:
            _quietly(self._client.close)

    def _run(self) -> None:
        tcp_error = None
        try:
            self._sock = tcp_connect(*self._address)
        except OSError as error:
            tcp_error = error
        self._go.wait()
        if self._discarded:
            if self._sock is not None:
                _quietly(self._sock.close)
            return
        try:
            if tcp_error is not None:
                raise self._host.unreachable(tcp_error)
            self._client = self._host.open_client(self._sock)
        except BaseException as error:   # handed to the thread that claims the connection
            self._error = error
            return
        if self._discarded:   # while it shook hands
            _quietly(self._client.close)


def _quietly(action) -> None:
    try:
        action()
    except Exception:   # closing what nobody uses: nothing to report
        pass
