"""The shared value checks: each refusal is one InvalidValueError line (a ClZooError and a ValueError)."""

from __future__ import annotations

import math

import pytest

from cl_zoo.errors import ClZooError
from cl_zoo.validation import (
    InvalidValueError,
    check_choice,
    check_nesting,
    check_number,
    check_numbers,
    check_text,
    check_yaml_nesting,
    decode_text,
    nesting_depth,
)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, "0.1", None])
def test_non_numbers_and_non_finite_values_are_refused(value: object) -> None:
    with pytest.raises(InvalidValueError, match="--lr must be a finite number"):
        check_number("--lr", value, low=0, low_open=True)


@pytest.mark.parametrize(
    ("value", "bounds", "message"),
    [
        (0.0, {"low": 0, "low_open": True}, "must be > 0, got 0.0"),
        (-1, {"low": 0}, "must be >= 0, got -1"),
        (5, {"low": 0, "high": 1}, "must be >= 0 and <= 1, got 5"),
        (1.0, {"high": 1, "high_open": True}, "must be < 1, got 1.0"),
    ],
)
def test_bounds_are_named_in_the_refusal(value: float, bounds: dict, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        check_number("x", value, **bounds)


def test_valid_values_pass_through_unchanged() -> None:
    assert check_number("x", 0.5, low=0, high=1) == 0.5
    assert check_number("k", 3, low=1, integer=True) == 3
    assert check_numbers("k", [1, 10], low=1, integer=True) == [1, 10]
    assert check_choice("engine", "a", ["a", "b"]) == "a"


def test_whole_numbers_and_lists_name_the_bad_item() -> None:
    with pytest.raises(InvalidValueError, match="whole number"):
        check_number("k", 2.5, integer=True)
    with pytest.raises(InvalidValueError, match=r"milestones\[1\] must be >= 0"):
        check_numbers("milestones", [3, -1], low=0)
    with pytest.raises(InvalidValueError, match="one of a, b"):
        check_choice("engine", "c", ["a", "b"])


def test_the_error_is_a_user_error_and_a_value_error() -> None:
    assert issubclass(InvalidValueError, ClZooError) and issubclass(InvalidValueError, ValueError)


def test_nesting_is_counted_without_recursion() -> None:
    deep: list = []
    inner = deep
    for _ in range(5000):  # far past the interpreter's recursion limit
        inner.append([])
        inner = inner[0]
    assert nesting_depth(deep) == 33  # stops counting just past the limit
    assert nesting_depth({"a": [1, {"b": 2}]}) == 3
    with pytest.raises(InvalidValueError, match="nests deeper than 32"):
        check_nesting(deep, "config.json")
    assert check_nesting({"a": 1}, "config.json") == {"a": 1}


def test_deep_yaml_is_refused_before_it_is_composed() -> None:
    with pytest.raises(InvalidValueError, match="recipe nests deeper"):
        check_yaml_nesting("a: " + "[" * 500 + "]" * 500, "recipe")
    check_yaml_nesting("a: {b: [1, 2]}\nc: 3\n", "recipe")
    check_yaml_nesting("a: [unclosed", "recipe")  # a syntax error is left to the caller's parse


def test_text_that_is_not_utf8_is_one_line() -> None:
    assert decode_text("epochs: 5".encode(), "r") == "epochs: 5"
    with pytest.raises(InvalidValueError, match=r"not UTF-8 text \(byte 0xe9 at offset 1\)"):
        decode_text(b"a\xe9", "recipe")
    with pytest.raises(InvalidValueError, match="not valid text"):
        check_text("--origin", "a\udcffb")
