"""Every `lazy("module", "name")` and `LazyModule("module")` in orchestrator/ has a twin that IDEs
and type checkers can follow: the assignment sits in the `else:` of an `if TYPE_CHECKING:`
whose body imports the very same thing under the same name (docs/design/architecture.md).

    if TYPE_CHECKING:
        from orchestrator.targets.fleet import fan_out
    else:
        fan_out = lazy("orchestrator.targets.fleet", "fan_out")
"""

from __future__ import annotations

import ast
import functools
import importlib
import os

import pytest

import orchestrator

PACKAGE_DIR = os.path.dirname(orchestrator.__file__)
LAZY_FACTORIES = {"lazy", "LazyModule"}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _factory(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in LAZY_FACTORIES:
            return name
    return None


def lazy_target(call: ast.Call) -> str:
    """What a lazy call stands for, as one dotted path: lazy("a.b", "C.m") -> "a.b.C.m"."""
    parts = [arg.value for arg in call.args if isinstance(arg, ast.Constant)]
    assert len(parts) == len(call.args), f"line {call.lineno}: lazy() takes string literals"
    return ".".join(parts)


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, bound)
        return f"{base}.{node.attr}" if base else None
    return None


def twin_bindings(body: list[ast.stmt]) -> dict[str, str]:
    """The names a TYPE_CHECKING block binds, each with the dotted path it stands for."""
    bound: dict[str, str] = {}
    for statement in body:
        if isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
            for alias in statement.names:
                bound[alias.asname or alias.name] = f"{statement.module}.{alias.name}"
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            path = _dotted(statement.value, bound)
            if path:
                bound[statement.targets[0].id] = path
    return bound


def missing_twins(source: str, where: str) -> list[str]:
    """One line per lazy call without its twin; every lazy call found is also returned as
    "ok: ..." so a caller can tell that the file was really searched."""
    tree = ast.parse(source, where)
    twinned: dict[int, tuple[str, str]] = {}  # id(call) -> (name it is assigned to, twin's path)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        bound = twin_bindings(node.body)
        for statement in node.orelse:
            if isinstance(statement, ast.Assign) and _factory(statement.value) \
                    and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
                name = statement.targets[0].id
                twinned[id(statement.value)] = (name, bound.get(name, "nothing"))
    found = []
    for node in ast.walk(tree):
        if not _factory(node):
            continue
        target = lazy_target(node)
        place = f"{where}:{node.lineno}"
        if id(node) not in twinned:
            found.append(f"{place}: {target} is not assigned in the else: of an "
                         f"`if TYPE_CHECKING:` that imports it")
            continue
        name, twin = twinned[id(node)]
        if twin != target:
            found.append(f"{place}: {name} = {target}, but its TYPE_CHECKING twin imports {twin}")
        else:
            found.append(f"ok: {place}: {target}")
    return found


def source_files() -> list[str]:
    return sorted(os.path.join(folder, name) for folder, _dirs, files in os.walk(PACKAGE_DIR)
                  for name in files if name.endswith(".py"))


@functools.lru_cache(maxsize=None)
def package_report() -> tuple[str, ...]:
    report: list[str] = []
    for path in source_files():
        with open(path, encoding="utf-8") as handle:
            report.extend(missing_twins(handle.read(), os.path.relpath(path, PACKAGE_DIR)))
    return tuple(report)


def test_every_lazy_name_has_its_type_checking_twin():
    report = package_report()
    assert [line for line in report if not line.startswith("ok: ")] == []
    assert len([line for line in report if line.startswith("ok: ")]) >= 20  # the search found them


@pytest.mark.parametrize("target", sorted({line.split(": ")[-1] for line in package_report()
                                           if line.startswith("ok: ")}))
def test_each_lazy_name_exists(target):
    """The string names something real (a typo would fail only on first call)."""
    parts = target.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        functools.reduce(getattr, parts[split:], found)
        return
    pytest.fail(f"{target}: no such module")


@pytest.mark.parametrize("source, problem", [
    ('fan_out = lazy("m.fleet", "fan_out")\n', "is not assigned in the else:"),
    ('if TYPE_CHECKING:\n    from m.fleet import fan_in as fan_out\n'
     'else:\n    fan_out = lazy("m.fleet", "fan_out")\n', "twin imports m.fleet.fan_in"),
    ('if TYPE_CHECKING:\n    from m.fleet import fan_out\n'
     'else:\n    other = lazy("m.fleet", "fan_out")\n', "twin imports nothing"),
    ('if TYPE_CHECKING:\n    pass\nelse:\n    sched = LazyModule("m.nightly.schedule")\n',
     "twin imports nothing"),
    ('def f():\n    return lazy("m.fleet", "fan_out")()\n', "is not assigned in the else:"),
])
def test_a_lazy_name_without_its_twin_is_reported(source, problem):
    [line] = missing_twins(source, "x.py")
    assert problem in line and line.startswith("x.py:")


@pytest.mark.parametrize("source", [
    'if TYPE_CHECKING:\n    from m.fleet import Fleet\n    open_fleet = Fleet.from_path\n'
    'else:\n    open_fleet = lazy("m.fleet", "Fleet.from_path")\n',
    'if TYPE_CHECKING:\n    from m.nightly import schedule as sched\n'
    'else:\n    sched = LazyModule("m.nightly.schedule")\n',
    'if typing.TYPE_CHECKING:\n    import m.nightly.schedule as sched\n'
    'else:\n    sched = lazy_mod.LazyModule("m.nightly.schedule")\n',
])
def test_the_twin_forms_are_accepted(source):
    [line] = missing_twins(source, "x.py")
    assert line.startswith("ok: x.py:")
