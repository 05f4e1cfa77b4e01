"""The reference pages under docs/reference/, written from the code itself.

Every command and option (the click tree, every lazily loaded command included), every step
kind and parameter (STEP_KINDS: `summary` and `Param.doc`), every verdict and exit code, and
every MCP tool and parameter (as the MCP SDK lists them to a client). The text lives next to
what it documents; this module only lays it out, so a page can never describe an option that
is gone. tests/unit/project/test_docs.py checks the committed pages against a fresh rendering, and a
missing text (a Param without doc, an option without help, a command without an example, a
tool parameter without a description) stops the rendering with MissingDocs.

    python -m orchestrator.cli.reference            # rewrite docs/reference/*.md
    python -m orchestrator.cli.reference /tmp/ref   # or write them into another folder
"""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
from dataclasses import dataclass
from typing import Iterator, Optional

import click

from orchestrator.ground import commands
from orchestrator.cli.app import main as orch_command
from orchestrator.ground.errors import EXIT_CODE_MEANINGS, ExitCode
from orchestrator.mcp.policy import ALLOWANCES, Policy
from orchestrator.playbook.loader import COMMON_KEYS
from orchestrator.playbook.steps import STEP_KINDS
from orchestrator.ground.verdicts import verdict_rules

REGENERATE = "python -m orchestrator.cli.reference"
HEADER = ("<!-- Generated from the code by `{command}`: edit the docstrings, help texts and "
          "Param docs there, not this file. -->\n").format(command=REGENERATE)


class MissingDocs(Exception):
    """Something the reference must show has no text in the code."""


@dataclass
class CommandDoc:
    path: tuple[str, ...]           # ("runs", "list")
    command: click.Command
    context: click.Context

    @property
    def name(self) -> str:
        return " ".join(("orch",) + self.path)


def command_tree() -> Iterator[CommandDoc]:
    """orch and every command under it, depth first in name order, each module loaded."""
    root = click.Context(orch_command, info_name="orch", terminal_width=100, max_content_width=100)
    yield CommandDoc((), orch_command, root)
    for name in sorted(commands.BY_NAME):
        command = orch_command.get_command(root, name)
        if command is None:
            raise MissingDocs(f"the command {name!r} of ground/commands.py could not be loaded")
        yield from _subtree((name,), command, root)


def _subtree(path: tuple[str, ...], command: click.Command, parent: click.Context) -> Iterator[CommandDoc]:
    context = click.Context(command, info_name=path[-1], parent=parent)
    yield CommandDoc(path, command, context)
    if isinstance(command, click.Group):
        for name in sorted(command.list_commands(context)):
            yield from _subtree(path + (name,), command.get_command(context, name), context)


def anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, spaces to dashes, punctuation dropped."""
    kept = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def _help_markdown(text: str) -> list[str]:
    """click help -> Markdown: a `\\b` paragraph (kept as typed) becomes a code block, the
    others one line each."""
    out: list[str] = []
    for paragraph in text.strip().split("\n\n"):
        lines = paragraph.splitlines()
        if lines and lines[0].strip() == "\b":
            body = [line for line in lines[1:]]
            indent = min((len(l) - len(l.lstrip()) for l in body if l.strip()), default=0)
            out += ["```text"] + [l[indent:].rstrip() for l in body] + ["```", ""]
        else:
            out += [" ".join(line.strip() for line in lines), ""]
    return out


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a bare | would end the cell (inside `code` too)."""
    return text.replace("|", "\\|")


def _metavar(param: click.Option) -> str:
    """What an option's value looks like; made here, not by click, whose wording of choices
    and ranges changes between releases (the pages must not)."""
    if param.metavar:
        return param.metavar
    if isinstance(param.type, click.Choice):
        return "[" + "|".join(str(choice) for choice in param.type.choices) + "]"
    return param.type.name.upper()


def _option_row(param: click.Parameter, context: click.Context) -> str:
    if isinstance(param, click.Argument):
        optional = "" if param.required else ", optional"
        return f"| `{param.make_metavar(context)}` | argument{optional} |"
    names = ", ".join(f"`{name}`" for name in param.opts + param.secondary_opts)
    if not param.help:
        raise MissingDocs(f"the option {names} of `{context.command_path}` has no help text")
    if not param.is_flag:
        names += f" `{_metavar(param)}`"
    extra = []
    if param.multiple and "repeatable" not in (param.help or ""):
        extra.append("repeatable")
    if param.required:
        extra.append("required")
    if param.envvar:
        extra.append(f"env `{param.envvar}`")
    if param.show_default and param.default not in (None, False, ()):
        extra.append(f"default `{param.default}`")
    text = (param.help or "").replace("\n", " ") + (" (" + "; ".join(extra) + ")" if extra else "")
    return f"| {_cell(names)} | {_cell(text)} |"


def command_section(doc: CommandDoc) -> list[str]:
    command, context = doc.command, doc.context
    help_text = command.help or ""
    if "Examples:" not in help_text and "Example:" not in help_text:
        raise MissingDocs(f"`{doc.name} --help` has no Examples: section")
    usage = " ".join(command.collect_usage_pieces(context))
    lines = [f"{'#' * min(2 + len(doc.path), 4)} {doc.name}", "",
             "```text", f"{doc.name} {usage}".rstrip(), "```", ""]
    lines += _help_markdown(help_text)
    # -h/--help is on every command: the page says so once
    help_option = command.get_help_option(context)
    params = [p for p in command.get_params(context)
              if not getattr(p, "hidden", False) and p is not help_option]
    params.sort(key=lambda p: not isinstance(p, click.Argument))   # arguments first, as in usage
    if params:
        lines += ["| option | what |", "| --- | --- |"]
        lines += [_option_row(p, context) for p in params]
        lines.append("")
    if isinstance(command, click.Group):
        subs = sorted(command.list_commands(context))
        lines += ["Commands: " + ", ".join(f"[{sub}](#{anchor(doc.name + ' ' + sub)})" for sub in subs), ""]
    return lines


def commands_page() -> str:
    docs = list(command_tree())
    lines = [HEADER, "# Command reference", "",
             "Every `orch` command with its options, as `orch COMMAND --help` (or `-h`) prints "
             "them. Exit codes: [exit-codes.md](exit-codes.md).", ""]
    lines += [f"{'  ' * max(len(d.path) - 1, 0)}- [{d.name}](#{anchor(d.name)})" for d in docs[1:]]
    lines.append("")
    for doc in docs:
        lines += command_section(doc)
    return _page(lines)


def _type_text(param) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list",
             dict: "mapping"}
    text = " or ".join(names.get(t, t.__name__) for t in param.types)
    if param.items:
        text += " of " + " or ".join(names.get(t, t.__name__) for t in param.items)
    return text


def _default_text(param) -> str:
    if param.required:
        return "required"
    if param.default in (None, [], {}):
        return ""
    return f"`{param.default!r}`" if not isinstance(param.default, str) else f"`{param.default}`"


def steps_page() -> str:
    lines = [HEADER, "# Step kinds", "",
             "Every step of a playbook is one of these kinds: `- KIND: {PARAM: VALUE, ...}`. "
             "Values may be jinja2 templates (`{{ var }}`), rendered per target when the step runs. "
             "Keys every step takes besides its kind's own: "
             + ", ".join(f"`{key}`" for key in COMMON_KEYS) + " ([guide](../guide/playbooks.md)).", ""]
    lines += [f"- [{kind}](#{anchor(kind)}): {cls.summary}" for kind, cls in STEP_KINDS.items()]
    lines.append("")
    for kind, cls in STEP_KINDS.items():
        if not cls.summary:
            raise MissingDocs(f"the step kind {kind!r} has no summary")
        lines += [f"## {kind}", "", cls.summary[0].upper() + cls.summary[1:] + ".", ""]
        if cls.shorthand:
            lines += [f"Shorthand: `- {kind}: VALUE` means `- {kind}: {{{cls.shorthand}: VALUE}}`.", ""]
        lines += ["| parameter | type | default | what |", "| --- | --- | --- | --- |"]
        for name, param in cls.params.items():
            if not param.doc:
                raise MissingDocs(f"the parameter {name!r} of the step kind {kind!r} has no doc")
            doc = param.doc
            if param.choices:
                doc += " (one of " + ", ".join(f"`{c}`" for c in param.choices) + ")"
            lines.append(f"| `{name}` | {_type_text(param)} | {_cell(_default_text(param))} | {_cell(doc)} |")
        lines.append("")
    return _page(lines)


def verdict_rows() -> list[tuple[str, int, str, str, str]]:
    """(verdict, exit code, workload, what it means, what to do) in the verdicts' order:
    everything the verdicts page shows, from the verdict table (ground/verdicts.py)."""
    rows = []
    for rule in verdict_rules():
        meaning = rule["description"]
        if not meaning:
            raise MissingDocs(f"the verdict {rule['name']!r} has no description in ground/verdicts.py")
        if rule["patterns"]:
            meaning += " Log signature: " + "; ".join(f"`{p}`" for p in rule["patterns"]) + "."
        rows.append((rule["name"], rule["exit_code"], rule["workload"], meaning, rule["remediation"]))
    return rows


def verdicts_page() -> str:
    lines = [HEADER, "# Verdicts", "",
             "What `orch run` and `orch nightly` conclude about a run, and the exit code each "
             "gives ([exit codes](exit-codes.md)), in the order that decides: the first verdict "
             "whose evidence a run shows is its verdict, and of several targets' verdicts the "
             "first is the run's. A failure signature decides the verdict only when the run ended "
             "badly; in a run that ended well it is a warning. The workload says whose runs show "
             "it (any trainer, torchrun's ranks, the DFlash threads). The monitor adds to a "
             "remediation what it knows of the run (the target, the playbook, the torch version); "
             "a report shows the one below when the run left none.", "",
             "| verdict | exit | workload | means | what to do |", "| --- | ---: | --- | --- | --- |"]
    for verdict, code, workload, meaning, remediation in verdict_rows():
        lines.append(f"| `{verdict}` | {code} | {workload} | {_cell(meaning)} | {_cell(remediation)} |")
    lines.append("")
    return _page(lines)


def exit_codes_page() -> str:
    lines = [HEADER, "# Exit codes", "",
             "Every `orch` command exits with one of these. `orch exec` passes the command's own "
             "exit code through (128+N when signal N killed it) and uses 255 for orch's own errors, "
             "as ssh does. Run verdicts and their codes: [verdicts.md](verdicts.md).", "",
             "| code | name | meaning |", "| ---: | --- | --- |"]
    for name, code in exit_codes():
        meaning = EXIT_CODE_MEANINGS.get(code)
        if not meaning:
            raise MissingDocs(f"the exit code {name} ({code}) has no meaning in ground.errors.EXIT_CODE_MEANINGS")
        lines.append(f"| {code} | `{name}` | {_cell(meaning)} |")
    lines.append("")
    return _page(lines)


def mcp_tools() -> list:
    """The tools `orch mcp` lists with every allowance given, as the MCP SDK describes them to
    a client (name, description, input JSON schema, annotations)."""
    try:
        # the MCP SDK is an extra (orch[mcp]); the test extra has it
        from orchestrator.mcp.server import build_server
    except ModuleNotFoundError as error:
        raise MissingDocs(f"the MCP tools need the MCP SDK ({error.name}): pip install -e '.[mcp]'") from None
    everything = Policy(allow=frozenset(ALLOWANCES))
    # listing registers no call: the tools' own objects (fleet, store, audit) are never used
    server = build_server(tools=None, policy=everything, audit=None)
    return asyncio.run(server.list_tools())


def _schema_type(schema: dict) -> str:
    if "anyOf" in schema:
        kinds = [_schema_type(option) for option in schema["anyOf"]]
        return " or ".join(kind for kind in kinds if kind != "null") + (" or null" if "null" in kinds else "")
    kind = schema.get("type", "any")
    if kind == "array" and isinstance(schema.get("items"), dict):
        kind = f"list of {_schema_type(schema['items'])}"
    bounds = [f"{sign} {schema[key]}" for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                       ("maximum", "<="), ("exclusiveMaximum", "<"))
              if key in schema]
    return ", ".join([kind] + bounds)


def mcp_page() -> str:
    allowance_of = {tool: name for name, tools in ALLOWANCES.items() for tool in tools}
    tools = mcp_tools()
    lines = [HEADER, "# MCP tools", "",
             "The tools `orch mcp` serves an AI agent ([guide](../guide/mcp.md)). A tool is listed "
             "only when the server's allowance includes it: read-only tools always, the others with "
             "`--allow exec` or `--allow write`.", ""]
    lines += [f"- [{tool.name}](#{anchor(tool.name)})" for tool in tools]
    lines.append("")
    for tool in tools:
        allowed = allowance_of.get(tool.name)
        listed = f"listed with `--allow {allowed}`" if allowed else "read-only, always listed"
        if not tool.description:
            raise MissingDocs(f"the MCP tool {tool.name!r} has no description (its docstring)")
        lines += [f"## {tool.name}", "", " ".join(inspect.cleandoc(tool.description).split()), "",
                  f"*{listed}.*", ""]
        properties = tool.input_schema.get("properties", {})
        required = set(tool.input_schema.get("required", []))
        if properties:
            lines += ["| parameter | type | default | what |", "| --- | --- | --- | --- |"]
            for name, schema in properties.items():
                if not schema.get("description"):
                    raise MissingDocs(f"the parameter {name!r} of the MCP tool {tool.name!r} has no "
                                      "description (Field(description=...))")
                default = "required" if name in required else (
                    f"`{json.dumps(schema['default'])}`" if "default" in schema else "")
                lines.append(f"| `{name}` | {_cell(_schema_type(schema))} | {_cell(default)} | "
                             f"{_cell(schema.get('description', ''))} |")
            lines.append("")
    return _page(lines)


def exit_codes() -> list[tuple[str, int]]:
    return [(name, value) for name, value in vars(ExitCode).items()
            if name.isupper() and isinstance(value, int)]


def _page(lines: list[str]) -> str:
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip("\n") + "\n"


PAGES = {"commands.md": commands_page, "steps.md": steps_page, "verdicts.md": verdicts_page,
         "exit-codes.md": exit_codes_page, "mcp-tools.md": mcp_page}


def render_all() -> dict[str, str]:
    """File name under docs/reference/ -> its text."""
    return {name: page() for name, page in PAGES.items()}


def default_folder() -> str:
    """docs/reference of the checkout this package is in."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(os.path.dirname(package), "docs", "reference")


def write_all(folder: Optional[str] = None) -> list[str]:
    folder = folder or default_folder()
    os.makedirs(folder, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = os.path.join(folder, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        written.append(path)
    return written


def main(argv: Optional[list[str]] = None) -> int:
    try:
        for path in write_all(*(argv if argv is not None else sys.argv[1:])[:1]):
            print(path)
    except MissingDocs as error:
        print(f"orch reference: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
