"""knn and linear-eval settings checked before work: a NaN, negative or empty value is one line.

Every case runs on data that does not exist and with model loading forbidden: the value must be
refused before the data, the model or the report folder is touched.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cl_zoo.cli import main
from cl_zoo.validation import InvalidValueError

LINEAR = ["linear-eval", "--train", "missing-train", "--test", "missing-test"]
KNN = ["knn", "--train", "missing-train", "--test", "missing-test"]
PAPER = [*LINEAR, "--protocol", "paper"]
SMALL = [*LINEAR, "--protocol", "small-scale"]


@pytest.fixture
def nothing_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder that must stay empty (no eval-reports/), and no model may load."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the settings were checked")

    import cl_zoo.eval.baseline as baseline

    monkeypatch.setattr(baseline, "load_model_or_baseline", refuse)
    monkeypatch.chdir(tmp_path)
    return tmp_path


CASES = [
    (SMALL + ["--lr", "nan"], "error: --lr must be a finite number, got nan"),
    (SMALL + ["--weight-decay", "nan"], "error: --weight-decay must be a finite number, got nan"),
    (PAPER + ["--weight-decay", "-1"], "error: --weight-decay must be >= 0, got -1.0"),
    (SMALL + ["--betas", "nan,nan"], "error: --betas[0] must be a finite number, got nan"),
    (SMALL + ["--betas", "2,2"], "error: --betas[0] must be >= 0 and < 1, got 2.0"),
    (SMALL + ["--betas", "0.5"], "error: --betas takes two numbers, got (0.5,)"),
    (PAPER + ["--momentum", "-1"], "error: --momentum must be >= 0 and < 1, got -1.0"),
    (PAPER + ["--momentum", "nan"], "error: --momentum must be a finite number, got nan"),
    (PAPER + ["--momentum", "5"], "error: --momentum must be >= 0 and < 1, got 5.0"),
    (LINEAR + ["--wd-grid", "nan"], "error: --wd-grid[0] must be a finite number, got nan"),
    (LINEAR + ["--wd-grid", "1e-4,,1e-2"], "error: --wd-grid must be comma-separated numbers, got '1e-4,,1e-2'"),
    (PAPER + ["--lr", "inf"], "error: --lr must be a finite number, got inf"),
    (LINEAR + ["--max-iter", "0"], "error: --max-iter must be >= 1, got 0"),
    (LINEAR + ["--max-iter", "-1"], "error: --max-iter must be >= 1, got -1"),
    (PAPER + ["--max-iter", "0"], "error: --max-iter must be >= 1, got 0"),
    (PAPER + ["--max-iter", "50"], "error: --max-iter applies to the fast protocol, not paper"),
    (PAPER + ["--gamma", "-1"], "error: --gamma must be > 0 and <= 1, got -1.0"),
    (PAPER + ["--gamma", "nan"], "error: --gamma must be a finite number, got nan"),
    (PAPER + ["--weight-decay", "nan"], "error: --weight-decay must be a finite number, got nan"),
    (PAPER + ["--epochs", "0"], "error: --epochs must be >= 1, got 0"),
    (PAPER + ["--milestones", "60,,80"], "error: --milestones must be comma-separated whole numbers, got '60,,80'"),
    (LINEAR + ["--val-fraction", "nan"], "error: --val-fraction must be a finite number, got nan"),
    (LINEAR + ["--train-batch-size", "8"], "error: --train-batch-size applies to the paper/small-scale protocols, not fast"),
    (KNN + ["-t", "nan"], "error: --temperature must be a finite number, got nan"),
    (KNN + ["-t", "-0.1"], "error: --temperature must be > 0, got -0.1"),
    (KNN + ["--k", "1,,2"], "error: --k must be comma-separated whole numbers, got '1,,2'"),
    (KNN + ["--k", "0"], "error: --k[0] must be >= 1, got 0"),
    (KNN + ["--k", "2.5"], "error: --k[0] must be a whole number, got 2.5"),
]


@pytest.mark.parametrize(("argv", "line"), CASES, ids=[" ".join(a[5:]) for a, _ in CASES])
def test_a_bad_setting_is_one_line_before_any_work(argv: list[str], line: str, nothing_runs: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code, err, out) == (2, line + "\n", "")
    assert not list(nothing_runs.iterdir())  # no report folder, no report


@pytest.mark.parametrize("argv", [
    KNN + ["--seed", "-1"], KNN + ["--per-class", "0"], KNN + ["--batch-size", "0"], LINEAR + ["-j", "-1"],
])
def test_common_numbers_are_click_ranges_printed_as_our_errors(argv: list[str], nothing_runs: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: Invalid value for '") and err.count("\n") == 1, err
    assert not list(nothing_runs.iterdir())


def test_knn_and_linear_eval_take_dash_j(nothing_runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (KNN + ["-j", "2", "-t", "nan"], LINEAR + ["-j", "2", "--max-iter", "0"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --") and "no such option" not in err, err


def test_the_python_api_refuses_the_same_values() -> None:
    from cl_zoo.eval.knn import knn_classify
    from cl_zoo.eval.linear import linear_augmented, linear_fast, protocol

    for settings in ({"lr": float("nan")}, {"momentum": 5.0}, {"betas": (float("nan"), 0.9)}, {"gamma": -1.0},
                     {"weight_decay": float("inf")}, {"milestones": (60, 0)}, {"workers": -1}):
        with pytest.raises(InvalidValueError):
            protocol("paper", **settings)
    changed = protocol("small-scale")
    changed.lr = float("nan")  # a dataclass field set after the protocol was built
    with pytest.raises(InvalidValueError, match="--lr"):
        linear_augmented(None, None, None, changed)  # refused before the model or the data are looked at
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 4)).astype(np.float32), np.arange(20) % 2
    for settings in ({"wd_grid": [float("nan")]}, {"wd_grid": []}, {"max_iter": 0}, {"val_fraction": float("nan")}):
        with pytest.raises(InvalidValueError):
            linear_fast(x, y, x, y, **settings)
    for settings in ({"temperature": float("nan")}, {"ks": []}, {"ks": [0]}, {"metric": "dot"}):
        with pytest.raises(InvalidValueError):
            knn_classify(x, y, x, y, **settings)
