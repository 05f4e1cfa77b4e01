"""Make the FX state that threads share thread-local in an installed torch: status, diff,
apply, revert, for one patch set.

Shipped into a container as one script (the marked imports below are inlined) and run with
the container's python; standard library only, Python 3.8+. It never imports torch itself:
the post-apply check imports it in a subprocess, so a broken torch cannot take the patcher
down half-way.

Why: several threads of one process compiling side by side (a trainer's drafters, each
``torch.compile(flex_attention)``) share FX state that torch keeps as module globals. The
states, one spec each, are in _fx_specs.py; the one mechanism that makes a global
thread-local and rewrites every use is _fx_threadlocal.py. Patch sets:

- "fx-threads": every state orch knows (the FX tracing flag, FX's node-meta state and FX's
  trace-time patching);
- "fx-tls": the flag alone (orch's first patch; its users' scripts and records keep working).

Protocol
--------
Invocation: ``PYTHON - ARGS_JSON`` with this file on stdin, or ``PYTHON fx_patch.py
ARGS_JSON``. ARGS_JSON is one argv element holding a JSON object; unknown keys are an
error::

    {"action": "status" | "diff" | "apply" | "revert",   # required
     "patch_set": "fx-tls" | "fx-threads",   # default fx-tls
     "orch_version": "0.1.0",        # written into the record and the file headers
     "record_dir": "/path"}          # default <site-packages>/.orch-fx-tls

Output: JSON lines on stdout; the last line is the result (exit code 0) or an error
(exit code 1): ``{"event": "error", "message": "...", "kind": "..."}`` with kind
"bad-args", "not-installed", "unknown-shape", "refused", "busy" (another orch action
holds the tree's lock longer than the wait), "write-failed", "import-check-failed",
"bad-record" or "internal". Every result has::

    {"event": "result", "action": ..., "patch_set": ..., "status": ..., "changed": bool,
     "message": "...", "torch_version": "2.13.0+cpu", "site_packages": "...",
     "record_dir": "...", "states": [...], "files": [...], "record": {...} | null,
     "removed_temp_files": [...], "leftover_temp_files": [...], "orphan_backups": [...]}

``states`` has one row per shared state orch knows (also those outside the patch set,
with ``in_set`` false)::

    {"state": "node-meta", "title": "FX node-meta state", "in_set": true,
     "status": "vulnerable" | "upstream" | "patched" | "drifted" | "absent" | "unknown",
     "where": "torch/fx/traceback.py:42", "why": "module globals current_meta, ...",
     "path": "torch/fx/traceback.py", "names": ["current_meta", ...]}

``status`` (overall, for the patch set) is the state after the action:

- "vulnerable": a state of the set is a module global in a shape orch recognises;
  ``files`` lists what apply would change.
- "fixed-upstream": every state of the set is thread-local upstream or not in this release.
- "patched": orch's record covers every vulnerable state of the set and every file matches
  its recorded after-hash; ``record`` says when, which orch and torch version.
- "drifted": the record says patched but files changed since (torch reinstalled, an
  interrupted apply, hand edits); per file ``state`` says which.
- "unknown": a shape orch does not recognise (``message`` says what): it refuses to touch
  anything.

File entries: ``{"path": ..., "sha256": ..., "dist_record": "ok" | "mismatch" |
"not-listed" | "missing"}`` ("ok": pristine as pip installed it, per the dist-info RECORD);
with a record also ``"state": "patched" | "original" | "changed" | "missing"``; when
vulnerable also ``"why"``. Actions:

- status and diff are read-only: they take the tree's lock shared (readers never refuse
  each other), delete nothing, and report what a killed orch left (``leftover_temp_files``,
  ``orphan_backups``).
- apply and revert take the lock exclusively and first remove a killed orch's temp files
  (``.NAME.XXXXXXXX.orch-tmp`` in torch/ and the record directory; ``removed_temp_files``).
  Backups are never deleted by cleanup: a backup without a record is reported; apply
  refuses to overwrite one whose bytes differ from the file it would back up.
- Either kind waits up to 15 s for the other kind, then fails with kind "busy".
- diff adds ``"diff"``: the unified diff apply would write ("" unless vulnerable).
- apply: from "vulnerable" (also when orch's record covers some states and others remain:
  the files are re-derived from the backups, so each keeps one backup of its pristine bytes);
  "patched" and "fixed-upstream" are no-ops (changed=false); anything else is an error.
  Adds ``"import_check"``.
- revert: restores orch's backups (byte-exact) for files that still hold orch's patch,
  whichever patch set wrote them; ``files`` entries get ``"action": "restored" |
  "already-original" | "left-alone"`` and the dist_record verdict of the bytes now on
  disk. The record is removed unless a file was left alone. Without a record: no change.

What apply changes is found by parsing, never by line numbers (_fx_threadlocal.py): the
state's module-level globals become one ``threading.local()`` holder with accessors and a
module class whose properties keep ``module.NAME`` working per thread; every read and write
in the module, and every ``<module>.NAME`` / ``from <module> import NAME`` elsewhere in
torch/ (found by searching the installed tree), goes through the accessors. The flag also
backports torch 2.14's checkpoint recompute handling (torch/utils/checkpoint.py); the
trace-time patching also guards each ``_Patcher`` patch to act only in the tracing thread. Each
changed file gets a header comment naming orch, its version and the patch set. Apply
computes and compiles every new file before writing any; backs up the originals; records
"applying"; writes each atomically (temp file, fsync, rename, fsync of the directory);
removes stale __pycache__ entries; then imports torch in a subprocess with the same python
and checks that threads see separate values of every patched state and that Dynamo's trace
rules still name valid functions. If a write or that check fails, every file is put back.
Internal switches, never set by orch's commands: ``ORCH_FX_PATCH_FAIL_AFTER=N`` (tests)
makes apply fail after writing N files; ``ORCH_FX_PATCH_KILL_BEFORE_RENAME=NAME`` (tests)
kills apply with SIGKILL just before it renames the temp file of NAME into place;
``ORCH_FX_PATCH_SOURCE_TREE=1`` (the release matrix, scripts/torch-matrix.py) skips the
import of the patched torch, and is refused before any write on a torch that has compiled
parts, where the import can run; the result then says the import was not checked.
"""

import ast
import difflib
import json
import os
import subprocess
import sys

from _protocol import *  # orch: inlined when shipped
from _locate import *  # orch: inlined when shipped
from _fx_files import *  # orch: inlined when shipped
from _fx_source import *  # orch: inlined when shipped
from _fx_threadlocal import *  # orch: inlined when shipped
from _fx_specs import *  # orch: inlined when shipped
from _fx_record import *  # orch: inlined when shipped

ARG_SPEC = {
    "action": (str, REQUIRED),
    "patch_set": (str, "fx-tls"),
    "orch_version": (str, "unknown"),
    "record_dir": (str, None),
}
ACTIONS = ("status", "diff", "apply", "revert")
READ_ONLY = ("status", "diff")
FAIL_AFTER_ENV = "ORCH_FX_PATCH_FAIL_AFTER"
SOURCE_TREE_ENV = "ORCH_FX_PATCH_SOURCE_TREE"
IMPORT_CHECK_TIMEOUT = 600
# Modules that use the flag's functions by name: imported by the check after apply.
NAME_USERS = ("torch.nested", "torch.export.unflatten", "torch._dynamo.variables.torch",
              "torch._dynamo.trace_rules")
PRISTINE_NOTE = ", pristine per the dist-info RECORD"


# --- reading the installed tree ------------------------------------------------------------


def torch_version(where):
    """torch.__version__ as the installed torch/version.py spells it ("2.8.0+cu128"), read
    without importing torch, so status and verify (which imports it) name the same version;
    the dist-info's Version when that file is missing or unusual."""
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


class Tree:
    """The installed torch as orch's patches see it: each file's bytes now, and its
    pristine bytes (the backup for a file orch's record holds, else the bytes now)."""

    def __init__(self, site_packages, record_dir, record):
        self.site_packages, self.record_dir = site_packages, record_dir
        self.recorded = dict((f["path"], f) for f in (record or {}).get("files", []))

    def current(self, relpath):
        return read_bytes(os.path.join(self.site_packages, *relpath.split("/")))

    def pristine(self, relpath):
        if relpath not in self.recorded:
            return self.current(relpath)
        backup = read_bytes(backup_path(self.record_dir, relpath))
        if sha256_hex(backup) != self.recorded[relpath]["sha256_before"]:
            raise PayloadError("the backup of %s in %s is missing or damaged; revert what can "
                               "be reverted, or reinstall torch" % (relpath, self.record_dir),
                               "bad-record")
        return backup


class Change:
    def __init__(self, relpath, before, after, why, current):
        self.relpath, self.before, self.after, self.why = relpath, before, after, why
        self.current = current  # what is on disk now (differs from before when orch's)


def plan_transforms(tree, specs):
    """{relpath: [(transform, why, names)]} for every file the specs change."""
    transforms = {}
    for spec in specs:
        home = tree.pristine(spec.relpath)
        present = present_names(spec, ast.parse(home))
        transforms.setdefault(spec.relpath, []).append(
            (lambda src, spec=spec: rewrite_home(spec, src), spec.why_home, present))
        for relpath, (transform, why) in sorted(spec.extra.items()):
            transforms.setdefault(relpath, []).append((transform, why, present))
        users = set(user_files(spec, tree.site_packages, present))
        # A file orch already changed is searched in its pristine bytes.
        users.update(p for p in tree.recorded if p != spec.relpath
                     and any(n.encode() in tree.pristine(p) for n in present))
        for relpath in sorted(users):
            transforms.setdefault(relpath, []).append(
                (lambda src, spec=spec: rewrite_user(spec, src), spec.why_user, present))
    return transforms


def build_plan(tree, specs, patch_set, orch_version):
    """Every file's new bytes, computed from its pristine bytes and compiled before anything
    is written."""
    plan = []
    for relpath, steps in sorted(plan_transforms(tree, specs).items()):
        before = tree.pristine(relpath)
        if before is None:
            raise UnknownShape(relpath, "is missing")
        src = Source(relpath, before)
        # Every transform runs (no short-circuit); each says whether it changed anything.
        changed = [(transform(src), why, names) for transform, why, names in steps]
        if not any(c for c, _, _ in changed):
            continue  # the names only appear in a comment, a string or on other objects
        # A user's transform says which names it rewrote; the why names exactly those.
        changed = [(did, why(did) if callable(why) else why,
                    did if isinstance(did, list) else found) for did, why, found in changed]
        names = []
        for did, _, found in changed:
            names += [n for n in found if did and n not in names]
        add_header(src, header_line(orch_version, patch_set, names))
        after = src.edited()
        try:
            compile(after, relpath, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise UnknownShape(relpath, "the patched file would not compile (%s)" % exc) from None
        why = "; and ".join(why for did, why, _ in changed if did)
        plan.append(Change(relpath, before, after, why, tree.current(relpath)))
    return plan


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


ROW_OF_SHAPE = {"global": "vulnerable", "upstream": "upstream", "absent": "absent",
                "unknown": "unknown", "orch-marked": "unknown"}


def state_row(spec, tree, covered, in_set):
    """One shared state's row: where it stands and why (file:line)."""
    # path and names: what the state is, for a caller matching a state it found itself
    # (`orch explain` looks its findings up here after its own analysis)
    row = {"state": spec.key, "title": spec.title, "in_set": in_set, "where": spec.relpath,
           "path": spec.relpath, "names": list(spec.names)}
    if spec.key in covered:
        row.update(status="patched", why="made thread-local by orch (record)")
        return row
    shape, line, reason = classify(spec, tree.pristine(spec.relpath))
    if shape == "orch-marked":
        reason = "carries orch's patch header, but no orch record covers it"
    row.update(status=ROW_OF_SHAPE[shape], why=reason)
    if line:
        row["where"] = "%s:%d" % (spec.relpath, line)
    return row


class Inspection:
    """What is installed: overall status, message, per-state rows, per-file entries,
    record, and (when vulnerable) the plan."""

    def __init__(self, status, message, files, states, record=None, plan=None):
        self.status, self.message, self.files, self.states = status, message, files, states
        self.record, self.plan = record, plan


def describe(rows):
    return ", ".join("%s (%s)" % (r["title"], r["where"]) for r in rows)


def outside_note(rows):
    """Said by a patch set that leaves shared states out (fx-tls): which, and the cure."""
    left = [r for r in rows if not r["in_set"] and r["status"] == "vulnerable"]
    if not left:
        return ""
    return "; still shared between threads, outside this patch set: %s: `orch patch " \
        "fx-threads apply` makes them thread-local" % describe(left)


def inspect_recorded(where, record, dist_hashes, rows):
    files = []
    for recorded in record["files"]:
        entry = file_entry(where["site_packages"], recorded["path"], dist_hashes)
        entry["state"] = recorded_file_state(entry, recorded)
        files.append(entry)
    when = "on %s by orch %s" % (record.get("applied_at"), record.get("orch_version"))
    if record.get("state") == "applied" and all(f["state"] == "patched" for f in files):
        return None, files, when
    for row in rows:
        if row["status"] == "patched":
            row.update(status="drifted", why="orch's record says patched, the files changed")
    if record.get("state") != "applied":
        why = "an apply was interrupted"
    else:
        why = "files changed since (%s)" % "; ".join(
            "%s is %s%s" % (f["path"], f["state"],
                            PRISTINE_NOTE if f["dist_record"] == "ok" else "")
            for f in files if f["state"] != "patched")
    return Inspection("drifted", "orch's record says patched %s, but %s; run revert to "
                      "reconcile (it restores only files that still hold orch's patch), then "
                      "apply again if needed" % (when, why), files, rows, record), files, when


def inspect(where, record_dir, patch_set, orch_version):
    site_packages, version = where["site_packages"], torch_version(where)
    dist_hashes = dist_record_hashes(where["dist_info"])
    record = load_record(record_dir)
    covered = recorded_states(record) if record else []
    tree = Tree(site_packages, record_dir, record)
    wanted = [s.key for s in PATCH_SETS[patch_set]]
    rows = [state_row(spec, tree, covered, spec.key in wanted) for spec in STATES]
    mine = [r for r in rows if r["in_set"]]
    files = [file_entry(site_packages, spec.relpath, dist_hashes)
             for spec in PATCH_SETS[patch_set]]
    if record is not None:
        drifted, files, when = inspect_recorded(where, record, dist_hashes, rows)
        if drifted:
            return drifted
    unknown = [r for r in mine if r["status"] == "unknown"]
    if unknown:
        if record is None and any("orch's patch header" in r["why"] for r in unknown):
            return Inspection("unknown", "%s carries orch's patch header but there is no "
                              "record: reinstall torch (pip install --force-reinstall --no-deps "
                              "torch==%s) to get pristine files"
                              % (unknown[0]["where"], where["version"]), files, rows)
        return Inspection("unknown", "; ".join("%s: %s" % (r["where"], r["why"])
                                               for r in unknown)
                          + "; refusing to touch anything", files, rows)
    vulnerable = [r for r in mine if r["status"] == "vulnerable"]
    if not vulnerable:
        if record is not None:
            return Inspection("patched", "patched %s (torch %s, %s); %d file(s)%s"
                              % (when, record.get("torch_version"),
                                 ", ".join(recorded_states(record)), len(files),
                                 outside_note(rows)), files, rows, record)
        return Inspection("fixed-upstream", upstream_message(version, mine) + outside_note(rows),
                          files, rows)
    specs = [STATE_BY_KEY[key] for key in wanted
             if key in covered or key in [r["state"] for r in vulnerable]]
    try:
        plan = build_plan(tree, specs, patch_set, orch_version)
    except UnknownShape as exc:
        for row in vulnerable:
            row.update(status="unknown", why=str(exc))
        return Inspection("unknown", "%s; refusing to touch anything" % exc, files, rows, record)
    files = [dict(file_entry(site_packages, change.relpath, dist_hashes), why=change.why)
             for change in plan]
    message = "torch %s shares between threads, as process-wide globals: %s: %d file(s) to " \
              "patch" % (version, describe(vulnerable), len(plan))
    if covered:
        message += " (orch already made %s thread-local %s; apply adds the rest)" % (
            ", ".join(covered), when)
    return Inspection("vulnerable", message + outside_note(rows), files, rows, record, plan)


def upstream_message(version, rows):
    if [r["state"] for r in rows] == [FLAG_STATE.key]:
        return ("torch %s already keeps the FX tracing flag thread-local upstream (%s with %s); "
                "nothing to patch" % (version, FLAG_TLS, ", ".join(FLAG_HELPERS)))
    return "torch %s: every FX state of this patch set is thread-local upstream or not in " \
        "this release (%s); nothing to patch" % (version, "; ".join(
            "%s: %s" % (r["title"], r["status"]) for r in rows))


# --- apply ---------------------------------------------------------------------------------


IMPORT_CHECK = r'''
import importlib, importlib.util, json, re, sys, threading
import torch
import torch.fx._symbolic_trace as st

problems = []


def in_thread(target):
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():
        problems.append("a check thread did not finish in 60 s")

%s

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
        named = sorted(set(re.findall(r"torch\.fx\.(_symbolic_trace|traceback)\.(\w+)",
                                      f.read())))
    for module, name in named:
        owner = st if module == "_symbolic_trace" else torch.fx.traceback
        if getattr(owner, name, None) is None:
            problems.append("Dynamo's trace_rules names torch.fx.%%s.%%s, which is gone"
                            %% (module, name))
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


def import_check(plan, specs, cwd):
    """Import the patched torch in a fresh interpreter; returns (ok, details).

    With ORCH_FX_PATCH_SOURCE_TREE=1 (internal: the release matrix, which checks the
    sources of many wheels without installing them) the import is skipped, and only for
    a tree that has no compiled parts and so could not be imported anyway; on a real
    install the variable is an error, so no user can skip the check by accident."""
    if os.environ.get(SOURCE_TREE_ENV) == "1":
        return True, {"problems": [], "skipped": "a source tree without compiled parts (%s=1):"
                      " compiled every changed file, did not import" % SOURCE_TREE_ENV}
    modules = [module_name(change.relpath) for change in plan] + list(NAME_USERS)
    script = IMPORT_CHECK % "\n".join(spec.import_check for spec in specs)
    try:
        # -B: the check leaves no bytecode of its own in torch's folders (a rolled-back
        # apply must leave the tree exactly as it found it)
        proc = subprocess.run([sys.executable, "-B", "-c", script, json.dumps(modules)],
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


def write_backups(record_dir, plan, tree):
    """Back up each file orch does not hold yet; returns the backups written. A backup left
    without a record is reused when it holds the same bytes and refused otherwise (before
    anything is written): orch never overwrites a copy it cannot account for."""
    needed = []
    for change in plan:
        if change.relpath in tree.recorded:
            continue  # its backup of the pristine bytes is there (Tree.pristine checked it)
        path = backup_path(record_dir, change.relpath)
        existing = read_bytes(path)
        if existing is not None and existing != change.before:
            raise PayloadError("%s exists without a record and differs from %s; move it away "
                               "and apply again; nothing was changed"
                               % (path, change.relpath), "refused")
        if existing is None:
            needed.append((path, change.before))
    written = []
    for path, data in needed:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, data)
        written.append(path)
        if read_bytes(path) != data:
            raise PayloadError("the backup %s does not read back as written; nothing was "
                               "changed" % path, "write-failed")
    return written


def write_plan(site_packages, plan):
    fail_after = os.environ.get(FAIL_AFTER_ENV)
    for index, change in enumerate(plan):
        if fail_after is not None and index == int(fail_after):
            raise OSError("simulated failure after %d file(s) (%s is set)"
                          % (index, FAIL_AFTER_ENV))
        path = os.path.join(site_packages, change.relpath)
        if read_bytes(path) != change.after:
            write_atomic(path, change.after)
            remove_stale_bytecode(path)


def roll_back(site_packages, plan):
    """Put back what was on disk before this apply; returns the files that could not be."""
    failed = []
    for change in plan:
        path = os.path.join(site_packages, change.relpath)
        try:
            if read_bytes(path) != change.current:
                write_atomic(path, change.current)
                remove_stale_bytecode(path)
        except OSError as exc:
            failed.append("%s (%s)" % (change.relpath, exc))
    return failed


def undo_record(record_dir, old_record, new_backups):
    """After a rolled-back apply: the record as it was, and only this apply's own backups
    removed (with the folders that held nothing else)."""
    if old_record is not None:
        save_record(record_dir, old_record)
    else:
        try:
            os.unlink(record_path(record_dir))
        except FileNotFoundError:
            pass
    for path in new_backups:
        os.unlink(path)
        directory = os.path.dirname(path)
        while directory.startswith(record_dir) and directory != record_dir:
            try:
                os.rmdir(directory)
            except OSError:
                break
            directory = os.path.dirname(directory)
    try:
        os.rmdir(record_dir)
    except OSError:
        pass  # not empty: something else lives there


def new_record(where, orch_version, patch_set, specs, plan):
    return {
        "schema": RECORD_SCHEMA,
        "state": "applying",
        "patch_set": patch_set,
        "states": [spec.key for spec in specs],
        "applied_at": utc_now(),
        "orch_version": orch_version,
        "torch_version": torch_version(where),
        "python": sys.executable,
        "site_packages": where["site_packages"],
        "files": [{"path": c.relpath, "sha256_before": sha256_hex(c.before),
                   "sha256_after": sha256_hex(c.after),
                   "backup": backup_relpath(c.relpath)} for c in plan],
    }


def apply_plan(where, record_dir, orch_version, patch_set, specs, inspection, tree):
    """Back up, record 'applying', write, check; on any failure put every file back."""
    site_packages, plan, old_record = where["site_packages"], inspection.plan, inspection.record
    os.makedirs(record_dir, exist_ok=True)
    new_backups = write_backups(record_dir, plan, tree)
    record = new_record(where, orch_version, patch_set, specs, plan)
    # Recorded before the first write: a crash mid-way leaves a "drifted" record that
    # revert can finish from the backups.
    save_record(record_dir, record)
    try:
        write_plan(site_packages, plan)
        ok, details = import_check(plan, specs, record_dir)
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
        undo_record(record_dir, old_record, new_backups)
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


def result(action, context, inspection, changed, message=None, **extra):
    where, record_dir, patch_set = context["where"], context["record_dir"], context["patch_set"]
    out = {
        "action": action,
        "patch_set": patch_set,
        "status": inspection.status,
        "changed": changed,
        "message": message or inspection.message,
        "torch_version": torch_version(where),
        "site_packages": where["site_packages"],
        "record_dir": record_dir,
        "states": inspection.states,
        "files": inspection.files,
        "record": record_summary(inspection.record) if inspection.record else None,
    }
    out.update(extra)
    return out


def inspect_context(context):
    return inspect(context["where"], context["record_dir"], context["patch_set"],
                   context["orch_version"])


def action_status(context):
    return result("status", context, inspect_context(context), False)


def action_diff(context):
    inspection = inspect_context(context)
    chunks = []
    for change in inspection.plan or []:
        # Text before a file's "---" line is ignored by patch and git apply. The diff is
        # against what is on disk now (orch's earlier patch, where there is one).
        chunks.append("# %s: %s\n" % (change.relpath, change.why))
        chunks.extend(difflib.unified_diff(
            change.current.decode("utf-8", "replace").splitlines(True),
            change.after.decode("utf-8", "replace").splitlines(True),
            "a/" + change.relpath, "b/" + change.relpath))
    return result("diff", context, inspection, False, diff="".join(chunks))


def action_apply(context):
    where, record_dir, patch_set = context["where"], context["record_dir"], context["patch_set"]
    inspection = inspect_context(context)
    if inspection.status in ("patched", "fixed-upstream"):
        return result("apply", context, inspection, False, "nothing to do: " + inspection.message)
    if inspection.status != "vulnerable":
        kind = "unknown-shape" if inspection.status == "unknown" else "refused"
        raise PayloadError("not applying: %s" % inspection.message, kind)
    refuse_source_tree_mode_on_an_install(where["site_packages"])
    covered = recorded_states(inspection.record) if inspection.record else []
    specs = [s for s in PATCH_SETS[patch_set]
             if s.key in covered or any(r["state"] == s.key and r["status"] == "vulnerable"
                                        for r in inspection.states)]
    tree = Tree(where["site_packages"], record_dir, inspection.record)
    record, check = apply_plan(where, record_dir, context["orch_version"], patch_set, specs,
                               inspection, tree)
    after = inspect_context(context)
    return result("apply", context, after, True,
                  "patched %d file(s); threads now have their own %s%s%s"
                  % (len(record["files"]), ", ".join(s.title for s in specs),
                     "; NOT import-checked: " + check["skipped"] if check.get("skipped") else "",
                     outside_note(after.states)),
                  import_check=check)


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


def remove_record(record_dir, record):
    """After a complete revert: the record and the backups it lists, then the folders
    that hold nothing else (a backup orch cannot account for stays)."""
    for recorded in record["files"]:
        try:
            os.unlink(backup_path(record_dir, recorded["path"]))
        except FileNotFoundError:
            pass
    os.unlink(record_path(record_dir))
    for directory, _, _ in sorted(os.walk(record_dir), key=lambda entry: -len(entry[0])):
        try:
            os.rmdir(directory)
        except OSError:
            pass


def action_revert(context):
    where, record_dir = context["where"], context["record_dir"]
    record = load_record(record_dir)
    if record is None:
        inspection = inspect_context(context)
        return result("revert", context, inspection, False,
                      "nothing to revert: no orch record in %s (%s)"
                      % (record_dir, inspection.message))
    dist_hashes = dist_record_hashes(where["dist_info"])
    files = [revert_file(where["site_packages"], record_dir, recorded, dist_hashes)
             for recorded in record["files"]]
    left = [f["path"] for f in files if f["action"] == "left-alone"]
    if not left:
        remove_record(record_dir, record)
    inspection = inspect_context(context)
    restored = [f for f in files if f["action"] == "restored"]
    mismatched = [f["path"] for f in files if f["dist_record"] != "ok"]
    message = "restored %d file(s), %d already original" % (
        len(restored), sum(f["action"] == "already-original" for f in files))
    if recorded_patch_set(record) != context["patch_set"]:
        message += " (orch's record was written by patch set %s: all of it is reverted)" \
            % recorded_patch_set(record)
    if left:
        message += ("; left alone (changed by someone else since the patch): %s; the record "
                    "is kept: reinstall torch, then revert again" % ", ".join(left))
    if mismatched:
        message += "; not as pip installed them (dist-info RECORD): %s" % ", ".join(mismatched)
    out = result("revert", context, inspection, bool(restored), message)
    out["files"] = files
    return out


ACTION_HANDLERS = {"status": action_status, "diff": action_diff, "apply": action_apply,
                   "revert": action_revert}


def run(args):
    if args["action"] not in ACTIONS:
        raise PayloadError("action must be one of %s" % ", ".join(ACTIONS), "bad-args")
    if args["patch_set"] not in PATCH_SETS:
        raise PayloadError("patch_set must be one of %s" % ", ".join(sorted(PATCH_SETS)),
                           "bad-args")
    where = locate("torch")
    record_dir = os.path.abspath(args["record_dir"]
                                 or os.path.join(where["site_packages"], RECORD_DIR_NAME))
    context = {"where": where, "record_dir": record_dir, "patch_set": args["patch_set"],
               "orch_version": args["orch_version"]}
    read_only = args["action"] in READ_ONLY
    lock = lock_torch_tree(where["site_packages"], exclusive=not read_only)
    try:
        if read_only:
            removed = []
        else:
            removed = remove_leftover_temp_files(where["site_packages"], record_dir)
        out = ACTION_HANDLERS[args["action"]](context)
        out["leftover_temp_files"] = leftover_temp_files(where["site_packages"], record_dir)
        out["orphan_backups"] = orphan_backups(record_dir)
    finally:
        os.close(lock)
    out["removed_temp_files"] = removed
    return out


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
