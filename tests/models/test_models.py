"""Backbones: output shapes and parameter counts.

Every architecture is checked on the ``meta`` device (shapes propagate, no memory or compute), so
the CMC ResNet-50 x2 pair costs nothing; a few small ones also run for real.
"""

from __future__ import annotations

import pytest
import torch

import cl_zoo
from cl_zoo.registry import build_arch


def meta_model(name: str, **kwargs: object) -> torch.nn.Module:
    with torch.device("meta"):
        return build_arch(name, **kwargs)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(set(cl_zoo.list_models()) - set(cl_zoo.list_models(pretrained=True))))  # architectures only
def test_every_backbone_output_shape(name: str) -> None:
    model = meta_model(name).eval()
    c, h, w = model.pretrained_cfg.input_size
    out = model(torch.empty(2, c, h, w, device="meta"))
    assert tuple(out.shape) == (2, model.num_features)


@pytest.mark.parametrize(
    ("name", "millions", "features"),
    [
        ("resnet18", 11.18, 512),
        ("resnet34", 21.28, 512),
        ("resnet50", 23.51, 2048),  # torchvision ResNet-50 is 25.56M; without fc (2048*1000+1000) 23.51M
        ("resnet18_cifar", 11.17, 512),
        ("cmc_resnet50x05_lab", 11.80, 2048),  # "about 12M for both" views
        ("cmc_resnet18_lab", 11.32, 728),  # width 0.71: the pair matches one ResNet-18 (11.18M) within 1.3%
        ("cmc_resnet50x1_lab", 47.01, 4096),
        ("cmc_resnet50x2_lab", 187.70, 8192),
    ],
)
def test_parameter_counts(name: str, millions: float, features: int) -> None:
    model = meta_model(name)
    assert n_params(model) / 1e6 == pytest.approx(millions, abs=0.01)
    assert model.num_features == features


def test_resnet50_matches_torchvision_without_fc() -> None:
    from torchvision.models import resnet50

    with torch.device("meta"):
        tv = resnet50()
    assert n_params(meta_model("resnet50")) == n_params(tv) - n_params(tv.fc)
    assert set(meta_model("resnet50").state_dict()) == {k for k in tv.state_dict() if not k.startswith("fc.")}


def test_resnet50_real_forward_and_stages() -> None:
    torch.manual_seed(0)
    model = cl_zoo.create_model("resnet50").eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        stages = model.forward_stages(x)
        feats = model(x)
    assert [tuple(s.shape) for s in stages] == [(1, 256, 16, 16), (1, 512, 8, 8), (1, 1024, 4, 4), (1, 2048, 2, 2)]
    assert feats.shape == (1, 2048) and torch.isfinite(feats).all()


@pytest.mark.parametrize("name", ["resnet18_cifar", "cmc_resnet18_cifar_lab", "cmc_alexnet_cifar_lab", "alexnet_cifar"])
def test_small_backbones_run_for_real(name: str) -> None:
    torch.manual_seed(0)
    kwargs = {"width": 0.25} if name in ("resnet18_cifar", "cmc_resnet18_cifar_lab") else {}
    model = cl_zoo.create_model(name, **kwargs).eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        out = model(x)
    assert out.shape == (2, model.num_features) and torch.isfinite(out).all()


def test_cmc_views_split_features() -> None:
    model = meta_model("cmc_resnet50x05_lab")
    l_feat, ab_feat = model.forward_views(torch.empty(2, 3, 64, 64, device="meta"))
    assert l_feat.shape == ab_feat.shape == (2, 1024)
    assert model.l_encoder.conv1.in_channels == 1 and model.ab_encoder.conv1.in_channels == 2
    # x0.5 per view: each half of the 11.8M is one ResNet-50 at half width (stem kept at 64).
    assert n_params(model.l_encoder) + n_params(model.ab_encoder) == n_params(model)


def test_width_and_bad_arguments() -> None:
    assert meta_model("resnet18_cifar", width=0.25).num_features == 128
    with pytest.raises(ValueError, match="stem"):
        meta_model("resnet18", stem="weird")
    assert cl_zoo.create_model("pixels")(torch.rand(2, 3, 32, 32)).shape == (2, 3072)


# --------------------------------------------------------------------------------------------
# The torch-free architecture table (cl_zoo/models/archs.py) and the family modules agree
# --------------------------------------------------------------------------------------------


def test_architecture_table_matches_the_family_modules() -> None:
    """Every ``@register_model`` builder of a family module is declared in the table with its entry
    point, and every declared entry point is that decorated builder: one list, checked both ways."""
    import importlib
    import inspect

    from cl_zoo.models.archs import ARCHITECTURES
    from cl_zoo.registry import find_arch, get_arch

    declared = {name: f"cl_zoo.models.{family}:{name}" for name, family, *_ in ARCHITECTURES}
    for family in sorted({family for _, family, *_ in ARCHITECTURES}):
        module = importlib.import_module(f"cl_zoo.models.{family}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and find_arch(name) is not None and get_arch(name).builder is fn:
                assert declared.get(name) == f"{module.__name__}:{name}", f"{name} is registered but not in archs.py"
    for name, entry_point in declared.items():
        entry = get_arch(name)
        module, _, function = entry_point.partition(":")
        assert entry.builder is getattr(importlib.import_module(module), function), name
        assert entry.family == module.rsplit(".", 1)[-1]


@pytest.mark.parametrize("name", sorted(set(cl_zoo.list_models()) - set(cl_zoo.list_models(pretrained=True))))
def test_declared_sizes_are_the_built_ones(name: str) -> None:
    """``cl-zoo models`` shows the table's sizes without building: they must be what a build gives."""
    from cl_zoo.registry import get_arch

    entry = get_arch(name)
    model = meta_model(name)
    assert (entry.params, entry.num_features) == (n_params(model), model.num_features)
