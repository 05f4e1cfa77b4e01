"""No code depends on swapping process globals: a command's streams, environment, folder and
interrupt travel in its Invocation (orchestrator/ground/invocation.py, docs/guide/agent.md).

The first test is the check of issue 26, as written there (a regex over the source); the
others read the syntax tree, so an assignment split over lines, `setattr(...)` or an
aliased module cannot slip past."""

from __future__ import annotations

import ast
import os
import re

import pytest

import orchestrator

PACKAGE_DIR = os.path.dirname(orchestrator.__file__)
PATCHED = re.compile(r"^\s*(os\.environ|sys\.std(in|out|err)|threading\.Thread\.\w+|"
                     r"signal\.(signal|getsignal)|paramiko\.Transport\.\w+)\s*=", re.M)
# module -> attributes no code may rebind (None: any attribute of it)
GLOBALS = {"os": {"environ"}, "sys": {"stdin", "stdout", "stderr"}, "signal": {"signal", "getsignal"},
           "threading.Thread": None, "paramiko.Transport": None, "console": {"out", "err"}}


# The body of a forked child in a container that becomes the command's own process, as an
# exec of python3 would: its streams are its own, nobody else's are swapped.
BECOMES_A_PROCESS = {os.path.join("payloads", "_inproc.py")}


def sources():
    for folder, _dirs, files in os.walk(PACKAGE_DIR):
        for name in sorted(files):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, PACKAGE_DIR)
            if name.endswith(".py") and relative not in BECOMES_A_PROCESS:
                with open(path, encoding="utf-8") as handle:
                    yield relative, handle.read()


def test_the_issues_grep_finds_nothing():
    found = [f"{path}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0).strip()}"
             for path, text in sources() for m in PATCHED.finditer(text)]
    assert found == []


def test_no_thread_is_interrupted_asynchronously():
    assert [path for path, text in sources() if "PyThreadState_SetAsyncExc" in text] == []


def dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def is_global(owner: str, attribute: str) -> bool:
    for module, attributes in GLOBALS.items():
        if owner == module or owner.endswith("." + module):
            return attributes is None or attribute in attributes
    return False


def rebinds(tree) -> list[str]:
    """Assignments (plain, augmented, setattr) to a process-wide attribute."""
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            targets = [t for target in targets
                       for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            pairs = [(dotted(t.value), t.attr) for t in targets if isinstance(t, ast.Attribute)]
        elif (isinstance(node, ast.Call) and dotted(node.func) == "setattr" and len(node.args) == 3
              and isinstance(node.args[1], ast.Constant)):
            pairs = [(dotted(node.args[0]), node.args[1].value)]
        else:
            continue
        found += [f"line {node.lineno}: {owner}.{attribute}" for owner, attribute in pairs
                  if is_global(owner, attribute)]
    return found


def test_no_process_global_is_rebound():
    found = {path: rebinds(ast.parse(text)) for path, text in sources()}
    assert {path: lines for path, lines in found.items() if lines} == {}


@pytest.mark.parametrize("source, expected", [
    ("import sys\nsys.stdout = x", ["line 2: sys.stdout"]),
    ("import os\nos.environ = {}", ["line 2: os.environ"]),
    ("import sys\nsys.stdout, sys.stderr = a, b", ["line 2: sys.stdout", "line 2: sys.stderr"]),
    ("import threading\nthreading.Thread.__init__ = f", ["line 2: threading.Thread.__init__"]),
    ("setattr(sys, 'stderr', x)", ["line 1: sys.stderr"]),
    ("signal.signal = f", ["line 1: signal.signal"]),
    ("self.paramiko.Transport.open_session = f", ["line 1: self.paramiko.Transport.open_session"]),
    ("from orchestrator.ground import console\nconsole.out = c", ["line 2: console.out"]),
    ("x.stdout = y\nenviron = {}\nsignal.signal(1, f)", []),
])
def test_the_tree_check_sees_each_form(source, expected):
    assert rebinds(ast.parse(source)) == expected


def calls(tree, name: str) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and dotted(node.func) == name]


def test_commands_return_their_exit_codes_and_never_ask_which_thread_they_run_in():
    """sys.exit and main_thread() in a command were how it told the agent from the direct
    path; the group turns a returned code into the exit status, the invocation says whether
    the command owns the process's signals."""
    found = {}
    for path, text in sources():
        if path.startswith(os.path.join("cli", "commands")):
            tree = ast.parse(text)
            lines = calls(tree, "sys.exit") + calls(tree, "threading.main_thread")
            if lines:
                found[path] = lines
    assert found == {}


def test_the_working_directory_is_never_changed_per_command():
    """Only a new agent process moves to / (the daemon's fork, and the agent's start: it
    holds no folder open); a command's folder is its invocation's. The payloads run in
    containers, in processes of their own."""
    found = sorted({path for path, text in sources() if not path.startswith("payloads")
                    for _ in calls(ast.parse(text), "os.chdir")})
    assert found == [os.path.join("agent", "client.py"), os.path.join("agentd", "server.py")]
