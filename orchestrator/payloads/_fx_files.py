"""Files of the installed tree for the fx patch payload: bytes and hashes, the wheel's
RECORD, atomic writes, the tree's lock, leftovers of a killed orch, stale bytecode.

Inlined when shipped, like _protocol.py. Standard library only, Python 3.8+.
"""

import base64
import csv
import errno
import fcntl
import hashlib
import os
import re
import signal
import stat
import tempfile
import time

from _protocol import *  # orch: inlined when shipped

KILL_BEFORE_RENAME_ENV = "ORCH_FX_PATCH_KILL_BEFORE_RENAME"
TEMP_SUFFIX = ".orch-tmp"
# write_atomic's temp files: "." + the file's name + "." + mkstemp's 8 random characters.
TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + "$")
# How long an action waits for another one's lock before it says "busy" (an apply of torch
# takes seconds; a status a fraction of one).
LOCK_WAIT_SECONDS = 15.0
LOCK_WAIT_ENV = "ORCH_FX_PATCH_LOCK_WAIT"  # tests only: a shorter wait
LOCK_POLL_SECONDS = 0.1


def read_bytes(path):
    """The file's bytes, or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def sha256_hex(data):
    return None if data is None else hashlib.sha256(data).hexdigest()


def dist_record_hash(data):
    """The hash as a wheel's RECORD writes it: sha256=<urlsafe base64, no padding>."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def dist_record_hashes(dist_info):
    """{relative path: "sha256=..."} from the dist-info RECORD ({} without one)."""
    if not dist_info:
        return {}
    try:
        with open(os.path.join(dist_info, "RECORD"), newline="", encoding="utf-8") as f:
            return {row[0]: row[1] for row in csv.reader(f) if len(row) >= 2 and row[1]}
    except OSError:
        return {}


def dist_record_verdict(relpath, data, dist_hashes):
    if data is None:
        return "missing"
    expected = dist_hashes.get(relpath)
    if expected is None:
        return "not-listed"
    return "ok" if expected == dist_record_hash(data) else "mismatch"


def fsync_directory(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, data):
    """Replace path by data so that readers see the old or the new file, never a part:
    temp file in the same directory, fsync, rename over, fsync the directory. The new
    file keeps the mode and owner of the one it replaces. (A rename also makes a new
    inode, so a hard-linked copy of a tree is never written through.)"""
    directory = os.path.dirname(path)
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    fd, temp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                                suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, stat.S_IMODE(old.st_mode) if old else 0o644)
        if old and hasattr(os, "chown") and os.geteuid() == 0:
            os.chown(temp, old.st_uid, old.st_gid)
        if os.environ.get(KILL_BEFORE_RENAME_ENV) == os.path.basename(path):
            os.kill(os.getpid(), signal.SIGKILL)  # tests only: a kill -9 at the worst moment
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    fsync_directory(directory)


def relative(path, site_packages):
    return os.path.relpath(path, site_packages).replace(os.sep, "/")


def leftover_temp_files(site_packages, record_dir):
    """The temp files a killed orch left (write_atomic's, by their name pattern) in torch/
    and the record directory, relative to site-packages."""
    found = []
    for top in (os.path.join(site_packages, "torch"), record_dir):
        for directory, _, names in os.walk(top):
            for name in names:
                path = os.path.join(directory, name)
                if TEMP_NAME.match(name) and os.path.isfile(path) \
                        and not os.path.islink(path):
                    found.append(relative(path, site_packages))
    return sorted(found)


def remove_leftover_temp_files(site_packages, record_dir):
    """Delete those temp files and nothing else (never a backup: a backup without a record
    guards nothing, but it is still someone's copy of torch's bytes). Only apply and revert
    call this, with the tree's lock held exclusively, so no running orch owns them."""
    removed = leftover_temp_files(site_packages, record_dir)
    for relpath in removed:
        os.unlink(os.path.join(site_packages, *relpath.split("/")))
    return removed


class TreeBusy(PayloadError):
    def __init__(self, site_packages, exclusive, wait):
        super().__init__(
            "another orch patch action is %s torch in %s (waited %.1fs); try again when it "
            "has finished" % ("using" if exclusive else "changing", site_packages, wait),
            "busy")


def lock_torch_tree(site_packages, exclusive):
    """A lock on the torch/ directory for the whole action (released when the process ends,
    even by kill -9). apply and revert take it exclusively: two changes never interleave,
    and no reader sees half of one. status and diff take it shared: readers never refuse
    each other. Either waits up to `wait` seconds for the other kind, then raises
    TreeBusy (kind "busy").

    Writers come first: a writer holds a gate (a lock on the site-packages folder) while it
    waits for the tree, and a reader passes the gate (shared, for a moment) before it takes
    the tree, so readers that keep arriving (an agent polling fx_tls_status) cannot keep a
    change waiting for ever; they wait for it instead."""
    wait = float(os.environ.get(LOCK_WAIT_ENV) or LOCK_WAIT_SECONDS)
    deadline = time.monotonic() + wait
    gate = os.open(site_packages, os.O_RDONLY)
    try:
        _flock_until(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline,
                     site_packages, exclusive, wait)
        fd = os.open(os.path.join(site_packages, "torch"), os.O_RDONLY)
        try:
            _flock_until(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline,
                         site_packages, exclusive, wait)
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        os.close(gate)   # the gate is held only on the way to the tree


def _flock_until(fd, mode, deadline, site_packages, exclusive, wait):
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            if time.monotonic() >= deadline:
                raise TreeBusy(site_packages, exclusive, wait) from None
        time.sleep(LOCK_POLL_SECONDS)


def remove_stale_bytecode(path):
    """Delete __pycache__/<name>.*.pyc of a source file we replaced, so no interpreter can
    pick up bytecode of the other version (pyc validation uses mtime+size, which a
    same-size edit within one second would not change)."""
    directory, name = os.path.split(path)
    cache = os.path.join(directory, "__pycache__")
    prefix = name[:-3] + "."
    try:
        entries = os.listdir(cache)
    except OSError:
        return
    for entry in entries:
        if entry.startswith(prefix) and entry.endswith(".pyc"):
            try:
                os.unlink(os.path.join(cache, entry))
            except OSError:
                pass
