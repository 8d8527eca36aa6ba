"""MoCo v3 as the authors build it: heads per backbone family, the frozen random patch projection,
the cosine momentum schedule and the asymmetric views (values from facebookresearch/moco-v3)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import cl_zoo
from cl_zoo.errors import ClZooError
from cl_zoo.losses.mocov3 import mocov3_loss
from cl_zoo.methods import build_method

pytest.importorskip("timm", reason="timm is in the test extra: pip install -e '.[test]'")


def tiny_vit() -> nn.Module:
    return cl_zoo.create_model("timm/vit_small_patch16_224", img_size=32, patch_size=8, depth=1)


def layers(head: nn.Module) -> list[nn.Module]:
    return [m for m in head.modules() if isinstance(m, (nn.Linear, nn.BatchNorm1d))]


def test_vit_and_resnet_heads_follow_the_authors_builders() -> None:
    vit = build_method("mocov3", tiny_vit(), head_hidden_dim=32, head_out_dim=16, epochs=10)
    res = build_method("mocov3", "resnet18_cifar", head_hidden_dim=32, head_out_dim=16, epochs=10)
    # MoCo_ViT: 3-layer projector, predictor ending in BN; MoCo_ResNet: 2-layer projector, predictor without it.
    assert sum(isinstance(m, nn.Linear) for m in layers(vit.head)) == 3
    assert sum(isinstance(m, nn.Linear) for m in layers(res.head)) == 2
    assert isinstance(layers(vit.predictor)[-1], nn.BatchNorm1d) and not layers(vit.predictor)[-1].affine
    assert isinstance(layers(res.predictor)[-1], nn.Linear)
    assert all(m.bias is None for m in [*layers(vit.head), *layers(vit.predictor)] if isinstance(m, nn.Linear))
    assert (vit.temperature, vit.base_momentum, vit.momentum_schedule) == (1.0, 0.99, "cosine")
    assert vit.view_config.presets() == ["mocov3", "mocov3_second"] and vit.sync_bn
    # The predictor is the query side's only: the key encoder is backbone + projector.
    assert not hasattr(vit.key_encoder.encoder, "predictor")


def test_cosine_momentum_goes_from_m0_to_one() -> None:
    method = build_method("mocov3", tiny_vit(), head_hidden_dim=32, head_out_dim=16, epochs=10)
    m = method.key_encoder.momentum
    assert m(0.0, 10) == pytest.approx(0.99) and m(5.0, 10) == pytest.approx(0.995) and m(10.0, 10) == pytest.approx(1.0)


def test_frozen_random_patch_projection_stays_as_drawn() -> None:
    torch.manual_seed(0)
    method = build_method("mocov3", tiny_vit(), head_hidden_dim=32, head_out_dim=16, epochs=1, freeze_patch_embed=True)
    proj = method.backbone.patch_embed.proj
    bound = math.sqrt(6.0 / (3 * 8 * 8 + 384))
    assert not proj.weight.requires_grad and proj.weight.abs().max() <= bound and proj.bias.abs().max() == 0
    before = proj.weight.detach().clone()
    opt = torch.optim.AdamW([p for g in method.parameter_groups(0.1) for p in g["params"]], lr=1e-2)
    assert all(p is not proj.weight for g in opt.param_groups for p in g["params"])
    views = [torch.randn(4, 3, 32, 32) for _ in range(2)]
    loss, logs = method(views, torch.arange(4), 0.0)
    loss.backward()
    opt.step()
    method.after_optimizer_step(0.5)
    assert torch.equal(proj.weight, before) and torch.equal(method.key_encoder.encoder.backbone.patch_embed.proj.weight, before)
    assert method.backbone.blocks[0].attn.qkv.weight.grad is not None and logs["loss"] == pytest.approx(loss.item())


def test_training_step_is_the_symmetric_loss_of_queries_and_momentum_keys() -> None:
    torch.manual_seed(1)
    method = build_method("mocov3", tiny_vit(), head_hidden_dim=32, head_out_dim=16, epochs=1, temperature=0.2)
    views = [torch.randn(4, 3, 32, 32) for _ in range(2)]
    torch.manual_seed(2)
    loss, _ = method(views, torch.arange(4), 0.0)
    with torch.no_grad():
        expected = mocov3_loss(method.query(views[0]), method.query(views[1]), method.key(views[0]), method.key(views[1]), 0.2)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_freeze_patch_embed_needs_a_vit() -> None:
    with pytest.raises(ClZooError, match="freeze_patch_embed freezes a ViT's patch projection and resnet18_cifar has none"):
        build_method("mocov3", "resnet18_cifar", epochs=1, freeze_patch_embed=True)
