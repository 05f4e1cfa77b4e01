"""docs/design/architecture.md keeps up with the code: every room of orchestrator/ is in its
map, in the layers' order, and every module and subpackage of a room is named there (in the
room's line of the map or in its paragraph)."""

from __future__ import annotations

import os
import re

import orchestrator
from tests.unit.project.test_import_graph import LAYERS

PACKAGE = os.path.dirname(orchestrator.__file__)
DOC = os.path.join(os.path.dirname(PACKAGE), "docs", "design", "architecture.md")
LONGEST_SENTENCE_WORDS = 60


def _doc() -> str:
    with open(DOC, encoding="utf-8") as file:
        return file.read()


def map_lines() -> dict[str, str]:
    """The map (the indented block under `orchestrator/`): room -> its text, continuation
    lines included, in the map's order."""
    block = _doc().split("    orchestrator/\n", 1)[1].split("\n\n", 1)[0]
    rooms: dict[str, str] = {}
    room = None
    for line in block.splitlines():
        found = re.match(r"^ {6}(\w+)/ ", line)
        if found:
            room = found.group(1)
            rooms[room] = ""
        if room is not None:
            rooms[room] += line + "\n"
    return rooms


def paragraph(room: str) -> str:
    """The room's paragraph under "## The layers": from **ROOM/.** to the next room's."""
    text = _doc()
    start = text.find(f"**{room}/.**")
    if start < 0:
        return ""
    end = text.find("\n**", start + 1)
    return text[start:end if end > 0 else None]


def parts(room: str) -> list[str]:
    """A room's modules (file stems) and subpackages (folder/), __init__ left out."""
    folder = os.path.join(PACKAGE, room)
    names = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith(".py") and name != "__init__.py":
            names.append(name[:-3])
        elif os.path.isdir(path) and os.path.exists(os.path.join(path, "__init__.py")):
            names.append(name + "/")
    return names


def test_the_map_has_every_room_in_the_layers_order():
    rooms = [room for room in LAYERS if os.path.isdir(os.path.join(PACKAGE, room))]
    assert list(map_lines()) == rooms


def test_every_module_is_named_in_its_rooms_line_or_paragraph():
    missing = []
    for room, line in map_lines().items():
        text = line + paragraph(room)
        for part in parts(room):
            word = part.rstrip("/")
            if not re.search(rf"(?<![\w.]){re.escape(word)}(?![\w])", text):
                missing.append(f"{room}/{part}")
    assert missing == [], "name them in docs/design/architecture.md: " + ", ".join(missing)


def sentences() -> list[str]:
    """The doc's prose sentences: paragraphs and list items apart (the map left out), each
    cut after . ! or ? before a capital, a backtick or a parenthesis."""
    prose = re.sub(r"(?m)^ {4}.*$", "", _doc())
    pieces = re.split(r"\n\s*\n|\n- ", prose)
    return [sentence for piece in pieces
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(*])", re.sub(r"\s+", " ", piece))]


def test_no_sentence_runs_on():
    long = [f"{len(s.split())} words: {s[:80]}..." for s in sentences()
            if len(s.split()) > LONGEST_SENTENCE_WORDS]
    assert long == []
