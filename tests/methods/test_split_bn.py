"""Split BatchNorm and MoCo v2's shuffled keys on one device (issue 39: lightly's MoCo benchmark uses both).

The layer is checked against a loop of plain BatchNorm2d, one per split (value, gradient, running
statistics), against lightly's own ``SplitBatchNorm`` where lightly is installed, and for the
properties the zoo relies on: eval mode and the state dict are a plain BatchNorm's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import cl_zoo
from cl_zoo.errors import ClZooError
from cl_zoo.methods import build_method
from cl_zoo.methods.split_bn import SplitBatchNorm2d, convert_split_batchnorm

TINY = dict(model_args=dict(width=0.125), head_hidden_dim=32, head_out_dim=16)


def _pair(splits: int, momentum: float | None = 0.1) -> tuple[nn.BatchNorm2d, SplitBatchNorm2d]:
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(5, momentum=momentum)
    with torch.no_grad():
        plain.weight.uniform_(0.5, 1.5)
        plain.bias.uniform_(-0.5, 0.5)
        plain.running_mean.uniform_(-1, 1)
        plain.running_var.uniform_(0.5, 2)
    return plain, convert_split_batchnorm(copy.deepcopy(plain), splits)


@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_split_bn_is_a_batchnorm_per_split(splits: int, momentum: float | None) -> None:
    plain, split = _pair(splits, momentum)
    x = torch.randn(8, 5, 3, 3, dtype=torch.float64, requires_grad=True)
    plain, split = plain.double(), split.double()
    grad_out = torch.randn(8, 5, 3, 3, dtype=torch.float64)
    out = split(x)
    (out * grad_out).sum().backward()
    # the reference: sample i belongs to split i % splits; each split is a BatchNorm of its own
    x_ref = x.detach().clone().requires_grad_(True)
    means, vars_ = [], []
    ref = torch.empty_like(out)
    refs = [copy.deepcopy(plain) for _ in range(splits)]
    for b, bn in enumerate(refs):
        ref[b::splits] = bn(x_ref[b::splits])
        means.append(bn.running_mean)
        vars_.append(bn.running_var)
    (ref * grad_out).sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(split.weight.grad, sum(bn.weight.grad for bn in refs))
    torch.testing.assert_close(split.bias.grad, sum(bn.bias.grad for bn in refs))
    torch.testing.assert_close(split.running_mean, torch.stack(means).mean(0))
    torch.testing.assert_close(split.running_var, torch.stack(vars_).mean(0))
    assert int(split.num_batches_tracked) == 1


def test_split_bn_matches_lightlys_split_batchnorm() -> None:
    batchnorm = pytest.importorskip("lightly.models.batchnorm", reason="lightly is not installed (benchmark-only dependency)")
    _, ours = _pair(4)
    theirs = batchnorm.SplitBatchNorm(5, 4)
    theirs.load_state_dict({**ours.state_dict(), "running_mean": ours.running_mean.repeat(4),
                            "running_var": ours.running_var.repeat(4)})
    for step in range(3):
        x = torch.randn(16, 5, 4, 4, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(ours(x), theirs(x))
    theirs.eval()  # lightly collapses its per-split statistics here; ours kept the collapsed ones all along
    ours.eval()
    torch.testing.assert_close(ours.running_mean, theirs.running_mean[:5])
    torch.testing.assert_close(ours.running_var, theirs.running_var[:5])
    x = torch.randn(3, 5, 4, 4)
    torch.testing.assert_close(ours(x), theirs(x))


def test_eval_mode_and_state_dict_are_plain_batchnorm() -> None:
    torch.manual_seed(0)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125).eval()
    split = convert_split_batchnorm(copy.deepcopy(model), 8)
    assert any(isinstance(m, SplitBatchNorm2d) for m in split.modules())
    assert not any(type(m) is nn.BatchNorm2d for m in split.modules())
    x = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(split(x), model(x))  # eval: any batch size, exactly BatchNorm2d
    plain = cl_zoo.create_model("resnet18_cifar", width=0.125)
    plain.load_state_dict(split.state_dict())  # strict: same keys and shapes, so it exports as the architecture


def test_split_bn_keeps_channels_last_and_refuses_an_indivisible_batch() -> None:
    _, split = _pair(2)
    x = torch.randn(4, 5, 3, 3)
    out = split(x.contiguous(memory_format=torch.channels_last))
    assert out.is_contiguous(memory_format=torch.channels_last)
    _, again = _pair(2)
    torch.testing.assert_close(out, again(x))
    with pytest.raises(ValueError, match="needs a batch divisible by 2, got 3 images"):
        split(torch.randn(3, 5, 3, 3))


def test_mocov2_split_bn_shuffles_keys_and_puts_them_back() -> None:
    torch.manual_seed(0)
    method = build_method("mocov2", "resnet18_cifar", queue_size=32, split_bn=4, **TINY)
    assert method.sync_bn is False  # the class default (SyncBN) gives way to the split
    assert any(isinstance(m, SplitBatchNorm2d) for m in method.backbone.modules())
    assert any(isinstance(m, SplitBatchNorm2d) for m in method.key_encoder.modules())
    x = torch.randn(8, 3, 16, 16)
    method.eval()  # no batch statistics: a key depends on its image only, so the order must come back
    plain = torch.nn.functional.normalize(method.key_encoder(x).float(), dim=1)
    torch.testing.assert_close(method.key(x), plain)
    method.train()
    torch.manual_seed(1)
    first = method.key(x)
    torch.manual_seed(2)
    second = method.key(x)
    assert not torch.allclose(first, second)  # the splits held other images: the batch was shuffled
    views = [torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16)]
    loss, _ = method.training_step(views, torch.arange(8), 0.0)
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="not divisible by split_bn=4"):
        method.check_batch_size(10)
    with pytest.raises(ClZooError, match="split_bn simulates shuffled BatchNorm"):
        build_method("mocov2", "resnet18_cifar", queue_size=32, split_bn=4, sync_bn=True, **TINY)
    with pytest.raises(ClZooError, match="split_bn must be an integer >= 1"):
        build_method("mocov2", "resnet18_cifar", queue_size=32, split_bn=0, **TINY)


def test_conversion_hands_over_the_same_parameters_and_buffers() -> None:
    """As convert_sync_batchnorm: an optimizer built before the conversion still steps the live layer, and
    dtype, device and a frozen parameter's requires_grad survive without being copied."""
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)).double()
    model[1].bias.requires_grad_(False)
    model.eval()
    bn = model[1]
    converted = convert_split_batchnorm(model, 2)
    split = converted[1]
    assert isinstance(split, SplitBatchNorm2d) and not split.training
    assert split.weight is bn.weight and split.bias is bn.bias and not split.bias.requires_grad
    assert split.running_mean is bn.running_mean and split.running_var is bn.running_var
    assert split.num_batches_tracked is bn.num_batches_tracked and split.running_mean.dtype == torch.float64
    untracked = convert_split_batchnorm(nn.BatchNorm2d(4, affine=False, track_running_stats=False), 2)
    assert untracked.weight is None and untracked.running_mean is None
    x = torch.randn(4, 4, 2, 2)
    plain = nn.BatchNorm2d(4, affine=False, track_running_stats=False)
    out = untracked.train()(x)
    torch.testing.assert_close(out[0::2], plain(x[0::2]))
    torch.testing.assert_close(out[1::2], plain(x[1::2]))
