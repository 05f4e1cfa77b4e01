"""Make torch's FX tracing flag thread-local in an installed torch: status, diff, apply, revert.

Shipped alone into a container and run with the container's python; standard library
only, Python 3.8+. It never imports torch itself: the post-apply check imports it in a
subprocess, so a broken torch cannot take the patcher down half-way.

Why: torch releases 2.1 to 2.13 keep ``_is_fx_tracing_flag`` as a module global in
torch/fx/_symbolic_trace.py, so while one thread runs ``symbolic_trace``/``make_fx``,
every other thread's ``torch.compile``d call raises "Detected that you are using FX to
symbolically trace a dynamo-optimized function". Upstream fixed it in 2.14 (pytorch PR
168999) with ``_is_fx_tracing_tls = threading.local()`` and helpers; this patch backports
that shape with the same helper names.

Protocol
--------
Invocation: ``PYTHON - ARGS_JSON`` with this file on stdin, or ``PYTHON fx_patch.py
ARGS_JSON``. ARGS_JSON is one argv element holding a JSON object; unknown keys are an
error::

    {"action": "status" | "diff" | "apply" | "revert",   # required
     "orch_version": "0.1.0",        # written into the record and the file headers
     "record_dir": "/path"}          # default <site-packages>/.orch-fx-tls

Output: JSON lines on stdout; the last line is the result (exit code 0) or an error
(exit code 1): ``{"event": "error", "message": "...", "kind": "..."}`` with kind
"bad-args", "not-installed", "unknown-shape", "refused", "write-failed",
"import-check-failed", "bad-record" or "internal". Every result has::

    {"event": "result", "action": ..., "status": ..., "changed": bool, "message": "...",
     "torch_version": "2.13.0+cpu", "site_packages": "...", "record_dir": "...",
     "files": [...], "record": {...} | null, "removed_temp_files": [...]}

``torch_version`` is ``torch.__version__`` as torch/version.py spells it (read, not
imported), the same string ``fx_race`` reports; the dist-info's Version without that file.

``status`` is the state after the action:

- "vulnerable": the module-level global flag, in a shape this patcher recognises;
  ``files`` lists what apply would change.
- "fixed-upstream": torch >= 2.14's thread-local helpers, not written by orch.
- "patched": orch's record exists and every file matches its recorded after-hash;
  ``record`` says when, which orch version, which torch version.
- "drifted": the record says patched but files changed since (torch reinstalled, an
  interrupted apply, hand edits); per file ``state`` says which.
- "unknown": a shape this patcher does not recognise (``message`` says what): it refuses
  to touch anything.

File entries: ``{"path": "torch/fx/_symbolic_trace.py", "sha256": ..., "dist_record":
"ok" | "mismatch" | "not-listed" | "missing"}`` (``dist_record`` compares with the
dist-info RECORD: "ok" means pristine as pip installed it); with a record also
``"state": "patched" | "original" | "changed" | "missing"``; when vulnerable also
``"why"``: why apply changes that file. Action specifics:

- every action first takes an exclusive lock on torch/ (another running action makes it
  fail with kind "refused") and removes what a killed orch left: its temp files
  (``.NAME.XXXXXXXX.orch-tmp``) in torch/ and the record directory, and backups without a
  record (``removed_temp_files`` lists them).
- status: changes nothing else.
- diff: adds ``"diff"``: the unified diff apply would write ("" unless vulnerable).
- apply: only from "vulnerable"; "patched" and "fixed-upstream" are no-ops
  (changed=false); anything else is an error. Adds ``"import_check"``.
- revert: restores orch's backups (byte-exact) for files that still hold orch's patch;
  ``files`` entries get ``"action": "restored" | "already-original" | "left-alone"`` and
  the dist_record verdict of the bytes now on disk. The record is removed unless a file
  was left alone. Without a record: changed=false.

The record directory (default ``<site-packages>/.orch-fx-tls/``) holds ``record.json``
and ``backups/<path>.orig``. It sits beside torch/, not in it, so searches of torch/ do
not show the backups and the record survives a reinstall of torch, which is how
"drifted" is seen.

What apply changes (found by parsing, never by line numbers; any shape it does not
expect makes the whole patch "unknown"). The shapes of torch 2.1 to 2.13 (docs/torch-
releases.md): the guard is ``is_fx_tracing()`` (all) and ``is_fx_symbolic_tracing()``
(2.9 on); the other users are in _higher_order_ops/cond.py (2.2) or utils.py (2.3 on):

- torch/fx/_symbolic_trace.py: the module-level ``_is_fx_tracing_flag = False`` becomes
  ``_is_fx_tracing_tls = threading.local()`` plus ``_get_is_fx_tracing()``,
  ``_set_is_fx_tracing(value)``, ``_is_fx_tracing_context(value)`` and a module class
  whose ``_is_fx_tracing_flag`` property reads/writes the calling thread's flag (so
  ``torch.fx._symbolic_trace._is_fx_tracing_flag`` keeps working for code outside
  torch); every read of the global becomes ``_get_is_fx_tracing()``, every
  ``global``-declared write ``_set_is_fx_tracing(...)`` (``Tracer.trace`` save/set/
  restore, ``is_fx_tracing``, and ``is_fx_symbolic_tracing`` where it exists).
- every other torch/**/*.py that reads or writes ``<...>._symbolic_trace.
  _is_fx_tracing_flag`` (found by searching the installed tree; in 2.13:
  torch/_higher_order_ops/utils.py) is rewritten to the helpers.
- torch/utils/checkpoint.py, although it never names the flag before 2.14: a backport
  of 2.14's recompute handling. With a per-thread flag, the non-reentrant checkpoint's
  recompute, which may run on an autograd worker thread, would see that thread's own
  (false) flag where the global flag showed the forward's; so the flag is captured at
  forward time and restored around the recompute (a context manager added to the
  recompute's ``with``, in whatever layout that statement has). status and diff say so.

Each changed file gets a header comment naming orch and its version. Apply computes and
compiles every new file before writing any; writes each atomically (temp file, fsync,
rename, fsync of the directory) after backing up the originals; removes stale
__pycache__ entries; then imports torch in a subprocess with the same python and checks
that threads see separate flags, that the attribute still works and that Dynamo's trace
rules still name valid functions. If a write or that check fails, every file is restored
from the originals. Internal switches, never set by orch's commands:
``ORCH_FX_PATCH_FAIL_AFTER=N`` (tests) makes apply fail after writing N files;
``ORCH_FX_PATCH_KILL_BEFORE_RENAME=NAME`` (tests) kills apply with SIGKILL just before
it renames the temp file of NAME into place; ``ORCH_FX_PATCH_SOURCE_TREE=1`` (the
release matrix, scripts/torch-matrix.py) skips the import of the patched torch, and is
refused before any write on a torch that has compiled parts, where the import can run;
the result then says the import was not checked.
"""

import ast
import base64
import csv
import datetime
import difflib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile

from _protocol import *  # orch: inlined when shipped
from _locate import *  # orch: inlined when shipped

ARG_SPEC = {
    "action": (str, REQUIRED),
    "orch_version": (str, "unknown"),
    "record_dir": (str, None),
}
ACTIONS = ("status", "diff", "apply", "revert")

SYMBOLIC_TRACE = "torch/fx/_symbolic_trace.py"
CHECKPOINT = "torch/utils/checkpoint.py"
FLAG = "_is_fx_tracing_flag"
TLS = "_is_fx_tracing_tls"
HELPERS = ("_get_is_fx_tracing", "_set_is_fx_tracing", "_is_fx_tracing_context")
MODULE_CLASS = "_ThreadLocalFxTracingFlagModule"
GUARDS = ("is_fx_tracing", "is_fx_symbolic_tracing")  # the second only since torch 2.9
MARKER = b"# orch fx-tls patch"
RECORD_DIR_NAME = ".orch-fx-tls"
RECORD_FILE = "record.json"
FAIL_AFTER_ENV = "ORCH_FX_PATCH_FAIL_AFTER"
SOURCE_TREE_ENV = "ORCH_FX_PATCH_SOURCE_TREE"
KILL_BEFORE_RENAME_ENV = "ORCH_FX_PATCH_KILL_BEFORE_RENAME"
TEMP_SUFFIX = ".orch-tmp"
# write_atomic's temp files: "." + the file's name + "." + mkstemp's 8 random characters.
TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + "$")
IMPORT_CHECK_TIMEOUT = 600
# Modules that use the flag's functions by name: imported by the check after apply.
NAME_USERS = ("torch.nested", "torch.export.unflatten", "torch._dynamo.variables.torch",
              "torch._dynamo.trace_rules")


class UnknownShape(PayloadError):
    def __init__(self, relpath, reason):
        super().__init__("%s: %s" % (relpath, reason), "unknown-shape")


# --- bytes and hashes -----------------------------------------------------------------------


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


def remove_leftover_temp_files(site_packages, record_dir):
    """Delete the temp files a killed orch left (write_atomic's, by their name pattern)
    in torch/ and the record directory; nothing else. Returns them, relative to
    site-packages. Only called with the tree's lock held, so no running orch owns them."""
    removed = []
    for top in (os.path.join(site_packages, "torch"), record_dir):
        for directory, _, names in os.walk(top):
            for name in names:
                path = os.path.join(directory, name)
                if TEMP_NAME.match(name) and os.path.isfile(path) \
                        and not os.path.islink(path):
                    os.unlink(path)
                    removed.append(os.path.relpath(path, site_packages).replace(os.sep, "/"))
    # Backups without a record: apply was killed before it recorded anything, and it
    # records before it writes any torch file, so these copies guard nothing.
    backups = os.path.join(record_dir, "backups")
    if os.path.isdir(backups) and not os.path.exists(record_path(record_dir)):
        shutil.rmtree(backups)
        removed.append(os.path.relpath(backups, site_packages).replace(os.sep, "/") + "/")
        try:
            os.rmdir(record_dir)
        except OSError:
            pass  # not empty: something else lives there
    return sorted(removed)


def lock_torch_tree(site_packages):
    """An exclusive lock on the torch/ directory for the whole action (released when the
    process ends, even by kill -9): two orch actions on one torch never interleave."""
    fd = os.open(os.path.join(site_packages, "torch"), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise PayloadError("another orch fx-tls action is running on %s; try again when it "
                           "has finished" % site_packages, "refused") from None
    return fd


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


# --- editing source by syntax-tree positions -----------------------------------------------


def first_lines(data, count):
    return b"\n".join(data.split(b"\n", count)[:count])


class Source:
    """A file's bytes and syntax tree; edits are byte ranges found from node positions, so
    every byte outside them stays as it was."""

    def __init__(self, relpath, data):
        self.relpath = relpath
        self.data = data
        if b"\r" in data:
            raise UnknownShape(relpath, "has carriage returns; only \\n line endings are handled")
        cookie = re.search(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", first_lines(data, 2),
                           re.MULTILINE)
        if cookie and cookie.group(1).lower().replace(b"_", b"-") not in (b"utf-8", b"utf8"):
            raise UnknownShape(relpath, "declares a non-UTF-8 source encoding")
        try:
            self.tree = ast.parse(data, filename=relpath)
        except (SyntaxError, ValueError) as exc:
            raise UnknownShape(relpath, "does not parse with Python %s (%s)"
                               % (platform.python_version(), exc)) from None
        self.line_starts = [0] + [m.end() for m in re.finditer(b"\n", data)]
        self.parents = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.edits = []

    # ast columns are UTF-8 byte offsets within the line, which is what we index.
    def offset(self, lineno, col):
        return self.line_starts[lineno - 1] + col

    def start(self, node):
        return self.offset(node.lineno, node.col_offset)

    def end(self, node):
        return self.offset(node.end_lineno, node.end_col_offset)

    def text(self, node):
        return self.data[self.start(node):self.end(node)]

    def first_line(self, node):
        """The first line of a statement, counting its decorators."""
        return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])

    def own_lines(self, node):
        """(start, end) byte range of the whole lines a statement occupies, the newline
        included; raises when something else shares those lines."""
        start = self.offset(self.first_line(node), 0)
        end_line_end = self.data.find(b"\n", self.end(node))
        end = len(self.data) if end_line_end < 0 else end_line_end + 1
        before = self.data[start:start + node.col_offset]  # decorators share the column
        after = self.data[self.end(node):end]
        if before.strip() or not re.match(rb"^[ \t]*(#[^\n]*)?\n?$", after):
            raise UnknownShape(self.relpath, "line %d holds more than one statement" % node.lineno)
        return start, end

    def indentation(self, node):
        return self.data[self.offset(node.lineno, 0):self.start(node)]

    def replace(self, start, end, new):
        self.edits.append((start, end, new))

    def insert(self, at, new):
        self.edits.append((at, at, new))

    def edited(self):
        pieces, cursor = [], 0
        # sorted() is stable: insertions at one offset keep the order they were made in.
        for start, end, new in sorted(self.edits, key=lambda edit: (edit[0], edit[1])):
            if start < cursor:
                raise UnknownShape(self.relpath, "two edits overlap")
            pieces += [self.data[cursor:start], new]
            cursor = end
        pieces.append(self.data[cursor:])
        return b"".join(pieces)


def enclosing_scope(src, node):
    """The innermost function, lambda or class around node, or the module."""
    parent = src.parents.get(node)
    while parent is not None and not isinstance(
            parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        parent = src.parents.get(parent)
    return parent or src.tree


def declares_global(function, name):
    return any(isinstance(node, ast.Global) and name in node.names
               for node in ast.walk(function))


def module_function(tree, name):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def module_class(tree, name):
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def module_level_names(tree):
    """Names bound directly in the module body by def, class or assignment."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def is_flag_name(node):
    return isinstance(node, ast.Name) and node.id == FLAG


def single_name_assignment(node, name):
    """True for `name = value` and `name: T = value` (one target, nothing chained)."""
    if isinstance(node, ast.Assign):
        return len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
            and node.targets[0].id == name
    return isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
        and node.target.id == name and node.value is not None


def header_line(orch_version):
    return ("# orch fx-tls patch (orch %s): _is_fx_tracing_flag is thread-local; "
            "`orch patch fx-tls revert` restores the original.\n" % orch_version).encode()


def add_header(src, orch_version):
    """The marker comment goes first, after a shebang or encoding line if there is one."""
    at = 0
    for _ in range(2):
        line_end = src.data.find(b"\n", at)
        line = src.data[at:line_end if line_end >= 0 else len(src.data)]
        if not (line.startswith(b"#!") or re.match(rb"^[ \t\f]*#.*?coding[:=]", line)):
            break
        at = line_end + 1
    src.insert(at, header_line(orch_version))


def ensure_module_import(src, module):
    """Add `import module` among the leading top-level imports, in alphabetical place,
    unless the module already imports it that way."""
    imports = []
    for node in src.tree.body:
        if isinstance(node, ast.Import):
            if any(alias.name == module and alias.asname is None for alias in node.names):
                return
            imports.append(node)
        elif isinstance(node, ast.ImportFrom) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue  # from-imports and the docstring may sit between the plain imports
        else:
            break
    if not imports:
        raise UnknownShape(src.relpath, "has no top-level import block to add `import %s` to"
                           % module)
    before = [node for node in imports if node.names[0].name < module]
    if before:
        src.insert(src.own_lines(before[-1])[1], b"import " + module.encode() + b"\n")
    else:
        src.insert(src.own_lines(imports[0])[0], b"import " + module.encode() + b"\n")


# --- the three transformations ---------------------------------------------------------------


TLS_BLOCK = '''\
# orch fx-tls: the FX tracing flag is per thread (backport of torch 2.14's helpers,
# pytorch PR 168999), so one thread's symbolic_trace no longer makes another
# thread's torch.compile'd calls fail.
_is_fx_tracing_tls = threading.local()


def _set_is_fx_tracing(value: bool) -> None:
    _is_fx_tracing_tls.flag = value


def _get_is_fx_tracing() -> bool:
    return getattr(_is_fx_tracing_tls, "flag", False)


@contextlib.contextmanager
def _is_fx_tracing_context(value: bool):
    previous = _get_is_fx_tracing()
    _set_is_fx_tracing(value)
    try:
        yield
    finally:
        _set_is_fx_tracing(previous)


class _ThreadLocalFxTracingFlagModule(type(sys.modules[__name__])):
    """Keeps `torch.fx._symbolic_trace._is_fx_tracing_flag` readable and writable as a
    module attribute for code outside torch: it is the calling thread's flag."""

    @property
    def _is_fx_tracing_flag(self) -> bool:
        return _get_is_fx_tracing()

    @_is_fx_tracing_flag.setter
    def _is_fx_tracing_flag(self, value: bool) -> None:
        _set_is_fx_tracing(value)


sys.modules[__name__].__class__ = _ThreadLocalFxTracingFlagModule
'''.encode()


def expect_symbolic_trace_shape(src):
    """Refuse unless the module has the pieces docs/torch-releases.md describes, in the expected form."""
    relpath, tree = src.relpath, src.tree
    taken = module_level_names(tree) & set((TLS, MODULE_CLASS) + HELPERS)
    if taken:
        raise UnknownShape(relpath, "already defines %s" % ", ".join(sorted(taken)))
    # Dynamo's guard calls is_fx_tracing() before 2.9 and is_fx_symbolic_tracing() (which
    # 2.9 added) since; both read the same global, so each that exists must read it.
    guards = [module_function(tree, name) for name in GUARDS]
    if guards[0] is None:
        raise UnknownShape(relpath, "no module-level is_fx_tracing()")
    for name, function in zip(GUARDS, guards):
        if function is not None and not any(is_flag_name(n) for n in ast.walk(function)):
            raise UnknownShape(relpath, "%s() does not read %s" % (name, FLAG))
    tracer = module_class(tree, "Tracer")
    trace = tracer and next((n for n in tracer.body if isinstance(n, ast.FunctionDef)
                             and n.name == "trace"), None)
    if trace is None or not declares_global(trace, FLAG):
        raise UnknownShape(relpath, "no Tracer.trace() with `global %s`" % FLAG)
    sets_true = any(single_name_assignment(n, FLAG) and isinstance(n.value, ast.Constant)
                    and n.value.value is True for n in ast.walk(trace))
    restores = any(isinstance(n, ast.Try) and any(single_name_assignment(s, FLAG)
                                                  for s in n.finalbody)
                   for n in ast.walk(trace))
    if not (sets_true and restores):
        raise UnknownShape(relpath, "Tracer.trace() does not set %s to True and restore it "
                           "in a finally block" % FLAG)


def patch_symbolic_trace(src):
    """Module flag -> thread-local holder + helpers; every use -> the helpers. Returns True
    (it always changes the file or raises)."""
    expect_symbolic_trace_shape(src)
    module_assignments = [n for n in src.tree.body if single_name_assignment(n, FLAG)]
    if len(module_assignments) != 1 or not (
            isinstance(module_assignments[0].value, ast.Constant)
            and module_assignments[0].value.value is False):
        raise UnknownShape(src.relpath, "expected exactly one module-level `%s = False`" % FLAG)
    declaration = module_assignments[0]
    if declaration.col_offset != 0:
        raise UnknownShape(src.relpath, "the module-level %s is indented" % FLAG)
    start, end = src.own_lines(declaration)
    src.replace(start, end, TLS_BLOCK)
    handled = {declaration.targets[0] if isinstance(declaration, ast.Assign)
               else declaration.target}
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Global) and FLAG in node.names:
            if node.names != [FLAG]:
                raise UnknownShape(src.relpath, "line %d declares more globals than %s"
                                   % (node.lineno, FLAG))
            src.replace(*src.own_lines(node), b"")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node is not declaration and \
                any(is_flag_name(n) for n in ast.walk(node.targets[0] if isinstance(
                    node, ast.Assign) else node.target)):
            handled.add(rewrite_global_write(src, node))
        elif isinstance(node, ast.Nonlocal) and FLAG in node.names:
            raise UnknownShape(src.relpath, "line %d: nonlocal %s" % (node.lineno, FLAG))
        elif isinstance(node, ast.arg) and node.arg == FLAG:
            raise UnknownShape(src.relpath, "line %d: a parameter named %s" % (node.lineno, FLAG))
    for node in ast.walk(src.tree):
        if not is_flag_name(node) or node in handled:
            continue
        if not isinstance(node.ctx, ast.Load):
            raise UnknownShape(src.relpath, "line %d changes %s in a way not handled "
                               "(augmented assignment, del, loop target, ...)" % node.lineno)
        src.replace(src.start(node), src.end(node), b"_get_is_fx_tracing()")
    for module in ("contextlib", "sys", "threading"):
        ensure_module_import(src, module)
    return True


def rewrite_global_write(src, node):
    """`_is_fx_tracing_flag = v` in a function with `global` -> `_set_is_fx_tracing(v)`."""
    scope = enclosing_scope(src, node)
    if not single_name_assignment(node, FLAG) or isinstance(node, ast.AnnAssign) \
            or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) \
            or not declares_global(scope, FLAG):
        raise UnknownShape(src.relpath, "line %d assigns %s in a form not handled (only "
                           "`global` writes in functions are)" % (node.lineno, FLAG))
    src.replace(src.start(node), src.end(node),
                b"_set_is_fx_tracing(" + src.text(node.value) + b")")
    return node.targets[0]


def dotted_name(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def rewrite_flag_attributes(src):
    """`<...>._symbolic_trace._is_fx_tracing_flag` reads/writes -> the helpers. Returns
    whether anything changed (a file may only mention the name in a comment)."""
    changed = False
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == FLAG for a in node.names):
            raise UnknownShape(src.relpath, "line %d imports %s by name (a snapshot of one "
                               "thread's value)" % (node.lineno, FLAG))
        if is_flag_name(node):
            raise UnknownShape(src.relpath, "line %d uses a bare name %s" % (node.lineno, FLAG))
        if not (isinstance(node, ast.Attribute) and node.attr == FLAG):
            continue
        owner = dotted_name(node.value)
        if owner is None or owner.split(".")[-1] != "_symbolic_trace":
            raise UnknownShape(src.relpath, "line %d: %s on %s, not on the _symbolic_trace "
                               "module" % (node.lineno, FLAG, owner or "an expression"))
        if isinstance(node.ctx, ast.Load):
            src.replace(src.end(node.value), src.end(node), b"._get_is_fx_tracing()")
        else:
            statement = src.parents.get(node)
            if not (isinstance(node.ctx, ast.Store) and isinstance(statement, ast.Assign)
                    and statement.targets == [node]):
                raise UnknownShape(src.relpath, "line %d changes %s in a form not handled"
                                   % (node.lineno, FLAG))
            src.replace(src.start(statement), src.end(statement),
                        src.text(node.value) + b"._set_is_fx_tracing("
                        + src.text(statement.value) + b")")
        changed = True
    return changed


def propagate_flag_into_recompute(src):
    """As upstream 2.14: the non-reentrant checkpoint captures the forward thread's flag
    and restores it around the recompute (which may run on an autograd worker thread)."""
    relpath = src.relpath
    outer = module_function(src.tree, "_checkpoint_without_reentrant_generator")
    recompute = outer and [n for n in outer.body
                           if isinstance(n, ast.FunctionDef) and n.name == "recompute_fn"]
    if not recompute or len(recompute) != 1:
        raise UnknownShape(relpath, "no _checkpoint_without_reentrant_generator() with one "
                           "nested recompute_fn()")
    recompute = recompute[0]
    capture = "is_fx_tracing"
    if any(isinstance(n, ast.Name) and n.id == capture or isinstance(n, ast.arg)
           and n.arg == capture for n in ast.walk(outer)):
        raise UnknownShape(relpath, "_checkpoint_without_reentrant_generator() already uses "
                           "the name %s" % capture)
    if not any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None
                                                 for a in n.names) for n in src.tree.body):
        raise UnknownShape(relpath, "does not `import torch` at module level")
    calls_fn = [w for w in ast.walk(recompute) if isinstance(w, ast.With)
                and any(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                        and isinstance(s.value.func, ast.Name) and s.value.func.id == "fn"
                        for s in w.body)]
    if len(calls_fn) != 1:
        raise UnknownShape(relpath, "recompute_fn() has no single `with ...:` block that "
                           "calls fn(...)")
    add_with_item(src, calls_fn[0], b"torch.fx._symbolic_trace._is_fx_tracing_context(%s)"
                  % capture.encode())
    # The capture goes with the other forward-time captures: after the statement before
    # recompute_fn (or above it when it comes first).
    index = outer.body.index(recompute)
    at = (src.own_lines(outer.body[index - 1])[1] if index
          else src.offset(src.first_line(recompute), 0))
    src.insert(at, src.indentation(recompute) + capture.encode()
               + b" = torch.fx._symbolic_trace._get_is_fx_tracing()\n")
    return True


def add_with_item(src, with_node, item):
    """Append a context manager to a with statement, whatever its layout (backslash
    continuations, parenthesised items, redundant parentheses, comments, a trailing
    comma): ", ITEM" goes right after the last item or after one of the closing
    parentheses between it and the colon, whichever place makes the statement parse to
    the same items plus the new one. Raises when none does."""
    src.insert(*with_item_insertion(src, with_node, item))


def with_item_insertion(src, with_node, item):
    """(offset, text) that adds item to with_node, checked by parsing the result."""
    last = with_node.items[-1]
    after_last = src.end(last.optional_vars or last.context_expr)
    candidates = []
    indent = src.data[src.offset(last.context_expr.lineno, 0):src.start(last.context_expr)]
    if not indent.strip() and src.data[after_last:after_last + 1] == b",":
        # One item per line, each with its comma: the new one gets its own line too.
        candidates.append((after_last + 1, b"\n" + indent + item + b","))
    # Between the last item and the header's colon there can only be whitespace,
    # closing parentheses, a comma, comments and backslash-newlines.
    candidates.append((after_last, b", " + item))
    at = after_last
    while at < len(src.data):
        char = src.data[at:at + 1]
        if char == b"#":
            at = src.data.find(b"\n", at)
            if at < 0:
                break
            continue
        if char == b":":
            break
        if char == b")":
            candidates.append((at + 1, b", " + item))
        at += 1
    expected = [ast.dump(i) for i in with_node.items] + [
        ast.dump(ast.parse(b"with " + item + b": pass").body[0].items[0])]
    for offset, text in candidates:
        edited = src.data[:offset] + text + src.data[offset:]
        try:
            tree = ast.parse(edited)
        except (SyntaxError, ValueError):
            continue
        new = next((n for n in ast.walk(tree) if isinstance(n, type(with_node))
                    and (n.lineno, n.col_offset) == (with_node.lineno, with_node.col_offset)),
                   None)
        if new is not None and [ast.dump(i) for i in new.items] == expected and \
                [ast.dump(b) for b in new.body] == [ast.dump(b) for b in with_node.body]:
            return offset, text
    raise UnknownShape(src.relpath, "line %d: found no place to add a context manager to "
                       "this with statement" % with_node.lineno)


# --- reading the installed tree ------------------------------------------------------------


def torch_version(where):
    """torch.__version__ as the installed torch/version.py spells it ("2.8.0+cu128"), read
    without importing torch, so status and verify fx-race (which imports it) name the same
    version; the dist-info's Version when that file is missing or unusual."""
    data = read_bytes(os.path.join(where["site_packages"], "torch", "version.py"))
    try:
        tree = ast.parse(data) if data is not None else None
    except (SyntaxError, ValueError):
        tree = None
    for node in tree.body if tree else []:
        if (single_name_assignment(node, "__version__") and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            return node.value.value
    return where["version"]


def classify_symbolic_trace(data):
    """'orch-marked', 'fixed-upstream', 'global-flag' or ('unknown', reason)."""
    if MARKER in first_lines(data, 3):
        return "orch-marked", None
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError) as exc:
        return "unknown", "does not parse with Python %s (%s)" % (platform.python_version(), exc)
    names = module_level_names(tree)
    if TLS in names and all(module_function(tree, h) for h in HELPERS) and FLAG not in names:
        return "fixed-upstream", None
    if FLAG in names:
        return "global-flag", None
    return "unknown", "neither a module-level %s nor %s with the helpers" % (FLAG, TLS)


def flag_reference_files(site_packages):
    """torch/**/*.py (not _symbolic_trace.py) whose text mentions the flag: found in the
    installed tree each time, because releases move these uses around."""
    root = os.path.join(site_packages, "torch")
    needle = FLAG.encode()
    found = []
    pending = [root]
    while pending:
        directory = pending.pop()
        for entry in os.scandir(directory):
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif entry.name.endswith(".py") and entry.is_file(follow_symlinks=False):
                with open(entry.path, "rb") as f:
                    if needle in f.read():
                        found.append(os.path.relpath(entry.path, site_packages))
    return sorted(path.replace(os.sep, "/") for path in found
                  if path.replace(os.sep, "/") != SYMBOLIC_TRACE)


# Why each file changes: shown by status and diff.
WHY_SYMBOLIC_TRACE = ("holds the process-wide flag: it becomes thread-local, with torch 2.14's "
                      "helpers, and every read and write in the file goes through them")
WHY_READER = ("reads or writes torch.fx._symbolic_trace.%s directly: rewritten to the helpers"
              % FLAG)
WHY_CHECKPOINT = ("never names the flag, but its non-reentrant recompute may run on an autograd "
                  "worker thread, which with a per-thread flag would no longer see the forward "
                  "thread's; backport of torch 2.14's recompute handling: the flag is captured "
                  "at forward time and restored around the recompute")


class Change:
    def __init__(self, relpath, before, after, why):
        self.relpath, self.before, self.after, self.why = relpath, before, after, why


def build_plan(site_packages, orch_version):
    """Every file's new bytes, computed and compiled before anything is written."""
    transforms = {SYMBOLIC_TRACE: [patch_symbolic_trace],
                  CHECKPOINT: [propagate_flag_into_recompute]}
    for relpath in flag_reference_files(site_packages):
        transforms.setdefault(relpath, []).append(rewrite_flag_attributes)
    plan = []
    for relpath in sorted(transforms):
        before = read_bytes(os.path.join(site_packages, relpath))
        if before is None:
            raise UnknownShape(relpath, "is missing")
        src = Source(relpath, before)
        # Every transform runs (no short-circuit); each says whether it changed anything.
        changed = [transform(src) for transform in transforms[relpath]]
        if not any(changed):
            continue  # the flag only appears in a comment or a string
        add_header(src, orch_version)
        after = src.edited()
        try:
            compile(after, relpath, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise UnknownShape(relpath, "the patched file would not compile (%s)" % exc) from None
        why = {SYMBOLIC_TRACE: WHY_SYMBOLIC_TRACE, CHECKPOINT: WHY_CHECKPOINT}.get(relpath,
                                                                                 WHY_READER)
        plan.append(Change(relpath, before, after, why))
    return plan


# --- the record ----------------------------------------------------------------------------


def record_path(record_dir):
    return os.path.join(record_dir, RECORD_FILE)


def backup_relpath(relpath):
    # ".orig", not ".py": no tool should take a backup for importable source.
    return "backups/" + relpath + ".orig"


def backup_path(record_dir, relpath):
    return os.path.join(record_dir, *backup_relpath(relpath).split("/"))


def load_record(record_dir):
    data = read_bytes(record_path(record_dir))
    if data is None:
        return None
    try:
        record = json.loads(data.decode("utf-8"))
        if all(isinstance(f["path"], str) and "sha256_before" in f and "sha256_after" in f
               for f in record["files"]):
            return record
    except (ValueError, KeyError, TypeError):
        pass
    raise PayloadError("the record %s is not readable; move it away and check the torch "
                       "files by hand (status shows them)" % record_path(record_dir),
                       "bad-record")


def save_record(record_dir, record):
    write_atomic(record_path(record_dir), (json.dumps(record, indent=2) + "\n").encode())


def record_summary(record):
    return {key: record.get(key) for key in
            ("state", "applied_at", "orch_version", "torch_version", "python")}


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


# --- status --------------------------------------------------------------------------------


def file_entry(site_packages, relpath, dist_hashes):
    data = read_bytes(os.path.join(site_packages, relpath))
    return {"path": relpath, "sha256": sha256_hex(data),
            "dist_record": dist_record_verdict(relpath, data, dist_hashes)}


def recorded_file_state(entry, recorded):
    if entry["sha256"] is None:
        return "missing"
    if entry["sha256"] == recorded["sha256_after"]:
        return "patched"
    return "original" if entry["sha256"] == recorded["sha256_before"] else "changed"


class Inspection:
    """What is installed: status, message, per-file entries, record, and (when
    vulnerable) the plan."""

    def __init__(self, status, message, files, record=None, plan=None):
        self.status, self.message, self.files = status, message, files
        self.record, self.plan = record, plan


PRISTINE_NOTE = ", pristine per the dist-info RECORD"


def inspect_recorded(where, record, dist_hashes):
    files = []
    for recorded in record["files"]:
        entry = file_entry(where["site_packages"], recorded["path"], dist_hashes)
        entry["state"] = recorded_file_state(entry, recorded)
        files.append(entry)
    when = "on %s by orch %s" % (record.get("applied_at"), record.get("orch_version"))
    if record.get("state") == "applied" and all(f["state"] == "patched" for f in files):
        return Inspection("patched", "patched %s (torch %s); %d file(s)"
                          % (when, record.get("torch_version"), len(files)), files, record)
    if record.get("state") != "applied":
        why = "an apply was interrupted"
    else:
        why = "files changed since (%s)" % "; ".join(
            "%s is %s%s" % (f["path"], f["state"],
                            PRISTINE_NOTE if f["dist_record"] == "ok" else "")
            for f in files if f["state"] != "patched")
    return Inspection("drifted", "orch's record says patched %s, but %s; run revert to "
                      "reconcile (it restores only files that still hold orch's patch), then "
                      "apply again if needed" % (when, why), files, record)


def inspect_unrecorded(where, orch_version, dist_hashes):
    site_packages, version = where["site_packages"], torch_version(where)
    entry = file_entry(site_packages, SYMBOLIC_TRACE, dist_hashes)
    data = read_bytes(os.path.join(site_packages, SYMBOLIC_TRACE))
    if data is None:
        return Inspection("unknown", "%s is missing from torch %s" % (SYMBOLIC_TRACE, version),
                          [entry])
    shape, reason = classify_symbolic_trace(data)
    if shape == "orch-marked":
        return Inspection("unknown", "%s carries orch's patch header but there is no record: "
                          "reinstall torch (pip install --force-reinstall --no-deps torch==%s) "
                          "to get pristine files" % (SYMBOLIC_TRACE, where["version"]), [entry])
    if shape == "fixed-upstream":
        return Inspection("fixed-upstream", "torch %s already keeps the FX tracing flag "
                          "thread-local upstream (%s with %s); nothing to patch"
                          % (version, TLS, ", ".join(HELPERS)), [entry])
    if shape == "unknown":
        return Inspection("unknown", "%s: %s; refusing to touch it" % (SYMBOLIC_TRACE, reason),
                          [entry])
    try:
        plan = build_plan(site_packages, orch_version)
    except UnknownShape as exc:
        return Inspection("unknown", "%s; refusing to touch anything" % exc, [entry])
    files = [dict(file_entry(site_packages, change.relpath, dist_hashes), why=change.why)
             for change in plan]
    return Inspection("vulnerable", "torch %s keeps %s as a process-wide global: %d file(s) to "
                      "patch" % (version, FLAG, len(plan)), files, plan=plan)


def inspect(where, record_dir, orch_version):
    dist_hashes = dist_record_hashes(where["dist_info"])
    record = load_record(record_dir)
    if record is not None:
        return inspect_recorded(where, record, dist_hashes)
    return inspect_unrecorded(where, orch_version, dist_hashes)


# --- apply ---------------------------------------------------------------------------------


IMPORT_CHECK = r'''
import importlib, importlib.util, json, re, sys, threading
import torch
import torch.fx._symbolic_trace as st

problems = []
seen = {}


def other_thread():
    seen["initial"] = st._get_is_fx_tracing()
    st._is_fx_tracing_flag = True  # written as a module attribute, as outside code does
    seen["attribute"] = st._is_fx_tracing_flag
    seen["is_fx_tracing"] = st.is_fx_tracing()


if st._get_is_fx_tracing() is not False:
    problems.append("the flag is not False after import")
with st._is_fx_tracing_context(True):
    worker = threading.Thread(target=other_thread, daemon=True)
    worker.start()
    worker.join(60)
    if not (st.is_fx_tracing() and st._is_fx_tracing_flag):
        problems.append("this thread does not see the flag it set")
if seen != {"initial": False, "attribute": True, "is_fx_tracing": True}:
    problems.append("another thread did not see its own flag: %r" % (seen,))
if st._get_is_fx_tracing() is not False:
    problems.append("another thread's write leaked here, or the context did not restore")
for name in json.loads(sys.argv[1]):
    try:
        present = importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package this torch does not have
        present = False
    if present:
        importlib.import_module(name)
try:
    import torch._dynamo.trace_rules as rules
except ImportError:
    rules = None
if rules is not None:
    with open(rules.__file__, encoding="utf-8") as f:
        named = sorted(set(re.findall(r"torch\.fx\._symbolic_trace\.(\w+)", f.read())))
    for name in named:
        if not callable(getattr(st, name, None)):
            problems.append("Dynamo's trace_rules names torch.fx._symbolic_trace.%s, which "
                            "is gone" % name)
print(json.dumps({"torch_version": torch.__version__, "problems": problems}))
'''


def module_name(relpath):
    name = relpath[:-3].replace("/", ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def compiled_parts(site_packages):
    """torch's compiled extension modules (torch/_C*.so and the like) in the tree."""
    try:
        names = os.listdir(os.path.join(site_packages, "torch"))
    except OSError:
        return []
    return [n for n in names if n.startswith("_C") and n.endswith((".so", ".pyd"))]


def refuse_source_tree_mode_on_an_install(site_packages):
    """ORCH_FX_PATCH_SOURCE_TREE=1 on a torch with compiled parts is an error, before any
    file is touched: the import check is never skipped where it could run."""
    found = compiled_parts(site_packages)
    if os.environ.get(SOURCE_TREE_ENV) == "1" and found:
        raise PayloadError("%s=1 is only for a source tree without compiled parts, and this "
                           "torch has %s; nothing was changed" % (SOURCE_TREE_ENV,
                                                                 ", ".join(found)), "refused")


def import_check(plan, cwd, site_packages):
    """Import the patched torch in a fresh interpreter; returns (ok, details).

    With ORCH_FX_PATCH_SOURCE_TREE=1 (internal: the release matrix, which checks the
    sources of many wheels without installing them) the import is skipped, and only for
    a tree that has no compiled parts and so could not be imported anyway; on a real
    install the variable is an error, so no user can skip the check by accident."""
    if os.environ.get(SOURCE_TREE_ENV) == "1":
        return True, {"problems": [], "skipped": "a source tree without compiled parts (%s=1):"
                      " compiled every changed file, did not import" % SOURCE_TREE_ENV}
    modules = [module_name(change.relpath) for change in plan] + list(NAME_USERS)
    try:
        # -B: the check leaves no bytecode of its own in torch's folders (a rolled-back
        # apply must leave the tree exactly as it found it)
        proc = subprocess.run([sys.executable, "-B", "-c", IMPORT_CHECK, json.dumps(modules)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                              timeout=IMPORT_CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return False, {"problems": ["importing torch took more than %ds" % IMPORT_CHECK_TIMEOUT]}
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        details = json.loads(lines[-1])
    except (IndexError, ValueError):
        stderr = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        details = {"problems": ["import failed (exit %d): %s" % (proc.returncode,
                                                               " | ".join(stderr[-8:]))]}
    return proc.returncode == 0 and not details.get("problems"), details


def write_backups(record_dir, plan):
    for change in plan:
        path = backup_path(record_dir, change.relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, change.before)
        if read_bytes(path) != change.before:
            raise PayloadError("the backup %s does not read back as written; nothing was "
                               "changed" % path, "write-failed")


def write_plan(site_packages, plan):
    fail_after = os.environ.get(FAIL_AFTER_ENV)
    for index, change in enumerate(plan):
        if fail_after is not None and index == int(fail_after):
            raise OSError("simulated failure after %d file(s) (%s is set)"
                          % (index, FAIL_AFTER_ENV))
        path = os.path.join(site_packages, change.relpath)
        write_atomic(path, change.after)
        remove_stale_bytecode(path)


def roll_back(site_packages, plan):
    """Put every original back; returns the files that could not be restored."""
    failed = []
    for change in plan:
        path = os.path.join(site_packages, change.relpath)
        try:
            if read_bytes(path) != change.before:
                write_atomic(path, change.before)
                remove_stale_bytecode(path)
        except OSError as exc:
            failed.append("%s (%s)" % (change.relpath, exc))
    return failed


def new_record(where, orch_version, plan):
    return {
        "schema": 1,
        "state": "applying",
        "applied_at": utc_now(),
        "orch_version": orch_version,
        "torch_version": torch_version(where),
        "python": sys.executable,
        "site_packages": where["site_packages"],
        "files": [{"path": c.relpath, "sha256_before": sha256_hex(c.before),
                   "sha256_after": sha256_hex(c.after),
                   "backup": backup_relpath(c.relpath)} for c in plan],
    }


def apply_plan(where, record_dir, orch_version, plan):
    """Back up, record 'applying', write, check; on any failure restore every file."""
    site_packages = where["site_packages"]
    os.makedirs(record_dir, exist_ok=True)
    write_backups(record_dir, plan)
    record = new_record(where, orch_version, plan)
    # Recorded before the first write: a crash mid-way leaves a "drifted" record that
    # revert can finish from the backups.
    save_record(record_dir, record)
    try:
        write_plan(site_packages, plan)
        ok, details = import_check(plan, record_dir, site_packages)
        if not ok:
            raise PayloadError("the patched torch failed the import check: %s; every file was "
                               "restored" % "; ".join(details.get("problems", [])),
                               "import-check-failed")
    except BaseException as exc:
        failed = roll_back(site_packages, plan)
        if failed:
            raise PayloadError("apply failed (%s) and these files could not be restored: %s; "
                               "run revert to finish from the backups in %s"
                               % (exc, ", ".join(failed), record_dir), "write-failed") from exc
        shutil.rmtree(record_dir, ignore_errors=True)
        if isinstance(exc, PayloadError):
            raise
        if isinstance(exc, OSError):
            raise PayloadError("writing the patch failed (%s); every file was restored"
                               % exc, "write-failed") from exc
        raise
    record["state"] = "applied"
    save_record(record_dir, record)
    return record, details


# --- actions -------------------------------------------------------------------------------


def result(action, where, record_dir, inspection, changed, message=None, **extra):
    out = {
        "action": action,
        "status": inspection.status,
        "changed": changed,
        "message": message or inspection.message,
        "torch_version": torch_version(where),
        "site_packages": where["site_packages"],
        "record_dir": record_dir,
        "files": inspection.files,
        "record": record_summary(inspection.record) if inspection.record else None,
    }
    out.update(extra)
    return out


def action_status(where, record_dir, orch_version):
    return result("status", where, record_dir, inspect(where, record_dir, orch_version), False)


def action_diff(where, record_dir, orch_version):
    inspection = inspect(where, record_dir, orch_version)
    chunks = []
    for change in inspection.plan or []:
        # Text before a file's "---" line is ignored by patch and git apply.
        chunks.append("# %s: %s\n" % (change.relpath, change.why))
        chunks.extend(difflib.unified_diff(
            change.before.decode("utf-8", "replace").splitlines(True),
            change.after.decode("utf-8", "replace").splitlines(True),
            "a/" + change.relpath, "b/" + change.relpath))
    return result("diff", where, record_dir, inspection, False, diff="".join(chunks))


def action_apply(where, record_dir, orch_version):
    inspection = inspect(where, record_dir, orch_version)
    if inspection.status in ("patched", "fixed-upstream"):
        return result("apply", where, record_dir, inspection, False,
                      "nothing to do: " + inspection.message)
    if inspection.status != "vulnerable":
        kind = "unknown-shape" if inspection.status == "unknown" else "refused"
        raise PayloadError("not applying: %s" % inspection.message, kind)
    refuse_source_tree_mode_on_an_install(where["site_packages"])
    record, check = apply_plan(where, record_dir, orch_version, inspection.plan)
    after = inspect(where, record_dir, orch_version)
    return result("apply", where, record_dir, after, True,
                  "patched %d file(s); threads now have separate FX tracing flags%s"
                  % (len(record["files"]), "; NOT import-checked: " + check["skipped"]
                     if check.get("skipped") else ""), import_check=check)


def revert_file(site_packages, record_dir, recorded, dist_hashes):
    """Restore one file from its backup if it still holds orch's patch."""
    relpath = recorded["path"]
    path = os.path.join(site_packages, relpath)
    current = sha256_hex(read_bytes(path))
    if current == recorded["sha256_after"]:
        backup = read_bytes(backup_path(record_dir, relpath))
        if sha256_hex(backup) != recorded["sha256_before"]:
            raise PayloadError("the backup of %s in %s is missing or damaged; nothing more was "
                               "restored; reinstall torch to get pristine files"
                               % (relpath, record_dir), "bad-record")
        write_atomic(path, backup)
        remove_stale_bytecode(path)
        action = "restored"
    elif current == recorded["sha256_before"]:
        action = "already-original"
    elif dist_record_verdict(relpath, read_bytes(path), dist_hashes) == "ok":
        action = "already-original"  # reinstalled: pristine for the version now installed
    else:
        action = "left-alone"
    entry = file_entry(site_packages, relpath, dist_hashes)
    entry["action"] = action
    return entry


def action_revert(where, record_dir, orch_version):
    record = load_record(record_dir)
    if record is None:
        inspection = inspect(where, record_dir, orch_version)
        return result("revert", where, record_dir, inspection, False,
                      "nothing to revert: no orch record in %s (%s)"
                      % (record_dir, inspection.message))
    dist_hashes = dist_record_hashes(where["dist_info"])
    files = [revert_file(where["site_packages"], record_dir, recorded, dist_hashes)
             for recorded in record["files"]]
    left = [f["path"] for f in files if f["action"] == "left-alone"]
    if not left:
        shutil.rmtree(record_dir)
    inspection = inspect(where, record_dir, orch_version)
    restored = [f for f in files if f["action"] == "restored"]
    mismatched = [f["path"] for f in files if f["dist_record"] != "ok"]
    message = "restored %d file(s), %d already original" % (
        len(restored), sum(f["action"] == "already-original" for f in files))
    if left:
        message += ("; left alone (changed by someone else since the patch): %s; the record "
                    "is kept: reinstall torch, then revert again" % ", ".join(left))
    if mismatched:
        message += "; not as pip installed them (dist-info RECORD): %s" % ", ".join(mismatched)
    out = result("revert", where, record_dir, inspection, bool(restored), message)
    out["files"] = files
    return out


ACTION_HANDLERS = {"status": action_status, "diff": action_diff, "apply": action_apply,
                   "revert": action_revert}


def run(args):
    if args["action"] not in ACTIONS:
        raise PayloadError("action must be one of %s" % ", ".join(ACTIONS), "bad-args")
    where = locate("torch")
    record_dir = os.path.abspath(args["record_dir"]
                                 or os.path.join(where["site_packages"], RECORD_DIR_NAME))
    lock = lock_torch_tree(where["site_packages"])
    try:
        removed = remove_leftover_temp_files(where["site_packages"], record_dir)
        out = ACTION_HANDLERS[args["action"]](where, record_dir, args["orch_version"])
    finally:
        os.close(lock)
    out["removed_temp_files"] = removed
    return out


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
