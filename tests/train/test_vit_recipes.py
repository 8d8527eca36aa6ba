"""The ViT recipes (MoCo v3 and CACR on timm ViTs): each value pinned to the source its comment quotes,
the learning rate and warm-up carried by the rules the sources state, and the CPU tier's two ViT rows on
one protocol.

Where-prefixes, as the recipes' headers say: ``CONFIG.md:``, ``main_moco.py:``, ``moco/builder.py:``,
``vits.py:``: facebookresearch/moco-v3 at c349e6e2; ``CACR ...``: the CACR paper (../shared/seeds/004);
``MoCo v3 setting (CACR C.2)``: a MoCo v3 value the CACR paper adopts for its ViTs; ``zoo CPU tier``: the
tier's shared protocol (docs/cpu-tier.md); ``cl-zoo ...``, ``provenance``, ``unused with cosine``: cl-zoo's own.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cl_zoo.methods import build_method
from cl_zoo.train.optim import build_optimizer
from cl_zoo.train.recipe import RECIPES_DIR, Recipe
from tests.train.test_recipe_sources import assert_values_are_their_quoted_sources

Row = tuple[Any, str, str | None]  # (value, where its comment starts, the text it quotes)

_LR_RULE = "args.lr = args.lr * args.batch_size / 256"
_COSINE = "Decays the learning rate with half-cycle cosine after warmup"
_INIT = "# weight initialization"
_PROJECTOR = "self._build_mlp(3, hidden_dim, mlp_dim, dim)"
_PREDICTOR = "self._build_mlp(2, dim, mlp_dim, dim)"
_BATCH = "Below are our pre-trained ViT models and logs (batch 4096)."
_SYNC_BN = "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)"
_AUTOCAST = "with torch.cuda.amp.autocast(True):"


def _mocov3_imagenet(cmd: int, vit: str) -> dict[str, Row]:
    """MoCo v3's ViT pre-training command of CONFIG.md whose flag lines start at ``cmd`` (its -a line)."""
    opt, sched, stab = cmd + 1, cmd + 2, cmd + 3
    return {
        "arch": (f"timm/{vit}", "vits.py:", None),
        "model_args.weight_init": ("moco", "vits.py:31-41", _INIT),
        "method_args.temperature": (0.2, f"CONFIG.md:{stab}", "--moco-t=.2"),
        "method_args.momentum": (0.99, "main_moco.py:99 code default", "'--moco-m', default=0.99"),
        "method_args.momentum_schedule": ("cosine", f"CONFIG.md:{stab}", "--moco-m-cos"),
        "method_args.head_hidden_dim": (4096, "main_moco.py:97 code default", "'--moco-mlp-dim', default=4096"),
        "method_args.head_out_dim": (256, "main_moco.py:95 code default", "'--moco-dim', default=256"),
        "method_args.head_layers": (3, "moco/builder.py:118", _PROJECTOR),
        "method_args.predictor_last_bn": (True, "moco/builder.py:122", _PREDICTOR),
        "method_args.freeze_patch_embed": (True, f"CONFIG.md:{stab}", "--stop-grad-conv1"),
        "data.image_size": (224, "main_moco.py:263", "transforms.RandomResizedCrop(224, scale=(args.crop_min, 1.))"),
        "data.augment": ("mocov3", "main_moco.py:261", "follow BYOL's augmentation recipe"),
        "data.dataset": ("imagenet", "provenance", None),
        "optim.name": ("adamw", f"CONFIG.md:{opt}", "--optimizer=adamw"),
        "optim.lr": (1.5e-4, f"CONFIG.md:{opt}", "--lr=1.5e-4"),
        "optim.lr_scaling": ("linear", "main_moco.py:190", _LR_RULE),
        "optim.base_batch": (256, "main_moco.py:190", _LR_RULE),
        "optim.momentum": (0.9, "main_moco.py:229", None),
        "optim.weight_decay": (0.1, f"CONFIG.md:{opt}", "--weight-decay=.1"),
        "optim.nesterov": (False, "main_moco.py:229", None),
        "schedule.name": ("cosine", "main_moco.py:421", _COSINE),
        "schedule.warmup_epochs": (40, f"CONFIG.md:{sched}", "--warmup-epochs=40"),
        "schedule.milestones": ([], "unused with cosine", None),
        "schedule.gamma": (0.1, "unused with cosine", None),
        "epochs": (300, f"CONFIG.md:{sched}", "--epochs=300"),
        "batch_size": (4096, "CONFIG.md:183", _BATCH),
        "precision": ("auto", "main_moco.py:352", _AUTOCAST),
        "sync_bn": (True, "main_moco.py:196", _SYNC_BN),
        "knn_every": (10, "cl-zoo online kNN monitor", None),
    }


_TIER_SHARED: dict[str, Row] = {
    "model_args.img_size": (64, "zoo CPU tier (issue 16)", None),
    "model_args.patch_size": (8, "zoo CPU tier (issue 62)", "a ViT-Tiny with patch 8 at 64 px"),
    "data.image_size": (64, "zoo CPU tier (issue 16)", None),
    "data.augment": ("mocov2", "zoo CPU tier", None),
    "data.dataset": ("imagenette", "provenance", None),
    "schedule.milestones": ([], "unused with cosine", None),
    "schedule.gamma": (0.1, "unused with cosine", None),
    "epochs": (30, "zoo CPU tier", None),
    "batch_size": (256, "zoo CPU tier", None),
    "precision": ("auto", "cl-zoo", None),
    "sync_bn": (False, "one process on the CPU", None),
    "knn_every": (5, "online kNN monitor", None),
    "seed": (0, "cl-zoo default seed", None),
    "workers": (2, "the machine's 2 cores", None),
}

_MOCOV3_SMALL = {**_mocov3_imagenet(127, "vit_small_patch16_224"),
                 "model_args.num_heads": (12, "vits.py:117", "num_heads=12")}

_MOCOV3_TIER: dict[str, Row] = {
    **_TIER_SHARED,
    "arch": ("timm/vit_tiny_patch16_224", "zoo CPU tier (issue 62)", None),
    "model_args.weight_init": ("moco", "as MoCo v3's ViTs: vits.py:31-41", _INIT),
    "method_args.temperature": (0.2, "MoCo v3 ViT runs: CONFIG.md:130", "--moco-t=.2"),
    "method_args.momentum": (0.99, "MoCo v3: main_moco.py:99 code default", "'--moco-m', default=0.99"),
    "method_args.momentum_schedule": ("cosine", "MoCo v3 ViT runs: CONFIG.md:130", "--moco-m-cos"),
    "method_args.head_hidden_dim": (4096, "MoCo v3: main_moco.py:97 code default", "'--moco-mlp-dim', default=4096"),
    "method_args.head_out_dim": (256, "MoCo v3: main_moco.py:95 code default", "'--moco-dim', default=256"),
    "method_args.head_layers": (3, "MoCo v3: moco/builder.py:118", _PROJECTOR),
    "method_args.predictor_last_bn": (True, "MoCo v3: moco/builder.py:122", _PREDICTOR),
    "method_args.freeze_patch_embed": (True, "MoCo v3 ViT runs: CONFIG.md:130", "--stop-grad-conv1"),
    "method_args.view_overrides": ({}, "zoo CPU tier: one augmentation family", None),
    "optim.name": ("adamw", "MoCo v3 ViT runs: CONFIG.md:102", "All ViT models are pre-trained for 300 epochs with AdamW."),
    "optim.lr": (1.5e-4, "MoCo v3: CONFIG.md:128", "--lr=1.5e-4"),
    "optim.lr_scaling": ("linear", "MoCo v3: main_moco.py:190", _LR_RULE),
    "optim.base_batch": (256, "MoCo v3: main_moco.py:190", _LR_RULE),
    "optim.momentum": (0.9, "MoCo v3: main_moco.py:229", None),
    "optim.weight_decay": (0.1, "MoCo v3: CONFIG.md:128", "--weight-decay=.1"),
    "optim.nesterov": (False, "MoCo v3: AdamW", None),
    "schedule.name": ("cosine", "zoo CPU tier: cosine for all; MoCo v3: main_moco.py:421", _COSINE),
    "schedule.warmup_epochs": (4, "MoCo v3: CONFIG.md:129", "--warmup-epochs=40"),
}

_CACR_MOCOV3 = "MoCo v3 setting (CACR C.2)"

_CACR_VIT_OPTIM: dict[str, Row] = {
    "optim.lr_scaling": ("linear", f"{_CACR_MOCOV3}: main_moco.py:190", _LR_RULE),
    "optim.base_batch": (256, f"{_CACR_MOCOV3}: main_moco.py:190", _LR_RULE),
    "optim.momentum": (0.9, f"{_CACR_MOCOV3}: main_moco.py:229", None),
    "optim.nesterov": (False, f"{_CACR_MOCOV3}: AdamW", None),
    "schedule.milestones": ([], "unused with cosine", None),
    "schedule.gamma": (0.1, "unused with cosine", None),
    "model_args.weight_init": ("moco", f"{_CACR_MOCOV3}: vits.py:31-41", _INIT),
    "method_args.head_hidden_dim": (4096, f"{_CACR_MOCOV3}: main_moco.py:97", "'--moco-mlp-dim', default=4096"),
    "method_args.head_out_dim": (128, "CACR C.2", "The output dimension of the encoder is set as 128."),
    "method_args.head_layers": (3, f"{_CACR_MOCOV3}: moco/builder.py:118", _PROJECTOR),
    "method_args.head_bn": (True, f"{_CACR_MOCOV3}: moco/builder.py:45", "mlp.append(nn.BatchNorm1d(dim2))"),
}

VIT_SOURCES: dict[str, dict[str, Row]] = {
    "mocov3_vit_small_imagenet": _MOCOV3_SMALL,
    "mocov3_vit_base_imagenet": _mocov3_imagenet(157, "vit_base_patch16_224"),
    "mocov3_vit_tiny_imagenette64_cpu_tier": _MOCOV3_TIER,
    "cacr_vit_base_imagenet": {
        **_CACR_VIT_OPTIM,
        "arch": ("timm/vit_base_patch16_224", "CACR Table 18", "ViT-Base/16 encoder backbone"),
        "method_args.num_positives": (1, "CACR C.2", "we train with two positive sampling sizes K= 1"),
        "method_args.t_pos": (1.0, "CACR C.2", "t+= 1.0"),
        "method_args.t_neg": (2.0, "CACR C.2", None),
        "method_args.form": ("moco", "CACR C.2", "The teacher encoder follows a EMA updating strategy"),
        "method_args.queue_size": (65536, "CACR C.2", "for all methods, the queue size for negative"),
        "method_args.momentum": (0.99, f"{_CACR_MOCOV3}: main_moco.py:99", "'--moco-m', default=0.99"),
        "method_args.momentum_schedule": ("cosine", f"{_CACR_MOCOV3}: CONFIG.md:160", "--moco-m-cos"),
        "data.image_size": (224, "CACR Algorithm 2", "transforms.RandomResizedCrop(224, scale=(0.2, 1.))"),
        "data.augment": ("mocov2", "CACR Algorithm 2", "ImageNet-100 and ImageNet-1K Transformation"),
        "data.dataset": ("imagenet", "provenance", None),
        "optim.name": ("adamw", f"{_CACR_MOCOV3}: CONFIG.md:158", "--optimizer=adamw"),
        "optim.lr": (1.5e-4, f"{_CACR_MOCOV3}: CONFIG.md:158", "--lr=1.5e-4"),
        "optim.weight_decay": (0.1, f"{_CACR_MOCOV3}: CONFIG.md:158", "--weight-decay=.1"),
        "schedule.name": ("cosine", f"{_CACR_MOCOV3}: main_moco.py:421", _COSINE),
        "schedule.warmup_epochs": (40, f"{_CACR_MOCOV3}: CONFIG.md:159", "--warmup-epochs=40"),
        "epochs": (300, "CACR B.4", "ViT-B/16 with 300 epochs"),
        "batch_size": (4096, f"{_CACR_MOCOV3}: CONFIG.md:183", _BATCH),
        "precision": ("auto", f"{_CACR_MOCOV3}: main_moco.py:352", _AUTOCAST),
        "sync_bn": (True, f"{_CACR_MOCOV3}: main_moco.py:196", _SYNC_BN),
        "knn_every": (10, "cl-zoo online kNN monitor", None),
    },
    "cacr_vit_tiny_imagenette64_cpu_tier": {
        **_TIER_SHARED,
        **_CACR_VIT_OPTIM,
        "arch": ("timm/vit_tiny_patch16_224", "zoo CPU tier (issue 62)", None),
        "method_args.num_positives": (4, "CACR C.1", None),
        "method_args.t_pos": (1.0, "CACR C.1", None),
        "method_args.t_neg": (2.0, "CACR C.1", None),
        "method_args.form": ("in_batch", "CACR Sec. 4.1", None),
        "method_args.repulsion": ("same_view", "CACR Sec. 3.2", None),
        "optim.name": ("adamw", f"{_CACR_MOCOV3}: CONFIG.md:102", "All ViT models are pre-trained for 300 epochs with AdamW."),
        "optim.lr": (1.5e-4, f"{_CACR_MOCOV3}: CONFIG.md:128", "--lr=1.5e-4"),
        "optim.weight_decay": (0.1, f"{_CACR_MOCOV3}: CONFIG.md:128", "--weight-decay=.1"),
        "schedule.name": ("cosine", "zoo CPU tier: cosine for all; MoCo v3: main_moco.py:421", _COSINE),
        "schedule.warmup_epochs": (4, f"{_CACR_MOCOV3}: CONFIG.md:129", "--warmup-epochs=40"),
    },
}

TIER_VIT = ("mocov3_vit_tiny_imagenette64_cpu_tier", "cacr_vit_tiny_imagenette64_cpu_tier")


def test_every_vit_recipe_is_in_the_table() -> None:
    assert sorted(p.stem for p in RECIPES_DIR.glob("*_vit_*.yaml")) == sorted(VIT_SOURCES)


@pytest.mark.parametrize("name", sorted(VIT_SOURCES))
def test_vit_recipe_values_are_their_quoted_sources(name: str) -> None:
    assert_values_are_their_quoted_sources(name, VIT_SOURCES[name], "VIT_SOURCES")


def test_peak_lr_and_warmup_follow_the_rules_the_sources_state() -> None:
    """MoCo v3's lr x batch / 256 (main_moco.py:190): 2.4e-3 at 4096, 1.5e-4 at the tier's 256; the tier's
    4 warm-up epochs are the 40 of 300 that ``--epochs 30`` makes of the ImageNet recipe."""
    for name in ("mocov3_vit_small_imagenet", "mocov3_vit_base_imagenet", "cacr_vit_base_imagenet"):
        assert Recipe.load(name).effective_lr == pytest.approx(2.4e-3), name
    shortened = Recipe.load("mocov3_vit_small_imagenet").with_overrides({"epochs": 30})
    for name in TIER_VIT:
        tier = Recipe.load(name)
        assert tier.effective_lr == pytest.approx(1.5e-4), name
        assert tier.schedule.warmup_epochs == shortened.schedule.warmup_epochs == 4, name
        assert tier.optim == shortened.optim, name


def test_the_tier_vit_pair_shares_the_tier_protocol() -> None:
    """The two ViT rows differ in their method only, and keep the ResNet rows' data, batch, epochs and
    evaluation; the CACR row keeps the ResNet CACR row's loss values."""
    mocov3, cacr = (Recipe.load(name) for name in TIER_VIT)
    resnet_cacr = Recipe.load("cacr_imagenette64_cpu_tier")

    def protocol(r: Recipe) -> tuple[Any, ...]:
        return (r.data, r.epochs, r.batch_size, r.knn_every, r.seed, r.workers, r.precision, r.sync_bn)

    assert protocol(mocov3) == protocol(cacr) == protocol(resnet_cacr)
    assert (mocov3.arch, mocov3.model_args, mocov3.optim, mocov3.schedule) == (cacr.arch, cacr.model_args, cacr.optim,
                                                                               cacr.schedule)
    loss_keys = ("num_positives", "t_pos", "t_neg", "form", "repulsion")
    assert {k: cacr.method_args[k] for k in loss_keys} == {k: resnet_cacr.method_args[k] for k in loss_keys}
    for key in ("head_hidden_dim", "head_layers"):
        assert cacr.method_args[key] == mocov3.method_args[key], key


def test_mocov3_tier_recipe_optimizes_as_the_authors_code() -> None:
    """AdamW with torch's betas, weight decay on every trainable parameter, the frozen patch projection
    left out; and both views from the tier's one augmentation preset."""
    pytest.importorskip("timm", reason="timm is in the test extra: pip install -e '.[test]'")
    recipe = Recipe.load("mocov3_vit_tiny_imagenette64_cpu_tier")
    torch.manual_seed(0)
    method = build_method(recipe.method, recipe.arch, model_args={**recipe.model_args, "depth": 1},
                          epochs=recipe.epochs, augment=recipe.data.augment, sync_bn=recipe.sync_bn,
                          **{**recipe.method_args, "head_hidden_dim": 64})
    assert method.view_config.presets() == ["mocov2", "mocov2"]
    optimizer = build_optimizer(recipe, method.parameter_groups(recipe.optim.weight_decay))
    assert isinstance(optimizer, torch.optim.AdamW)
    (group,) = optimizer.param_groups
    assert group["betas"] == (0.9, 0.999) and group["weight_decay"] == 0.1
    assert group["lr"] == pytest.approx(1.5e-4)
    in_optimizer = {id(p) for p in group["params"]}
    proj = method.backbone.patch_embed.proj
    assert not any(id(p) in in_optimizer for p in proj.parameters())
    assert in_optimizer == {id(p) for p in method.parameters() if p.requires_grad}
