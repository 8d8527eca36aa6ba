"""click's own refusals print as ours: one ``error: ...`` line, exit 2, and one spelling of each option."""

from __future__ import annotations

import pytest

from cl_zoo.cli import main
from tests.cli.test_cli_vocabulary import all_commands


@pytest.mark.parametrize(("argv", "line"), [
    (["knn", "--train", "a", "--test", "b", "--qqqqqq"], "error: No such option '--qqqqqq' (see cl-zoo knn --help)"),
    (["linear-eval", "--train", "a", "--test", "b", "--protocol", "bogus"],
     "error: Invalid value for '--protocol': 'bogus' is not one of 'fast', 'paper', 'small-scale' (see cl-zoo linear-eval --help)"),
    (["search"], "error: Missing argument 'EMBEDDINGS' (see cl-zoo search --help)"),
    (["bogus"], "error: No such command 'bogus' (see cl-zoo --help)"),
    (["embed", "x", "-j", "-1"], "error: Invalid value for '-j' / '--workers': -1 is not in the range x>=0 (see cl-zoo embed --help)"),
], ids=["option", "choice", "argument", "command", "range"])
def test_click_usage_errors_are_one_error_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code, err, out) == (2, line + "\n", "")  # was a usage block and click's "Error: ..."


def test_a_bare_group_still_shows_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export"]) == 2
    assert "Usage: cl-zoo export" in capsys.readouterr().err


def test_models_matching_nothing_is_an_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "zzz*"]) == 2
    assert capsys.readouterr().err == "error: no model matches 'zzz*'; cl-zoo models lists them all\n"
    assert main(["models", "--pretrained", "zzz*"]) == 2
    assert capsys.readouterr().err == "error: no model matches 'zzz*' among pretrained entries; cl-zoo models lists them all\n"


def test_every_workers_option_is_also_dash_j() -> None:
    """`knn -j 2` was "no such option" while embed and search took it."""
    with_workers = {name: param.opts for name, command in all_commands() for param in command.params
                    if "--workers" in getattr(param, "opts", [])}
    assert {"embed", "search", "knn", "linear-eval", "pretrain", "detect"} <= set(with_workers)
    assert all("-j" in opts for opts in with_workers.values()), with_workers
