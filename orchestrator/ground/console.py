"""Printing: human tables and messages on the terminal, JSON for scripts.

Every layer prints through it; it imports nothing of orch's (the screens that draw a run
or a fan-out are the CLI's: cli/screens/).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from orchestrator.ground import invocation

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

# rich is imported when something is first printed through it (~20 ms): `orch exec`, whose
# output is the command's own bytes, prints nothing through rich unless something fails.
# `out` and `err`, the consoles every command prints to, are the current invocation's
# (ground/invocation.py): the agent's commands print to their own client's streams.


def make_console(**options) -> Console:
    """A console as orch prints: no highlighting, no wrapping, and no emoji codes (a SHA-256
    fingerprint's ":CD:" would otherwise print as a disc)."""
    from rich.console import Console  # rich on first print: see above
    return Console(highlight=False, soft_wrap=True, emoji=False, **options)


def __getattr__(name: str):
    """`console.out` (stdout) and `console.err` (stderr) of the current invocation."""
    if name not in ("out", "err"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _stream(name)


def _stream(name: str) -> Console:
    """The current invocation's console for out or err, made when first used. One set on
    the module (`console.out = ...`: a test's fixed-width screen) is used instead; orch's
    own code never sets one (tests/unit/project/test_no_process_patching.py)."""
    if name in globals():
        return globals()[name]
    current = invocation.current()
    made = current.consoles.get(name)
    if made is None:   # one, if two race
        made = current.consoles.setdefault(
            name, make_console(stderr=name == "err", **current.console_options(name)))
    return made


def print_json(data: Any) -> None:
    stdout = invocation.current().stdout
    stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    stdout.flush()


def write(text: str) -> None:
    """Plain text on the current invocation's stdout (grep's lines, a diff), no rich."""
    invocation.current().stdout.write(text)


def flush() -> None:
    invocation.current().stdout.flush()


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None, *,
          optional: Sequence[str] = (), no_wrap: Sequence[str] = (),
          out: Console | None = None) -> list[str]:
    """Print a table on `out` (default: stdout's console). Cells are data, never rich markup:
    a step message or an MCP argument holding `[/]` prints as typed (as markup it would raise
    MarkupError).

    So that no cell wraps (a wrapped table is hard to read in 80 columns), the `optional`
    columns are left out, in the order given, while the table is wider than the console;
    returns the names left out, for the caller to say where they are (--json, below)."""
    from rich.text import Text  # rich on first print: see above
    out = out or _stream("out")
    cells = [[Text("" if cell is None else str(cell)) for cell in row] for row in rows]

    def fits(names: list[str]) -> bool:
        wide = out.options.update_width(1 << 16)   # the table's own width, not the console's
        return out.measure(_grid(columns, names, cells, title, no_wrap), options=wide).maximum <= out.width

    shown = list(columns)
    dropped = []
    for name in optional:
        if fits(shown):
            break
        shown.remove(name)
        dropped.append(name)
    for name in reversed(dropped):   # one dropped late may fit again without the earlier ones
        again = [column for column in columns if column in shown or column == name]
        if fits(again):
            shown = again
    out.print(_grid(columns, shown, cells, title, no_wrap))
    return [name for name in columns if name not in shown]


def _grid(columns: Sequence[str], shown: list[str], cells: list, title, no_wrap):
    from rich.table import Table  # rich on first print: see above
    grid = Table(title=title, show_edge=False, header_style="bold")
    picked = [columns.index(name) for name in shown]
    for index in picked:
        grid.add_column(columns[index], no_wrap=columns[index] in no_wrap)
    for row in cells:
        grid.add_row(*[row[index] for index in picked])
    return grid


def error(message: str) -> None:
    _stream("err").print(f"[bold red]orch: error:[/] {escape(message)}")


def target_error(target: str, message) -> None:
    """An error line that names its target once (payload errors already start with it)."""
    text = str(message)
    error(text if text.startswith(f"{target}: ") else f"{target}: {text}")


def warn(message: str) -> None:
    _stream("err").print(f"[yellow]orch: warning:[/] {escape(message)}")


def info(message: str) -> None:
    _stream("err").print(escape(message))


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape  # rich on first print: see above
    return rich_escape(str(text))
