"""Both ends of `orch cp` (stdlib only, Python 3.8+): a file or a tree as a framed tar stream,
with the sha256 of every file computed while it streams, on each side.

The same code runs on the controller (orchestrator/remote/transfer.py imports it) and in the
container (payloads/cp.py inlines it), so the sender of a push is the receiver of a pull.

The stream is a sequence of frames: KIND (1 byte), LENGTH (4 bytes, big-endian), DATA.
  S  first, once: {"bytes": file bytes in all, "files": n} as JSON, for progress
  T  tar bytes: one PAX tar stream (tarfile writes and parses its headers)
  M  last: the sender's {"sha256": {member name: hex}} as JSON, after the tar's end
  X  the sender's error (a file that changed while it was read): the receiver gives up
A stream without its M frame (a broken link) is never committed. On a pull the sender is
the container, untrusted: a frame out of that order is a damaged stream, S and X frames are
a few KiB, and the manifest may be no larger than the names the receiver wrote make it.

The receiver writes nothing under a final name until the manifest matched what it wrote:
a new file or tree is built under a temporary name (`.orch-cp-RANDOM`) beside its final
name and renamed there at the end; into an existing folder each file gets a temporary name
in its own folder and all are renamed at the end. On any failure the temporary names are
removed. Member names are data: absolute names, `..`, and names outside the stream's one
top entry are refused, and so is a top entry other than the one the receiver asked for (a
pull knows the name of what it pulls: the sender does not choose what is written); every
folder is opened with O_NOFOLLOW one component at a time, so a symbolic link of the tree
(or planted in a merged folder) is never followed, and the destination's own folders are
opened the same way, following a link on the way only when root or the receiver's own
account owns it. Modes: special bits (setuid, setgid, sticky) only when asked for, a pull's
files and folders under the receiving user's umask, and a folder that existed before keeps
its mode and time. The sender walks its tree the same way, by folder descriptors: a folder
swapped for a link while it is read is an error, never followed.

The receiver walks the tar itself, block by block: tarfile parses each header (next_member),
and a file's data goes from the piece it was read in to sha256 and write(2) with no copy in
between. Through `tarfile 'r|'` each byte was copied four times more (its stream's buffer,
the member's reader), in pieces larger than the CPU's cache: a 200 MB push spent 0.8 s of
CPU in the container's receiver, 0.3 s this way (tar -x: 0.25 s).
"""

import errno
import hashlib
import io
import json
import os
import secrets
import shutil
import stat
import struct
import tarfile

FRAME_HEADER = struct.Struct(">cI")
CHUNK = 256 << 10               # file data is read and hashed in pieces of this size
READ_PIECE = 64 << 10           # a receiver reads a T frame in pieces of this size
MAX_TAR_FRAME = 1 << 20         # what a receiver accepts per frame (untrusted on a pull)
MAX_SMALL_FRAME = 16 << 10      # an S or X frame (the sender cuts its error message to fit)
MAX_JSON_FRAME = 256 << 20      # a manifest: 10,000 files are about 1 MB (bounded further by
                                # the names received, manifest_limit)
MAX_MESSAGE_CHARS = 1000        # of an X frame's message
AFTER_END_BYTES = tarfile.RECORDSIZE   # tar bytes a receiver reads past the tar's end
MAX_LINKS = 40                  # symbolic links followed on the way to a destination (as Linux)
MAX_TAR_HEADER = 1 << 20        # a PAX or GNU long-name header's data
TEMP_MARK = ".orch-cp-"
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
_READ_FILE = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)   # not sparse ones
_ZERO_BLOCK = tarfile.NUL * tarfile.BLOCKSIZE
_ENCODING, _ERRORS = "utf-8", "surrogateescape"   # names are bytes, as on the sender
_LONG_HEADERS = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                 tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


class TransferError(Exception):
    """Something the user must hear about, as one sentence (kind: what went wrong)."""

    def __init__(self, message, kind="failed"):
        Exception.__init__(self, message)
        self.kind = kind


# ------------------------------------------------------------------ shared
def frame(kind, data):
    return FRAME_HEADER.pack(kind, len(data)) + data


def error_frame(error):
    message = str(error)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 3] + "..."
    return frame(b"X", json.dumps({"message": message, "kind": str(error.kind)[:64]}).encode())


def tree_digest(hashes):
    """One sha256 for a whole transfer: over every file's name and sha256, sorted by name."""
    digest = hashlib.sha256()
    for name in sorted(hashes, key=_name_bytes):
        encoded = _name_bytes(name)
        digest.update(b"%d:" % len(encoded) + encoded + b" " + hashes[name].encode() + b"\n")
    return digest.hexdigest()


def _name_bytes(name):
    return name.encode(_ENCODING, _ERRORS)


def member_parts(name):
    """The components of a member's name; TransferError for one that could leave the tree."""
    if not name or name.startswith("/") or "\0" in name:
        raise TransferError("refused a member named %r: not a relative path" % name, "unsafe-member")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise TransferError("refused a member named %r: it points outside the tree" % name,
                            "unsafe-member")
    return parts


# ------------------------------------------------------------------ sending
def source_problem(path, recursive):
    """Why path cannot be sent (a TransferError), or None."""
    try:
        info = os.stat(path)
    except OSError as error:
        return TransferError("%s: %s" % (path, error.strerror), "no-source")
    if stat.S_ISDIR(info.st_mode) and not recursive:
        return TransferError("%s is a folder (copy it with -r)" % path, "is-a-folder")
    return None


def top_name(path):
    """The name of path's top entry in its stream (both ends compute it: a pull's receiver
    refuses a stream whose top entry is another)."""
    top = os.path.basename(os.path.normpath(path))
    if top in ("", ".", ".."):
        top = os.path.basename(os.path.abspath(path)) or "root"
    return top


def walk(path):
    """(member name, path shown in messages, folder fd, name in it, lstat) of path and, for a
    folder, everything below it, in tar order. The path itself is followed (the user named
    it: its folder fd is None and its name the path); below it every folder is opened by
    its descriptor with O_NOFOLLOW, so a folder swapped for a link while the walk reads it
    is an error (`changed`), never a way elsewhere. The fds are the walk's: valid until it
    goes on."""
    info = os.stat(path)
    top = top_name(path)
    yield top, path, None, path, info
    if stat.S_ISDIR(info.st_mode):
        folder = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        for entry in _walk_opened(folder, info, top, path):
            yield entry


def _walk_opened(fd, info, member, shown):
    """Below the folder opened as fd (closed at the end), once it is the one listed."""
    try:
        _same_entry(fd, info, shown)
        for entry in _walk_below(fd, member, shown):
            yield entry
    finally:
        os.close(fd)


def _walk_below(folder, member, shown):
    with os.scandir(folder) as listing:
        entries = sorted(((entry.name, entry.stat(follow_symlinks=False)) for entry in listing),
                         key=lambda entry: entry[0])
    for name, info in entries:
        below, full = member + "/" + name, shown + "/" + name
        yield below, full, folder, name, info
        if stat.S_ISDIR(info.st_mode):
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=folder)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    raise TransferError("%s changed while it was copied (it is no folder now)"
                                        % full, "changed")
                raise OSError(error.errno, error.strerror, full)
            for entry in _walk_opened(fd, info, below, full):
                yield entry


def _same_entry(fd, info, shown):
    """The folder opened is the one listed (another swapped in between is an error)."""
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
        raise TransferError("%s changed while it was copied (another folder is there now)"
                            % shown, "changed")


def measure(path, last_bytes=None):
    """{"bytes", "files"} of what walk(path) sends (the S frame)."""
    total = files = 0
    for _, _, _, _, info in walk(path):
        if stat.S_ISREG(info.st_mode):
            total, files = total + _sent_size(info, last_bytes), files + 1
    return {"bytes": total, "files": files}


def send_frames(path, on_data=None, skipped=None, hashes=None, last_bytes=None):
    """The framed stream of path: S, T..., M (or X when a file changed under the read, or
    could not be read: the generator itself never raises, so a stream always ends).
    on_data(n) is told of every n bytes of file data; skipped gets what tar cannot carry
    here (sockets, devices, fifos), which is left out; hashes gets every file's sha256.
    last_bytes: path is one regular file, and only its last last_bytes bytes are sent (as
    `tail -c`: a log that grows meanwhile is no error, its end at the start is sent)."""
    hashes = {} if hashes is None else hashes
    out = _TarFrames()
    try:
        if last_bytes is not None and (last_bytes < 0 or not os.path.isfile(path)):
            raise TransferError("%s: a byte range is for one regular file" % path, "bad-args")
        yield frame(b"S", json.dumps(measure(path, last_bytes)).encode())
        for member, full, folder, name, info in walk(path):
            kind = stat.S_IFMT(info.st_mode)
            if kind not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
                if skipped is not None:
                    skipped.append(member)
                continue
            size = _sent_size(info, last_bytes)
            for ready in out.add(_header(member, folder, name, info, size)):
                yield ready
            if kind == stat.S_IFREG:
                digest = hashlib.sha256()
                for piece in _file_data(full, folder, name, size, info, last_bytes is None):
                    digest.update(piece)
                    if on_data:
                        on_data(len(piece))
                    for ready in out.add(piece):
                        yield ready
                for ready in out.add(tarfile.NUL * (-size % tarfile.BLOCKSIZE)):
                    yield ready
                hashes[member] = digest.hexdigest()
        for ready in out.add(tarfile.NUL * (2 * tarfile.BLOCKSIZE), flush=True):  # the end
            yield ready
    except OSError as error:
        yield error_frame(TransferError("%s: %s" % (error.filename, error.strerror), "unreadable"))
        return
    except TransferError as error:
        yield error_frame(error)
        return
    yield frame(b"M", json.dumps({"sha256": hashes}).encode())


def _sent_size(info, last_bytes):
    """How many bytes of a file the stream carries: all, or its last last_bytes."""
    if not stat.S_ISREG(info.st_mode):
        return 0
    return info.st_size if last_bytes is None else min(info.st_size, last_bytes)


class _TarFrames:
    """Tar bytes gathered into T frames of about CHUNK bytes (10,000 small headers are
    not 10,000 frames)."""

    def __init__(self):
        self._pieces, self._size = [], 0

    def add(self, piece, flush=False):
        self._pieces.append(piece)
        self._size += len(piece)
        if self._size >= CHUNK or flush:
            data, self._pieces, self._size = b"".join(self._pieces), [], 0
            for start in range(0, len(data), MAX_TAR_FRAME):
                yield frame(b"T", data[start:start + MAX_TAR_FRAME])


def _header(member, folder, name, info, size):
    entry = tarfile.TarInfo(member if not stat.S_ISDIR(info.st_mode) else member + "/")
    entry.mode = stat.S_IMODE(info.st_mode)
    entry.mtime = int(info.st_mtime)
    entry.uid = entry.gid = 0
    entry.uname = entry.gname = ""
    if stat.S_ISDIR(info.st_mode):
        entry.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(info.st_mode):
        entry.type, entry.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=folder)
    else:
        entry.size = size
    return entry.tobuf(tarfile.PAX_FORMAT, _ENCODING, _ERRORS)


def _file_data(shown, folder, name, size, info, whole=True):
    """size bytes of the file `name` in folder (None: name is the path the user named, and
    followed), its last ones (from st_size - size), in pieces; a file that shrank meanwhile
    is an error (tar's header holds its size already), and so is one that grew when the
    whole file was to be sent, and one that is no longer the regular file listed
    (O_NONBLOCK: a fifo swapped in never blocks the open)."""
    try:
        if folder is None:
            fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        else:
            fd = os.open(name, _READ_FILE, dir_fd=folder)
    except OSError as error:
        raise TransferError("cannot read %s: %s" % (shown, error.strerror), "unreadable")
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            raise TransferError("%s changed while it was copied (another file is there now)"
                                % shown, "changed")
        offset = info.st_size - size
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        left = size
        while left:
            piece = os.read(fd, min(CHUNK, left))
            if not piece:
                raise TransferError("%s shrank while it was copied" % shown, "changed")
            left -= len(piece)
            yield piece
        if whole and os.read(fd, 1):
            raise TransferError("%s grew while it was copied" % shown, "changed")
    finally:
        os.close(fd)


# ------------------------------------------------------------------ receiving
class FrameReader:
    """The tar bytes of a framed stream, read as they arrive; the S, M and X frames are kept
    aside. read_exact(n) reads the raw stream. The frames' order is checked as they come:
    one S first, T frames, M only once the tar has ended (finish), X anywhere."""

    def __init__(self, read_exact, on_size=None):
        self._read_exact = read_exact
        self._on_size = on_size
        self._piece = memoryview(b"")   # tar bytes read, from _offset
        self._offset = 0
        self._frame_left = 0            # tar bytes of the current T frame not yet read
        self._manifest_limit = None     # set by finish(): the tar has ended, M may come
        self.size = None
        self.manifest = None
        self.ended = False        # the raw stream ended (before its manifest: a broken link)

    def views(self, size):
        """The next size tar bytes, as views of the pieces they were read in (no copy)."""
        left = size
        while left:
            if self._offset >= len(self._piece) and not self._next_piece():
                raise truncated() if self.ended else damaged("the tar ends early")
            end = self._offset + min(left, len(self._piece) - self._offset)
            view = self._piece[self._offset:end]
            self._offset = end
            left -= len(view)
            yield view

    def read(self, size):
        """The next size tar bytes (a header)."""
        return b"".join(self.views(size))

    def finish(self, manifest_limit=MAX_JSON_FRAME):
        """The manifest (at most manifest_limit bytes), reading past what the tar's end
        left: at most AFTER_END_BYTES of tar bytes more."""
        self._manifest_limit = manifest_limit
        after_end = len(self._piece) - self._offset
        self._piece, self._offset = memoryview(b""), 0
        while self.manifest is None:
            if after_end > AFTER_END_BYTES:
                raise damaged("%d tar bytes after the tar's end" % after_end)
            if self._frame_left:
                if not self._next_piece():
                    raise truncated()
                after_end += len(self._piece)
                self._piece = memoryview(b"")
            elif not self._next_frame():
                raise truncated()
        return self.manifest

    def _next_piece(self):
        """Read on in the current T frame, or the next one. A frame is read READ_PIECE bytes
        at a time: each piece is hashed and written while the CPU's cache holds it."""
        while not self._frame_left:
            if self.manifest is not None or not self._next_frame():
                return False
        wanted = min(self._frame_left, READ_PIECE)
        data = self._read_exact(wanted)
        if len(data) < wanted:
            self.ended = True
            return False
        self._frame_left -= wanted
        self._piece, self._offset = memoryview(data), 0
        return True

    def _next_frame(self):
        header = self._read_exact(FRAME_HEADER.size)
        if len(header) < FRAME_HEADER.size:
            self.ended = True
            return False
        kind, length = FRAME_HEADER.unpack(header)
        self._check_frame(kind, length)
        if kind == b"T":
            self._frame_left = length
            return True
        data = self._read_exact(length)
        if len(data) < length:
            self.ended = True
            return False
        value = _json(data)
        if kind == b"X":
            raise TransferError("the sender failed: %s" % str(value.get("message"))[:MAX_MESSAGE_CHARS],
                                str(value.get("kind") or "sender-failed")[:64])
        if kind == b"S":
            self.size = value
            if self._on_size:
                self._on_size(value)
        else:
            if not isinstance(value.get("sha256"), dict):
                raise TransferError("the stream's manifest is damaged", "bad-stream")
            self.manifest = value["sha256"]
        return True

    def _check_frame(self, kind, length):
        """Each kind in its place and within its size, before its data is read."""
        if kind not in (b"S", b"T", b"M", b"X"):
            raise damaged("a frame of kind %r" % kind)
        if kind == b"S" and self.size is not None:
            raise damaged("a second S frame")
        if kind in (b"T", b"M") and self.size is None:
            raise damaged("frame %r before the stream's S frame" % kind)
        if kind == b"M" and self._manifest_limit is None:
            raise damaged("the manifest came before the tar's end")
        limit = {b"T": MAX_TAR_FRAME, b"M": self._manifest_limit}.get(kind, MAX_SMALL_FRAME)
        if length > limit:
            raise damaged("frame %r of %d bytes" % (kind, length))


def manifest_limit(hashes):
    """The largest manifest a sender of these files can send (json.dumps of {"sha256":
    hashes}, each name escaped at most 6 characters a byte): a larger one is no manifest of
    what was received, whatever it says."""
    return 64 + sum(6 * len(_name_bytes(name)) + 72 for name in hashes)


def next_member(reader):
    """The next member's TarInfo, its data not yet read; None at the tar's end (its first
    zero block). Headers are parsed by tarfile: a plain one by TarInfo.frombuf, one with
    extended headers (PAX, GNU long names) by tarfile reading those few blocks."""
    blocks, held = [], 0
    while True:
        block = reader.read(tarfile.BLOCKSIZE)
        if block == _ZERO_BLOCK and not blocks:
            return None
        try:
            info = tarfile.TarInfo.frombuf(block, _ENCODING, _ERRORS)
        except (tarfile.HeaderError, ValueError) as error:
            raise damaged(str(error) or "a header block is not one")
        blocks.append(block)
        if info.type not in _LONG_HEADERS:
            break
        if info.type == tarfile.XGLTYPE:
            raise TransferError("refused a global PAX header: orch cp's streams have none",
                                "unsupported-member")
        held += tarfile.BLOCKSIZE + info.size
        if held > MAX_TAR_HEADER:   # bounded before it is read (on a pull it is the container's)
            raise damaged("a %d-byte tar header" % held)
        blocks.append(reader.read(info.size + _padding(info.size)))
    return info if len(blocks) == 1 else _extended_member(b"".join(blocks))


def _extended_member(blocks):
    try:
        with tarfile.open(fileobj=io.BytesIO(blocks + _ZERO_BLOCK * 2), mode="r:",
                          encoding=_ENCODING, errors=_ERRORS) as tar:
            member = tar.next()
    except tarfile.TarError as error:
        raise damaged(str(error))
    if member is None:
        raise damaged("an extended header without its member")
    return member


def _skip_padding(reader, size):
    reader.read(_padding(size))


def _padding(size):
    return -size % tarfile.BLOCKSIZE


def damaged(what):
    return TransferError("the stream is damaged (%s)" % what, "bad-stream")


def truncated():
    return TransferError("the stream ended before its manifest (the link broke, or the sender "
                         "stopped): nothing was written under its final name", "truncated")


def _json(data):
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise TransferError("the stream is damaged (a frame is not a JSON object)", "bad-stream")
    return value


def destination(dest, top, top_is_dir):
    """(folder, final name) for a top entry `top` sent to dest, as cp and scp decide: into
    dest when it is a folder (or ends in /), else dest names the copy itself."""
    if dest.endswith("/") or os.path.isdir(dest):
        if not os.path.isdir(dest):
            raise TransferError("%s: no such folder" % dest, "no-folder")
        return dest, top
    folder = os.path.dirname(dest) or "."
    if not os.path.isdir(folder):
        raise TransferError("%s: no such folder (the copy's folder must exist)" % folder,
                            "no-folder")
    if top_is_dir and os.path.lexists(dest):
        raise TransferError("%s exists and is not a folder" % dest, "not-a-folder")
    return folder, os.path.basename(dest)


def open_folder(path):
    """The folder at path, opened one component at a time with O_NOFOLLOW. A symbolic link
    on the way is followed only when root or this process's own user owns it: another
    account's link (a destination folder it replaced with a link to /etc) could send the
    copy anywhere root can write; the kernel's protected_symlinks asks the same of links in
    sticky folders only."""
    fd = os.open("/" if path.startswith("/") else ".", _DIR_FLAGS)
    parts = [part for part in path.split("/") if part not in ("", ".")]
    followed, walked = 0, "/" if path.startswith("/") else ""
    try:
        while parts:
            part = parts.pop(0)
            try:
                below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(error.errno, error.strerror, os.path.join(walked, part))
                target = _trusted_link(fd, part, os.path.join(walked, part))
                followed += 1
                if followed > MAX_LINKS:
                    raise TransferError("%s: too many symbolic links on the way" % path,
                                        "unsafe-dest")
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            os.close(fd)
            fd, walked = below, os.path.join(walked, part)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _trusted_link(folder, name, shown):
    """The target of the link `name` in folder, when root or we own it."""
    info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    if not stat.S_ISLNK(info.st_mode):
        raise TransferError("%s is not a folder" % shown, "no-folder")
    if info.st_uid not in (0, os.geteuid()):
        raise TransferError("refused to write through %s: it is a symbolic link of uid %d, "
                            "another account's (name the folder it leads to, if that is "
                            "meant)" % (shown, info.st_uid), "unsafe-dest")
    return os.readlink(name, dir_fd=folder)


class Receiver:
    """Unpacks one framed stream under dest (see the module's docstring).

    top: the name the stream's top entry must have (a pull: the basename of what was asked
    for); None takes the sender's. folders: whether the top may be a folder (-r).
    umask: applied to every mode (a pull: the receiving user's); None: modes as sent.
    special: keep setuid, setgid and sticky bits (never, unless asked for)."""

    def __init__(self, dest, on_data=None, on_size=None, on_cleanup=None, top=None,
                 folders=True, umask=None, special=False):
        self.dest = dest
        self.on_data = on_data
        self.on_size = on_size
        self.on_cleanup = on_cleanup  # called once before what was staged is removed
        self.hashes = {}
        self.counts = {"files": 0, "dirs": 0, "links": 0, "bytes": 0}
        self._expected_top = top
        self._folders = folders
        self._mode_mask = (0o7777 if special else 0o7777 & ~SPECIAL_BITS) & ~(umask or 0)
        self._base = None         # fd of the folder the top entry goes into
        self._top = None          # the sender's top name
        self._final = None        # its final name
        self._temp_top = None     # the top's temporary name, while it is new
        self._folder = None       # its path
        self._merge = False       # True: the top is a folder that exists, merged into
        self._staged = []         # (fd of its folder, temporary name, final name) when merging
        self._dirs = []           # (parts, mode, mtime) of folders made: set at the end
        self._fds = {}

    def receive(self, read_exact):
        """Read the whole stream, check every sha256, then commit; returns what it wrote."""
        reader = FrameReader(read_exact, self.on_size)
        try:
            self._unpack(reader)
            manifest = reader.finish(manifest_limit(self.hashes))
            if manifest != self.hashes:
                raise TransferError(_mismatch(manifest, self.hashes), "hash-mismatch")
            self._commit()
        except BaseException:
            try:
                if self.on_cleanup:
                    self.on_cleanup()
            finally:   # also when a signal's handler raised inside on_cleanup
                self._discard()
            raise
        finally:
            self._close_fds()
        return dict(self.counts, digest=tree_digest(self.hashes),
                    path=os.path.join(self._folder, self._final))

    def _unpack(self, reader):
        member = next_member(reader)
        if member is None:
            raise TransferError("the stream held nothing", "bad-stream")
        while member is not None:
            self._member(reader, member)
            member = next_member(reader)

    def _member(self, reader, member):
        parts = member_parts(member.name)
        if self._top is None:
            self._start(parts, member)
        elif parts[0] != self._top or len(parts) == 1:
            raise TransferError("refused a member named %r: outside the tree %r"
                                % (member.name, self._top), "unsafe-member")
        inner = parts[1:]
        if member.isdir():
            self._dir(inner, member)
        elif member.type in _FILE_TYPES and member.sparse is None:
            self._file(inner, member, reader)
        elif member.issym():
            self._link(inner, member)
        else:
            raise TransferError("refused %r: orch cp carries files, folders and symbolic links "
                                "only" % member.name, "unsupported-member")

    def _start(self, parts, member):
        if len(parts) != 1:
            raise TransferError("the stream does not start with its top entry", "bad-stream")
        if self._expected_top is not None and parts[0] != self._expected_top:
            raise TransferError("refused a stream whose top entry is %r: %r was asked for "
                                "(the sender does not choose the name written)"
                                % (parts[0], self._expected_top), "unsafe-member")
        if member.isdir() and not self._folders:
            raise TransferError("refused a folder %r: a file was asked for (a folder is "
                                "copied with -r)" % parts[0], "unsafe-member")
        self._top = parts[0]
        self._folder, self._final = destination(self.dest, self._top, member.isdir())
        self._base = open_folder(self._folder)
        existing = _lstat(self._base, self._final)
        is_dir = existing is not None and stat.S_ISDIR(existing.st_mode)
        if existing is not None and is_dir != member.isdir():
            raise TransferError("%s exists and is %s" % (
                os.path.join(self._folder, self._final),
                "a folder" if is_dir else "not a folder"), "in-the-way")
        self._merge = member.isdir() and is_dir
        if not self._merge:
            self._temp_top = _temp_name()
            if member.isdir():
                os.mkdir(self._temp_top, 0o700, dir_fd=self._base)

    # -- members, by their path below the top ([] is the top itself)
    def _dir(self, inner, member):
        self.counts["dirs"] += 1
        made = not self._merge if not inner else False
        if inner:
            folder = self._folder_fd(inner[:-1])
            found = _lstat(folder, inner[-1])
            if found is None:
                os.mkdir(inner[-1], 0o700, dir_fd=folder)
                made = True
            elif not stat.S_ISDIR(found.st_mode):
                raise TransferError("%s exists and is not a folder" % "/".join(inner),
                                    "not-a-folder")
        if made:   # a folder that existed keeps its mode and time
            self._dirs.append((inner, member.mode & self._mode_mask, member.mtime))

    def _file(self, inner, member, reader):
        folder, name, staged = self._placing(inner)
        fd = os.open(name, _NEW_FILE, 0o600, dir_fd=folder)
        digest = hashlib.sha256()
        try:
            if staged:
                self._staged.append((folder, name, inner[-1]))
            for piece in reader.views(member.size):
                digest.update(piece)
                _write_all(fd, piece)
                if self.on_data:
                    self.on_data(len(piece))
            _skip_padding(reader, member.size)
            os.fchmod(fd, member.mode & self._mode_mask)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
        self.hashes[member.name] = digest.hexdigest()
        self.counts["files"] += 1
        self.counts["bytes"] += member.size

    def _link(self, inner, member):
        folder, name, staged = self._placing(inner)
        os.symlink(member.linkname, name, dir_fd=folder)
        if staged:
            self._staged.append((folder, name, inner[-1]))
        self.counts["links"] += 1

    def _placing(self, inner):
        """(folder fd, name to write, staged?) for a file or link: the top under its
        temporary name; inside a new tree its own name; inside a merged one a temporary
        name of its own, renamed at the commit."""
        if not inner:
            return self._base, self._temp_top, False
        folder = self._folder_fd(inner[:-1])
        if not self._merge:
            return folder, inner[-1], False
        found = _lstat(folder, inner[-1])
        if found is not None and stat.S_ISDIR(found.st_mode):
            raise TransferError("%s exists and is a folder" % "/".join(inner), "is-a-folder")
        return folder, _temp_name(), True

    def _folder_fd(self, inner):
        """The folder at inner below the top, opened one component at a time, never
        through a symbolic link."""
        key = tuple(inner)
        if key in self._fds:
            return self._fds[key]
        if not inner:
            top = self._final if self._merge else self._temp_top
            fd = _open_dir(self._base, top, top)
        else:
            fd = _open_dir(self._folder_fd(inner[:-1]), inner[-1], "/".join(inner))
        self._fds[key] = fd
        return fd

    # -- the end
    def _commit(self):
        for folder, temp, final in self._staged:
            os.rename(temp, final, src_dir_fd=folder, dst_dir_fd=folder)
        self._staged = []
        # deepest first, after what is in them (a folder may be read-only), each through its
        # own descriptor: fchmod, never chmod by name with follow_symlinks=False, which
        # glibc older than 2.32 cannot do (NotImplementedError, the renames above done)
        for inner, mode, mtime in sorted(self._dirs, key=lambda d: -len(d[0])):
            fd = self._folder_fd(inner)
            os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
        if not self._merge:
            _replace(self._base, self._temp_top, self._final)
            self._temp_top = None

    def _discard(self):
        for folder, temp, _ in self._staged:
            _quietly(lambda: os.unlink(temp, dir_fd=folder))
        if self._temp_top is not None and self._base is not None:
            found = _lstat(self._base, self._temp_top)
            if found is not None and stat.S_ISDIR(found.st_mode):
                _quietly(lambda: shutil.rmtree(os.path.join(self._folder, self._temp_top)))
            elif found is not None:
                _quietly(lambda: os.unlink(self._temp_top, dir_fd=self._base))

    def _close_fds(self):
        for fd in list(self._fds.values()) + ([self._base] if self._base is not None else []):
            _quietly(lambda: os.close(fd))
        self._fds = {}


def _replace(folder, temp, final):
    """rename(2) replaces a file or a link at final, never writing through it; a folder at
    final (only when a file replaces it) stays, and is an error."""
    try:
        os.rename(temp, final, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError as error:
        if error.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise TransferError("%s is in the way (a folder where a file goes, or the reverse)"
                                % final, "in-the-way")
        raise


def _open_dir(parent, name, shown):
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise TransferError("refused to write below %s: it is a symbolic link or no folder"
                                % shown, "unsafe-member")
        if error.errno == errno.ENOENT:   # a sender sends every folder before what is in it
            raise damaged("a member of %s came before the folder itself" % shown)
        raise


def _lstat(folder, name):
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _temp_name():
    return TEMP_MARK + secrets.token_hex(8)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _quietly(action):
    try:
        action()
    except OSError:
        pass


def _mismatch(expected, got):
    wrong = sorted(set(expected) ^ set(got)) or sorted(
        name for name in expected if expected[name] != got.get(name))
    return ("sha256 mismatch: %d file(s) differ from what was sent (%s); nothing was "
            "written under its final name" % (len(wrong), ", ".join(repr(n) for n in wrong[:3])))
