"""StrEnum: an enum whose members are their strings, for the words orch stores or prints
(Python 3.11's enum.StrEnum; orch runs on 3.10 too).

A member equals its string ("exited" == RunState.EXITED) and hashes as it (so a set or a
dict of members finds the plain string too), is saved as it in JSON, and prints as it (str()
and f-strings give "exited", not "RunState.EXITED"): records and messages keep their words
while code names them by constant.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    def __str__(self) -> str:
        return str.__str__(self)

    __format__ = str.__format__
    __hash__ = str.__hash__      # Enum's own hashes the member's name
