"""What the client and the agent share: the socket's place, the messages, their framing.

Stdlib only, and small: the client imports it on every quick command.

A message is a 4-byte big-endian length and that many bytes of JSON (one object with a
"type"). The client's "go" travels with its fds 0, 1 and 2 (SCM_RIGHTS).
  client -> agent: run {argv, cwd, env, stdio, term_size} | go | signal {signum} | status | stop
  agent -> client: accepted | exit {code} | refused {reason} | status {...} | stopping
A run goes: run, accepted, go (the client's confirmation: without it nothing runs), exit.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import zlib

from orchestrator import __version__

# The agent ended after it accepted a command: its outcome is unknown (as ssh's 255 when
# its ControlMaster dies). Never a rerun: the command may have run.
EXIT_AGENT_LOST = 255
# 2: the client's fds come with its "go" after "accepted", no longer with "run"
PROTOCOL = 2
IDLE_DEFAULT_S = 600.0
MAX_MESSAGE = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


def agent_dir() -> str:
    """$ORCH_AGENT_DIR, else $XDG_RUNTIME_DIR/orch, else ~/.local/state/orch (made 0700)."""
    explicit = os.environ.get("ORCH_AGENT_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "orch")
    return os.path.expanduser("~/.local/state/orch")


def install_tag() -> str:
    """Each installation of orch (version and place) has an agent of its own: an agent never
    runs another installation's code. PROTOCOL is in it too: a client never talks to an
    agent of an older protocol (one still running from before an update in place), which
    would refuse it until it idles out."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return format(zlib.crc32(f"{__version__}\0{here}\0{PROTOCOL}".encode()), "08x")  # hashlib: +4 ms


def socket_path(directory: str | None = None) -> str:
    return os.path.join(directory or agent_dir(), f"agent-{install_tag()}.sock")


class UntrustedAgent(PermissionError):
    """The agent's folder or the process on its socket is not safe to hand a command to."""


def private_dir(directory: str) -> str:
    """Make directory (mode 0700) if missing, then check it as check_dir does."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    problem = unsafe_dir(directory)
    if problem:
        raise UntrustedAgent(problem)
    return directory


def unsafe_dir(directory: str):
    """Why directory may not hold our agent's socket; None when it may (or does not exist).

    A command's environment and terminal go to whatever listens there, so: the folder is
    ours, mode 0700, not a symbolic link; every folder above it (as resolved) belongs to
    root or to us and nobody else can write to it unless it is sticky (/tmp), so nobody else
    can swap the folder. Only a few stat calls: the quick path runs this every time."""
    uid = os.getuid()
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return f"the agent folder {directory} is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return f"the agent folder {directory} is not a folder"
    if info.st_uid != uid:
        return f"the agent folder {directory} belongs to uid {info.st_uid}, not to uid {uid}"
    if info.st_mode & 0o077:
        return (f"the agent folder {directory} has mode {stat.S_IMODE(info.st_mode):04o}, "
                "not 0700 (`chmod 700` it)")
    parent = os.path.dirname(os.path.realpath(directory))
    while True:
        info = os.stat(parent)
        if info.st_uid not in (0, uid):
            return f"{parent}, above the agent folder, belongs to uid {info.st_uid}"
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return f"{parent}, above the agent folder, is writable by other users"
        if parent == os.path.dirname(parent):
            return None
        parent = os.path.dirname(parent)


def peer_uid(sock: socket.socket):
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED); None where
    the system cannot say (then nobody is trusted)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    credentials = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


def encode(message: dict) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


def send(sock: socket.socket, message: dict) -> None:
    sock.sendall(encode(message))


class Reader:
    """Reads framed messages from a stream socket (the first may carry fds)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def receive(self, want_fds: int = 0):
        """(message or None at EOF, fds): fds only with want_fds and only on the first read."""
        fds: list[int] = []
        while len(self.buffer) < _HEADER.size or len(self.buffer) < _HEADER.size + self._length():
            if want_fds and not fds:
                data, fds, _, _ = socket.recv_fds(self.sock, 65536, want_fds)
            else:
                data = self.sock.recv(65536)
            if not data:
                for fd in fds:
                    os.close(fd)
                return None, []
            self.buffer += data
        length = self._length()
        body = self.buffer[_HEADER.size:_HEADER.size + length]
        self.buffer = self.buffer[_HEADER.size + length:]
        return json.loads(body), fds

    def _length(self) -> int:
        length = _HEADER.unpack(self.buffer[:_HEADER.size])[0]
        if length > MAX_MESSAGE:
            raise ValueError(f"message of {length} bytes is too long")
        return length
