"""A run folder never rewrites a file it did not create: ``--recipe exp/recipe.yaml --out exp`` is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import TINY_PRETRAIN, make_folder, run_cli_captured


def test_a_recipe_inside_the_run_folder_is_not_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "exp"
    exp.mkdir()
    recipe = exp / "recipe.yaml"
    text = "# my sweep: keep these comments\nmethod: simclr\nepochs: 50\n"
    recipe.write_text(text)
    data = make_folder(tmp_path / "data" / "train")
    code, _, err = run_cli_captured(["pretrain", "--recipe", str(recipe), *TINY_PRETRAIN, "--data", str(data), "--out", str(exp),
                                     "--epochs", "1", "--batch-size", "16", "--knn-every", "0", "--workers", "0", "--device", "cpu",
                                     "--no-progress"], capsys)
    assert code == 2 and err.startswith("error: ") and "is also an input" in err and len(err.strip().splitlines()) == 1, err
    assert recipe.read_text() == text and sorted(p.name for p in exp.iterdir()) == ["recipe.yaml"]
