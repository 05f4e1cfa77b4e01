"""Folder trees for copy tests: one with every kind of entry, a snapshot to compare,
and what a failed copy left behind."""

from __future__ import annotations

import hashlib
import os
import stat

from orchestrator.payloads._tarstream import TEMP_MARK


ODD_NAME = "a name with spaces\nand a newline"


def make_tree(root):
    tree = root / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "empty").mkdir()
    (tree / ODD_NAME).write_bytes(b"odd\n")
    script = tree / "sub" / "run.sh"
    script.write_bytes(b"#!/bin/sh\necho hi\n")
    script.chmod(0o751)
    (tree / "secret").write_bytes(b"k")
    (tree / "secret").chmod(0o600)
    os.symlink("sub/run.sh", tree / "link")
    os.symlink("/etc/passwd", tree / "outside-link")
    os.utime(tree / ODD_NAME, (1_600_000_000, 1_600_000_000))
    os.utime(tree / "empty", (1_500_000_000, 1_500_000_000))
    (tree / "sub").chmod(0o750)
    return tree


def snapshot(root):
    """Every entry below root: kind, mode, mtime (not for links), content or link target."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", stat.S_IMODE(info.st_mode), int(info.st_mtime))
            else:
                found[rel] = ("file", stat.S_IMODE(info.st_mode), int(info.st_mtime),
                              hashlib.sha256(open(path, "rb").read()).hexdigest())
    return found


def leftovers(folder):
    return [name for _, dirs, files in os.walk(folder) for name in dirs + files
            if name.startswith(TEMP_MARK)]
