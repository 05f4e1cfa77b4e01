"""The shortcuts of source_search's def mode give the answers of the long way.

may_define lets a file go unparsed only when no occurrence of the name can be a def,
class or assignment of it: every layout Python accepts for a definition must keep the file
(checked against ast itself), while calls, imports, attributes and strings let it go.
rg's `--stats` count of files searched must equal the Python walk's count."""

from __future__ import annotations

import os
import shutil
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.payloads import payload_source
from tests.fixtures.payloads import env_with_path, run_payload, write_dist_info

needs_rg = pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep (rg) is not on PATH")


def load_source_search():
    """The payload as shipped (helpers inlined), loaded as a module for its functions."""
    module = types.ModuleType("source_search_shipped")
    exec(compile(payload_source("source_search"), "source_search.py", "exec"), module.__dict__)
    return module


SEARCH = load_source_search()


def defines(source: bytes, name: str) -> bool:
    """Whether def mode's ast walk finds a definition of name in source (the long way)."""
    import ast
    tree = ast.parse(source)
    return any(SEARCH.name_matches(qualname, [name])
               for qualname, _, _ in SEARCH.iter_definitions(tree.body))


# Each layout defines N (def mode reports it); {N} is where the name goes.
DEFINING = [
    "def {N}(): pass",
    "async def {N}(): pass",
    "class {N}: pass",
    "class\t{N}(object): pass",
    "def \\\n    {N}(): pass",
    "def\\\n{N}(): pass",
    "{N} = 1",
    "{N}=1",
    "{N} \\\n    = 1",
    "{N}: int = 1",
    "{N} : int",
    "{N}:int",
    "({N}): int = 1",
    "a, {N} = 1, 2",
    "a,{N}=1,2",
    "[a, {N}] = 1, 2",
    "(a,\n {N}\n) = 1, 2",
    "(a,  # a comment\n {N}) = 1, 2",
    "(a, \\\n {N}) = 1, 2",
    "*{N}, a = 1, 2",
    "a, *{N} = 1, 2",
    "first, (second, *{N}) = 1, (2, 3)",
    "a = {N} = 1",
    "x = 1; {N} = 2",
    "x = 1;{N} = 2",
    "if True:\n    {N} = 1",
    "if True: {N} = 1",
    "try:\n    {N} = 1\nexcept ImportError:\n    pass",
    "class C:\n    {N} = 1",
    "class C:\n    def {N}(self): pass",
    "def f():\n    def {N}(): pass",
    "@decorator\ndef {N}(): pass",
    "\f{N} = 1",
]
# Each layout mentions N without def mode reporting a definition: the file may be skipped.
NOT_DEFINING = [
    "{N}()",
    "x = {N}()",
    "x.{N} = 1",
    "x = m.{N}",
    "from m import {N}",
    "import {N}",
    "import m as {N}",
    "from m import x as {N}",
    "y = 'torch.fx.{N}'",
    "{N} == 1",
    "{N}.attr = 1",
    "{N}[0] = 1",
    "{N} += 1",
    "x_{N} = 1",
    "{N}_x = 1",
    "if {N}(): pass",
    "print({N}())",
]


@pytest.mark.parametrize("layout", DEFINING)
def test_every_layout_of_a_definition_keeps_the_file(layout):
    source = layout.replace("{N}", "trace").encode()
    assert defines(source, "trace"), "the case itself is wrong"
    assert SEARCH.may_define(source, "trace")


@pytest.mark.parametrize("layout", NOT_DEFINING)
def test_uses_that_define_nothing_let_the_file_go(layout):
    source = layout.replace("{N}", "trace").encode()
    assert not defines(source, "trace"), "the case itself is wrong"
    assert not SEARCH.may_define(source, "trace")


def test_a_name_python_normalises_keeps_the_file():
    # "\ufb01" (the fi ligature) is "fi" to Python: "def \ufb01nd" defines find.
    source = "def \ufb01nd(): pass\nfind()\n".encode()
    assert defines(source, "find")
    assert SEARCH.may_define(source, "find")
    # Non-ASCII text that Python does not normalise to ASCII leaves the shortcut on.
    assert not SEARCH.may_define("# caf\u00e9 \u2014 note\nfind()\n".encode(), "find")


def test_a_file_in_another_encoding_is_always_parsed():
    # In Latin-1, b"\xaa" is U+00AA, which Python normalises to "a": this defines "abc".
    source = b"# -*- coding: latin-1 -*-\ndef \xaabc(): pass\nabc()\n"
    assert defines(source, "abc")
    assert SEARCH.may_define(source, "abc")
    assert not SEARCH.may_define(b"# -*- coding: utf-8 -*-\nabc()\n", "abc")


def test_a_def_far_from_its_name_keeps_the_file():
    source = ("def" + " \\\n" * 200 + "trace(): pass\n").encode()
    assert defines(source, "trace")
    assert SEARCH.may_define(source, "trace")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(DEFINING + NOT_DEFINING), min_size=1, max_size=6),
       st.sampled_from(["trace", "is_fx_symbolic_tracing", "T"]))
def test_the_shortcut_never_loses_a_definition(layouts, name):
    source = "\n".join(layouts).replace("{N}", name).encode()
    try:
        found = defines(source, name)
    except SyntaxError:
        return  # some layouts do not combine (an indented line after "x = 1;...")
    if found:
        assert SEARCH.may_define(source, name)


# --- how many files were searched -------------------------------------------------------------


@pytest.fixture()
def odd_tree(tmp_path):
    """Files rg and the walk might count differently: links, a FIFO, a folder named *.py,
    hidden and empty files, other suffixes, a name that is not UTF-8, ignore files."""
    pkg = tmp_path / "site" / "pkg"
    (pkg / "dir.py").mkdir(parents=True)
    (pkg / "dir.py" / "inside.py").write_text("find()\n")
    (pkg / ".hidden").mkdir()
    (pkg / ".hidden" / "h.py").write_text("x = 1\n")
    (pkg / ".dot.py").write_text("find = 1\n")
    (pkg / "empty.py").write_text("")
    (pkg / "notes.txt").write_text("find\n")
    (pkg / ".gitignore").write_text("*.py\n")
    (pkg / ".ignore").write_text("*.py\n")
    (pkg / "link.py").symlink_to(pkg / "empty.py")
    (pkg / "linkdir").symlink_to(pkg / ".hidden", target_is_directory=True)
    (pkg / "broken.py").symlink_to(tmp_path / "nowhere.py")
    os.mkfifo(pkg / "fifo.py")
    (pkg / os.fsdecode(b"bad\xff.py")).write_bytes(b"find()\n")
    return tmp_path / "site", pkg


@needs_rg
def test_rg_counts_the_files_the_walk_counts(odd_tree):
    site, pkg = odd_tree
    relpaths, searched = SEARCH.rg_files_containing(shutil.which("rg"), "find", str(pkg), str(site))
    assert searched == SEARCH.count_python_files(str(pkg)) == 5
    assert relpaths == ["pkg/.dot.py", os.fsdecode(b"pkg/bad\xff.py"), "pkg/dir.py/inside.py"]


def test_rg_stats_are_not_used_when_they_cannot_match_the_walk(tmp_path):
    stats = b"\n3 matches\n2 files contained matches\n14 files searched\n0 bytes printed\n"
    assert SEARCH.rg_files_searched(stats, b"", str(tmp_path)) == 14
    # An unreadable file: the walk counts it, rg does not.
    assert SEARCH.rg_files_searched(stats, b"rg: x.py: Permission denied\n", str(tmp_path)) is None
    # A module file rather than a package folder: rg searches it whatever its name.
    module = tmp_path / "single.so"
    module.write_bytes(b"")
    assert SEARCH.rg_files_searched(stats, b"", str(module)) is None
    # An rg that prints no count.
    assert SEARCH.rg_files_searched(b"", b"", str(tmp_path)) is None


@pytest.mark.parametrize("engine", ["python", "rg"])
def test_a_package_that_is_one_module_counts_one_file(tmp_path, engine):
    if engine == "rg" and shutil.which("rg") is None:
        pytest.skip("ripgrep (rg) is not on PATH")
    site = tmp_path / "site"
    site.mkdir()
    (site / "single.py").write_text("def find():\n    return 1\n")
    write_dist_info(site, "single", "1.0", "single")
    run = run_payload(sys.executable, "source_search",
                      {"package": "single", "pattern": "find", "mode": "def", "engine": engine},
                      env=env_with_path(site))
    assert [(e["path"], e["line"]) for e in run.of("def")] == [("single.py", 1)]
    assert run.expect_result()["files_searched"] == 1
