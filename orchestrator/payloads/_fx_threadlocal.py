"""One mechanism for every FX state that threads share: module globals become one
``threading.local()`` holder with accessor functions, and every use in the installed
package is rewritten to the accessors, found by parsing (never by line numbers).

A SharedState spec says which module, which names (each release has its own subset),
what the accessors are called and how the state looks when it is already thread-local
upstream; this module does the rest:

- classify(): where the state stands in one release's source ("global", "upstream",
  "absent", "orch-marked" or "unknown"), with the line that shows it;
- rewrite_home(): in the state's own module, the module-level assignments become the
  holder and its accessors, every read of a name ``get()``, every ``global``-declared write
  ``set(value)``; a module class keeps ``module.NAME`` readable and writable from outside,
  as the calling thread's value;
- rewrite_user(): in any other file, ``<module>.NAME`` (by full path or an alias the file
  imports) and names imported with ``from <module> import NAME`` go through the accessors.

Any other shape (a write without ``global``, augmented assignment, del, a loop target, a
parameter of that name, an initial value that is not a literal) raises UnknownShape, so
nothing is touched. Inlined when shipped, like _protocol.py; standard library only.
"""

import ast
import os
import re

from _protocol import *  # orch: inlined when shipped
from _fx_source import *  # orch: inlined when shipped


class SharedState:
    """What one shared state is; see the module docstring. Optional hooks:
    upstream(tree) -> line or None (already thread-local in this release);
    expect(src) raises UnknownShape for a home module it does not know;
    extra: {relpath: (transform(src) -> changed, why)} for files that need more than the
    rewrite (the flag's checkpoint backport)."""

    def __init__(self, key, title, module, names, holder, module_class, comment,
                 required=(), accessor_names=None, holder_attrs=None, extra_block=b"",
                 imports=("sys", "threading"), exists_if=None, strict=False,
                 upstream=None, expect=None, extra=None, why_home="", import_check="",
                 names_optional=False, exists_why=""):
        self.key, self.title, self.module, self.names = key, title, module, tuple(names)
        self.relpath = module.replace(".", "/") + ".py"
        self.holder, self.module_class, self.comment = holder, module_class, comment
        self.required = tuple(required)
        self.accessor_names = accessor_names or {}
        self.holder_attrs = holder_attrs or {}
        self.extra_block, self.imports = extra_block, tuple(imports)
        self.exists_if, self.strict = exists_if, strict
        self.upstream, self.expect = upstream, expect
        self.extra = extra or {}
        self.why_home, self.import_check = why_home, import_check
        # names_optional: the state exists (exists_if names a function or class) whether or
        # not the release has the globals; the extra transforms are the rest of the patch.
        self.names_optional, self.exists_why = names_optional, exists_why
        accessors = [f(n) for n in self.names for f in (self.getter, self.setter)]
        if len(set(accessors)) != len(accessors):  # a spec error, caught by any test run
            raise ValueError("%s: two names share an accessor" % key)

    def getter(self, name):
        return self.accessor_names.get(name, ("_orch_tls_get_" + name,))[0]

    def setter(self, name):
        pair = self.accessor_names.get(name)
        return pair[1] if pair else "_orch_tls_set_" + name

    def holder_attr(self, name):
        return self.holder_attrs.get(name, name)

    def defined_names(self, present):
        return [self.holder, self.module_class] + [f(n) for n in present
                                                    for f in (self.getter, self.setter)]

    def why_user(self, present):
        return ("reads or writes %s directly: rewritten to the helpers (its thread-local "
                "accessors)"
                % ", ".join("%s.%s" % (self.module, n) for n in present))


# --- where a state stands ---------------------------------------------------------------------


def module_declarations(tree, name):
    return [n for n in tree.body if single_name_assignment(n, name)]


def classify(spec, data):
    """(shape, line, reason) of spec's state in one home-module source (None: missing)."""
    if data is None:
        if spec.exists_if:
            return "absent", None, "%s is not in this release" % spec.relpath
        return "unknown", None, "%s is missing" % spec.relpath
    if MARKER in first_lines(data, 3):
        return "orch-marked", 1, "carries orch's patch header"
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError) as exc:
        return "unknown", None, "does not parse (%s)" % exc
    names = module_level_names(tree)
    line = spec.upstream(tree) if spec.upstream else None
    if line is not None:
        return "upstream", line, "already thread-local upstream"
    present = [n for n in spec.names if n in names]
    exists = spec.exists_if and module_definition(tree, spec.exists_if)
    if not present:
        if spec.exists_if and not exists:
            return "absent", None, "no %s in %s: not in this release" % (
                spec.exists_if, spec.relpath)
        if spec.names_optional:
            return "global", exists.lineno, spec.exists_why
        return "unknown", None, "neither the module-level %s nor a thread-local shape orch " \
            "knows" % " / ".join(spec.names)
    missing = [n for n in spec.required if n not in present]
    if missing:
        return "unknown", None, "has %s but not %s" % (", ".join(present), ", ".join(missing))
    first = min(d.lineno for n in present for d in module_declarations(tree, n))
    why = "module globals %s" % ", ".join(present)
    return "global", first, why + ("; " + spec.exists_why if spec.exists_why else "")


def module_definition(tree, name):
    """The module-level function or class of that name, or None."""
    return module_function(tree, name) or module_class(tree, name)


def present_names(spec, tree):
    names = module_level_names(tree)
    return [n for n in spec.names if n in names]


# --- the home module --------------------------------------------------------------------------


def literal_initial(relpath, declaration, name):
    """The initial value's source, re-evaluated once per thread: only literals whose fresh
    copy means the same (a constant, an empty dict or list)."""
    value = declaration.value
    if isinstance(value, ast.Constant) or (isinstance(value, ast.Dict) and not value.keys) \
            or (isinstance(value, ast.List) and not value.elts):
        return value
    raise UnknownShape(relpath, "line %d: the initial value of %s is not a literal orch can "
                       "give each thread a copy of" % (declaration.lineno, name))


def accessor_block(spec, initials):
    """The holder, one getter and setter per name, the extra block and the module class."""
    out = ["# orch: %s" % line if line else "#" for line in spec.comment.splitlines()]
    out += ["%s = threading.local()" % spec.holder, "", ""]
    for name, (value, text) in initials.items():
        holder, attr = spec.holder, spec.holder_attr(name)
        out += ["def %s(value):" % spec.setter(name),
                "    %s.%s = value" % (holder, attr), "", ""]
        if isinstance(value, ast.Constant):
            out += ["def %s():" % spec.getter(name),
                    "    return getattr(%s, %r, %s)" % (holder, attr, text), "", ""]
        else:
            out += ["def %s():" % spec.getter(name),
                    "    try:",
                    "        return %s.%s" % (holder, attr),
                    "    except AttributeError:  # this thread's first use: a fresh %s" % text,
                    "        %s.%s = value = %s" % (holder, attr, text),
                    "        return value", "", ""]
    text = ("\n".join(out) + "\n").encode() + spec.extra_block
    lines = ["class %s(type(sys.modules[__name__])):" % spec.module_class,
             '    """Keeps the module attributes %s' % ", ".join(initials),
             "    readable and writable for code outside this module: each is the calling",
             '    thread\'s value."""']
    for name in initials:
        lines += ["", "    @property", "    def %s(self):" % name,
                  "        return %s()" % spec.getter(name), "",
                  "    @%s.setter" % name, "    def %s(self, value):" % name,
                  "        %s(value)" % spec.setter(name)]
    lines += ["", "", "sys.modules[__name__].__class__ = %s" % spec.module_class, ""]
    return text + "\n".join(lines).encode()


def rewrite_home(spec, src):
    """The module's globals -> the holder and accessors; every use -> the accessors."""
    if spec.expect:
        spec.expect(src)
    present = present_names(spec, src.tree)
    if not present and spec.names_optional:
        return False  # nothing global in this release: the extra transforms do the rest
    taken = module_level_names(src.tree) & set(spec.defined_names(present))
    if taken:
        raise UnknownShape(src.relpath, "already defines %s" % ", ".join(sorted(taken)))
    declarations, initials = [], {}
    for name in present:
        found = module_declarations(src.tree, name)
        if len(found) != 1 or found[0].col_offset != 0:
            raise UnknownShape(src.relpath, "expected exactly one unindented module-level "
                               "`%s = ...`" % name)
        value = literal_initial(src.relpath, found[0], name)
        initials[name] = (value, src.text(value).decode())
        declarations.append(found[0])
    declarations.sort(key=lambda d: d.lineno)
    src.replace(*src.own_lines(declarations[0]), accessor_block(spec, initials))
    for later in declarations[1:]:
        src.replace(*src.own_lines(later), b"")
    handled = set(d.targets[0] if isinstance(d, ast.Assign) else d.target for d in declarations)
    names = set(present)
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Global) and names & set(node.names):
            rewrite_global_statement(src, node, names)
        elif isinstance(node, ast.Nonlocal) and names & set(node.names):
            raise UnknownShape(src.relpath, "line %d: nonlocal %s" % (node.lineno,
                                                                    ", ".join(node.names)))
        elif isinstance(node, ast.arg) and node.arg in names:
            raise UnknownShape(src.relpath, "line %d: a parameter named %s"
                               % (node.lineno, node.arg))
        elif isinstance(node, ast.Name) and node.id in names and node not in handled:
            rewrite_home_name(spec, src, node)
    for module in spec.imports:
        ensure_module_import(src, module)
    return True


def rewrite_global_statement(src, node, names):
    """`global NAME` goes away; a statement that also declares other names is refused."""
    others = [n for n in node.names if n not in names]
    if others:
        raise UnknownShape(src.relpath, "line %d declares more globals than %s"
                           % (node.lineno, ", ".join(sorted(names & set(node.names)))))
    src.replace(*src.own_lines(node), b"")


def rewrite_home_name(spec, src, node):
    if isinstance(node.ctx, ast.Load):
        src.replace(src.start(node), src.end(node), spec.getter(node.id).encode() + b"()")
        return
    statement = src.parents.get(node)
    scope = enclosing_scope(src, node)
    if not (isinstance(node.ctx, ast.Store) and isinstance(statement, ast.Assign)
            and statement.targets == [node]
            and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef))
            and declares_global(scope, node.id)):
        raise UnknownShape(src.relpath, "line %d changes %s in a form not handled (only "
                           "`global` writes `NAME = value` in functions are)"
                           % (node.lineno, node.id))
    src.replace(src.start(statement), src.end(statement),
                spec.setter(node.id).encode() + b"(" + src.text(statement.value) + b")")


# --- every other file that uses it ------------------------------------------------------------


def package_of(relpath):
    """torch/fx/proxy.py and torch/fx/__init__.py are both in package torch.fx."""
    return relpath[:-3].split("/")[:-1]


def resolve_from(relpath, node):
    """The absolute module name of an ImportFrom (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = package_of(relpath)
    base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
    return ".".join(base + ([node.module] if node.module else []))


def module_aliases(spec, src):
    """Names and dotted paths that stand for spec.module in this file, and the names it
    imports from it by name: ({owner}, {bound name: imported name, ...}, [alias nodes])."""
    owners, by_name, alias_nodes = {spec.module}, {}, []
    parent, _, leaf = spec.module.rpartition(".")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == spec.module and alias.asname:
                    owners.add(alias.asname)
        elif isinstance(node, ast.ImportFrom):
            module = resolve_from(src.relpath, node)
            for alias in node.names:
                if module == parent and alias.name == leaf:
                    owners.add(alias.asname or leaf)
                elif module == spec.module and alias.name in spec.names:
                    by_name[alias.asname or alias.name] = alias.name
                    alias_nodes.append((node, alias))
    return owners, by_name, alias_nodes


def rewrite_user(spec, src):
    """Every use of the state through its module in this file -> the accessors. Returns
    the names it rewrote ([]: a file may only mention a name in a comment or on another
    object)."""
    owners, by_name, alias_nodes = module_aliases(spec, src)
    leaf = spec.module.rpartition(".")[2]
    found = set(by_name.values()) if rewrite_imported_names(spec, src, by_name, alias_nodes) \
        else set()
    for node in ast.walk(src.tree):
        if spec.strict and isinstance(node, ast.Name) and node.id in spec.names \
                and node.id not in by_name:
            raise UnknownShape(src.relpath, "line %d uses a bare name %s" % (node.lineno, node.id))
        if not (isinstance(node, ast.Attribute) and node.attr in spec.names):
            continue
        owner = dotted_name(node.value)
        ours = owner in owners or (spec.strict and owner is not None
                                   and owner.split(".")[-1] == leaf)
        if not ours:
            if spec.strict:
                raise UnknownShape(src.relpath, "line %d: %s on %s, not on the %s module"
                                   % (node.lineno, node.attr, owner or "an expression", leaf))
            continue  # another object's attribute of the same name
        rewrite_user_attribute(spec, src, node)
        found.add(node.attr)
    return [name for name in spec.names if name in found]


def rewrite_imported_names(spec, src, by_name, alias_nodes):
    """`from M import NAME [as x]` -> `from M import GETTER [as x]`, and each read of the
    bound name -> a call: the import was a snapshot of the import-time object."""
    if not by_name:
        return False
    if spec.strict:
        statement = alias_nodes[0][0]
        raise UnknownShape(src.relpath, "line %d imports %s by name (a snapshot of one "
                           "thread's value)" % (statement.lineno, ", ".join(sorted(by_name))))
    for statement, alias in alias_nodes:
        if len(statement.names) != len(set(a.name for a in statement.names)):
            raise UnknownShape(src.relpath, "line %d imports a name twice" % statement.lineno)
        rewrite_alias(spec, src, statement, alias)
    for node in ast.walk(src.tree):
        if isinstance(node, ast.arg) and node.arg in by_name:
            raise UnknownShape(src.relpath, "line %d: a parameter named %s"
                               % (node.lineno, node.arg))
        if isinstance(node, (ast.Global, ast.Nonlocal)) and set(node.names) & set(by_name):
            raise UnknownShape(src.relpath, "line %d rebinds an imported %s"
                               % (node.lineno, ", ".join(node.names)))
        if isinstance(node, ast.Name) and node.id in by_name:
            if not isinstance(node.ctx, ast.Load):
                raise UnknownShape(src.relpath, "line %d rebinds %s, imported from %s"
                                   % (node.lineno, node.id, spec.module))
            getter = spec.getter(by_name[node.id])
            bound = node.id if node.id != by_name[node.id] else getter
            src.replace(src.start(node), src.end(node), bound.encode() + b"()")
    return True


def rewrite_alias(spec, src, statement, alias):
    """Replace the imported name inside the statement's text (one alias: `NAME` or
    `NAME as x`), found by its position (Python 3.10+) or by scanning the statement."""
    getter = spec.getter(alias.name).encode()
    if hasattr(alias, "lineno"):
        start = src.start(alias)
    else:  # Python < 3.10: aliases have no position; the first whole-word match after "import"
        text = src.data[src.start(statement):src.end(statement)]
        after = text.index(b" import ") + len(b" import ")
        match = re.compile(rb"\b%s\b" % alias.name.encode()).search(text, after)
        if match is None:
            raise UnknownShape(src.relpath, "line %d: cannot find %s in the import"
                               % (statement.lineno, alias.name))
        start = src.start(statement) + match.start()
    src.replace(start, start + len(alias.name), getter)


def rewrite_user_attribute(spec, src, node):
    if isinstance(node.ctx, ast.Load):
        src.replace(src.end(node.value), src.end(node),
                    b"." + spec.getter(node.attr).encode() + b"()")
        return
    statement = src.parents.get(node)
    if not (isinstance(node.ctx, ast.Store) and isinstance(statement, ast.Assign)
            and statement.targets == [node]):
        raise UnknownShape(src.relpath, "line %d changes %s in a form not handled"
                           % (node.lineno, node.attr))
    src.replace(src.start(statement), src.end(statement),
                src.text(node.value) + b"." + spec.setter(node.attr).encode() + b"("
                + src.text(statement.value) + b")")


def user_files(spec, site_packages, present):
    """torch/**/*.py, other than the home module, whose text mentions one of the names:
    found in the installed tree each time, because releases move these uses around."""
    root = os.path.join(site_packages, "torch")
    needles = [n.encode() for n in present]
    found, pending = [], [root]
    while pending:
        directory = pending.pop()
        for entry in os.scandir(directory):
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif entry.name.endswith(".py") and entry.is_file(follow_symlinks=False):
                with open(entry.path, "rb") as f:
                    data = f.read()
                if any(needle in data for needle in needles):
                    found.append(os.path.relpath(entry.path, site_packages).replace(os.sep, "/"))
    return sorted(path for path in found if path != spec.relpath)
