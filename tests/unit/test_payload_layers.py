"""The payload rooms sit where the layering says: payloads/ (the scripts and their loader)
imports nothing of orch's; remote/ may use that loader; payload_api.py runs payloads on a
remote Target; none of them is in an import cycle with any other room of orch.

The graph is built from the source: a room is a subpackage or a top-level module of
orchestrator; every import counts, also one inside a function, except those under
`if TYPE_CHECKING:` (never run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"


def room_of(module: str) -> str:
    """orchestrator.remote.ssh -> remote; orchestrator.payload_api -> payload_api."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "orchestrator"


def imported_modules(tree: ast.AST, package: str) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            for alias in node.names:  # `from orchestrator import payload_api` names a module
                if (ROOT.parent / (base.replace(".", "/") + "/" + alias.name)).with_suffix(".py").exists() \
                        or (ROOT.parent / base.replace(".", "/") / alias.name / "__init__.py").exists():
                    found.add(f"{base}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name == "orchestrator" or name.startswith("orchestrator.")}


def room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        room = room_of(module.removesuffix(".__init__"))
        targets = {room_of(name) for name in imported_modules(ast.parse(path.read_text()), package)}
        graph.setdefault(room, set()).update(targets - {room})
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_payloads_import_nothing_of_orch():
    assert room_graph()["payloads"] == set()


def test_remote_uses_only_the_payload_loader_and_the_rooms_below():
    assert room_graph()["remote"] <= {"errors", "paths", "config", "payloads"}


def test_the_payload_rooms_are_in_no_import_cycle():
    graph = room_graph()
    for room in ("payloads", "remote", "payload_api", "inventory_check"):
        assert room not in reachable(graph, room), \
            f"{room} imports, through {sorted(graph[room])}, something that imports {room}"


def test_the_graph_sees_function_level_imports_and_skips_type_checking_ones():
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from orchestrator.engine import Engine\n"
                     "def f():\n    from orchestrator.monitor import Monitor\n"
                     "from orchestrator import payload_api\n")
    assert imported_modules(tree, "orchestrator.steps") == {
        "orchestrator.monitor", "orchestrator", "orchestrator.payload_api"}
