"""orch cp's stream (payloads/_tarstream.py): a tree's round trip, the sha256 check, and
member names that could leave the tree, all against real files in tmp_path; the cp payload
and remote/transfer.py against this machine (a host Target on the local transport)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import random
import stat
import subprocess
import sys
import tarfile

import pytest

from orchestrator.ground.errors import BadArgument, OrchError, PayloadError
from orchestrator.payloads import _tarstream as tarstream
from orchestrator.payloads import compact_source
from orchestrator.payloads._tarstream import (MAX_TAR_FRAME, MAX_TAR_HEADER, TEMP_MARK, FrameReader, Receiver,
                                              TransferError, frame, member_parts, next_member,
                                              send_frames, tree_digest)
from orchestrator.remote import transfer
from orchestrator.remote.container import Target
from orchestrator.remote.local import LocalTransport
from tests.support.trees import leftovers, make_tree, snapshot


def stream_of(path, **kwargs):
    return io.BytesIO(b"".join(send_frames(str(path), **kwargs)))


def test_a_tree_round_trips_with_links_an_empty_folder_odd_names_modes_and_mtimes(tmp_path):
    tree = make_tree(tmp_path / "src")
    dest = tmp_path / "dest"
    dest.mkdir()
    sent = {}
    done = Receiver(str(dest)).receive(stream_of(tree, hashes=sent).read)
    assert snapshot(dest / "tree") == snapshot(tree)
    assert done["files"] == 3 and done["links"] == 2 and done["dirs"] == 3
    assert done["digest"] == tree_digest(sent) and done["path"] == str(dest / "tree")
    assert os.readlink(dest / "tree" / "outside-link") == "/etc/passwd"   # copied, not followed


def test_dest_names_the_copy_unless_it_is_a_folder(tmp_path):
    tree = make_tree(tmp_path / "src")
    Receiver(str(tmp_path / "renamed")).receive(stream_of(tree).read)
    assert snapshot(tmp_path / "renamed") == snapshot(tree)
    Receiver(str(tmp_path / "one.sh")).receive(stream_of(tree / "sub" / "run.sh").read)
    assert (tmp_path / "one.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE((tmp_path / "one.sh").stat().st_mode) == 0o751
    with pytest.raises(TransferError, match="no such folder"):
        Receiver(str(tmp_path / "missing" / "x")).receive(stream_of(tree).read)


def test_a_merge_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    tree = make_tree(tmp_path / "src")
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    dest = tmp_path / "dest" / "tree"
    dest.mkdir(parents=True)
    os.symlink(victim, dest / "secret")      # where the stream's file "secret" goes
    os.symlink(tmp_path, dest / "sub")       # where the stream's folder "sub" goes
    with pytest.raises(TransferError, match="not a folder"):
        Receiver(str(tmp_path / "dest")).receive(stream_of(tree).read)
    assert victim.read_bytes() == b"untouched" and not (tmp_path / "run.sh").exists()
    os.unlink(dest / "sub")
    Receiver(str(tmp_path / "dest")).receive(stream_of(tree).read)
    assert victim.read_bytes() == b"untouched"
    assert (dest / "secret").read_bytes() == b"k" and not (dest / "secret").is_symlink()
    assert leftovers(tmp_path) == []


def tar_stream(members, manifest=None, tar_format=tarfile.PAX_FORMAT, frame_size=MAX_TAR_FRAME):
    """A framed stream of hand-made members: (TarInfo, data or None), written by tarfile."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tar_format) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return framed(raw.getvalue(), manifest if manifest is not None else {
        info.name: hashlib.sha256(data).hexdigest() for info, data in members if info.isreg()},
        frame_size)


def framed(data, hashes, frame_size=MAX_TAR_FRAME):
    """Tar bytes as the stream's S, T..., M frames."""
    tar = b"".join(frame(b"T", data[at:at + frame_size]) for at in range(0, len(data), frame_size))
    return io.BytesIO(frame(b"S", b'{"bytes": 0, "files": 0}') + tar
                      + frame(b"M", json.dumps({"sha256": hashes}).encode()))


def entry(name, kind=tarfile.REGTYPE, data=b"", linkname=""):
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, linkname
    return info, (data if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize("name", ["/etc/evil", "top/../../evil", "../evil", "other/evil"])
def test_names_that_leave_the_tree_are_refused_and_nothing_is_left(tmp_path, name):
    dest = tmp_path / "dest"
    dest.mkdir()
    stream = tar_stream([entry("top", tarfile.DIRTYPE), entry("top/ok", data=b"1"),
                         entry(name, data=b"evil")])
    with pytest.raises(TransferError) as raised:
        Receiver(str(dest)).receive(stream.read)
    assert raised.value.kind == "unsafe-member"
    assert os.listdir(dest) == [] and not (tmp_path / "evil").exists()


def test_a_link_of_the_tree_is_never_followed_on_extraction(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    stream = tar_stream([entry("top", tarfile.DIRTYPE),
                         entry("top/escape", tarfile.SYMTYPE, linkname=str(outside)),
                         entry("top/escape/planted", data=b"evil")])
    with pytest.raises(TransferError, match="symbolic link"):
        Receiver(str(dest)).receive(stream.read)
    assert os.listdir(outside) == [] and os.listdir(dest) == []


def test_hard_links_and_devices_are_refused(tmp_path):
    stream = tar_stream([entry("top", tarfile.DIRTYPE),
                         entry("top/hard", tarfile.LNKTYPE, linkname="/etc/shadow")])
    with pytest.raises(TransferError) as raised:
        Receiver(str(tmp_path)).receive(stream.read)
    assert raised.value.kind == "unsupported-member" and os.listdir(tmp_path) == []


def test_a_sha256_mismatch_writes_nothing_under_the_final_name(tmp_path):
    stream = tar_stream([entry("big.bin", data=b"what arrived")],
                        manifest={"big.bin": hashlib.sha256(b"what was sent").hexdigest()})
    with pytest.raises(TransferError) as raised:
        Receiver(str(tmp_path)).receive(stream.read)
    assert raised.value.kind == "hash-mismatch" and os.listdir(tmp_path) == []


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.999])
def test_a_stream_cut_short_leaves_no_final_name_and_no_temporary_file(tmp_path, keep):
    source = tmp_path / "src"
    make_tree(source)
    (source / "tree" / "big").write_bytes(os.urandom(3 << 20))
    data = stream_of(source / "tree").getvalue()
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(TransferError) as raised:
        Receiver(str(dest)).receive(io.BytesIO(data[:int(len(data) * keep)]).read)
    assert raised.value.kind == "truncated" and os.listdir(dest) == []


def test_a_signal_raised_as_the_cleanup_begins_still_leaves_nothing(tmp_path):
    # the payload's SIGTERM handler raising inside on_cleanup, right after the cut stream's
    # EOF began the cleanup (seen in the sandbox: a push whose link broke, 1 run in 8)
    (tmp_path / "big").write_bytes(os.urandom(3 << 20))
    data = stream_of(tmp_path / "big").getvalue()
    dest = tmp_path / "dest"
    dest.mkdir()

    def terminated():
        raise SystemExit(143)
    with pytest.raises(SystemExit):
        Receiver(str(dest), on_cleanup=terminated).receive(io.BytesIO(data[:len(data) // 2]).read)
    assert os.listdir(dest) == []


def test_the_senders_error_stops_the_receiver(tmp_path):
    stream = io.BytesIO(frame(b"X", b'{"message": "x changed", "kind": "changed"}'))
    with pytest.raises(TransferError, match="x changed"):
        Receiver(str(tmp_path)).receive(stream.read)


def test_what_a_receiver_holds_is_bounded(tmp_path):
    huge = io.BytesIO(b"T" + (10 << 20).to_bytes(4, "big"))
    with pytest.raises(TransferError, match="damaged"):
        next_member(FrameReader(huge.read))
    info = tarfile.TarInfo("top")
    info.pax_headers = {"comment": "x" * (MAX_TAR_HEADER + 10)}
    with pytest.raises(TransferError, match="tar header"):
        Receiver(str(tmp_path)).receive(tar_stream([(info, b"")]).read)


LONG = "d" * 120 + "/" + "f" * 150


@pytest.mark.parametrize("tar_format", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_long_and_non_ascii_names_come_through_extended_headers(tmp_path, tar_format):
    """Headers beyond ustar's fields (PAX records, GNU long names), as tarfile writes them,
    in frames that split headers and data at odd places."""
    target = "t" * 150
    members = [entry("top", tarfile.DIRTYPE), entry("top/" + LONG.split("/")[0], tarfile.DIRTYPE),
               entry("top/" + LONG, data=os.urandom(70_000)),
               entry("top/grüße ü.txt", data=b"umlauts\n"),
               entry("top/link", tarfile.SYMTYPE, linkname=target)]
    Receiver(str(tmp_path)).receive(tar_stream(members, tar_format=tar_format, frame_size=700).read)
    assert (tmp_path / "top" / LONG).read_bytes() == members[2][1]
    assert (tmp_path / "top" / "grüße ü.txt").read_bytes() == b"umlauts\n"
    assert os.readlink(tmp_path / "top" / "link") == target
    assert leftovers(tmp_path) == []


def test_the_receiver_reads_what_the_sender_writes_in_any_framing(tmp_path):
    tree = make_tree(tmp_path / "src")
    (tree / LONG.split("/")[0]).mkdir()
    (tree / LONG).write_bytes(os.urandom(300_000))
    hashes = {}
    stream = b"".join(send_frames(str(tree), hashes=hashes))
    Receiver(str(tmp_path / "back")).receive(framed(_tar_bytes(stream), hashes, frame_size=4099).read)
    assert snapshot(tmp_path / "back") == snapshot(tree)


def _tar_bytes(stream):
    """The T frames' data of a framed stream, joined."""
    tar, at = [], 0
    while at < len(stream):
        kind, length = tarstream.FRAME_HEADER.unpack(stream[at:at + 5])
        if kind == b"T":
            tar.append(stream[at + 5:at + 5 + length])
        at += 5 + length
    return b"".join(tar)


def test_damaged_and_unsupported_headers_are_refused_and_leave_nothing(tmp_path):
    good = tarfile.TarInfo("top").tobuf(tarfile.USTAR_FORMAT)
    bad_checksum = good[:148] + b"0000000\0" + good[156:]
    sparse = tarfile.TarInfo("top")
    sparse.type = tarfile.GNUTYPE_SPARSE
    empty_pax = tarfile.TarInfo("././@PaxHeader")
    empty_pax.type = tarfile.XHDTYPE
    cases = {
        "bad-stream": bad_checksum + _END,
        "unsupported-member": sparse.tobuf(tarfile.GNU_FORMAT) + _END,
        "bad-stream ": empty_pax.tobuf(tarfile.USTAR_FORMAT) * (MAX_TAR_HEADER // 512 + 2),
    }
    for kind, raw in cases.items():
        with pytest.raises(TransferError) as raised:
            Receiver(str(tmp_path)).receive(framed(raw, {}).read)
        assert raised.value.kind == kind.strip(), kind
    pax = io.BytesIO()
    with tarfile.open(fileobj=pax, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": "global"}) as tar:
        tar.addfile(tarfile.TarInfo("top"), io.BytesIO(b""))
    with pytest.raises(TransferError, match="global PAX header"):
        Receiver(str(tmp_path)).receive(framed(pax.getvalue(), {"top": ""}).read)
    assert os.listdir(tmp_path) == []


_END = tarfile.NUL * (2 * tarfile.BLOCKSIZE)


def test_a_member_whose_folder_the_stream_never_sent_is_a_damaged_stream(tmp_path):
    stream = tar_stream([entry("top", tarfile.DIRTYPE), entry("top/missing/file", data=b"x")])
    with pytest.raises(TransferError, match="came before the folder") as raised:
        Receiver(str(tmp_path)).receive(stream.read)
    assert raised.value.kind == "bad-stream" and os.listdir(tmp_path) == []


def test_a_manifest_inside_a_files_data_is_a_damaged_stream(tmp_path):
    whole = tar_stream([entry("big.bin", data=os.urandom(5000))]).getvalue()
    raw = _tar_bytes(whole)[:512 + 2048]   # the header and part of the data, then M
    with pytest.raises(TransferError, match="the manifest came before the tar's end") as raised:
        Receiver(str(tmp_path)).receive(framed(raw, {}).read)
    assert raised.value.kind == "bad-stream" and os.listdir(tmp_path) == []


def test_member_parts():
    assert member_parts("top/./a//b/") == ["top", "a", "b"]
    for bad in ("", "/x", "a/../b", ".", "a\0b"):
        with pytest.raises(TransferError):
            member_parts(bad)


@pytest.mark.parametrize("now, said", [(b"1" * 20, "grew"), (b"1" * 4, "shrank")])
def test_a_file_that_changes_while_it_is_read_is_the_senders_error(tmp_path, monkeypatch, now, said):
    path = tmp_path / "changes"
    path.write_bytes(b"1" * 10)
    seen = os.stat(path)                     # the size its tar header says
    path.write_bytes(now)
    monkeypatch.setattr(tarstream, "walk", lambda _: iter([("changes", str(path), None, str(path), seen)]))
    with pytest.raises(TransferError, match=said):
        Receiver(str(tmp_path / "out")).receive(stream_of(path).read)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


# ------------------------------------------------------------------ the payload, the controller
def test_the_shipped_payload_receives_and_sends(tmp_path):
    tree = make_tree(tmp_path / "src")
    dest = tmp_path / "dest"
    dest.mkdir()
    run = subprocess.run([sys.executable, "-I", "-S", "-c", compact_source("cp"),
                          json.dumps({"action": "receive", "path": str(dest)})],
                         input=stream_of(tree).getvalue(), capture_output=True, timeout=60)
    final = json.loads(run.stdout.decode().splitlines()[-1])
    assert run.returncode == 0 and final["event"] == "result" and final["files"] == 3
    assert snapshot(dest / "tree") == snapshot(tree)
    sent = subprocess.run([sys.executable, "-I", "-S", "-c", compact_source("cp"),
                           json.dumps({"action": "send", "path": str(tree), "recursive": True})],
                          capture_output=True, timeout=60)
    Receiver(str(tmp_path / "back")).receive(io.BytesIO(sent.stdout).read)
    assert snapshot(tmp_path / "back") == snapshot(tree)


@pytest.fixture
def here():
    return Target("here", LocalTransport())


def test_push_and_pull_through_a_target(tmp_path, here):
    tree = make_tree(tmp_path / "src")
    (tmp_path / "remote").mkdir()
    pushed = transfer.push(here, str(tree), str(tmp_path / "remote") + "/", recursive=True)
    assert snapshot(tmp_path / "remote" / "tree") == snapshot(tree)
    pulled = transfer.pull(here, str(tmp_path / "remote" / "tree"), str(tmp_path / "back"),
                           recursive=True)
    assert snapshot(tmp_path / "back") == snapshot(tree)
    assert pushed["digest"] == pulled["digest"] and pushed["files"] == 3


def test_bad_sources_and_destinations_are_said_before_anything_runs(tmp_path, here):
    with pytest.raises(BadArgument, match="a folder"):
        transfer.push(here, str(tmp_path), "/tmp/x")
    with pytest.raises(BadArgument, match="No such file"):
        transfer.push(here, str(tmp_path / "none"), "/tmp/x")
    with pytest.raises(BadArgument, match="no such folder"):
        transfer.pull(here, "/etc/hostname", str(tmp_path / "no" / "x"))
    with pytest.raises(PayloadError, match="copy it with -r"):
        transfer.pull(here, str(tmp_path), str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_a_full_disk_on_a_pull_is_a_sentence_and_leaves_nothing(tmp_path, here, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device", "big.bin")
    monkeypatch.setattr(tarstream, "_write_all", full)
    source = tmp_path / "big.bin"
    source.write_bytes(b"x" * 1000)
    (tmp_path / "into").mkdir()
    with pytest.raises(OrchError, match="here: writing big.bin: No space left on device"):
        transfer.pull(here, str(source), str(tmp_path / "into") + "/")
    assert os.listdir(tmp_path / "into") == []


def test_last_bytes_sends_the_end_of_one_file_as_tail_does(tmp_path):
    log = tmp_path / "output.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)))
    (tmp_path / "dest").mkdir()
    done = Receiver(str(tmp_path / "dest" / "tail.log")).receive(
        stream_of(log, last_bytes=100).read)
    assert (tmp_path / "dest" / "tail.log").read_bytes() == log.read_bytes()[-100:]
    assert done["bytes"] == 100
    Receiver(str(tmp_path / "dest" / "all.log")).receive(stream_of(log, last_bytes=1 << 30).read)
    assert (tmp_path / "dest" / "all.log").read_bytes() == log.read_bytes()


def test_a_log_that_grows_under_a_tail_is_no_error(tmp_path):
    """The end it had when the copy began is sent; a whole copy of a growing file fails."""
    log = tmp_path / "output.log"
    log.write_bytes(os.urandom(1 << 20))
    start = log.read_bytes()
    for last_bytes, fails in ((600 << 10, False), (None, True)):
        frames = send_frames(str(log), last_bytes=last_bytes)
        pieces = [next(frames), next(frames)]     # S, then the first T: the read has begun
        with open(log, "ab") as handle:
            handle.write(b"more\n")
        pieces += list(frames)
        dest = tmp_path / f"copy-{last_bytes}"
        if fails:
            with pytest.raises(TransferError, match="grew while it was copied"):
                Receiver(str(dest)).receive(io.BytesIO(b"".join(pieces)).read)
        else:
            Receiver(str(dest)).receive(io.BytesIO(b"".join(pieces)).read)
            assert dest.read_bytes() == start[-(600 << 10):]
        log.write_bytes(start)


def test_last_bytes_is_for_one_regular_file(tmp_path):
    tree = make_tree(tmp_path / "src")
    with pytest.raises(TransferError, match="a byte range is for one regular file"):
        Receiver(str(tmp_path / "x")).receive(stream_of(tree, last_bytes=10).read)


def test_a_damaged_stream_is_always_a_transfer_error_and_leaves_nothing(tmp_path):
    """A pull's stream is the container's: whatever byte of it is wrong, the receiver says
    so as a TransferError (or, for a byte nothing reads, receives what was sent), never
    another exception, and never leaves a temporary file. Half the damage falls in the tar
    headers (found by their ustar magic), the rest anywhere."""
    tree = make_tree(tmp_path / "src")
    (tree / LONG.split("/")[0]).mkdir()
    (tree / LONG).write_bytes(os.urandom(3000))
    stream = stream_of(tree).getvalue()
    headers = [at - 257 for at in range(len(stream)) if stream.startswith(b"ustar", at)]
    chance = random.Random(30)
    for trial in range(300):
        damaged = bytearray(stream)
        for _ in range(chance.choice((1, 1, 2, 8))):
            at = (chance.choice(headers) + chance.randrange(512) if chance.random() < 0.5
                  else chance.randrange(len(damaged)))
            damaged[at] = chance.randrange(256)
        if chance.random() < 0.2:
            damaged = damaged[:chance.randrange(len(damaged))]
        dest = tmp_path / f"dest-{trial}"
        dest.mkdir()
        try:
            Receiver(str(dest)).receive(io.BytesIO(bytes(damaged)).read)
        except TransferError:
            assert os.listdir(dest) == [], trial
        assert leftovers(dest) == [], trial
