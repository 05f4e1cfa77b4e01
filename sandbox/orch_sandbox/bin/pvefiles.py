"""`pct push` and `pct pull` the way pct.pm does them: open on the host, setns() into the
container's mount namespace, create the other end there (no symlink tricks can escape),
copy. Ownership and permissions follow pct.pm's create_file().
"""

import ctypes
import grp
import os
import pwd
import shutil

import pvelib
from pvelib import PveError

CLONE_NEWNS = 0x00020000


def enter_mount_namespace(pid):
    """Switch this (single-threaded) process into the container's mount namespace."""
    try:
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    except OSError:
        raise PveError("failed to open the container's mount namespace") from None
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNS) != 0:
        raise PveError("failed to enter the container's mount namespace")
    os.close(fd)
    try:
        os.chdir("/")
    except OSError:
        raise PveError("failed to change to container root directory") from None


def parse_perms(perms):
    """pct.pm: octal unless prefixed 0x; '0' is prepended when missing (so '644' = 0644)."""
    if perms is None:
        return None
    text = perms if perms.startswith("0") else "0" + perms
    try:
        if text.lower().startswith("0x"):
            return int(text, 16)
        return int(text, 8)
    except ValueError:
        raise PveError(f"invalid mode: '{text}'") from None


def resolve_owner(user, group):
    uid = gid = None
    if user is not None:
        try:
            uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
        except KeyError:
            raise PveError(f"failed to get uid for: {user}") from None
    if group is not None:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise PveError(f"failed to get gid for: {group}") from None
    return uid, gid


def create_file(path, perms, user, group):
    """pct.pm's create_file: new files get perms or 0666 & ~umask; existing ones keep theirs."""
    mode = parse_perms(perms)
    uid, gid = resolve_owner(user, group)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0)
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    except FileExistsError:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError as error:
            raise PveError(f"failed to create file: {path}: {error.strerror}") from None
    except OSError as error:
        raise PveError(f"failed to create file: {path}: {error.strerror}") from None
    if mode is not None:
        os.fchmod(fd, mode)
    if uid is not None or gid is not None:
        try:
            os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
        except OSError as error:
            raise PveError(f"failed to change file owner: {error.strerror}") from None
    return os.fdopen(fd, "wb")


def container_pid(vmid):
    pid = pvelib.init_pid(vmid)
    if pid is None:
        raise PveError(f"unable to get PID for CT {vmid} (not running?)")
    return pid


def push(vmid, source, destination, perms, user, group):
    pid = container_pid(vmid)
    try:
        source_file = open(source, "rb")
    except OSError:
        raise PveError(f"failed to open {source} for reading") from None
    with source_file:
        enter_mount_namespace(pid)
        with create_file(destination, perms, user, group) as target:
            shutil.copyfileobj(source_file, target, 1 << 20)


def pull(vmid, path, destination, perms, user, group):
    pid = container_pid(vmid)
    with create_file(destination, perms, user, group) as target:
        enter_mount_namespace(pid)
        try:
            source_file = open(path, "rb")
        except OSError as error:
            raise PveError(f"failed to open {path}: {error.strerror}") from None
        with source_file:
            shutil.copyfileobj(source_file, target, 1 << 20)
