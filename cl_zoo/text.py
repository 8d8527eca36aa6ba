"""Small text helpers for one-line messages, shared by modules at every level (stdlib only).

Error messages are one line (the CLI prints them as ``error: ...``), so any text that comes from
elsewhere (an exception from a parser, a server's answer) is squeezed onto one line and cut to a
length first; sizes in limits are printed the same way everywhere. The strict reader of a JSON-lines
path list is here too: both an input list (:mod:`cl_zoo.data.images`) and an output's row list
(:mod:`cl_zoo.arrays`) are read with it, and neither should import the other for it.
"""

from __future__ import annotations

import json

from cl_zoo.errors import DataError

__all__ = ["exception_line", "is_repo_id", "listed", "mib", "one_line", "parse_json_lines"]


def one_line(value: object, limit: int = 200) -> str:
    """``str(value)`` with every run of whitespace (line breaks included) as one space, cut to ``limit``."""
    return " ".join(str(value).split())[:limit]


def exception_line(exc: BaseException, limit: int = 200) -> str:
    """:func:`one_line` of an exception, or its class name when it has no message (``MemoryError()``)."""
    return one_line(exc, limit) or type(exc).__name__


def listed(items: list[str], limit: int) -> str:
    """The first ``limit`` items joined by commas, then "and N more" for the rest."""
    more = len(items) - limit
    return ", ".join(items[:limit]) + (f" and {more} more" if more > 0 else "")


def mib(n: int) -> str:
    """A byte count as a limit reads best: whole MiB from 1 MiB up, bytes below."""
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n} bytes"


def is_repo_id(text: str) -> bool:
    """Whether ``text`` has the shape of a Hub repo id, ``owner/name`` (both parts non-empty)."""
    return text.count("/") == 1 and all(text.split("/"))


def parse_json_lines(text: str, name: str) -> list[str]:
    """The paths of a JSON-lines list: one JSON string per ``\n``-terminated line, blank lines skipped.

    Split on ``\n`` only: JSON escapes every line break inside a string, while a raw ``\r`` or
    U+2028 may legally sit in one, so splitting on every Unicode break would cut names apart. Any
    other row (an object, a number, a bare name) is refused naming its line, rather than guessed at:
    the format exists so that names are exact.
    """
    paths = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            raise DataError(f"{name} line {n} is not a JSON string") from None
        if not isinstance(value, str):
            raise DataError(f"{name} line {n} is {type(value).__name__}, not a JSON string path")
        if not value:
            raise DataError(f"{name} line {n} is an empty string, not a path")
        paths.append(value)
    return paths
