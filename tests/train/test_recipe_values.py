"""Every recipe value checked before any work: in a recipe file, through ``--set`` and options, and for
a Recipe built in Python (the Trainer checks it too). Each refusal is one ``error:`` line, exit 2,
with nothing written."""

from __future__ import annotations

import dataclasses

import pytest

from cl_zoo.errors import ClZooError
from cl_zoo.train.loop import Trainer, check_batch_fits
from cl_zoo.train.recipe import OptimConfig, Recipe
from cl_zoo.validation import InvalidValueError
from tests.helpers import TINY_PRETRAIN, make_folder, run_cli_captured

pytestmark = pytest.mark.usefixtures("isolated_cache", "one_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("data") / "train", per_class=4)


def _refused(args: list[str], capsys, out) -> str:
    code, _, err = run_cli_captured(["pretrain", "--no-progress", *args, "--out", str(out)], capsys)
    err = err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, (args, err)
    assert not out.exists(), "a refused run wrote its folder"
    return err


@pytest.mark.parametrize("text,words", [
    (b"method: dcl\n# caf\xe9\n", "is not UTF-8 text (byte 0xe9 at offset 17); save it as UTF-8"),
    (b"method_args: {x: " + b"[" * 500 + b"]" * 500 + b"}\n", "nests deeper than 32 levels"),
    (b"epochs: " + b"9" * 5000 + b"\n", "line 1: a number of 5000 characters; no recipe value needs more than 64"),
    (b"optim: {lr: .inf}\n", "optim.lr must be a finite number, got inf"),
    (b"optim: {lr: .nan}\n", "optim.lr must be a finite number, got nan"),
    (b"optim: {momentum: .nan}\n", "optim.momentum must be a finite number, got nan"),
    (b"optim: {momentum: 1.5}\n", "optim.momentum must be >= 0 and < 1, got 1.5"),
    (b"optim: {weight_decay: .inf}\n", "optim.weight_decay must be a finite number, got inf"),
    (b"schedule: {warmup_epochs: .nan}\n", "schedule.warmup_epochs must be a finite number, got nan"),
    (b"schedule: {name: step, milestones: [1, .inf]}\n", "schedule.milestones[1] must be a finite number, got inf"),
    (b"schedule: {gamma: .nan}\n", "schedule.gamma must be a finite number, got nan"),
    (b"epochs: 1000000000\n", "epochs must be >= 1 and <= 100000, got 1000000000"),
    (b"batch_size: 100000000\n", "batch_size must be >= 1 and <= 1048576"),
    (b"seed: -1\n", "seed must be >= 0"),
    (b"method_args: {temperature: .inf}\n", "method_args.temperature must be a finite number, got inf"),
    (b"method_args: {temperature: 0}\n", "method_args.temperature must be > 0"),
])
def test_recipe_file_values_are_one_line(tmp_path, folder, capsys, text, words):
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(text)
    err = _refused(["--recipe", str(recipe), *TINY_PRETRAIN, "--data", str(folder)], capsys, tmp_path / "run")
    assert err.startswith(f"error: recipe {recipe}") and words in err, err


@pytest.mark.parametrize("args,words", [
    (["--set", "optim.momentum=.nan"], "command line: optim.momentum must be a finite number, got nan"),
    (["--set", "optim.weight_decay=-1"], "optim.weight_decay must be >= 0 and <= 1, got -1"),
    (["--lr", "inf"], "optim.lr must be a finite number, got inf"),
    (["--image-size", "1000000"], "data.image_size must be >= 1 and <= 4096, got 1000000"),
    (["--set", "epochs=" + "9" * 5000], "--set epochs: line 1: a number of 5000 characters"),
    (["--set", "method_args.x=" + "[" * 500 + "]" * 500], "--set method_args.x nests deeper than 32 levels"),
])
def test_pretrain_options_are_checked_before_any_work(tmp_path, folder, capsys, args, words):
    err = _refused(["--method", "dcl", "--arch", "pixels", "--set", "model_args.input_size=16", "--data", str(folder),
                    *args], capsys, tmp_path / "run")
    assert words in err, err


def test_a_batch_too_big_for_memory_is_refused_with_the_estimate():
    recipe = Recipe().with_overrides({"data.image_size": 4096, "batch_size": 256})
    with pytest.raises(ClZooError, match=r"needs at least 96\.0 GiB .* more than the 16\.0 GiB free"):
        check_batch_fits(recipe, 2, 1, 16 << 30)
    check_batch_fits(Recipe(), 2, 1, 16 << 30)  # CIFAR-sized: fine


def test_a_recipe_built_in_python_gets_the_same_checks(tmp_path, folder):
    bad = dataclasses.replace(Recipe(), optim=OptimConfig(momentum=float("nan")))
    with pytest.raises(InvalidValueError, match="optim.momentum must be a finite number, got nan"):
        Trainer(bad, folder, tmp_path / "run")
    assert not (tmp_path / "run").exists()
