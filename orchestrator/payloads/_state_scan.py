"""The process-wide mutable state of one Python module, found with ast (never imported).

What counts as shared state (everything every thread of the process sees):
- a module global some function of the module rebinds under `global NAME`;
- a module-level dict, list, set (or defaultdict, OrderedDict, deque, Counter) that a
  function mutates in place: `NAME[k] = v`, `del NAME[k]`, `NAME.append(...)`, `.update`, ...;
- a class attribute assigned at run time: `Class.attr = v` in a function, `cls.attr = v` in
  a classmethod.
Module globals holding a `threading.local()` or a `ContextVar(...)` are reported as already
thread-local.

For each state: where it is defined, every write (line, the function's qualified name, how),
and which functions read it. Reads are by name inside the module (`NAME`, `Class.attr`).

Inlined when shipped, like _protocol.py; standard library only, Python 3.8+.
"""

import ast

MUTATORS = frozenset(("append", "extend", "insert", "pop", "popitem", "remove", "clear",
                      "update", "setdefault", "add", "discard", "appendleft", "extendleft",
                      "popleft", "sort", "reverse", "__setitem__", "__delitem__"))
CONTAINER_CALLS = frozenset(("dict", "list", "set", "defaultdict", "OrderedDict", "deque",
                             "Counter", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet"))
THREAD_LOCAL_CALLS = frozenset(("local", "ContextVar"))
MAX_STATES = 200


def call_name(node):
    """`f` for f(...), `b` for a.b(...); None otherwise."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute):
            return func.attr
    return None


def module_assignments(tree):
    """NAME -> (line, value node) for each simple module-level assignment (the first one;
    also inside module-level if/try blocks, as `try: import x except: x = None`)."""
    found = {}

    def visit(body):
        for node in body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id not in found:
                        found[target.id] = (node.lineno, node.value)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))
    visit(tree.body)
    return found


def value_kind(value):
    """'thread-local', 'container' or 'value' for a module-level assignment's value."""
    name = call_name(value)
    if name in THREAD_LOCAL_CALLS:
        return "thread-local"
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return "container"
    if name in CONTAINER_CALLS:
        return "container"
    return "value"


class Function:
    def __init__(self, node, qualname, cls):
        self.node, self.qualname, self.cls = node, qualname, cls
        self.start = node.lineno
        self.end = getattr(node, "end_lineno", None) or node.lineno
        self.globals = set()
        for child in ast.walk(node):
            if isinstance(child, ast.Global):
                self.globals.update(child.names)
        args = node.args.args
        self.first_arg = args[0].arg if args else None
        self.is_classmethod = any(isinstance(d, ast.Name) and d.id == "classmethod"
                                  for d in node.decorator_list)


def functions(tree):
    """Every function and method, with its qualified name (Tracer.trace, f.<locals>.g)."""
    found = []

    def visit(node, prefix, cls):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                found.append(Function(child, qualname, cls))
                visit(child, qualname + ".<locals>.", None)
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", child.name)
            else:
                visit(child, prefix, cls)
    visit(tree, "", None)
    return found


def own_nodes(function):
    """The nodes of a function's body, without those of functions nested in it (they are
    Functions of their own)."""
    stack = list(function.node.body)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                      ast.ClassDef)):
                stack.append(child)


def local_names(function):
    """Names a function binds itself (assigned, arguments), unless declared global."""
    names = set(a.arg for a in function.node.args.args + function.node.args.kwonlyargs)
    for extra in (function.node.args.vararg, function.node.args.kwarg):
        if extra is not None:
            names.add(extra.arg)
    for node in own_nodes(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
    return names - function.globals


class ModuleStates:
    """The shared state of one module: `states` {key: dict}, `reads` {qualname: set(keys)}."""

    def __init__(self, tree):
        self.tree = tree
        self.functions = functions(tree)
        self.assigned = module_assignments(tree)
        self.classes = set(n.name for n in tree.body if isinstance(n, ast.ClassDef))
        self.states = {}
        self.reads = {}
        for function in self.functions:
            self._scan(function)
        self._thread_locals()
        self._scan_reads()

    def state(self, key, kind, line):
        if key not in self.states:
            if len(self.states) >= MAX_STATES:
                return None
            self.states[key] = {"name": key, "kind": kind, "line": line, "thread_local": False,
                                "writes": []}
        return self.states[key]

    def _write(self, key, kind, line, function, how):
        state = self.state(key, kind, line)
        if state is not None and len(state["writes"]) < 50:
            state["writes"].append({"line": getattr(how[1], "lineno", 0),
                                    "function": function.qualname, "how": how[0]})

    def _scan(self, function):
        local = local_names(function)
        for node in own_nodes(function):
            self._rebinds(function, node)
            self._mutations(function, node, local)
            self._class_attrs(function, node, local)

    def _rebinds(self, function, node):
        """`global NAME` then NAME = ... / NAME += ... / del NAME."""
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and node.id in function.globals:
            line = self.assigned.get(node.id, (node.lineno, None))[0]
            self._write(node.id, "global", line, function, ("rebinds under `global`", node))

    def _mutations(self, function, node, local):
        target = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            target, how = node.value, "item assignment" if isinstance(node.ctx, ast.Store) else "del item"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATORS:
            target, how = node.func.value, ".%s()" % node.func.attr
        if not isinstance(target, ast.Name) or target.id in local:
            return
        assigned = self.assigned.get(target.id)
        if assigned is None or value_kind(assigned[1]) != "container":
            return
        self._write(target.id, "container", assigned[0], function, ("mutates in place: " + how, node))

    def _class_attrs(self, function, node, local):
        if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)):
            return
        owner = node.value.id
        if owner in self.classes and owner not in local:
            cls = owner
        elif function.is_classmethod and owner == function.first_arg and function.cls:
            cls = function.cls
        else:
            return
        self._write("%s.%s" % (cls, node.attr), "class attribute", node.lineno, function,
                    ("assigns the class attribute at run time", node))

    def _thread_locals(self):
        for name, (line, value) in self.assigned.items():
            if value_kind(value) == "thread-local":
                state = self.state(name, "thread-local", line)
                if state is not None:
                    state["thread_local"] = True
                    state["holder"] = call_name(value)

    def _scan_reads(self):
        for function in self.functions:
            local = local_names(function)
            seen = set()
            for node in own_nodes(function):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) \
                        and node.id in self.states and node.id not in local:
                    seen.add(node.id)
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    key = "%s.%s" % (node.value.id, node.attr)
                    if key in self.states:
                        seen.add(key)
                    if function.cls and node.value.id in ("self", "cls"):
                        key = "%s.%s" % (function.cls, node.attr)
                        if key in self.states:
                            seen.add(key)
            if seen:
                self.reads[function.qualname] = seen

    def function_at(self, line):
        """The innermost function whose lines hold `line`, or None (module level)."""
        best = None
        for function in self.functions:
            if function.start <= line <= function.end:
                if best is None or function.start >= best.start:
                    best = function
        return best

    def enclosing(self, line):
        """Every function holding `line`, outermost first."""
        return sorted((f for f in self.functions if f.start <= line <= f.end),
                      key=lambda f: f.start)

    def readers(self, key):
        return sorted(q for q, keys in self.reads.items() if key in keys)
