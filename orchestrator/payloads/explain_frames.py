"""The frames of a traceback, explained with the installed source: each frame's lines, the
installed version of its package and whether its file is still the one the wheel installed
(the dist-info RECORD), and the process-wide mutable state the failing frames read
(_state_scan.py), directly or through the checks they call.

Shipped into a container and run with the container's (venv's) python; standard library
only, Python 3.8+. Nothing is imported: files are read and parsed with ast.

Args::

    {"frames": [{"file": "/venv/.../torch/_dynamo/eval_frame.py", "line": 1120,
                 "function": "compile_wrapper", "innermost": true,
                 "code": "raise RuntimeError("}, ...],   # the line as the log shows it
     "roots": ["/root/run"],      # more directories whose files may be read (the trainer's)
     "context": 3,                # lines shown either side of each frame's line
     "ran_at": 1796302364.3}      # when the run started (epoch seconds), if known

The source that ran: a file orch's fx patch changed since the run (its record beside
site-packages, <site>/.orch-fx-tls: the file's sha256 after the patch, the backup of its
bytes before) is read from orch's backup when the run predates the patch: the record's
applied_at is later than ran_at, or, without ran_at, the log's own code lines match the
backup's and not the file's now. Such files say "patched_since" and "ran": "backup". Each
frame says whether the log's code line is the source's line (`code_matches`), so a file
changed in another way is seen too.

A frame's file is read only when it is a .py file inside one of this python's sys.path
directories (site-packages, the standard library) or one of `roots`; a path from another
machine is matched by its part after site-packages/ (or dist-packages/). Anything else
(`<frozen ...>`, C++ frames, files elsewhere) is reported as not available, with why.

Each frame's `with`: the `with` items around its line and its un-released acquire()s,
[{expr, line, entering, how: with|acquire, lock}], `lock` the object the expression names
(_locks.py: {id, name, kind, defined}), or None with `not_lock` (a context manager, an
object that is no lock) or `unresolved` (why it could not be followed).

Result::

    {"event": "result", "python": "...", "files": {FILE: {...}}, "frames": [...],
     "modules": {MODULE: {"relpath": ..., "states": [...]}}}
"""

import ast
import base64
import datetime
import hashlib
import json
import os
import sys

from _protocol import *  # orch: inlined when shipped
from _locate import *  # orch: inlined when shipped
from _state_scan import *  # orch: inlined when shipped
from _locks import *  # orch: inlined when shipped

ARG_SPEC = {"frames": (list, REQUIRED), "roots": (list, []), "context": (int, 3),
            "ran_at": (float, None)}
MAX_FRAMES = 400
MAX_MODULES = 60
MAX_FILE_BYTES = 4 << 20
MAX_CALLS = 8           # calls followed per frame (into the checks it makes)
MAX_FOLLOWED = 80       # and in all
CHECK_DEPTH = 2         # a check, and the helpers it calls (is_fx_symbolic_tracing -> _get_...)
SITE_DIRS = ("site-packages", "dist-packages")
ORCH_PATCH_RECORD = os.path.join(".orch-fx-tls", "record.json")    # _fx_record.py's, beside torch/
MAX_LOCALS = 40


# ------------------------------------------------------------------ where a file is
class Files:
    """Resolves a traceback's file names to readable files of this python's installation."""

    def __init__(self, roots):
        self.roots = [os.path.realpath(r) for r in search_path()]
        self.sites = [r for r in self.roots if os.path.basename(r) in SITE_DIRS]
        # never the whole file system: a root of "/" would let any .py file through
        self.extra = [os.path.realpath(os.path.expanduser(r)) for r in roots
                      if isinstance(r, str) and r and os.path.isdir(os.path.expanduser(r))
                      and os.path.realpath(os.path.expanduser(r)) != "/"]
        self.tops = {}       # site -> {top-level name: dist-info}
        self.records = {}    # dist-info -> {relpath: hash}
        self.patches = {}    # site -> orch's patch record there ({} when none)
        self.ran_before_patch = None   # decided from the run's time or the log's code lines
        self.cache = {}

    def resolve(self, name):
        if name not in self.cache:
            self.cache[name] = self._resolve(name)
            self.mark(self.cache[name])
        return self.cache[name]

    def _resolve(self, name):
        if name.startswith("<") or not name:
            return {"status": "unavailable", "reason": "no Python source file (%s)" % (name or "?")}
        if not name.endswith(".py"):
            return {"status": "unavailable", "reason": "not a Python source file"}
        for candidate in self._candidates(name):
            real = os.path.realpath(candidate)
            root = self._root_of(real)
            if root is not None and os.path.isfile(real):
                return self._describe(real, root)
        return {"status": "unavailable",
                "reason": "not in this python's installed packages or the run's files (%s)"
                          % sys.executable}

    def _candidates(self, name):
        yield name
        for marker in SITE_DIRS:
            at = name.rfind("/%s/" % marker)
            if at >= 0:
                tail = name[at + len(marker) + 2:]
                for site in self.sites:
                    yield os.path.join(site, tail)

    def _root_of(self, real):
        best = None
        for root in self.roots + self.extra:
            if real.startswith(root.rstrip("/") + "/") and (best is None or len(root) > len(best)):
                best = root
        return best

    def _describe(self, real, root):
        relpath = os.path.relpath(real, root)
        found = {"status": "ok", "path": real, "root": root, "relpath": relpath,
                 "module": module_name(relpath)}
        if root in self.sites:
            found.update(self._package(root, relpath, real))
        elif root in self.extra:
            found["package"] = None
        else:
            found["package"] = "(standard library)"
        return found

    def _package(self, site, relpath, real):
        top = relpath.split("/", 1)[0]
        top = top[:-3] if top.endswith(".py") else top
        dist_info = self._tops(site).get(top)
        if dist_info is None:
            return {"package": top, "distribution": None, "version": None, "record": None}
        meta = read_metadata(dist_info)
        expected = self._record(dist_info).get(relpath)
        if expected is None:
            state = "not-listed"
        else:
            state = "ok" if file_hash(real) == expected else "mismatch"
        found = {"package": top, "distribution": meta.get("Name"), "version": meta.get("Version"),
                 "record": state}
        if state == "mismatch":
            found.update(self._orch_patch(site, relpath, real))
        return found

    def _orch_patch(self, site, relpath, real):
        """When orch's fx patch made the file what it is: its backup of the bytes before."""
        if site not in self.patches:
            try:
                with open(os.path.join(site, ORCH_PATCH_RECORD), "rb") as handle:
                    self.patches[site] = json.loads(handle.read().decode("utf-8"))
            except (OSError, ValueError):
                self.patches[site] = {}
        record = self.patches[site] if isinstance(self.patches[site], dict) else {}
        entry = next((f for f in record.get("files") or [] if isinstance(f, dict)
                      and f.get("path") == relpath), None)
        if entry is None or sha256_file(real) != entry.get("sha256_after"):
            return {}
        backup = os.path.join(site, os.path.dirname(ORCH_PATCH_RECORD), "backups", relpath + ".orig")
        if not os.path.isfile(backup) or sha256_file(backup) != entry.get("sha256_before"):
            return {"patched_since": "orch", "backup": None}
        return {"patched_since": "orch", "backup": backup, "applied_at": record.get("applied_at")}

    def decide(self, frames, ran_at):
        """Whether the run predates orch's patch: by the run's time, else by the log's code."""
        patched = [(f, self.resolve(str(f.get("file") or ""))) for f in frames]
        patched = [(f, info) for f, info in patched if info.get("backup")]
        if not patched:
            return
        applied = epoch_of(patched[0][1].get("applied_at"))
        if ran_at is not None and applied is not None:
            self.ran_before_patch = ran_at < applied
        else:
            votes = [code_is(f, info["backup"]) - code_is(f, info["path"]) for f, info in patched]
            self.ran_before_patch = sum(votes) > 0 if any(votes) else None
        for info in self.cache.values():
            self.mark(info)

    def mark(self, info):
        if info.get("backup") and self.ran_before_patch:
            info["ran"] = "backup"

    def _tops(self, site):
        if site not in self.tops:
            found = {}
            for dist_info in dist_infos_in(site):
                for name in top_level_names(dist_info):
                    found.setdefault(name, dist_info)
            self.tops[site] = found
        return self.tops[site]

    def _record(self, dist_info):
        if dist_info not in self.records:
            hashes = {}
            for row in read_lines(os.path.join(dist_info, "RECORD")):
                parts = row.rsplit(",", 2)
                if len(parts) == 3 and parts[1].startswith("sha256="):
                    hashes[parts[0]] = parts[1][len("sha256="):]
            self.records[dist_info] = hashes
        return self.records[dist_info]


def module_name(relpath):
    parts = relpath[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest


def file_hash(path):
    """The sha256 as a wheel's RECORD writes it."""
    return base64.urlsafe_b64encode(_digest(path).digest()).rstrip(b"=").decode()


def sha256_file(path):
    """The sha256 as orch's patch record writes it (hex)."""
    try:
        return _digest(path).hexdigest()
    except OSError:
        return None


def epoch_of(text):
    """An ISO time with its offset (orch's record: 2026-12-03T13:10:00+00:00) as epoch seconds."""
    try:
        return datetime.datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def code_is(frame, path):
    """1 when the log's code line for the frame is that file's line there, else 0."""
    code, line = str(frame.get("code") or "").strip(), frame.get("line")
    if not code or not isinstance(line, int):
        return 0
    try:
        with open(path, "rb") as handle:
            lines = handle.read(MAX_FILE_BYTES).decode("utf-8", "replace").splitlines()
    except OSError:
        return 0
    return int(1 <= line <= len(lines) and lines[line - 1].strip() == code)


# ------------------------------------------------------------------ modules
class Modules:
    """Each module's text, tree and shared state, read once, at most MAX_MODULES."""

    def __init__(self):
        self.loaded = {}

    def get(self, info):
        module = info["module"]
        if module in self.loaded:
            return self.loaded[module]
        if len(self.loaded) >= MAX_MODULES:
            return None
        self.loaded[module] = entry = {"info": info, "lines": [], "scan": None, "error": None}
        # the source that ran: orch's backup when the run predates orch's patch
        path = info["backup"] if info.get("ran") == "backup" else info["path"]
        try:
            if os.path.getsize(path) > MAX_FILE_BYTES:
                raise ValueError("larger than %d bytes" % MAX_FILE_BYTES)
            with open(path, "rb") as handle:
                data = handle.read()
            entry["lines"] = data.decode("utf-8", "replace").splitlines()
            entry["scan"] = ModuleStates(ast.parse(data, info["path"]))
        except (OSError, ValueError, SyntaxError, RecursionError) as exc:
            entry["error"] = "%s: %s" % (type(exc).__name__, exc)
        return entry


def line_text(lines, line):
    return lines[line - 1].strip()[:400] if 1 <= line <= len(lines) else ""


def source_around(lines, line, context):
    if not lines or not 1 <= line <= len(lines):
        return []
    return source_lines(lines, line - context, line + context)


def source_lines(lines, start, end):
    start, end = max(1, start), min(len(lines), end)
    return [{"line": n, "text": lines[n - 1][:400]} for n in range(start, end + 1)]


# ------------------------------------------------------------------ calls a frame makes
def imports(tree, module):
    """Local name -> the dotted name it stands for, from the module's imports."""
    names = {}
    package = module.split(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                # the module's own package, level parts up (a package's __init__ counts too)
                parent = package[:len(package) - node.level]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                if alias.name != "*":
                    names[alias.asname or alias.name] = "%s.%s" % (base, alias.name) if base else alias.name
    return names


def aliases(functions, line):
    """`name = a.b.c` in the functions that hold `line` (a check cached in a local)."""
    found = {}
    for function in functions:
        for node in own_nodes(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name) and node.lineno <= line:
                name = expression_name(node.value)
                if name:
                    found[node.targets[0].id] = name
    return found


def statements_at(function, line):
    """The statements of `function` whose lines hold `line`, outermost first."""
    found, body = [], list(function.node.body)
    while body:
        inner = []
        for node in body:
            if node.lineno <= line <= (getattr(node, "end_lineno", None) or node.lineno):
                found.append(node)
                for name in ("body", "orelse", "finalbody"):
                    inner.extend(getattr(node, name, None) or [])
                for handler in getattr(node, "handlers", None) or []:
                    inner.extend(handler.body)
        body = [n for n in inner if isinstance(n, ast.stmt)]
    return found


def with_blocks(function, line, lines):
    """The `with` statements around `line`: [{expr, line, entering}]; entering: the frame
    stands on the `with` line itself (acquiring: a lock it waits for), else inside its body
    (holding it)."""
    found = []
    for statement in statements_at(function, line):
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            entering = line < statement.body[0].lineno
            for item in statement.items:
                found.append({"expr": segment(lines, item.context_expr), "line": statement.lineno,
                              "entering": entering, "node": item.context_expr, "how": "with"})
    return found[:20]


def acquired_locks(function, line, lines):
    """`X.acquire()` calls in the function before `line` with no `X.release()` after them
    (up to the line): locks this frame holds without a `with` [{expr, line, entering: False}];
    one on `line` itself is being acquired (entering)."""
    calls = [n for n in own_nodes(function) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr in ("acquire", "release")
             and n.lineno <= line]
    found = []
    for call in sorted(calls, key=lambda n: n.lineno):
        expr = segment(lines, call.func.value)
        if call.func.attr == "acquire":
            found = [f for f in found if f["expr"] != expr]
            found.append({"expr": expr, "line": call.lineno, "entering": call.lineno == line,
                          "node": call.func.value, "how": "acquire"})
        else:
            found = [f for f in found if f["expr"] != expr]
    return found[:20]


def segment(lines, node):
    """The source text of an expression on one line (col offsets count UTF-8 bytes)."""
    end = getattr(node, "end_lineno", None)
    if end == node.lineno and 1 <= node.lineno <= len(lines):
        raw = lines[node.lineno - 1].encode("utf-8")
        return raw[node.col_offset:node.end_col_offset].decode("utf-8", "replace")[:200]
    return expression_name(node) or "?"


def calls_on_the_way(function, line, innermost):
    """Calls in the conditions that led to `line` (the if/while/assert tests around it) and,
    for the frame that raised, in its own statement: the checks the error depends on. (An
    outer frame's own statement is the call into the next frame, already on the stack.)"""
    parts = []
    statements = statements_at(function, line)
    for statement in statements:
        if isinstance(statement, (ast.If, ast.While, ast.Assert)):
            parts.append(statement.test)
    if innermost and statements and not hasattr(statements[-1], "body"):
        parts.append(statements[-1])
    calls = [n for part in parts for n in ast.walk(part) if isinstance(n, ast.Call)]
    return calls[:MAX_CALLS]


class Callees:
    """Resolves a call in a frame to a function of an installed module."""

    def __init__(self, files, modules):
        self.files, self.modules, self.followed = files, modules, 0

    def resolve(self, info, scan, tree_imports, local_aliases, call):
        name = expression_name(call.func)
        if not name:
            return None
        first, _, rest = name.partition(".")
        if first in local_aliases:
            name = local_aliases[first] + ("." + rest if rest else "")
            first, _, rest = name.partition(".")
        if first in tree_imports:
            name = tree_imports[first] + ("." + rest if rest else "")
        elif any(f.qualname == name for f in scan.functions):
            return info, name
        return self._find(info, name)

    def _find(self, info, name):
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module, function = parts[:cut], ".".join(parts[cut:])
            for relpath in ("/".join(module) + ".py", "/".join(module) + "/__init__.py"):
                found = self.files.resolve(os.path.join(info["root"], relpath))
                if found.get("status") == "ok":
                    return found, function
        return None

    def reads(self, frame_info, frame_line, function, scan, module, innermost):
        """What the functions called on the way to `frame_line` read, and the functions they
        call in turn (CHECK_DEPTH deep): [(module, key, via)]."""
        local_aliases = aliases(scan.enclosing(frame_line), frame_line)
        calls = calls_on_the_way(function, frame_line, innermost)
        return self._follow(frame_info, scan, module, local_aliases, calls, [], 1)

    def _follow(self, info, scan, module, local_aliases, calls, chain, depth):
        found = []
        tree_imports = imports(scan.tree, module)
        for call in calls:
            if self.followed >= MAX_FOLLOWED:
                break
            target = self.resolve(info, scan, tree_imports, local_aliases, call)
            if target is None:
                continue
            self.followed += 1
            callee_info, qualname = target
            entry = self.modules.get(callee_info)
            if entry is None or entry["scan"] is None:
                continue
            callee = next((f for f in entry["scan"].functions if f.qualname == qualname), None)
            if callee is None or any(c["function"] == qualname for c in chain):
                continue
            via = {"function": qualname, "module": callee_info["module"],
                   "relpath": callee_info["relpath"], "line": callee.start,
                   "call_line": call.lineno, "chain": [c["function"] for c in chain],
                   "source": source_lines(entry["lines"], callee.start,
                                          min(callee.end, callee.start + 11))}
            for key in sorted(entry["scan"].reads.get(qualname, ())):
                found.append((callee_info["module"], key, via))
            if depth < CHECK_DEPTH:
                inner = [n for n in own_nodes(callee) if isinstance(n, ast.Call)][:MAX_CALLS]
                found += self._follow(callee_info, entry["scan"], callee_info["module"], {},
                                      inner, chain + [via], depth + 1)
        return found


# ------------------------------------------------------------------ the run
def lock_identity(block, info, entry, locks):
    """A `with` item or acquire() with the lock its expression names (_locks.py)."""
    node = block.pop("node")
    try:
        block.update(locks.resolve(info, entry, block["line"], node))
    except RecursionError:
        block.update({"lock": None, "unresolved": "nested too deep"})
    return block


def explain_frame(frame, files, modules, callees, context, locks):
    name, line = str(frame.get("file") or ""), frame.get("line")
    out = {"file": name, "line": line, "function": frame.get("function") or ""}
    info = files.resolve(name)
    if info["status"] != "ok" or not isinstance(line, int):
        out["source"], out["reads"] = [], []
        return out
    entry = modules.get(info)
    if entry is None:
        out.update(source=[], reads=[], note="more than %d modules: not read" % MAX_MODULES)
        return out
    out["source"] = source_around(entry["lines"], line, context)
    code = str(frame.get("code") or "").strip()
    out["code_matches"] = line_text(entry["lines"], line) == code[:400] if code else None
    scan = entry["scan"]
    if scan is None:
        out.update(reads=[], note=entry["error"])
        return out
    function = scan.function_at(line)
    out["qualname"] = function.qualname if function else "<module>"
    if function is not None and frame.get("innermost"):
        out["locals"] = sorted(local_names(function))[:MAX_LOCALS]
    blocks = (with_blocks(function, line, entry["lines"])
              + acquired_locks(function, line, entry["lines"])) if function else []
    out["with"] = [lock_identity(block, info, entry, locks) for block in blocks]
    reads = []
    if function is not None:
        for key in sorted(scan.reads.get(function.qualname, ())):
            reads.append({"module": info["module"], "state": key, "via": None})
        for module, key, via in callees.reads(info, line, function, scan, info["module"],
                                                  bool(frame.get("innermost"))):
            reads.append({"module": module, "state": key, "via": via})
    out["reads"] = reads
    return out


def module_report(entry):
    scan = entry["scan"]
    report = {"relpath": entry["info"]["relpath"], "path": entry["info"]["path"],
              "error": entry["error"], "states": [], "ran": entry["info"].get("ran", "file")}
    if scan is None:
        return report
    lines = entry["lines"]
    for key in sorted(scan.states):
        state = dict(scan.states[key])
        state["writes"] = [dict(w, text=line_text(lines, w["line"])) for w in state["writes"]]
        state["text"] = line_text(lines, state["line"])
        state["readers"] = scan.readers(key)[:40]
        state["functions"] = [{"qualname": f.qualname, "start": f.start, "end": f.end}
                              for f in scan.functions
                              if any(w["function"] == f.qualname for w in state["writes"])]
        report["states"].append(state)
    return report


def run(args):
    frames = [f for f in args["frames"] if isinstance(f, dict)][:MAX_FRAMES]
    files = Files(args["roots"])
    files.decide(frames, args["ran_at"])
    modules = Modules()
    callees = Callees(files, modules)
    context = max(0, min(args["context"], 20))
    locks = Locks(files, modules)
    explained = [explain_frame(f, files, modules, callees, context, locks) for f in frames]
    return {"python": sys.executable,
            "python_version": "%d.%d.%d" % sys.version_info[:3],
            "files": files.cache, "frames": explained, "ran_before_patch": files.ran_before_patch,
            "modules": dict((name, module_report(entry)) for name, entry in modules.loaded.items()),
            "limits": {"modules": MAX_MODULES, "frames": MAX_FRAMES}}


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
