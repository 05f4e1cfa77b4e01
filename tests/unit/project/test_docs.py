"""The docs a user looks things up in: the reference is the code's (regenerated, nothing
missing), the README stays short and keeps CI's test command, the commands shown are real,
every relative link (README.md, docs/**/*.md) reaches a file and, with #, a heading, and
every page or file named on either side of docs/ exists."""

from __future__ import annotations

import glob
import os
import re
import shlex
from types import SimpleNamespace
from typing import Iterator

import click
import pytest

from orchestrator.cli import reference
from orchestrator.cli.app import main as orch_command
from orchestrator.config.schema import Param
from orchestrator.mcp.policy import ALLOWANCES, READ_TOOLS
from orchestrator.playbook.steps import STEP_KINDS
from orchestrator.playbook.steps.base import Step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
README_BUDGET = 150
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
# A path into this repository, as docs name one (`orchestrator/remote/ssh.py`, tests/unit/x.py)
REPO_PATH = re.compile(r"(?<![\w/.-])(?:orchestrator|tests|scripts|benchmarks|playbooks|sandbox|templates)"
                       r"/[\w./-]*\w\.(?:py|yaml|sh|j2|toml|txt)\b")
# Paths named in other repositories: SpecForge's old training script and its training docs.
NOT_OURS = {"scripts/train_dflash.py", "docs/basic_usage/training.md"}
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w/-]+\.md\b")
SOURCE_FOLDERS = ("orchestrator", "sandbox", "tests", "scripts", "benchmarks", "playbooks", "templates", ".ci")
EXAMPLE = re.compile(r"^ {4,}(?:\.venv/bin/)?(orch .*[^\\])$", re.M)   # one whole line of a code block


def markdown_files() -> list[str]:
    found = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    return [os.path.join(ROOT, "README.md")] + sorted(found)


def prose(path: str) -> str:
    """The page without code blocks and code spans: a link there is an example, not a link."""
    with open(path, encoding="utf-8") as handle:
        return CODE_SPAN.sub("", FENCE.sub("", handle.read()))


def anchors(path: str) -> Iterator[str]:
    """The #anchors GitHub gives the page's headings (a repeated heading gets -1, -2, ...)."""
    with open(path, encoding="utf-8") as handle:
        text = FENCE.sub("", handle.read())
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M):
        slug = reference.anchor(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        yield slug if count == 0 else f"{slug}-{count}"


def broken_links(path: str) -> list[str]:
    broken = []
    for url in LINK.findall(prose(path)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", url):          # http:, mailto:, ...
            continue
        target, _, fragment = url.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        if not os.path.exists(full):
            broken.append(f"{url} (no such file)")
        elif fragment and full.endswith(".md") and fragment not in set(anchors(full)):
            broken.append(f"{url} (no heading #{fragment})")
    return broken


def test_the_committed_reference_is_the_code_s():
    stale = []
    for name, text in reference.render_all().items():
        path = os.path.join(ROOT, "docs", "reference", name)
        committed = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if committed != text:
            stale.append(name)
    assert not stale, (f"docs/reference/{', '.join(stale)} no longer match the code: regenerate with "
                       f"`.venv/bin/{reference.REGENERATE}` and commit the result")


def test_the_reference_covers_every_command_step_parameter_verdict_and_code():
    pages = reference.render_all()
    for doc in reference.command_tree():
        assert f"# {doc.name}\n" in pages["commands.md"]
        for param in doc.command.params:
            for option in param.opts if isinstance(param, click.Option) else ():
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in pages["commands.md"], (doc.name, option)
    assert "| `hang_after` |" in pages["steps.md"] and "## monitor" in pages["steps.md"]
    for kind, cls in STEP_KINDS.items():
        section = pages["steps.md"].split(f"## {kind}\n", 1)[1].split("\n## ", 1)[0]
        assert all(f"| `{name}` |" in section for name in cls.params), kind
    for tool in READ_TOOLS + sum(ALLOWANCES.values(), ()):
        assert f"\n## {tool}\n" in pages["mcp-tools.md"], tool
    assert "| `argv` | list of string | required |" in pages["mcp-tools.md"]
    assert "| `cuda-oom` | 10 |" in pages["verdicts.md"]
    assert "| 21 | `LOCKED` |" in pages["exit-codes.md"]


def test_a_parameter_without_a_doc_fails_the_reference(monkeypatch):
    class Undocumented(Step):
        kind = "undocumented"
        summary = "a step kind for this test"
        params = {"quiet": Param((bool,), default=False)}

    monkeypatch.setitem(STEP_KINDS, "undocumented", Undocumented)
    with pytest.raises(reference.MissingDocs, match="'quiet' of the step kind 'undocumented'"):
        reference.steps_page()


def test_a_command_without_an_example_fails_the_reference():
    command = click.Command("bare", help="Does something.\n\nNo example here.")
    doc = reference.CommandDoc(("bare",), command, click.Context(command, info_name="bare"))
    with pytest.raises(reference.MissingDocs, match="orch bare --help"):
        reference.command_section(doc)


def test_an_option_without_help_fails_the_reference():
    command = click.Command("bare", help="Does something.\n\n\b\nExample:\n  orch bare --loud",
                            params=[click.Option(["--loud"], is_flag=True)])
    doc = reference.CommandDoc(("bare",), command, click.Context(command, info_name="bare"))
    with pytest.raises(reference.MissingDocs, match="`--loud` of `bare` has no help"):
        reference.command_section(doc)


def test_an_mcp_parameter_without_a_description_fails_the_reference(monkeypatch):
    tool = SimpleNamespace(name="peek", description="Look at something.",
                           input_schema={"properties": {"depth": {"type": "integer"}}})
    monkeypatch.setattr(reference, "mcp_tools", lambda: [tool])
    with pytest.raises(reference.MissingDocs, match="'depth' of the MCP tool 'peek'"):
        reference.mcp_page()


def test_every_exit_code_has_its_meaning():
    codes = dict(reference.exit_codes())
    assert codes["RUN_HANG"] == 11 and codes["EXEC_ORCH_ERROR"] == 255
    assert "hang_after" in reference.exit_codes_page()


def test_readme_within_its_line_budget():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        lines = handle.read().count("\n")
    assert lines <= README_BUDGET, f"README.md has {lines} lines; the budget is {README_BUDGET}: move detail into docs/"


def test_ci_runs_the_readme_s_test_command():
    """.ci/run runs exactly the command the README tells a user to run."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    command = re.search(r"^exec (bash scripts/test\.sh)", ci, re.M).group(1)
    assert f"\n    {command}\n" in readme


def parse_orch_command(line: str) -> None:
    """Parse LINE as orch would, down to its last subcommand: an unknown command or option,
    or a missing argument, raises click's usage error. Nothing runs."""
    args = shlex.split(line, comments=True)[1:]
    command, context = orch_command, orch_command.make_context("orch", args)
    while isinstance(command, click.Group):
        # the words after the group's options: click 8.2+ keeps the first in _protected_args
        # (its public name is deprecated), click 8.1 in protected_args
        first = vars(context).get("_protected_args", None)
        rest = [*(first if first is not None else context.protected_args), *context.args]
        if not rest:
            return
        sub = command.get_command(context, rest[0])
        if sub is None:
            raise click.UsageError(f"no command {rest[0]!r}")
        command, context = sub, sub.make_context(rest[0], rest[1:], parent=context)


@pytest.mark.parametrize("path", [os.path.join(ROOT, "README.md")]
                         + sorted(glob.glob(os.path.join(ROOT, "docs", "guide", "*.md"))),
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_the_commands_shown_are_real(path):
    """Every `orch ...` line of a code block in the README and the guide parses: the command,
    its subcommands and options exist, the arguments are there."""
    with open(path, encoding="utf-8") as handle:
        lines = EXAMPLE.findall(handle.read())
    wrong = []
    for line in lines:
        try:
            parse_orch_command(line)
        except click.ClickException as error:
            wrong.append(f"{line}: {error.format_message()}")
    assert wrong == []


def test_a_command_that_is_not_there_is_found():
    for line in ("orch grep-torch --nope x", "orch runz list", "orch run"):
        with pytest.raises(click.UsageError):
            parse_orch_command(line)
    parse_orch_command("orch -i sandbox runs compare last~1 last   # a comment")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_file_of_this_repository_the_docs_name_exists(path):
    """After code moves (the layers as folders), a page naming the old path is wrong."""
    with open(path, encoding="utf-8") as handle:
        named = set(REPO_PATH.findall(handle.read())) - NOT_OURS
    assert sorted(p for p in named if not os.path.exists(os.path.join(ROOT, p))) == []


def docs_named_in_the_sources() -> dict[str, list[str]]:
    """docs/...md path -> the files (code comments, help texts, tests) that name it."""
    named: dict[str, list[str]] = {}
    for folder in SOURCE_FOLDERS:
        for where, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            for name in files:
                if name.endswith((".py", ".md", ".yaml", ".sh", ".toml", ".j2", ".txt")) or "." not in name:
                    path = os.path.join(where, name)
                    with open(path, encoding="utf-8", errors="replace") as handle:
                        for page in DOCS_PATH.findall(handle.read()):
                            named.setdefault(page, []).append(os.path.relpath(path, ROOT))
    return named


def test_every_docs_page_the_code_names_exists():
    """A page moved or renamed takes every mention along: comments, --help texts, tests."""
    named = docs_named_in_the_sources()
    assert "docs/guide/agent.md" in named        # the walk sees the code's mentions
    assert {page: files for page, files in named.items()
            if page not in NOT_OURS and not os.path.exists(os.path.join(ROOT, page))} == {}


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## The `orch mcp` part\n\n"
                                   "[ok](#the-orch-mcp-part) [b](b.md) [c](a.md#nowhere) "
                                   "`[code](x.md)` [web](https://example.com)\n")
    assert broken_links(str(tmp_path / "a.md")) == ["b.md (no such file)", "a.md#nowhere (no heading #nowhere)"]
