"""Which lock a `with X:` line (or an `X.acquire()`) names: the object, not its spelling.

One lock is often spelled differently in different modules: torch/_dynamo/convert_frame.py
defines `compile_lock = threading.RLock()` and torch/_inductor/compile_fx.py takes the same
object with `from torch._dynamo.convert_frame import compile_lock` (inside a function). A
wait graph keyed by the spelling sees two locks and misses the cycle between them, so each
expression is followed, with ast only (nothing imported), to where its object is made:

- a name: bindings of the enclosing functions first (a function-level import, an
  assignment before the line), then the module's own (an assignment, an import);
- `m.NAME` with m an imported module (`import a.b as m`, `from a import b`): NAME in m;
- `self.NAME` / `cls.NAME` in a method, `Class.NAME`: the class body's assignment or a
  method's `self.NAME = ...`;
- an import: the name in the module it comes from (a sibling file of the same root, the
  installed package's file), at most MAX_HOPS modules away.

It is a lock when the object is made by threading.Lock/RLock/Condition/Semaphore/
BoundedSemaphore (or _thread.allocate_lock, multiprocessing's); its identity is the module
and name where it is made ("torch/_dynamo/convert_frame.py:compile_lock"). Anything else a
`with` names is not: a call's result (`_disable_current_modes()`, a context manager), an
object made by another call. An expression that cannot be followed (a function's argument,
a module not found) is "unresolved": the caller decides by its name.

Inlined when shipped (explain_frames.py); standard library only, Python 3.8+.
"""

import ast
import os

from _state_scan import *  # orch: inlined when shipped

LOCK_MAKERS = frozenset(("Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore",
                         "allocate_lock"))
LOCK_MODULES = frozenset(("threading", "_thread", "multiprocessing", "torch.multiprocessing"))
MAX_HOPS = 6


def expression_name(node):
    """'a.b.c' for the expression a.b.c; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def function_imports(function, line):
    """Names an enclosing function binds with its own imports before `line`."""
    found = {}
    for node in own_nodes(function):
        if getattr(node, "lineno", line + 1) > line:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(import_names(node, None))
    return found


def import_names(node, package):
    """Local name -> ("module", dotted) or ("from", module, name) for one import statement.
    PACKAGE: the importing module's dotted name parts, for a relative import."""
    found = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                found[alias.asname] = ("module", alias.name)
            else:
                top = alias.name.split(".")[0]
                found[top] = ("module", top)
        return found
    base = node.module or ""
    if node.level:
        parts = list(package or [])
        parent = parts[:len(parts) - node.level] if node.level <= len(parts) else []
        base = ".".join(parent + ([base] if base else []))
    for alias in node.names:
        if alias.name != "*":
            found[alias.asname or alias.name] = ("from", base, alias.name)
    return found


def module_imports(tree, module):
    """The module-level imports (also inside module-level if/try blocks)."""
    found = {}
    package = module.split(".")

    def visit(body):
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name, value in import_names(node, package).items():
                    found.setdefault(name, value)
            elif isinstance(node, (ast.If, ast.Try)):
                for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                    visit(block)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
    visit(tree.body)
    return found


def function_assignment(function, name, line):
    """The last `name = value` of the function before `line`: the value node, or None."""
    best = None
    for node in own_nodes(function):
        if isinstance(node, ast.Assign) and node.lineno <= line and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if best is None or node.lineno > best.lineno:
                best = node
    return best


class Locks:
    """Resolves lock expressions to the object's identity. FILES, MODULES: explain_frames'
    Files (file names to installed or run files) and Modules (each module read once)."""

    def __init__(self, files, modules):
        self.files, self.modules = files, modules

    def resolve(self, info, entry, line, node):
        """{"lock": {id, name, kind, defined}} or {"lock": None, "not_lock": why} or
        {"lock": None, "unresolved": why} for the expression NODE on LINE of a module."""
        if isinstance(node, ast.Call):
            maker = self.maker(info, entry, node)
            if maker:
                return {"lock": None, "not_lock": "a lock made on the spot, held by no one else"}
            return {"lock": None, "not_lock": "a call's result (a context manager), not a lock"}
        name = expression_name(node)
        if name is None:
            return {"lock": None, "unresolved": "not a name or an attribute"}
        scope = {"function": entry["scan"].function_at(line), "line": line}
        return self.follow(info, entry, name, scope, MAX_HOPS)

    # ---------------------------------------------------------------- names
    def follow(self, info, entry, name, scope, hops):
        if hops <= 0:
            return {"lock": None, "unresolved": "more than %d modules away" % MAX_HOPS}
        first, _, rest = name.partition(".")
        scan = entry["scan"]
        function, line = scope.get("function"), scope.get("line") or 0
        for enclosing in reversed(scan.enclosing(line)) if function else []:
            bound = function_imports(enclosing, line).get(first)
            if bound:
                return self.imported(info, bound, rest, hops)
            value = function_assignment(enclosing, first, line)
            if value is not None:
                return self.value(info, entry, value.value, rest, value.lineno, first,
                                  {"function": enclosing, "line": value.lineno}, hops)
            if first in ("self", "cls") and enclosing.cls and rest:
                return self.attribute(info, entry, enclosing.cls, rest, hops)
            if first in local_names(enclosing):
                return {"lock": None, "unresolved": "%s is an argument of %s" % (first, enclosing.qualname)}
        return self.module_level(info, entry, first, rest, hops)

    def module_level(self, info, entry, first, rest, hops):
        scan = entry["scan"]
        assigned = scan.assigned.get(first)
        if assigned is not None:
            return self.value(info, entry, assigned[1], rest, assigned[0], first, {}, hops)
        if first in scan.classes and rest:
            return self.attribute(info, entry, first, rest, hops)
        bound = module_imports(scan.tree, info["module"]).get(first)
        if bound:
            return self.imported(info, bound, rest, hops)
        return {"lock": None, "unresolved": "%s is not bound in %s" % (first, info["relpath"])}

    def value(self, info, entry, value, rest, line, name, scope, hops):
        """NAME = VALUE at LINE: a lock made there, or what VALUE names in turn."""
        if isinstance(value, ast.Call):
            kind = self.maker(info, entry, value)
            if kind and not rest:
                qual = name if not scope else "%s.<locals>.%s" % (scope["function"].qualname, name)
                return self.lock(info, qual, kind, line)
            return {"lock": None, "not_lock": "%s is made by %s(), not a lock"
                    % (name, expression_name(value.func) or "a call")}
        inner = expression_name(value)
        if inner is None:
            return {"lock": None, "not_lock": "%s is no lock (%s)" % (name, type(value).__name__)}
        return self.follow(info, entry, inner + ("." + rest if rest else ""), scope, hops - 1)

    def attribute(self, info, entry, cls, rest, hops):
        """Class.NAME: the class body's `NAME = ...`, else a method's `self.NAME = ...`."""
        attr, _, more = rest.partition(".")
        node = next((n for n in entry["scan"].tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            return {"lock": None, "unresolved": "no class %s in %s" % (cls, info["relpath"])}
        for statement in node.body:
            if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr
                                                         for t in statement.targets):
                return self.value(info, entry, statement.value, more, statement.lineno,
                                  "%s.%s" % (cls, attr), {}, hops)
        for child in ast.walk(node):
            if isinstance(child, ast.Assign) and any(
                    isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                    and t.value.id == "self" for t in child.targets):
                return self.value(info, entry, child.value, more, child.lineno,
                                  "%s.%s" % (cls, attr), {}, hops)
        return {"lock": None, "unresolved": "%s.%s is not assigned in %s" % (cls, attr, info["relpath"])}

    def imported(self, info, bound, rest, hops):
        if bound[0] == "module":
            module, name = bound[1], rest
        else:
            module, name = bound[1], bound[2] + ("." + rest if rest else "")
        return self.in_module(info, module, name, hops - 1)

    def in_module(self, info, module, name, hops):
        """NAME (dotted) inside MODULE, or inside its submodule when NAME starts with one."""
        if not name:
            return {"lock": None, "not_lock": "%s is a module" % module}
        found = self.module_file(info, module)
        if found is None:
            first = name.split(".")[0]
            sub = self.module_file(info, "%s.%s" % (module, first))
            if sub is not None:       # `from torch._dynamo import convert_frame`
                return self.in_module(info, "%s.%s" % (module, first), name[len(first) + 1:], hops)
            return {"lock": None, "unresolved": "module %s not found here" % module}
        entry = self.modules.get(found)
        if entry is None or entry["scan"] is None:
            return {"lock": None, "unresolved": "module %s could not be read" % module}
        first, _, rest = name.partition(".")
        if first not in entry["scan"].assigned and first not in entry["scan"].classes \
                and first not in module_imports(entry["scan"].tree, found["module"]) \
                and self.module_file(info, "%s.%s" % (module, first)) is not None:
            return self.in_module(info, "%s.%s" % (module, first), rest, hops)
        return self.module_level(found, entry, first, rest, hops)

    def module_file(self, info, module):
        """The file of MODULE beside INFO's root (its site-packages, the run's folder)."""
        if module in LOCK_MODULES:
            return None
        base = os.path.join(info["root"], *module.split("."))
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            found = self.files.resolve(candidate)
            if found.get("status") == "ok":
                return found
        return None

    # ---------------------------------------------------------------- locks
    def maker(self, info, entry, call):
        """The kind of lock CALL makes ("RLock"), or None when it makes something else."""
        name = expression_name(call.func)
        if not name:
            return None
        parts = name.split(".")
        if parts[-1] not in LOCK_MAKERS:
            return None
        if len(parts) == 1:
            bound = module_imports(entry["scan"].tree, info["module"]).get(parts[0])
            if bound is None or bound[0] != "from" or bound[1] not in LOCK_MODULES:
                return None
            return bound[2]
        bound = module_imports(entry["scan"].tree, info["module"]).get(parts[0])
        module = bound[1] if bound and bound[0] == "module" else parts[0]
        prefix = ".".join([module] + parts[1:-1])
        return parts[-1] if prefix in LOCK_MODULES or parts[0] in ("mp", "ctx") else None

    @staticmethod
    def lock(info, qualname, kind, line):
        return {"lock": {"id": "%s:%s" % (info["relpath"], qualname), "name": qualname.split(".")[-1],
                         "kind": "Lock" if kind == "allocate_lock" else kind,
                         "defined": "%s:%d" % (info["relpath"], line)}}
