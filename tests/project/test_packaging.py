"""What a wheel carries: every code package, and recipes/, transfer/detectron2/, model_cards/ as
cl_zoo._bundled.* read through cl_zoo.bundled (the wheel itself is built and used by .ci/wheel)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cl_zoo.bundled import SOURCE_FOLDERS, bundled_folder
from cl_zoo.errors import ClZooError
from cl_zoo.registry import DEFAULT_MODEL
from cl_zoo.train.recipe import RECIPES_DIR, Recipe, resolve_recipe_path
from tests.helpers import REPO_ROOT

REPO = REPO_ROOT
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_code_package_is_in_the_wheel() -> None:
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "cl_zoo").rglob("__init__.py")}
    missing = on_disk - set(SETUPTOOLS["packages"])
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"


def test_bundles_are_mapped_from_the_folders_the_code_reads() -> None:
    mapped = {name.removeprefix("cl_zoo._bundled."): folder for name, folder in SETUPTOOLS["package-dir"].items()}
    assert mapped == SOURCE_FOLDERS
    assert {f"cl_zoo._bundled.{kind}" for kind in SOURCE_FOLDERS} <= set(SETUPTOOLS["packages"])
    data = SETUPTOOLS["package-data"]
    for kind, folder in SOURCE_FOLDERS.items():
        patterns = data[f"cl_zoo._bundled.{kind}"]
        files = {p for pattern in patterns for p in (REPO / folder).glob(pattern) if p.is_file()}
        everything = {p for p in (REPO / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        if kind == "model_cards":  # the default checkpoint only: the others come from the Hub
            everything = {p for p in everything if p.parent.name == DEFAULT_MODEL}
            assert everything, f"model_cards/{DEFAULT_MODEL} is missing"
        assert files == everything, f"package-data ships {sorted(map(str, files ^ everything))} wrongly"


def test_a_checkout_reads_the_repository_folders_in_place() -> None:
    for kind, folder in SOURCE_FOLDERS.items():
        assert bundled_folder(kind).samefile(REPO / folder)  # type: ignore[arg-type]
    assert RECIPES_DIR.samefile(REPO / "recipes")


def test_an_installed_layout_is_found_through_importlib(tmp_path: Path) -> None:
    """A copy of the package laid out as the wheel installs it, with no repository folders around it."""
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "cl_zoo", site / "cl_zoo", ignore=shutil.ignore_patterns("__pycache__"))
    for kind, folder in SOURCE_FOLDERS.items():
        (site / "cl_zoo" / "_bundled" / kind).mkdir(parents=True)
    (site / "cl_zoo" / "_bundled" / "recipes" / "only_here.yaml").write_text("method: dcl\n")
    code = ("from cl_zoo.bundled import bundled_folder; from cl_zoo.train.recipe import resolve_recipe_path; "
            "print(bundled_folder('detectron2')); print(resolve_recipe_path('only_here'))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    detectron2, recipe = out.stdout.split()
    assert Path(detectron2) == site / "cl_zoo" / "_bundled" / "detectron2"
    assert Path(recipe) == site / "cl_zoo" / "_bundled" / "recipes" / "only_here.yaml"


def test_bundled_recipe_by_name_and_unknown_name_lists_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no recipes/ folder here: the name must resolve through the bundle
    assert Recipe.load("dcl_cifar10").method == "dcl"
    # the repository path the model cards quote names the bundled file when there is no such file here
    assert resolve_recipe_path("recipes/dcl_imagenette64_cpu.yaml") == RECIPES_DIR / "dcl_imagenette64_cpu.yaml"
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "dcl_cifar10.yaml").write_text("method: simclr\n")
    assert Recipe.load("recipes/dcl_cifar10.yaml").method == "simclr"  # a real local file wins
    with pytest.raises(ClZooError, match=r"recipe not found: dcl_cifar1 \(bundled recipes: .*dcl_cifar10"):
        Recipe.load("dcl_cifar1")


def test_the_package_says_whose_it_is_and_ships_its_licence() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert project["authors"] and project["keywords"]
    from cl_zoo.registry import ZOO_NAMESPACE

    assert project["urls"]["Homepage"] == f"https://huggingface.co/{ZOO_NAMESPACE}"  # where the zoo publishes
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # PEP 639: the expression says it


def test_default_output_folders_are_git_ignored() -> None:
    ignored = set((REPO / ".gitignore").read_text().split())
    assert {"/out/", "/runs/", "/eval-reports/"} <= ignored
