"""Run a command as the leader of its own process group, and kill that group when orch
stops listening: the SSH channel closed (orch's --timeout, Ctrl-C, a lost connection), or
when the command outlives its own wall-clock limit.

    python3 -c SOURCE [--in-python] [--limit=SECONDS] ARGV...   (stdin, stdout, stderr: the command's own)

--limit: the group is killed after SECONDS (0: no limit) even while the channel stays open
(a link that died without closing, a controller that hangs), and the exit status is 124, as
timeout(1) gives. orch sets it a little past its own timeout, which normally comes first.
--in-python: ARGV is `python3 - ARGS`, run in the forked child by this interpreter (_inproc).

How it notices: closing a channel makes sshd close its end of the command's stdout and
stderr pipes; poll() then reports POLLERR/POLLHUP on our end without anything written.
A command that detaches itself (setsid, as orch's launcher does) is in another group and
survives, on purpose. Exit status: the command's, or 128+N when signal N ended it.
stdlib only, Python 3.8+.
"""

import os
import select
import stat
import sys
import time

try:
    # signal's C module, without the enum wrappers of `signal` (importing enum is ~3 ms of
    # every reaped command); same functions, plain int constants
    import _signal as signal
except ImportError:  # a Python without it
    import signal

from _environ import *  # orch: inlined when shipped
from _inproc import *  # orch: inlined when shipped

HANG_UP = select.POLLERR | select.POLLHUP


def start(argv, in_python=False):
    env = start_environment()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        # Python ignores SIGPIPE and SIGXFSZ for itself, and an ignored signal stays ignored
        # across exec: the command gets the defaults, as subprocess's restore_signals does
        for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT,
                       signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(number, signal.SIG_DFL)
        os.setpgid(0, 0)
        if in_python:
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)   # as a new python3 has them
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            run_here(argv, env)
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as error:
            sys.stderr.write("%s: %s\n" % (argv[0], error.strerror))
            os._exit(127 if isinstance(error, FileNotFoundError) else 126)
    try:
        os.setpgid(pid, pid)  # also here: whichever of the two runs first makes the group
    except OSError:
        pass
    return pid


def watched_pipes():
    """stdout/stderr when they are pipes or sockets: only those report a closed reader."""
    fds = []
    for fd in (1, 2):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            fds.append(fd)
    return fds


def code_of(status):
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def kill_group(pid):
    for number, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0)):
        try:
            os.killpg(pid, number)
        except OSError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            time.sleep(0.02)


LIMIT = "--limit="
TIMED_OUT = 124


def split_limit(argv):
    """(seconds or None, the command's argv)."""
    if argv and argv[0].startswith(LIMIT):
        try:
            seconds = float(argv[0][len(LIMIT):])
        except ValueError:
            seconds = 0
        return (seconds if seconds > 0 else None), argv[1:]
    return None, argv


def main(argv):
    # before --limit, which orch always sends: a command named --in-python stays one
    in_python = bool(argv) and argv[0] == IN_PYTHON
    if in_python:
        argv = argv[1:]
    limit, argv = split_limit(argv)
    in_python = in_python and runs_here(argv)
    if not argv:
        sys.stderr.write("reaper: no command\n")
        return 2
    deadline = None if limit is None else time.monotonic() + limit
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    stop = []
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, lambda number, _frame: stop.append(number))
    pid = start(argv, in_python)
    poller = select.poll()
    poller.register(wake_read, select.POLLIN)
    for fd in watched_pipes():
        poller.register(fd, 0)  # no events asked: only errors and hang-ups are reported
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return code_of(status)
        if stop:
            kill_group(pid)
            return 128 + stop[0]
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            kill_group(pid)
            sys.stderr.write("orch: %s ran past its limit of %g s and was killed\n" % (argv[0], limit))
            return TIMED_OUT
        for fd, events in poller.poll(None if left is None else max(1, int(left * 1000) + 1)):
            if fd == wake_read:
                os.read(wake_read, 512)
            elif events & HANG_UP:
                kill_group(pid)
                return 128 + signal.SIGHUP


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
