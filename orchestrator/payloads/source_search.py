"""Search an installed package's Python source (torch by default): grep or definitions.

Shipped alone into a container and run with the container's python; standard library
only, Python 3.8+. The package is found without importing it (see torch_locate.py; the
locate code below is a copy of it).

Protocol
--------
Invocation: ``PYTHON - ARGS_JSON`` with this file on stdin, or ``PYTHON source_search.py
ARGS_JSON``. ARGS_JSON is one argv element holding a JSON object; unknown keys are an
error. Options (defaults in brackets)::

    package      import or distribution name                      ["torch"]
    pattern      grep: the pattern; def: NAME or dotted Class.method (required)
    fixed        pattern is a literal string, not a regex          [false]
    word         match whole words only                            [false]
    ignore_case  case-insensitive                                  [false]
    context      lines of context before and after each hit        [0]
    mode         "grep" or "def"                                   ["grep"]
    show         def mode: include each definition's source        [false]
    engine       "auto" (rg when on PATH), "rg" or "python"        ["auto"]
    max_hits     stop after this many hits or definitions          [1000]
    cpu_seconds  RLIMIT_CPU of the search (SIGXCPU), 0 for none    [0]

Output: JSON lines on stdout, in order of path (directory by directory, names sorted, as
``rg --sort path`` walks) then line. Grep hits::

    {"event": "hit", "path": "torch/fx/_symbolic_trace.py", "line": 70, "text": "...",
     "before": [[68, "..."], [69, "..."]], "after": [[71, "..."]]}

Definitions (def mode)::

    {"event": "def", "path": "torch/fx/_symbolic_trace.py", "line": 69, "end_line": 70,
     "kind": "function" | "method" | "class" | "assignment",
     "qualname": "Tracer.trace", "signature_line": "def is_fx_symbolic_tracing() -> bool:",
     "body": "<the definition's source, decorators included; only with show=true>"}

Paths are relative to site-packages, "/"-separated; ``text`` is the line without its "\\n".
The last line is the result (exit code 0)::

    {"event": "result", "mode": "grep", "hits": N, "files_searched": M | null,
     "truncated": bool, "engine": "rg" | "python", "engine_reason": "no ripgrep in the
     container", "version": "2.13.0+cpu",
     "package_dir": "...", "site_packages": "...", "warnings": ["..."]}

``truncated`` is true when more than max_hits hits exist; ``files_searched`` is then null
(the search stopped early). On failure the last line is (exit code 1)::

    {"event": "error", "message": "...", "kind": "bad-args" | "bad-pattern" |
     "not-installed" | "rg-failed" | "internal"}

What is searched, identically for both engines: every regular file named ``*.py`` under the
package directory, hidden ones included, symlinks not followed, no ignore files. A line is
the text between "\\n"s, decoded as UTF-8 (invalid bytes become U+FFFD); a pattern matches
a line when ``re.search`` finds it there (no multi-line matches).

Regex syntax: the python engine uses Python ``re``; rg uses Rust regex, which agrees for
common patterns (literals, classes, ``\\b``, ``\\w``, anchors, repetition, alternation).
Every pattern is first checked with Python ``re`` so both engines accept the same
patterns; with engine "auto", a pattern rg cannot take (look-around, backreferences, a
line break or NUL) is searched by the python engine instead. ``word`` is
``(?<!\\w)(?:PATTERN)(?!\\w)`` in Python and ``rg -w``. The pattern is data: it goes to rg as
one argv element (no shell) and never runs.

Def mode finds ``def``/``async def`` (kind "function", or "method" directly in a class
body), ``class``, and assignments ``NAME = ...`` / ``NAME: T = ...`` at module or class
level (also inside module-level if/try blocks); not imports, not function locals. A dotted
NAME matches the end of the qualified name (``Tracer.trace``); nested functions are named
like Python does (``outer.<locals>.inner``; "<locals>" is skipped when matching). Files
are prefiltered by the literal last part of NAME (rg when available); a file where every
occurrence of it stands where Python cannot define it (a call, an import, an attribute, a
string like "torch.fx.NAME") is not parsed either (see may_define). The rest are parsed
with ``ast``; those that do not parse with this python are listed in warnings.

``files_searched`` counts the regular ``*.py`` files under the package directory; with rg
it is rg's own count (``--stats``), which equals a walk of the tree (docs/design/source-search.md).
"""

import ast
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading

from _protocol import *  # orch: inlined when shipped
from _locate import *  # orch: inlined when shipped

ARG_SPEC = {
    "package": (str, "torch"),
    "pattern": (str, REQUIRED),
    "fixed": (bool, False),
    "word": (bool, False),
    "ignore_case": (bool, False),
    "context": (int, 0),
    "mode": (str, "grep"),
    "show": (bool, False),
    "engine": (str, "auto"),
    "max_hits": (int, 1000),
    "cpu_seconds": (int, 0),
}
MODES = ("grep", "def")
ENGINES = ("auto", "rg", "python")
MAX_CONTEXT = 1000

# Constructs that see past the edges of one line (so a whole-text prefilter could miss a
# line's match). A cautious yes/no is enough: a false yes only skips the prefilter.
LINE_EDGE_CONSTRUCTS = re.compile(r"\\[AZ]|\(\?<?[=!]")
# Python re features rg rejects outright; others it rejects are caught when it fails.
RG_UNSUPPORTED = re.compile(r"\(\?<?[=!]|\\[1-9]|\(\?P=")
# The line of rg --stats that counts the files it searched (ripgrep 0.8 and later).
FILES_SEARCHED = re.compile(rb"^(\d+) files searched$", re.MULTILINE)


def check_args(args):
    if args["mode"] not in MODES:
        raise PayloadError("mode must be one of %s" % ", ".join(MODES), "bad-args")
    if args["engine"] not in ENGINES:
        raise PayloadError("engine must be one of %s" % ", ".join(ENGINES), "bad-args")
    if not 0 <= args["context"] <= MAX_CONTEXT:
        raise PayloadError("context must be between 0 and %d" % MAX_CONTEXT, "bad-args")
    if args["max_hits"] < 1:
        raise PayloadError("max_hits must be at least 1", "bad-args")
    if not args["pattern"]:
        raise PayloadError("the pattern is empty", "bad-args")
    if args["mode"] == "def" and not all(p.isidentifier() for p in args["pattern"].split(".")):
        raise PayloadError("def mode takes a name like is_fx_symbolic_tracing or Tracer.trace, "
                           "not %r" % args["pattern"], "bad-args")


# --- files ----------------------------------------------------------------------------------


def relative(path, site_packages):
    prefix = site_packages.rstrip(os.sep) + os.sep
    if path.startswith(prefix):  # the common case, much cheaper than relpath
        return path[len(prefix):].replace(os.sep, "/")
    return os.path.relpath(path, site_packages).replace(os.sep, "/")


def path_order(relpath):
    # rg --sort path sorts names within each directory; comparing component lists gives
    # the same order ("a/b.py" before "a-c.py"), unlike comparing whole strings.
    return relpath.split("/")


def walk_python_files(directory, ordered):
    """Paths of the regular *.py files under directory; in path order when ordered."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return  # unreadable directory: rg skips it too
    if ordered:
        entries.sort(key=lambda entry: entry.name)
    # DirEntry types come from the directory listing: no stat per file, and links are
    # neither files nor directories here, so they are not followed (as in rg).
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            for path in walk_python_files(entry.path, ordered):
                yield path
        elif entry.name.endswith(".py") and entry.is_file(follow_symlinks=False):
            yield entry.path


def python_files(package_dir, site_packages):
    """Relative paths of every regular *.py file under package_dir, in path order."""
    if not os.path.isdir(package_dir):
        single = package_dir.endswith(".py") and os.path.isfile(package_dir)
        return [relative(package_dir, site_packages)] if single else []
    return [relative(p, site_packages) for p in walk_python_files(package_dir, ordered=True)]


def count_python_files(package_dir):
    if not os.path.isdir(package_dir):
        return 1 if package_dir.endswith(".py") and os.path.isfile(package_dir) else 0
    return sum(1 for _ in walk_python_files(package_dir, ordered=False))


class BackgroundCount(threading.Thread):
    """Counts the files while rg searches (rg's own statistics only count files with hits)."""

    def __init__(self, package_dir):
        super().__init__(daemon=True)
        self.package_dir = package_dir
        self.count = None

    def run(self):
        self.count = count_python_files(self.package_dir)


def read_text_lines(path):
    """(text, lines) of a file: UTF-8 with U+FFFD for bad bytes; a final "\\n" ends the
    last line rather than starting an empty one."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return text, lines


# --- grep -----------------------------------------------------------------------------------


def compile_pattern(pattern, fixed, word, ignore_case):
    body = re.escape(pattern) if fixed else pattern
    if word:
        body = r"(?<!\w)(?:%s)(?!\w)" % body
    try:
        return re.compile(body, re.IGNORECASE if ignore_case else 0)
    except (re.error, OverflowError, RecursionError) as exc:
        raise PayloadError("the pattern %r is not a valid regular expression (Python re "
                           "syntax): %s; set fixed to search for it literally" % (pattern, exc),
                           "bad-pattern") from None


def whole_text_prefilter(regex, pattern, fixed):
    """A regex that finds something in a file's whole text whenever one of its lines
    matches (so files without a match are skipped fast), or None when the pattern has
    constructs that behave differently at line edges inside a whole text."""
    if not fixed and LINE_EDGE_CONSTRUCTS.search(pattern):
        return None
    return re.compile(regex.pattern, regex.flags | re.MULTILINE)


def context_lines(get_line, numbers):
    return [[n, get_line(n)] for n in numbers if get_line(n) is not None]


def hit_event(relpath, number, get_line, context):
    return {
        "path": relpath,
        "line": number,
        "text": get_line(number),
        "before": context_lines(get_line, range(max(1, number - context), number)),
        "after": context_lines(get_line, range(number + 1, number + context + 1)),
    }


def python_grep(regex, prefilter, files, site_packages, warnings):
    """Yields (relpath, matching line numbers, get_line) for each file with a hit."""
    for relpath in files:
        try:
            text, lines = read_text_lines(os.path.join(site_packages, relpath))
        except OSError as exc:
            warnings.append("%s: %s" % (relpath, exc.strerror or exc))
            continue
        if prefilter is not None and not prefilter.search(text):
            continue
        numbers = [i + 1 for i, line in enumerate(lines) if regex.search(line)]
        if numbers:
            yield relpath, numbers, (lambda n, lines=lines: lines[n - 1]
                                     if 1 <= n <= len(lines) else None)


def rg_base_argv(rg):
    # No config file, no ignore files, hidden files included, every file searched as
    # text, bytes as they are (no BOM sniffing): the python engine's view of a tree.
    # No --sort: it makes rg single-threaded (twice the time); results are sorted here.
    return [rg, "--no-config", "--no-ignore", "--hidden", "--text", "--encoding", "none",
            "--glob", "*.py"]


def rg_grep_argv(rg, args, package_dir):
    argv = rg_base_argv(rg) + ["--json"]
    if args["fixed"]:
        argv.append("--fixed-strings")
    if args["word"]:
        argv.append("--word-regexp")
    if args["ignore_case"]:
        argv.append("--ignore-case")
    if args["context"]:
        argv += ["--context", str(args["context"])]
    # --regexp keeps a pattern that starts with "-" from being read as an option.
    return argv + ["--regexp", args["pattern"], "--", package_dir]


def rg_data_text(value):
    if "text" in value:
        return value["text"]
    import base64  # rarely needed: rg sends lines that are not UTF-8 this way

    return base64.b64decode(value["bytes"]).decode("utf-8", "replace")


class RgGrep:
    """Runs rg --json and yields per-file results like python_grep."""

    def __init__(self, argv, site_packages):
        self.argv = argv
        self.site_packages = site_packages
        self.messages = 0
        self.finished = False
        self.stderr = ""

    def files(self):
        import tempfile  # grep mode only: a def search starts faster without it

        with tempfile.TemporaryFile() as err:  # a file, so a chatty rg can't fill a pipe
            proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=err)
            try:
                for item in self._files(proc.stdout):
                    yield item
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.stdout.close()
                proc.wait()
                err.seek(0)
                self.stderr = err.read().decode("utf-8", "replace")

    def _files(self, stdout):
        numbers, lines = [], {}
        for raw in stdout:
            message = json.loads(raw)
            self.messages += 1
            kind, data = message["type"], message["data"]
            if kind == "begin":
                numbers, lines = [], {}
            elif kind in ("match", "context"):
                text = rg_data_text(data["lines"])
                lines[data["line_number"]] = text[:-1] if text.endswith("\n") else text
                if kind == "match":
                    numbers.append(data["line_number"])
            elif kind == "end" and numbers:
                path = rg_data_text(data["path"])
                yield relative(path, self.site_packages), numbers, lines.get
            elif kind == "summary":
                self.finished = True


def emit_hits(file_results, context, max_hits):
    """Emits hit events in order; returns (hits emitted, whether more hits existed)."""
    count = 0
    for relpath, numbers, get_line in file_results:
        for number in numbers:
            if count == max_hits:
                return count, True
            emit("hit", **hit_event(relpath, number, get_line, context))
            count += 1
    return count, False


def pattern_fits_rg(pattern, fixed):
    # An argv element cannot hold NUL, and rg refuses a line break outside multiline mode.
    if "\n" in pattern or "\x00" in pattern:
        return False
    return fixed or not RG_UNSUPPORTED.search(pattern)


def choose_engine(requested, pattern_fits_rg):
    """'rg' or 'python' for this search; raises when rg is demanded but cannot be used."""
    rg = shutil.which("rg")
    if requested == "python":
        return "python", None
    if requested == "rg":
        if rg is None:
            raise PayloadError("engine rg was requested but rg is not on PATH (%s); use engine "
                               "auto or python" % os.environ.get("PATH", ""), "rg-failed")
        if not pattern_fits_rg:
            raise PayloadError("rg cannot take this pattern (look-around, backreference, line "
                               "break or NUL); use engine auto or python", "bad-pattern")
        return "rg", rg
    return ("rg", rg) if rg is not None and pattern_fits_rg else ("python", None)


def run_grep(args, where, warnings):
    site_packages, package_dir = where["site_packages"], where["package_dir"]
    regex = compile_pattern(args["pattern"], args["fixed"], args["word"], args["ignore_case"])
    engine, rg = choose_engine(args["engine"], pattern_fits_rg(args["pattern"], args["fixed"]))
    if engine == "rg":
        counter = BackgroundCount(package_dir)
        counter.start()
        search = RgGrep(rg_grep_argv(rg, args, package_dir), site_packages)
        results = sorted(search.files(), key=lambda found: found[0].split("/"))
        hits, truncated = emit_hits(results, args["context"], args["max_hits"])
        counter.join()
        if not truncated and not search.finished:
            if search.messages or args["engine"] == "rg":
                raise PayloadError("rg failed: %s" % search.stderr.strip()[-2000:], "rg-failed")
            # rg refused the pattern before searching anything: Python re takes it.
            reason = (search.stderr.strip().splitlines() or ["no message"])[-1]
            warnings.append("rg could not run this pattern (%s); searched with the python "
                            "engine" % reason)
            engine = "python"
        else:
            # rg keeps going past unreadable files and says so on stderr, as python_grep does.
            warnings.extend(search.stderr.strip().splitlines()[:20])
            return engine, hits, truncated, None if truncated else counter.count
    files = python_files(package_dir, site_packages)
    prefilter = whole_text_prefilter(regex, args["pattern"], args["fixed"])
    results = python_grep(regex, prefilter, files, site_packages, warnings)
    hits, truncated = emit_hits(results, args["context"], args["max_hits"])
    return engine, hits, truncated, None if truncated else len(files)


# --- definitions ----------------------------------------------------------------------------


def nested_bodies(node):
    """Statement lists inside a non-scope compound statement (if, try, with, for, ...)."""
    for field in ("body", "orelse", "finalbody"):
        body = getattr(node, field, None)
        if isinstance(body, list):
            yield body
    for handler in getattr(node, "handlers", None) or []:
        yield handler.body
    for case in getattr(node, "cases", None) or []:  # match statements, Python 3.10+
        yield case.body


def target_names(target):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            for name in target_names(element):
                yield name
    elif isinstance(target, ast.Starred):
        for name in target_names(target.value):
            yield name


def assigned_names(node):
    if isinstance(node, ast.Assign):
        for target in node.targets:
            for name in target_names(target):
                yield name
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        yield node.target.id


def iter_definitions(body, scope=(), in_class=False, in_function=False):
    """(qualname parts, kind, node) for the definitions in a statement list, recursively."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield scope + (node.name,), "method" if in_class else "function", node
            for found in iter_definitions(node.body, scope + (node.name, "<locals>"),
                                          False, True):
                yield found
        elif isinstance(node, ast.ClassDef):
            yield scope + (node.name,), "class", node
            for found in iter_definitions(node.body, scope + (node.name,), True, in_function):
                yield found
        else:
            if not in_function:
                for name in assigned_names(node):
                    yield scope + (name,), "assignment", node
            for nested in nested_bodies(node):
                for found in iter_definitions(nested, scope, in_class, in_function):
                    yield found


def name_matches(qualname_parts, wanted_parts):
    parts = [p for p in qualname_parts if p != "<locals>"]
    return parts[-len(wanted_parts):] == wanted_parts


def definition_event(relpath, lines, qualname, kind, node, show):
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    end = getattr(node, "end_lineno", None) or node.lineno
    event = {
        "path": relpath,
        "line": node.lineno,
        "end_line": end,
        "kind": kind,
        "qualname": ".".join(qualname),
        "signature_line": lines[node.lineno - 1] if node.lineno <= len(lines) else "",
    }
    if show:
        event["body"] = "\n".join(lines[first - 1:end])
    return event


# Where Python defines a name it is the word after def/class, or a target followed by "=",
# ":" (annotation), or "," ")" "]" (inside a tuple or list target), or by a line end, a
# comment or a line continuation where the target goes on. Bytes next to the name that make
# it part of a longer identifier or an attribute (x.NAME) rule that place out.
KEYWORD_BEFORE = re.compile(rb"(?:def|class)(?:[ \t\f]|\\(?:\r\n|\r|\n))+\Z")
KEYWORD_WINDOW = 256
BLANK = b" \t\f\r\n\\"  # what may stand between def and its name, continuations included
# "import NAME", "... as NAME" (import, with, except, match) bind it, but not as a
# definition this mode reports.
IMPORT_OR_AS_BEFORE = re.compile(rb"(?<![A-Za-z0-9_.])(?:import|as)[ \t\f]+\Z")
TARGET_AFTER = re.compile(rb"[ \t\f]*(?:=(?!=)|[:,)\]\\#\r\n]|\Z)")
IDENTIFIER_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
# PEP 263: a coding declaration on line 1 or 2.
CODING_LINE = re.compile(rb"(?:[^\r\n]*(?:\r\n|\r|\n))?[ \t\f]*#[^\r\n]*?coding[:=][ \t]*([-\w.]+)")
ASCII_WORD = re.compile(r"[A-Za-z0-9_]")
NON_ASCII = re.compile(r"[^\x00-\x7f]")


def declares_other_encoding(data):
    declared = CODING_LINE.match(data)
    if declared is None:
        return False
    name = declared.group(1).decode("ascii").lower().replace("_", "-")
    return not (name in ("utf-8", "utf8") or name.startswith("utf-8-"))


def has_chars_normalized_to_ascii(data):
    """Whether the text has a character that Python's NFKC normalisation of identifiers
    turns into ASCII letters or digits (U+FB01, the "fi" ligature, becomes "fi"): a name
    spelled with one is NAME to Python but not NAME in bytes."""
    if data.isascii():
        return False
    import unicodedata  # only for non-ASCII files
    chars = set(NON_ASCII.findall(data.decode("utf-8", "replace")))
    return any(ASCII_WORD.search(unicodedata.normalize("NFKC", c)) for c in chars)


def binds_at(data, start, end):
    """Whether the name at data[start:end] may be one Python binds (see KEYWORD_BEFORE)."""
    if start and (data[start - 1] in IDENTIFIER_BYTES or data[start - 1] == ord(".")):
        return False
    if end < len(data) and data[end] in IDENTIFIER_BYTES:
        return False
    window = max(0, start - KEYWORD_WINDOW)
    before = KEYWORD_BEFORE.search(data, window, start)
    if before is not None or (window and not data[window:start].translate(None, BLANK)):
        return True  # after def/class (or after more blank space than the window shows)
    if IMPORT_OR_AS_BEFORE.search(data, window, start) is not None:
        return False
    return TARGET_AFTER.match(data, end) is not None


def may_define(data, name):
    """False only when no occurrence of name in data (a file's bytes) can be a def, class
    or assignment of it: then the file is not parsed. A cautious yes is always allowed."""
    if not name.isascii() or names_may_differ_from_bytes(data):
        return True
    return has_binding_occurrence(data, name.encode("ascii"))


def names_may_differ_from_bytes(data):
    """Whether a name Python reads in data may be spelled otherwise in its bytes (another
    encoding, a character NFKC turns into ASCII): then no byte search may rule a name out.
    A question about the file alone, asked once per file (it decodes a non-ASCII one)."""
    return declares_other_encoding(data) or has_chars_normalized_to_ascii(data)


def has_binding_occurrence(data, needle):
    """Whether an occurrence of needle (an ASCII name's bytes) in data may be bound there."""
    start = data.find(needle)
    while start != -1:
        if binds_at(data, start, start + len(needle)):
            return True
        start = data.find(needle, start + 1)
    return False


def definitions_in_file(path, relpath, wanted_parts, show, warnings):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        warnings.append("%s: %s" % (relpath, exc.strerror or exc))
        return []
    # Parsing is the slow part: a file that lacks any part of "Tracer.trace" defines
    # neither, and one where "trace" only appears where Python does not bind it (a call,
    # an import, an attribute, a string like "torch.fx.trace") is skipped unparsed too.
    if not all(part.encode("utf-8") in data for part in wanted_parts):
        return []
    if not may_define(data, wanted_parts[-1]):
        return []
    try:
        tree = ast.parse(data, filename=relpath)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        import platform  # only for this warning

        warnings.append("%s: does not parse with Python %s (%s)"
                        % (relpath, platform.python_version(), type(exc).__name__))
        return []
    lines = data.decode("utf-8", "replace").split("\n")
    found = [definition_event(relpath, lines, qualname, kind, node, show)
             for qualname, kind, node in iter_definitions(tree.body)
             if name_matches(qualname, wanted_parts)]
    return sorted(found, key=lambda event: event["line"])


def rg_files_containing(rg, literal, package_dir, site_packages):
    """(relative paths of the files rg finds the literal in, how many files it searched or
    None when it cannot say for sure), or None if rg failed."""
    # --stats adds "N files searched" after the NUL-ended paths; it counts every file
    # searched, which makes a walk of the tree to count them unnecessary.
    argv = rg_base_argv(rg) + ["--files-with-matches", "--null", "--stats", "--fixed-strings",
                               "--regexp", literal, "--", package_dir]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode not in (0, 1):
        return None
    found = proc.stdout.split(b"\0")
    paths, stats = [os.fsdecode(p) for p in found[:-1]], found[-1]
    relpaths = sorted((relative(p, site_packages) for p in paths), key=path_order)
    return relpaths, rg_files_searched(stats, proc.stderr, package_dir)


def rg_files_searched(stats, stderr, package_dir):
    """rg's count of files searched, when it is the python walk's count: a directory (a
    module file given to rg is searched whatever its name) and no file rg could not read
    (the walk counts those)."""
    counted = FILES_SEARCHED.search(stats)
    if counted is None or stderr.strip() or not os.path.isdir(package_dir):
        return None
    return int(counted.group(1))


def python_files_containing(literal, files, site_packages):
    needle = literal.encode("utf-8")
    found = []
    for relpath in files:
        try:
            with open(os.path.join(site_packages, relpath), "rb") as f:
                if needle in f.read():
                    found.append(relpath)
        except OSError:
            continue  # reported when parsing is attempted; unreadable files have no defs
    return found


def run_def(args, where, warnings):
    site_packages, package_dir = where["site_packages"], where["package_dir"]
    wanted = args["pattern"].split(".")
    engine, rg = choose_engine(args["engine"], True)
    candidates = None
    if engine == "rg":
        listed = rg_files_containing(rg, wanted[-1], package_dir, site_packages)
        if listed is None:
            warnings.append("rg failed to list candidate files; used the python engine")
        else:
            candidates, files_count = listed
            if files_count is None:
                files_count = count_python_files(package_dir)
    if candidates is None:
        engine = "python"
        files = python_files(package_dir, site_packages)
        files_count = len(files)
        candidates = python_files_containing(wanted[-1], files, site_packages)
    count = 0
    for relpath in candidates:
        path = os.path.join(site_packages, relpath)
        for event in definitions_in_file(path, relpath, wanted, args["show"], warnings):
            if count == args["max_hits"]:
                return engine, count, True, None
            emit("def", **event)
            count += 1
    return engine, count, False, files_count


def engine_reason(requested, engine):
    """Why this engine searched, in words (the output says which engine ran and why)."""
    if requested == engine:
        return "asked for"
    if engine == "rg":
        return "ripgrep is on PATH"
    if shutil.which("rg") is None:
        return "no ripgrep in the container"
    return "a pattern ripgrep cannot take"


def limit_cpu(seconds):
    """RLIMIT_CPU: a pattern that backtracks for ever (Python re runs in C, where no timer
    or signal handler can stop it) is killed by SIGXCPU after `seconds` of CPU; rg, forked
    after this, gets the same limit of its own."""
    if seconds <= 0:
        return
    for already in resource.getrlimit(resource.RLIMIT_CPU):
        if already != resource.RLIM_INFINITY:
            seconds = min(seconds, already)   # a lower limit set already stays
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, resource.getrlimit(resource.RLIMIT_CPU)[1]))
    except (ValueError, OSError):
        pass  # not allowed here: the wall-clock limit still holds


def run(args):
    check_args(args)
    limit_cpu(args["cpu_seconds"])
    where = locate(args["package"])
    warnings = []
    search = run_def if args["mode"] == "def" else run_grep
    engine, hits, truncated, files_searched = search(args, where, warnings)
    return {
        "mode": args["mode"],
        "hits": hits,
        "files_searched": files_searched,
        "truncated": truncated,
        "engine": engine,
        "engine_reason": engine_reason(args["engine"], engine),
        "version": where["version"],
        "package_dir": where["package_dir"],
        "site_packages": where["site_packages"],
        "warnings": warnings,
    }


if __name__ == "__main__":
    sys.exit(run_main(sys.argv, ARG_SPEC, run))
