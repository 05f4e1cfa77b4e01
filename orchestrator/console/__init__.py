"""Printing: human tables and messages on the terminal, JSON for scripts.

The presentation room: commands, the engine and the MCP server call it; it imports
nothing of orch's (console.run holds what `orch run` shows).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.markup import escape as rich_escape
from rich.table import Table



def make_console(**options) -> Console:
    """A console as orch prints: no highlighting, no wrapping, and no emoji codes (a SHA-256
    fingerprint's ":CD:" would otherwise print as a disc)."""
    return Console(highlight=False, soft_wrap=True, emoji=False, **options)


out = make_console()
err = make_console(stderr=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> None:
    grid = Table(title=title, show_edge=False, header_style="bold")
    for column in columns:
        grid.add_column(column)
    for row in rows:
        grid.add_row(*["" if cell is None else str(cell) for cell in row])
    out.print(grid)


def error(message: str) -> None:
    err.print(f"[bold red]orch: error:[/] {escape(message)}")


def target_error(target: str, message) -> None:
    """An error line that names its target once (payload errors already start with it)."""
    text = str(message)
    error(text if text.startswith(f"{target}: ") else f"{target}: {text}")


def warn(message: str) -> None:
    err.print(f"[yellow]orch: warning:[/] {escape(message)}")


def info(message: str) -> None:
    err.print(escape(message))


def escape(text: str) -> str:
    return rich_escape(str(text))
