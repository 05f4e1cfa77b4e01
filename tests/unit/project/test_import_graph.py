"""orch's rooms (its subpackages and top-level modules) import each other one way only.

The graph is built from the source's AST: every `import` counts, those inside functions too,
except the ones under `if TYPE_CHECKING:` (type hints only, never run).
"""

from __future__ import annotations

import ast
import functools
import os
import re

import pytest

import orchestrator
from orchestrator.ground.graphs import strongly_connected

PACKAGE_DIR = os.path.dirname(orchestrator.__file__)
DOTTED_MODULE = re.compile(r"orchestrator(\.[a-z_]+)+")

def room_of(module: str) -> str | None:
    """orchestrator.playbook.steps.base -> playbook; orchestrator.cli -> cli; others -> None."""
    parts = module.split(".")
    if parts[0] != "orchestrator" or len(parts) < 2:
        return None
    return parts[1]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_modules(tree: ast.AST, package: str) -> list[str]:
    """Every module a file imports (absolute names), leaving out TYPE_CHECKING blocks. A string
    that is exactly a module's dotted name ("orchestrator.targets.fleet") counts too: that is how the
    CLI names the modules it imports on first use (importlib), and such a dependency must not
    hide from this graph."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and DOTTED_MODULE.fullmatch(node.value):
            found.append(node.value)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.append(base)
            # `from orchestrator import steps` names a room too
            found.extend(f"{base}.{alias.name}" for alias in node.names if base == "orchestrator")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def rooms_in(root: str) -> set[str]:
    """The package's subpackages and top-level modules (not names like __version__)."""
    return {name[:-3] if name.endswith(".py") else name for name in os.listdir(root)
            if (name.endswith(".py") and name != "__init__.py")
            or os.path.isfile(os.path.join(root, name, "__init__.py"))}


@functools.lru_cache(maxsize=None)
def room_graph(root: str = PACKAGE_DIR) -> dict[str, set[str]]:
    """room -> the other rooms its modules import."""
    rooms = rooms_in(root)
    graph: dict[str, set[str]] = {}
    for module, targets in module_imports(root).items():
        room = room_of(module)
        if room is not None:
            graph.setdefault(room, set()).update(
                other for other in map(room_of, targets) if other in rooms and other != room)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one room (ground/graphs.py's Tarjan,
    which test_a_cycle_is_found and tests/unit/test_deadlocks.py check on graphs of known cycles)."""
    ordered = {node: sorted(graph[node]) for node in sorted(graph)}
    return [sorted(part) for part in strongly_connected(ordered) if len(part) > 1]


# The layers, bottom first: a room imports only rooms listed before it (docs/design/architecture.md).
LAYERS = [
    "ground",    # errors, paths, console, lazy, fx_states: nothing of orch's
    "config",    # the inventory and YAML sources, jinja2's sandbox
    "payloads",  # the scripts run inside containers (stdlib only) and their loader
    "remote",    # SSH, pct exec, the container API the payloads answer
    "targets",   # the fleet, the Proxmox API, distros, inventory check
    "runs",      # the run store: records, baselines, compare, reports
    "watch",     # log formats, workers, the classifier, the monitor
    "forensics", # explain, suspects in the installed source, live stacks: after the fact
    "playbook",  # loader, render, steps/, engine, attach
    "nightly",   # unattended reruns and their schedule
    "mcp",       # the MCP server's tools and policy
    "agent",     # the thin client of the warm agent (of orch's, only the command table)
    "cli",       # the entry point, the click app, the commands
    "agentd",    # the warm agent: runs the CLI's commands
    "__main__",  # python -m orchestrator
]

# Inside a room, the same rule between its modules or subpackages (bottom first).
SUBLAYERS = {
    "playbook": ["model", "render", "steps", "loader", "engine", "attach"],
    "watch": ["logformats", "tbevents", "distributed", "torchrun", "dflash", "tracebacks", "causes", "stacks",
              "classify", "monitor", "nodes"],
    "forensics": ["stacktool", "suspects", "explain"],
    "cli": ["screens", "commands", "app", "reference", "main"],  # main names app in a string: the hand-off
    "nightly": ["notify_apprise", "textfile", "rerun", "schedule"],
}


def test_every_room_has_its_place_in_the_layers():
    assert sorted(rooms_in(PACKAGE_DIR)) == sorted(LAYERS)


@pytest.mark.parametrize("room", LAYERS)
def test_a_layer_imports_only_the_layers_below_it(room):
    below = set(LAYERS[: LAYERS.index(room)])
    above = room_graph().get(room, set()) - below
    assert above == set(), f"{room} imports {sorted(above)}, which are not below it in LAYERS"


def test_the_command_tables_modules_are_ones_the_cli_may_import():
    """ground/commands.py names each command's module (cli/app.py imports it): a name, not an
    import of the bottom layer's, so it must name a room the cli may import."""
    from orchestrator.ground import commands
    may = set(LAYERS[: LAYERS.index("cli") + 1])
    named = {module for command in commands.COMMANDS
             for module in (command.module, *(m for m, _ in command.grafted))}
    assert {module.split(".")[0] for module in named} <= may, named


def test_the_bottom_and_the_payloads_import_nothing_of_orchs():
    graph = room_graph()
    assert graph["ground"] == set() and graph["payloads"] == set()
    # the thin client reads the one table of commands, a stdlib-only module, and nothing else
    agent_imports = {target for module, targets in module_imports().items()
                     if module.startswith("orchestrator.agent.") for target in targets}
    # (`from orchestrator.ground import commands` is seen as orchestrator.ground; the thin
    # client's own start-up test, tests/unit/cli/test_startup.py, sees what it loads)
    assert agent_imports <= {"orchestrator.ground", "orchestrator.ground.commands", "orchestrator.agent",
                             "orchestrator.agent.protocol", "orchestrator.__version__"}, agent_imports


def sublayer_of(module: str, room: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == room else None


@pytest.mark.parametrize("room", sorted(SUBLAYERS))
def test_inside_a_room_the_modules_point_down(room):
    order = SUBLAYERS[room]
    wrong = []
    for module, imported in module_imports().items():
        mine = sublayer_of(module, room)
        if mine is None:
            continue
        assert mine in order or mine == "__init__", f"{module}: place it in SUBLAYERS[{room!r}]"
        for target in imported:
            theirs = sublayer_of(target, room)
            if theirs in order and mine in order and order.index(theirs) > order.index(mine):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_no_import_cycle_between_modules():
    imports = module_imports()
    graph = {module: targets & set(imports) for module, targets in imports.items()}
    left = cycles(graph)
    assert left == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in left)


@functools.lru_cache(maxsize=None)
def module_imports(root: str = PACKAGE_DIR) -> dict[str, set[str]]:
    """module -> the orchestrator modules it imports (TYPE_CHECKING left out)."""
    found: dict[str, set[str]] = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
            module = relative[: -len(".__init__")] if relative.endswith(".__init__") else relative
            package = module if name == "__init__.py" else module.rsplit(".", 1)[0]
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read(), path)
            found[module] = {target for target in imported_modules(tree, package)
                             if target.startswith("orchestrator.")}
    return found


@pytest.mark.parametrize("source, expected", [
    ("import orchestrator.steps.base\n", {"steps"}),
    ("def f():\n    from orchestrator.engine import run_playbook\n", {"engine"}),
    ("from orchestrator import runs, paths, __version__\n", {"runs", "paths"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from orchestrator.engine import Engine\n", set()),
    ("from ..steps import base\n", {"steps"}),
    ('import importlib\nFLEET = "orchestrator.engine"\nimportlib.import_module(FLEET)\n', {"engine"}),
    ('"""A docstring naming orchestrator.engine is not an import."""\n', set()),
])
def test_graph_counts_function_imports_not_type_checking(tmp_path, source, expected):
    root = tmp_path / "orchestrator"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "mod.py").write_text(source)
    for room in ("steps", "engine.py", "runs", "paths.py"):
        (root / room).mkdir() if "." not in room else (root / room).write_text("")
        if "." not in room:
            (root / room / "__init__.py").write_text("")
    assert room_graph(str(root)).get("sub", set()) == expected


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def function_level_imports(root: str = PACKAGE_DIR) -> list[tuple[str, int, str, str]]:
    """(file, line, imported module, the line with the comment/import lines above it) of every
    import made inside a function body, TYPE_CHECKING blocks left out."""
    found = []
    for folder, _dirs, files in os.walk(root):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            lines = text.splitlines()
            for function in ast.walk(ast.parse(text, path)):
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for statement in function.body:
                    for node in ast.walk(statement):
                        if isinstance(node, (ast.Import, ast.ImportFrom)):
                            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                            context = _with_comment_above(lines, node.lineno - 1)
                            found.append((os.path.relpath(path, os.path.dirname(root)), node.lineno,
                                          module or "", "\n".join(context)))
    return found


# orch's own modules that need an optional extra: imported where that extra is first needed.
NEEDS_AN_EXTRA = {"orchestrator.mcp.server"}   # the MCP SDK (orch[mcp])


def _with_comment_above(lines: list[str], index: int) -> list[str]:
    """The import's line and the comment/import lines right above it (a reason written once
    above two imports covers both)."""
    start = index
    while start > 0 and lines[start - 1].strip().startswith(("#", "import ", "from ")):
        start -= 1
    return lines[start:index + 1]


def test_orch_imports_its_own_modules_at_the_top():
    """An import inside a function hides a dependency (and, before, a cycle)."""
    late = [f"{file}:{line}: {module}" for file, line, module, _ in function_level_imports()
            if module.startswith("orchestrator") and module not in NEEDS_AN_EXTRA]
    assert late == []


def test_a_late_third_party_import_says_why():
    """Only an optional or heavy dependency is imported inside a function, with a comment
    (on its line or the line above) saying why."""
    unexplained = [f"{file}:{line}: {module}" for file, line, module, context
                   in function_level_imports() if "#" not in context]
    assert unexplained == []


def test_late_imports_are_found(tmp_path):
    root = tmp_path / "orchestrator"
    root.mkdir()
    (root / "mod.py").write_text("import os\ndef f():\n    import json\n"
                                 "def g():\n    # rich is slow to import\n    import rich\n"
                                 "    import rich.table\n    x = 1\n    import yaml\n")
    found = [(line, module, "#" in context) for _file, line, module, context
             in function_level_imports(str(root))]
    assert found == [(3, "json", False), (6, "rich", True), (7, "rich.table", True), (9, "yaml", False)]


def test_the_step_kinds_name_the_playbook_model_not_its_parser():
    """steps/ reads the playbook's data (model.py), never the loader, the engine or attach, not
    even for type hints: a step kind stays testable alone, and no file-level circle remains."""
    above = ("orchestrator.playbook.loader", "orchestrator.playbook.engine",
             "orchestrator.playbook.attach")
    steps_dir = os.path.join(PACKAGE_DIR, "playbook", "steps")
    wrong = []
    for name in sorted(os.listdir(steps_dir)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(steps_dir, name), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):  # TYPE_CHECKING blocks included
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(above):
                wrong.append(f"steps/{name}: {node.module}")
    assert wrong == []
