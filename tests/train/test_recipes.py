"""Every bundled recipe parses, names real presets/architectures, cites a source for each value,
and builds its method, which then takes one training step on a tiny input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cl_zoo.data.augment import PRESETS
from cl_zoo.methods import build_method
from cl_zoo.registry import is_architecture, is_timm_arch, list_models
from cl_zoo.train.recipe import RECIPES_DIR, Recipe

RECIPES = sorted(RECIPES_DIR.glob("*.yaml"))
# The seed papers' methods, each with an ImageNet and a CIFAR-10 recipe; MoCo v3 (the CACR paper's ViT
# baseline) has ViT recipes only.
SEED_METHODS = {"simclr", "mocov2", "dcl", "dclw", "simo", "jcl", "cmc", "cacr"}
METHODS_WITH_RECIPES = SEED_METHODS | {"mocov3"}


def test_every_method_has_imagenet_and_cifar_recipes() -> None:
    names = {p.stem for p in RECIPES}
    for method in SEED_METHODS:
        assert f"{method}_imagenet" in names and f"{method}_cifar10" in names, method
    assert "cmc_cifar10_lab" in names


def _tiny_model_args(recipe: Recipe, size: int) -> dict[str, object]:
    """The recipe's model_args, narrowed to a few channels (a timm ViT: one block, 48 wide, at ``size`` px)."""
    if is_timm_arch(recipe.arch):
        return {**recipe.model_args, "img_size": size, "depth": 1, "embed_dim": 48}
    return {**recipe.model_args, "width": 0.0625}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_values_cite_a_source(path: Path) -> None:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("method:"):
            continue
        is_section = stripped.endswith(":") or stripped.endswith("{}")
        if not is_section:
            assert "#" in line and line.split("#", 1)[1].strip(), f"{path.name}:{number} has no source comment"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_builds_and_steps(path: Path) -> None:
    recipe = Recipe.load(path)
    assert recipe.method in METHODS_WITH_RECIPES
    if is_timm_arch(recipe.arch):  # timm's names are built on first use, not listed
        pytest.importorskip("timm", reason="timm is in the test extra: pip install -e '.[test]'")
        assert is_architecture(recipe.arch)
    else:
        assert recipe.arch in list_models(recipe.arch)
    assert recipe.data.augment in PRESETS
    assert path.stem.startswith(recipe.method + "_")
    # Shrink only what costs time or memory (width, bank size); every other hyperparameter is the recipe's.
    args = dict(recipe.method_args)
    if "bank_size" in args:
        args["bank_size"] = 64
    if args.get("num_negatives") and recipe.method == "simo":
        args["num_negatives"] = min(args["num_negatives"], 3)
    if args.get("num_negatives") and recipe.method == "cmc":
        args["num_negatives"] = 16
    size = 16 if "cifar" in recipe.arch else 32
    torch.manual_seed(0)
    method = build_method(
        recipe.method,
        recipe.arch,
        model_args=_tiny_model_args(recipe, size),
        epochs=recipe.epochs,
        augment=recipe.data.augment,
        sync_bn=recipe.sync_bn,
        **args,
    )
    assert all(p in PRESETS for p in method.view_config.presets())
    assert method.sync_bn == recipe.sync_bn
    batch = max(4, args.get("split_bn", 1))  # split BatchNorm needs a batch its splits divide
    views = [torch.rand(batch, 3, size, size) for _ in range(method.num_views)]
    loss, logs = method(views, torch.arange(batch), 0.0)
    assert torch.isfinite(loss) and "loss" in logs
    loss.backward()
    method.after_optimizer_step(0.01)
