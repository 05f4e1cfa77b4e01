"""An interactive terminal on a target through a PTY end to end (`orch shell`).

The SSH channel asks sshd for a pty of the local terminal's size and TERM; on a container
the command is `pct exec VMID -- ...`, whose lxc-attach allocates a pty of its own inside
the container when its standard input is a terminal (sshd's pty) and passes on that pty's
size changes (docs/design/proxmox-semantics.md: pct has no `-t`, none is needed). This side
puts the local terminal in raw mode, so every key (Ctrl-C, Ctrl-Z, Ctrl-D) reaches the
remote pty as a byte and the remote line discipline decides what it means; a resize here
(SIGWINCH) becomes a window-change request on the channel. The terminal's attributes are
restored on every way out: the shell's exit, a dropped link, an exception, SIGTERM.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import termios
import time
import tty
from typing import Callable, Optional, Sequence

from orchestrator.ground import invocation
from orchestrator.ground.errors import OrchError
from orchestrator.remote.base import connection_lost, with_env

# The program that starts the shell in the target: constant text, the user's command and
# the venv path arrive as "$@" and $ORCH_VENV, never as code. With a venv its bin/ goes
# first on PATH (what `activate` does, without its prompt change) and the shell is an
# interactive non-login one: a login shell's profile resets PATH (Debian's /etc/profile).
# Without one it is the account's login shell from passwd (what `pct enter` and ssh give),
# started in its home folder: lxc-attach sets no HOME.
SHELL_SCRIPT = r'''
entry=$(getent passwd "$(id -u)" 2>/dev/null)
shell=${entry##*:}
[ -x "$shell" ] || shell=/bin/sh
home=$(printf %s "$entry" | cut -d: -f6)
export HOME="${HOME:-${home:-/}}"
cd "$HOME" 2>/dev/null || cd /
if [ -n "${ORCH_VENV-}" ]; then
    if [ ! -x "$ORCH_VENV/bin/python" ]; then
        printf 'orch shell: no virtual environment at %s (no bin/python there)\n' "$ORCH_VENV" >&2
        exit 127
    fi
    VIRTUAL_ENV=$ORCH_VENV PATH=$ORCH_VENV/bin:$PATH
    export VIRTUAL_ENV PATH
fi
unset ORCH_VENV
[ "$#" -gt 0 ] && exec "$@"
[ -n "${VIRTUAL_ENV-}" ] && exec "$shell" -i
exec "$shell" -l
'''.strip()

# How long after the end of a pty session's output its exit status may come (see exit_status)
STATUS_WAIT_S = 10.0


def shell_argv(command: Sequence[str] = (), term: Optional[str] = None,
               venv: Optional[str] = None) -> list[str]:
    """The argv that starts the shell (or `command`) in the target, with TERM and the venv."""
    assignments = [f"TERM={term}"] if term else []
    if venv:
        assignments.append(f"ORCH_VENV={venv}")
    argv = ["sh", "-c", SHELL_SCRIPT, "orch-shell", *command]
    return with_env(assignments, argv) if assignments else argv


def terminal_size(fd: int) -> tuple[int, int]:
    """(columns, lines) of the terminal on fd; (80, 24) when it says 0 x 0 (a new pty)."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 80, 24
    return (size.columns or 80, size.lines or 24)


class RawMode:
    """The terminal on fd in raw mode while inside; its attributes as they were afterwards,
    however the inside ends. TCSADRAIN on the way back: output already written is shown,
    keys typed meanwhile stay for the local shell."""

    def __init__(self, fd: int):
        self.fd = fd
        self.saved: Optional[list] = None

    def __enter__(self) -> "RawMode":
        self.saved = termios.tcgetattr(self.fd)
        tty.setraw(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


class WindowChanges:
    """SIGWINCH, turned into a readable fd (a self-pipe) for the relay's select: the signal
    handler only writes a byte; the relay reads the new size and tells the channel, in the
    main loop, never inside paramiko's locks."""

    def __init__(self):
        self.read_fd, self._write_fd = os.pipe()
        for fd in (self.read_fd, self._write_fd):
            os.set_blocking(fd, False)

    def notify(self, *_signal_args) -> None:
        try:
            os.write(self._write_fd, b"w")
        except OSError:
            pass   # the pipe is full: a resize is pending already

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self._write_fd)


def relay(channel, in_fd: int, out_fd: int, changes: Optional[WindowChanges] = None,
          size_of: Callable[[], tuple[int, int]] = lambda: (80, 24)) -> None:
    """Copy keys from in_fd to the channel and its output to out_fd until the channel ends
    (the remote command exited, or the connection closed). A resize noted in `changes`
    becomes channel.resize_pty with size_of()'s (columns, lines). End of input (a pipe)
    closes the channel's input side; the output goes on until the remote end."""
    watched = [channel, in_fd] + ([changes.read_fd] if changes else [])
    while True:
        try:
            ready, _, _ = select.select(watched, [], [], 1.0)
        except (OSError, ValueError):
            return   # the channel closed under select (the watchdog, the interrupt)
        if changes and changes.read_fd in ready:
            changes.drain()
            columns, lines = size_of()
            _quietly(lambda: channel.resize_pty(width=columns, height=lines))
        if in_fd in ready and not _forward_input(channel, in_fd):
            watched.remove(in_fd)
        if channel in ready or channel.closed:
            if not _forward_output(channel, out_fd):
                return


def _forward_input(channel, in_fd: int) -> bool:
    """One read of keys into the channel; False at the end of input."""
    try:
        data = os.read(in_fd, 4096)
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EINTR):
            return True
        data = b""   # EIO: the local terminal went away
    if not data:
        _quietly(channel.shutdown_write)
        return False
    _quietly(lambda: channel.sendall(data))
    return True


def _forward_output(channel, out_fd: int) -> bool:
    """What the channel has for us, written out whole; False when its output ended."""
    try:
        data = channel.recv(65536)
    except Exception:   # OSError, EOFError, paramiko's SSHException: a broken link
        return False
    if not data:
        return False
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(out_fd, view):]
        except BlockingIOError:
            select.select([], [out_fd], [], 1.0)
        except OSError:
            return True   # the local terminal went away; the remote end ends with the channel
    return True


def exit_status(channel, wait: float = STATUS_WAIT_S) -> Optional[int]:
    """The remote command's exit status; None when the channel closed without one. sshd
    may send a pty session's EOF before the status (the output drained before the shell
    was reaped): the status is waited for, and a closed channel ends the wait (paramiko
    marks its status ready with -1 then)."""
    deadline = time.monotonic() + wait
    while not channel.exit_status_ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    if channel.exit_status_ready() and channel.exit_status >= 0:
        return channel.exit_status
    return None


def interactive(channel, in_fd: int, out_fd: int) -> Optional[int]:
    """Drive `channel` (a pty already requested, its command started) from the terminal on
    in_fd/out_fd until it ends: raw mode, resizes, the terminal restored afterwards.
    Returns the remote exit status, None when the link dropped."""
    current = invocation.current()
    changes = WindowChanges()
    try:
        with current.signal_handler(signal.SIGWINCH, changes.notify), RawMode(in_fd):
            relay(channel, in_fd, out_fd, changes, lambda: terminal_size(in_fd))
    finally:
        changes.close()
    return exit_status(channel)


def open_shell(target, command: Sequence[str], venv: Optional[str], in_fd: int,
               out_fd: int, term: str) -> int:
    """`command` (none: the login shell) in target on a pty, driven from the local terminal
    on in_fd/out_fd. Returns the remote exit status; raises ConnectionLost when the link
    dropped before the remote end said it."""
    terminal = getattr(target.host, "terminal", None)
    if terminal is None:
        raise OrchError(f"{target.describe()}: orch shell cannot open a terminal through "
                        f"host {target.host.name}'s transport",
                        hint=f"`orch exec {target.name} -- CMD` runs a command there")
    if target.vmid:
        target.require_running()   # pct's own error would be one more line on the pty
    argv = target.wrap(shell_argv(command, term, venv))
    started = time.monotonic()
    with terminal(argv, term, terminal_size(in_fd)) as (channel, lost_reason):
        status = interactive(channel, in_fd, out_fd)
    if status is None:
        raise connection_lost(target.host.name, f"a shell in {target.name}",
                              time.monotonic() - started, why=lost_reason())
    return status


def _quietly(action: Callable[[], object]) -> None:
    try:
        action()
    except Exception:   # a channel whose connection broke: the loop's end tells the story
        pass
