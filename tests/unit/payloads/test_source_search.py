"""source_search on a small tree built to hold the awkward cases: both engines must report
the same hits, in the same order, and a pattern is only ever data."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.payloads import env_with_path, run_payload, write_dist_info

HAVE_RG = shutil.which("rg") is not None
needs_rg = pytest.mark.skipif(not HAVE_RG, reason="ripgrep (rg) is not on PATH")

DEFS = '''\
import functools

LIMIT = 3
LIMIT_TOO: int = 4
first, (second, *rest) = 1, (2, 3)

if LIMIT:
    GUARDED = True


def plain(x):
    return x


async def waiting():
    return None


@functools.lru_cache
@staticmethod
def decorated():
    """Decorated twice."""
    return 1


class Tracer:
    traced_func_name = "forward"

    def trace(self, root):
        def helper():
            return root
        return helper()


class Other:
    def trace(self):
        return "other"


def outer():
    LOCAL_ONLY = 1

    def trace():
        return LOCAL_ONLY
    return trace
'''


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """site/pkg with the cases: path order, hidden files, links, encodings, line ends."""
    site = tmp_path_factory.mktemp("search") / "site"
    pkg = site / "pkg"
    files = {
        "__init__.py": "from pkg.a import b  # needle\n",
        "a/b.py": "x = 1  # needle\nneedle_two = 2\n\nNeedle = 3\nprint('needle')\n",
        "a-c.py": "needle in a-c\n",
        "a/deeper/z.py": "# needle at depth\n",
        ".hidden.py": "needle hidden file\n",
        ".dot/inside.py": "needle in hidden dir\n",
        "noeol.py": "first\nneedle without newline",
        "defs.py": DEFS,
        "quotes.py": ('cmd = "$(touch CANARY)"  # needle\nq = \'it\\\'s\'\n'
                      'tick = `touch CANARY`\ndq = "say \\"hi\\""\n'),
        "context.py": "".join(f"line {n}\n" for n in range(1, 11)).replace("line 5", "needle 5"),
        "notes.txt": "needle in a text file: not Python, not searched\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    (pkg / "crlf.py").write_bytes(b"needle crlf\r\nother\r\n")
    (pkg / "latin.py").write_bytes(b"caf\xe9 needle\n")
    (pkg / "bom.py").write_bytes(b"\xef\xbb\xbfneedle after bom\n")
    (pkg / "nul.py").write_bytes(b"needle\x00 with nul\n")
    (pkg / "link.py").symlink_to(pkg / "a-c.py")
    (pkg / "linkdir").symlink_to(pkg / "a", target_is_directory=True)
    write_dist_info(site, "pkg", "1.0", "pkg")
    return site


def search(site, pattern, **options):
    args = {"package": "pkg", "pattern": pattern, **options}
    return run_payload(sys.executable, "source_search", args, env=env_with_path(site))


def hits_of(run):
    return [(h["path"], h["line"], h["text"], tuple(map(tuple, h["before"])),
             tuple(map(tuple, h["after"]))) for h in run.of("hit")]


def both_engines(site, pattern, **options):
    """Hits and result of the rg and python engines, asserting they agree."""
    by_python = search(site, pattern, engine="python", **options)
    by_rg = search(site, pattern, engine="rg", **options)
    python_result, rg_result = by_python.expect_result(), by_rg.expect_result()
    assert (python_result["engine"], rg_result["engine"]) == ("python", "rg")
    assert hits_of(by_rg) == hits_of(by_python), pattern
    for key in ("hits", "truncated", "files_searched"):
        assert rg_result[key] == python_result[key], key
    return hits_of(by_python), python_result


@needs_rg
@pytest.mark.parametrize("pattern, options", [
    ("needle", {}),
    ("needle", {"ignore_case": True}),
    ("needle", {"word": True}),
    ("needle", {"word": True, "ignore_case": True}),
    ("needle", {"context": 2}),
    ("needle", {"fixed": True, "context": 1}),
    (r"^needle\b", {}),
    (r"needle$", {}),
    (r"needle_\w+", {}),
    ("[Nn]eedle|first", {}),
    ("a-c", {"fixed": True}),
    ("caf", {}),
    ("line [0-9]+", {"context": 3}),
    ("zzz-not-there", {}),
    ("-needle", {}),
])
def test_engines_agree(tree, pattern, options):
    both_engines(tree, pattern, **options)


@needs_rg
def test_what_is_searched_hidden_yes_links_and_other_suffixes_no(tree):
    hits, result = both_engines(tree, "needle")
    paths = {h[0] for h in hits}
    assert {"pkg/.hidden.py", "pkg/.dot/inside.py", "pkg/nul.py", "pkg/crlf.py"} <= paths
    assert not {"pkg/link.py", "pkg/notes.txt"} & paths
    assert not any(p.startswith("pkg/linkdir/") for p in paths)
    python_files = [p for p in tree.joinpath("pkg").rglob("*.py")
                    if not any(part.is_symlink() for part in [p, *p.parents])]
    assert result["files_searched"] == len(python_files)


def test_hits_come_in_path_order_directory_by_directory(tree):
    hits, _ = both_engines(tree, "needle") if HAVE_RG else (
        hits_of(search(tree, "needle", engine="python")), None)
    paths = [h[0] for h in hits]
    # "a/b.py" before "a-c.py": names compared per directory, as rg --sort path does.
    assert paths.index("pkg/a/b.py") < paths.index("pkg/a-c.py")
    assert paths == sorted(paths, key=lambda p: p.split("/"))


def test_lines_and_context_are_exact(tree):
    run = search(tree, "needle", engine="python", context=2)
    by_path = {h["path"]: h for h in run.of("hit")}
    assert by_path["pkg/context.py"] == {
        "event": "hit", "path": "pkg/context.py", "line": 5, "text": "needle 5",
        "before": [[3, "line 3"], [4, "line 4"]], "after": [[6, "line 6"], [7, "line 7"]]}
    assert by_path["pkg/noeol.py"]["text"] == "needle without newline"
    assert by_path["pkg/noeol.py"]["after"] == []
    assert by_path["pkg/crlf.py"]["text"] == "needle crlf\r"
    assert by_path["pkg/latin.py"]["text"] == "caf\ufffd needle"
    assert by_path["pkg/bom.py"]["text"] == "\ufeffneedle after bom"


@needs_rg
def test_truncation_stops_at_max_hits_in_both_engines(tree):
    hits, result = both_engines(tree, "needle", max_hits=3)
    assert len(hits) == 3 and result["truncated"] is True and result["files_searched"] is None
    everything, full = both_engines(tree, "needle")
    assert hits == everything[:3]
    exact, result = both_engines(tree, "needle", max_hits=full["hits"])
    assert exact == everything and result["truncated"] is False


HOSTILE = ['$(touch CANARY)', '`touch CANARY`', "it\\'s", '"; touch CANARY; echo "',
           "'; touch CANARY #", "a\nb", "needle\x00", "--files", "-e", "\\", "*", "$HOME",
           "say \\\"hi\\\""]


@pytest.mark.parametrize("pattern", HOSTILE)
def test_hostile_patterns_are_searched_literally_and_never_run(tree, tmp_path, pattern):
    runs = [search(tree, pattern, fixed=True, engine="python")]
    if HAVE_RG and "\n" not in pattern and "\x00" not in pattern:
        runs.append(search(tree, pattern, fixed=True, engine="rg"))
    runs.append(search(tree, pattern, fixed=True, engine="auto"))
    expected = [(h["path"], h["line"]) for h in runs[0].of("hit")]
    for run in runs:
        run.expect_result()
        assert [(h["path"], h["line"]) for h in run.of("hit")] == expected
        assert all(pattern in h["text"] for h in run.of("hit"))
    assert not any(p.name == "CANARY" for p in tree.parent.rglob("*"))
    assert not (tmp_path / "CANARY").exists() and not os.path.exists("CANARY")


def test_hostile_pattern_that_is_present_is_found(tree):
    run = search(tree, "$(touch CANARY)", fixed=True)
    assert [(h["path"], h["line"]) for h in run.of("hit")] == [("pkg/quotes.py", 1)]


@needs_rg
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="ne dl$()`'\";\\|*.\n", min_size=1, max_size=12))
def test_any_literal_gives_the_same_hits_in_both_engines(tree, pattern):
    python = search(tree, pattern, fixed=True, engine="python")
    auto = search(tree, pattern, fixed=True, engine="auto")
    assert hits_of(auto) == hits_of(python)


def test_a_pattern_with_a_line_break_matches_no_single_line(tree):
    run = search(tree, "first\nneedle", engine="auto")
    assert run.expect_result()["hits"] == 0 and run.final["engine"] == "python"


@needs_rg
def test_look_around_falls_back_to_python_with_auto_and_is_refused_by_rg(tree):
    auto = search(tree, r"(?<!_)needle\b")
    assert auto.expect_result()["engine"] == "python"
    assert auto.final["engine_reason"] == "a pattern ripgrep cannot take"
    assert search(tree, "needle", engine="python").final["engine_reason"] == "asked for"
    assert search(tree, "needle", engine="auto").final["engine_reason"] == "ripgrep is on PATH"
    assert ("pkg/a/b.py", 1) in [(h["path"], h["line"]) for h in auto.of("hit")]
    search(tree, r"(?<!_)needle", engine="rg").expect_error("bad-pattern")


@needs_rg
def test_a_regex_only_python_understands_falls_back_after_rg_refuses_it(tree):
    run = search(tree, r"needle\Z")  # \Z: Python's end of text; rg has no such escape
    result = run.expect_result()
    assert result["engine"] == "python" and "rg could not run" in result["warnings"][0]


def test_an_invalid_regex_is_a_clear_error(tree):
    error = search(tree, "needle(").expect_error("bad-pattern")
    assert "fixed" in error["message"]


def test_a_missing_rg_is_reported_when_asked_for(tree):
    env = env_with_path(tree)
    env["PATH"] = "/nonexistent"
    run = run_payload(sys.executable, "source_search",
                      {"package": "pkg", "pattern": "x", "engine": "rg"}, env=env)
    run.expect_error("rg-failed")
    auto = run_payload(sys.executable, "source_search", {"package": "pkg", "pattern": "needle"},
                       env=env)
    result = auto.expect_result()
    assert (result["engine"], result["engine_reason"]) == ("python", "no ripgrep in the container")
    assert hits_of(auto) == hits_of(search(tree, "needle", engine="python"))


# --- def mode ------------------------------------------------------------------------------


def defs_of(site, name, **options):
    runs = [search(site, name, mode="def", engine="python", **options)]
    if HAVE_RG:
        runs.append(search(site, name, mode="def", engine="rg", **options))
    events = [run.of("def") for run in runs]
    assert all(e == events[0] for e in events), "engines disagree"
    runs[0].expect_result()
    return [(e["path"], e["line"], e["kind"], e["qualname"]) for e in events[0]], events[0]


@pytest.mark.parametrize("name, expected", [
    ("plain", [("pkg/defs.py", 11, "function", "plain")]),
    ("waiting", [("pkg/defs.py", 15, "function", "waiting")]),
    ("Tracer", [("pkg/defs.py", 26, "class", "Tracer")]),
    ("LIMIT", [("pkg/defs.py", 3, "assignment", "LIMIT")]),
    ("LIMIT_TOO", [("pkg/defs.py", 4, "assignment", "LIMIT_TOO")]),
    ("rest", [("pkg/defs.py", 5, "assignment", "rest")]),
    ("GUARDED", [("pkg/defs.py", 8, "assignment", "GUARDED")]),
    ("traced_func_name", [("pkg/defs.py", 27, "assignment", "Tracer.traced_func_name")]),
    ("Tracer.trace", [("pkg/defs.py", 29, "method", "Tracer.trace")]),
    ("trace", [("pkg/defs.py", 29, "method", "Tracer.trace"),
               ("pkg/defs.py", 36, "method", "Other.trace"),
               ("pkg/defs.py", 43, "function", "outer.<locals>.trace")]),
    ("outer.trace", [("pkg/defs.py", 43, "function", "outer.<locals>.trace")]),
    ("helper", [("pkg/defs.py", 30, "function", "Tracer.trace.<locals>.helper")]),
    ("LOCAL_ONLY", []),
    ("needle", []),
])
def test_definitions_are_found_exactly(tree, name, expected):
    assert defs_of(tree, name)[0] == expected


def test_show_gives_the_whole_definition_with_decorators(tree):
    _, events = defs_of(tree, "decorated", show=True)
    (event,) = events
    assert event["line"] == 21 and event["end_line"] == 23
    assert event["signature_line"] == "def decorated():"
    assert event["body"] == ('@functools.lru_cache\n@staticmethod\ndef decorated():\n'
                             '    """Decorated twice."""\n    return 1')
    _, events = defs_of(tree, "Tracer.trace")
    assert "body" not in events[0]


def test_def_mode_wants_a_name(tree):
    search(tree, "not a name", mode="def").expect_error("bad-args")
    search(tree, "Tracer.", mode="def").expect_error("bad-args")


def test_def_mode_truncates_at_max_hits(tree):
    run = search(tree, "trace", mode="def", max_hits=2)
    assert len(run.of("def")) == 2 and run.expect_result()["truncated"] is True


def test_a_pattern_that_backtracks_for_ever_is_stopped_by_its_cpu_limit(tmp_path):
    """Python re runs a catastrophic pattern in C, where nothing interrupts it: RLIMIT_CPU
    (cpu_seconds) kills the payload with SIGXCPU after that much CPU time."""
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("x = '" + "a" * 40 + "!'\n")
    write_dist_info(site, "pkg", "1.0", "pkg")
    run = run_payload(sys.executable, "source_search",
                      {"package": "pkg", "pattern": "(a+)+$", "engine": "python", "cpu_seconds": 1},
                      env=env_with_path(site), timeout=30)
    assert run.returncode == -24 and run.events == []   # SIGXCPU (the controller sees 152)
