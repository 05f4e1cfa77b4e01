"""Where orch keeps its state in a container, and how a payload makes sure nobody else can
touch it (stdlib only; shared by payloads and imported by the controller for STATE_DIR).

Payloads run as root in containers other accounts may share. A folder in /tmp or /var/tmp
with a fixed name can be created first by any of them: root then runs their wheel, writes
through their symlink, or signals the pid their pid.json names. So orch's state lives in
STATE_DIR, a folder owned by root with mode 0700, and every folder a payload writes into is
opened one component at a time from `/` with O_NOFOLLOW and checked: no symlink, owned by
root (or this uid), not writable by group or others unless it is sticky (/tmp, /var/tmp) and
the next component is ours. The folder a payload writes into is made 0700; folders made on
the way to it (a container without /var/lib) are 0755, as `mkdir -p` makes them.
"""

import errno
import os
import stat

STATE_DIR = "/var/lib/orch"   # orch's own folder in every container (root, 0700)
USER_STATE_DIR = "~/.local/state/orch"   # the same for a host target reached as another account

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


class UnsafePath(Exception):
    """A folder orch must not use: a symlink, someone else's, or writable by others."""


def secure_dir(path, create=True, private=False):
    """Check (and with create, make) the folder `path`; returns it, or None when it is
    missing and create is False. private: the folder itself is made (or must be) 0700.
    Raises UnsafePath saying which component is wrong and why."""
    if not os.path.isabs(path):
        raise UnsafePath("%s: orch's folders in a container are absolute paths" % path)
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise UnsafePath("%s: '.' and '..' are not allowed in orch's folders" % path)
    fd = os.open("/", _DIR_FLAGS)
    try:
        where = "/"
        sticky = _check(fd, where, last=not parts, private=private)
        for index, part in enumerate(parts):
            where = "/" + "/".join(parts[:index + 1])
            last = index == len(parts) - 1
            child = _open_child(fd, part, where, create, 0o700 if last and private else 0o755)
            if child is None:
                return None
            os.close(fd)
            fd = child
            sticky = _check(fd, where, last=last, private=private, after_sticky=sticky)
        return path
    finally:
        os.close(fd)


def payload_folder(path, create):
    """The folder a payload works in (a run folder, a wheelhouse), checked; made 0700 when
    create. One under STATE_DIR makes STATE_DIR root's 0700 folder first. None when it is
    missing and create is False."""
    if path.startswith(STATE_DIR.rstrip("/") + "/"):
        if secure_dir(STATE_DIR, create=create, private=True) is None:
            return None
    return secure_dir(path, create=create, private=create)


def _open_child(parent, name, where, create, mode):
    for _ in range(2):  # a folder made by someone else between our open and mkdir: look again
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as error:
            # O_DIRECTORY | O_NOFOLLOW on a link: ENOTDIR on Linux, ELOOP elsewhere
            if error.errno not in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
                raise
            if stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
                raise UnsafePath("%s is a symlink: orch does not follow links in its folders "
                                 "(someone may be redirecting root's writes)" % where)
            raise UnsafePath("%s is not a folder" % where)
        try:
            os.mkdir(name, mode, dir_fd=parent)
        except FileExistsError:
            pass
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _check(fd, where, last, private, after_sticky=False):
    """Raise unless the open folder fd can be trusted; returns whether it is sticky (then
    its child must be ours, checked one step further)."""
    info = os.fstat(fd)
    mine = os.geteuid()
    if info.st_uid not in (0, mine):
        raise UnsafePath("%s belongs to uid %d, not to root: another account made it, and orch "
                         "will not use it (remove it, or move it away, as root)"
                         % (where, info.st_uid))
    if after_sticky and info.st_uid != mine:
        raise UnsafePath("%s, in a world-writable folder, is not this account's (uid %d)"
                         % (where, info.st_uid))
    if private and last and info.st_uid == mine and stat.S_IMODE(info.st_mode) != 0o700:
        os.fchmod(fd, 0o700)   # ours: an earlier orch made it 0755
        info = os.fstat(fd)
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if private and last and info.st_mode & 0o077:
        raise UnsafePath("%s must be mode 0700, it is %o" % (where, stat.S_IMODE(info.st_mode)))
    sticky = bool(info.st_mode & stat.S_ISVTX)
    if writable and (last or not sticky):
        raise UnsafePath("%s is writable by other accounts (mode %o): orch will not keep "
                         "root's files there" % (where, stat.S_IMODE(info.st_mode)))
    return bool(writable and sticky)


def open_new(folder, name, mode=0o600):
    """A new file in a checked folder under a name nobody can guess, created exclusively
    and never through a link; returns (fd, path)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        path = os.path.join(folder, ".%s.%s.part" % (name, os.urandom(6).hex()))
        try:
            return os.open(path, flags, mode), path
        except FileExistsError:
            continue
    raise UnsafePath("%s: cannot make a temporary file" % folder)
