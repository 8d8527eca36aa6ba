"""Checks on the values a user or a file hands to cl-zoo, shared by the CLI and the Python API.

A value is checked where it enters (a CLI option, a recipe field, a config file) and before any work
or write starts, so nonsense ends as one ``error:`` line and exit 2 instead of a traceback an hour in,
or a run that "succeeds" on a NaN learning rate. Every check raises :class:`InvalidValueError`, a
:class:`ClZooError` (the CLI prints its message as one line) and a ``ValueError`` (so Python callers
that already catch ``ValueError`` keep working).

Structured text (YAML recipes, JSON configs) is bounded before it is trusted: its size by the
caller, its nesting depth here, because Python's parsers and every recursive walk over their result
end in ``RecursionError`` on a file nested a few hundred levels deep.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Real
from typing import Any

from cl_zoo.errors import ClZooError

# Deeper than any config, recipe or card cl-zoo writes or reads (they nest 4-6 levels), far below the
# depth at which the parsers or a recursive walk over their result exhaust the interpreter's stack.
MAX_NESTING = 32
# The largest seed numpy's legacy RandomState takes (torch and numpy's Generator take more).
MAX_SEED = 2**32 - 1


class InvalidValueError(ClZooError, ValueError):
    """A value outside what it can mean: not finite, out of range, badly encoded or nested too deep."""


def _bounds_text(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {_shown(low)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {_shown(high)}")
    return " and ".join(parts)


def _shown(bound: float) -> str:
    """A bound as the user would type it: whole numbers in full (a seed's 4294967295, not 4.29497e+09)."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> Any:
    """``value`` itself when it is a finite number inside the bounds, else one line naming ``name``.

    ``low_open``/``high_open`` exclude the bound itself (a learning rate ``> 0``). Booleans are refused:
    YAML reads ``yes`` as ``True``, and ``True`` is an int to Python.
    """
    kind = "a whole number" if integer else "a finite number"
    if isinstance(value, bool) or not isinstance(value, Real) or (integer and not float(value).is_integer()):
        raise InvalidValueError(f"{name} must be {kind}, got {value!r}")
    if not math.isfinite(value):
        raise InvalidValueError(f"{name} must be {kind}, got {value!r}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        raise InvalidValueError(f"{name} must be {_bounds_text(low, high, low_open, high_open)}, got {value!r}")
    return value


def check_count(name: str, value: Any, *, high: float | None = None) -> Any:
    """``value`` when it is a whole number from 1 to ``high``; zero or a negative count is named as
    "not positive", the words a user of a count expects, before the bounds are checked."""
    if isinstance(value, Real) and not isinstance(value, bool) and value <= 0:
        raise InvalidValueError(f"{name} must be positive, got {value}")
    return check_number(name, value, low=1, high=high, integer=True)


def check_seed(name: str, value: Any) -> int:
    """A random seed every generator cl-zoo seeds accepts: a whole number in 0..:data:`MAX_SEED`.

    numpy's generators refuse a negative seed and torch's a seed past 64 bits, each with its own
    traceback and only once the run reaches them.
    """
    return int(check_number(name, value, low=0, high=MAX_SEED, integer=True))


def check_numbers(name: str, values: Iterable[Any], **bounds: Any) -> list[Any]:
    """Every item of ``values`` through :func:`check_number` (a list option: ``--k 1,10``, milestones)."""
    return [check_number(f"{name}[{i}]", v, **bounds) for i, v in enumerate(values)]


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """``value`` when it is one of ``choices`` (strings), else one line listing them."""
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        raise InvalidValueError(f"{name} must be one of {', '.join(options)}, got {value!r}")
    return value


def decode_text(raw: bytes, what: str) -> str:
    """``raw`` as UTF-8 text; a file in another encoding is one line naming where it stops being UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidValueError(
            f"{what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None


def check_text(name: str, value: str) -> str:
    """``value`` when it can be written as UTF-8 (a lone surrogate from a mis-decoded argv cannot)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidValueError(
            f"{name} is not valid text (character {exc.start} is an undecodable byte); pass it as UTF-8"
        ) from None
    return value


def nesting_depth(data: Any, limit: int = MAX_NESTING) -> int:
    """How deeply ``data`` nests lists and dicts, counted without recursion and stopping past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_nesting(data: Any, what: str, limit: int = MAX_NESTING) -> Any:
    """``data`` itself when it nests at most ``limit`` levels, else one line naming ``what``."""
    if nesting_depth(data, limit) > limit:
        raise InvalidValueError(f"{what} nests deeper than {limit} levels; no cl-zoo file does")
    return data


def check_yaml_nesting(text: str, what: str, limit: int = MAX_NESTING) -> None:
    """Refuse YAML ``text`` that nests deeper than ``limit`` before it is composed into objects.

    PyYAML's parser is a state machine (no recursion), but its composer and constructor recurse once
    per level, so the depth is counted on the parser's event stream first.
    """
    import yaml

    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > limit:
                    raise InvalidValueError(f"{what} nests deeper than {limit} levels; no cl-zoo file does")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        return  # the caller's own parse reports the syntax error with its position
