"""Editing Python source by syntax-tree positions, for the fx patch payload: every byte
outside an edit stays as it was; any shape not expected raises UnknownShape.

Inlined when shipped, like _protocol.py. Standard library only, Python 3.8+.
"""

import ast
import platform
import re

from _protocol import *  # orch: inlined when shipped

# Every file orch patches starts with a comment that begins so (the first versions wrote
# it for the flag alone; the name stays so their files are recognised).
MARKER = b"# orch fx-tls patch"


class UnknownShape(PayloadError):
    def __init__(self, relpath, reason):
        super().__init__("%s: %s" % (relpath, reason), "unknown-shape")


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



def single_name_assignment(node, name):
    """True for `name = value` and `name: T = value` (one target, nothing chained)."""
    if isinstance(node, ast.Assign):
        return len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
            and node.targets[0].id == name
    return isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
        and node.target.id == name and node.value is not None




def header_line(orch_version, patch_set, names):
    return ("# orch fx-tls patch (orch %s, patch set %s): thread-local %s; "
            "`orch patch %s revert` restores the original.\n"
            % (orch_version, patch_set, ", ".join(names), patch_set)).encode()


def add_header(src, line):
    """The marker comment goes first, after a shebang or encoding line if there is one."""
    at = 0
    for _ in range(2):
        line_end = src.data.find(b"\n", at)
        text = src.data[at:line_end if line_end >= 0 else len(src.data)]
        if not (text.startswith(b"#!") or re.match(rb"^[ \t\f]*#.*?coding[:=]", text)):
            break
        at = line_end + 1
    src.insert(at, line)

def ensure_module_import(src, module):
    """Add `import module` among the leading top-level imports, in alphabetical place,
    unless the module already imports it that way (or an earlier edit added it)."""
    added = src.__dict__.setdefault("added_imports", set())
    if module in added:
        return
    added.add(module)
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



def dotted_name(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))



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


