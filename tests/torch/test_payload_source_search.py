"""source_search and torch_locate on a real torch install: hits equal `grep -rn` over the
same tree, with either engine; definitions of the names the FX debugging is about."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.fixtures.payloads import clean_env, run_payload

pytestmark = pytest.mark.torch
HAVE_RG = shutil.which("rg") is not None
ENGINES = ["python", "rg"] if HAVE_RG else ["python"]
ST = "torch/fx/_symbolic_trace.py"


def search(venv, pattern, **options):
    return run_payload(venv.python, "source_search", {"pattern": pattern, **options},
                       env=clean_env())


def grep_rn(site_packages, pattern, *flags):
    """(path, line, text) of `grep -rn` over torch's *.py files, the manual way."""
    proc = subprocess.run(["grep", "-rna", "--include=*.py", *flags, "-e", pattern, "torch"],
                          cwd=site_packages, capture_output=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    found = set()
    for raw in proc.stdout.split(b"\n"):
        if raw:
            path, line, text = raw.split(b":", 2)
            found.add((path.decode(), int(line), text.decode("utf-8", "replace")))
    return found


def test_locate_finds_torch_without_importing_it(real_torch_venv):
    run = run_payload(real_torch_venv.python, "torch_locate", {"package": "torch"},
                      env=clean_env(), via_stdin=True, cwd="/")
    result = run.expect_result()
    assert result["version"].startswith("2.13.0")
    assert result["site_packages"] == str(real_torch_venv.site_packages)
    assert result["package_dir"] == str(real_torch_venv.site_packages / "torch")
    assert result["dist_info"].endswith(".dist-info")
    assert result["python"] == real_torch_venv.python


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pattern, options, grep_flags", [
    ("def is_fx_symbolic_tracing", {"fixed": True}, ["-F"]),
    ("_is_fx_tracing_flag", {}, []),
    (r"is_fx_(symbolic_)?tracing\(\)", {}, ["-E"]),
    ("FX_TRACING", {"fixed": True, "ignore_case": True}, ["-F", "-i"]),
    ("symbolic_trace", {"word": True}, ["-w"]),
    (r"^import (threading|contextlib)$", {}, ["-E"]),
])
def test_hits_equal_grep_rn(real_torch_venv, engine, pattern, options, grep_flags):
    run = search(real_torch_venv, pattern, engine=engine, max_hits=100000, **options)
    result = run.expect_result()
    assert result["engine"] == engine and result["truncated"] is False
    hits = [(h["path"], h["line"], h["text"]) for h in run.of("hit")]
    assert set(hits) == grep_rn(real_torch_venv.site_packages, pattern, *grep_flags)
    assert len(hits) == len(set(hits)) == result["hits"] > 0
    assert hits == sorted(hits, key=lambda h: (h[0].split("/"), h[1]))
    assert result["files_searched"] > 2000 and result["version"].startswith("2.13.0")


def test_context_lines_come_from_the_file(real_torch_venv):
    run = search(real_torch_venv, "def is_fx_symbolic_tracing", fixed=True, context=2)
    (hit,) = run.of("hit")
    lines = (real_torch_venv.site_packages / ST).read_text().split("\n")
    line = hit["line"]
    assert hit["path"] == ST and hit["text"] == lines[line - 1]
    assert hit["before"] == [[n, lines[n - 1]] for n in (line - 2, line - 1)]
    assert hit["after"] == [[n, lines[n - 1]] for n in (line + 1, line + 2)]


def definitions(venv, name, **options):
    runs = [search(venv, name, mode="def", engine=engine, **options) for engine in ENGINES]
    events = [run.of("def") for run in runs]
    assert all(e == events[0] for e in events), "engines disagree"
    runs[0].expect_result()
    return events[0]


def line_of(venv, relpath, text):
    lines = (venv.site_packages / relpath).read_text().split("\n")
    return lines.index(text) + 1


def test_def_show_is_fx_symbolic_tracing(real_torch_venv):
    (found,) = definitions(real_torch_venv, "is_fx_symbolic_tracing", show=True)
    assert (found["path"], found["kind"], found["qualname"]) == \
        (ST, "function", "is_fx_symbolic_tracing")
    assert found["line"] == line_of(real_torch_venv, ST, "def is_fx_symbolic_tracing() -> bool:")
    assert found["body"] == ("def is_fx_symbolic_tracing() -> bool:\n"
                             "    return _is_fx_tracing_flag and not torch.compiler.is_compiling()")


def test_def_of_the_flag_is_the_module_assignment(real_torch_venv):
    (found,) = definitions(real_torch_venv, "_is_fx_tracing_flag", show=True)
    assert (found["path"], found["kind"], found["body"]) == \
        (ST, "assignment", "_is_fx_tracing_flag = False")
    assert found["line"] == line_of(real_torch_venv, ST, "_is_fx_tracing_flag = False")


def test_def_show_tracer_trace(real_torch_venv):
    (found,) = definitions(real_torch_venv, "Tracer.trace", show=True)
    assert (found["path"], found["kind"], found["qualname"]) == (ST, "method", "Tracer.trace")
    body = found["body"].split("\n")
    # The body starts at the decorator; "line" is the def line, as grep would show it.
    assert body[:2] == ["    @compatibility(is_backward_compatible=True)", "    def trace("]
    assert found["signature_line"] == "    def trace("
    assert body[-1] == "        return self.graph"
    assert "        global _is_fx_tracing_flag" in body
    assert found["end_line"] - found["line"] + 2 == len(body)


HOSTILE = ['$(touch {canary})', '`touch {canary}`', "'; touch {canary} #",
           '"; touch {canary}; echo "', "a\nb$(touch {canary})", "--files",
           '"data-dependent" in e.args[0]', "\\", "isinstance(e.args[0], str) and"]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_patterns_are_searched_literally(real_torch_venv, tmp_path, template):
    canary = tmp_path / "CANARY"
    pattern = template.format(canary=canary)
    runs = [search(real_torch_venv, pattern, fixed=True, engine=e, max_hits=100000)
            for e in ENGINES + ["auto"] if e != "rg" or "\n" not in pattern]
    hits = [[(h["path"], h["line"]) for h in run.of("hit")] for run in runs]
    assert all(run.expect_result() for run in runs) and all(h == hits[0] for h in hits)
    if "\n" not in pattern:  # grep -F reads a line break as two patterns; we don't
        expected = grep_rn(real_torch_venv.site_packages, pattern, "-F")
        assert {(p, n) for p, n, _ in expected} == set(hits[0])
    assert not canary.exists() and not os.path.exists("CANARY")


def test_a_quoted_pattern_is_found_where_it_is(real_torch_venv):
    run = search(real_torch_venv, '"data-dependent" in e.args[0]', fixed=True)
    assert [h["path"] for h in run.of("hit")] == [ST]


def test_the_def_shortcut_keeps_every_definition_in_torch(real_torch_venv):
    """Every name torch defines (def, class, assignment, as def mode sees them) passes the
    shortcut that lets files go unparsed, in the file that defines it; and the shortcut does
    let most files that merely mention a name go. may_define is the file's question
    (names_may_differ_from_bytes) or the name's (has_binding_occurrence): the file's is asked
    once per file here, not once per name (it decodes a non-ASCII file: 28 s of 40 s)."""
    import ast
    import types

    from orchestrator.payloads import payload_source
    shipped = types.ModuleType("source_search_shipped")
    exec(compile(payload_source("source_search"), "source_search.py", "exec"), shipped.__dict__)
    checked, mentions, skipped = 0, 0, 0
    for path in (real_torch_venv.site_packages / "torch").rglob("*.py"):
        data = path.read_bytes()
        try:
            tree = ast.parse(data)
        except SyntaxError:
            continue
        defined = {qualname[-1] for qualname, _, _ in shipped.iter_definitions(tree.body)}
        if not shipped.names_may_differ_from_bytes(data):
            lost = sorted(name for name in defined if name.isascii()
                          and not shipped.has_binding_occurrence(data, name.encode("ascii")))
            assert not lost, f"{path}: {lost[:10]}"
        checked += len(defined)
        if b"is_fx_symbolic_tracing" in data and "is_fx_symbolic_tracing" not in defined:
            mentions += 1
            skipped += not shipped.may_define(data, "is_fx_symbolic_tracing")
    assert checked > 50000
    assert mentions >= 3 and skipped >= mentions - 1


@pytest.mark.skipif(not HAVE_RG, reason="ripgrep (rg) is not on PATH")
@pytest.mark.parametrize("name", ["is_fx_symbolic_tracing", "Tracer.trace", "_is_fx_tracing_flag"])
def test_def_mode_engines_agree_on_torch_with_the_files_searched(real_torch_venv, name):
    by_rg, by_python = (search(real_torch_venv, name, mode="def", engine=engine)
                        for engine in ("rg", "python"))
    assert by_rg.of("def") == by_python.of("def")
    rg_result, python_result = by_rg.expect_result(), by_python.expect_result()
    assert rg_result["files_searched"] == python_result["files_searched"] > 2000
