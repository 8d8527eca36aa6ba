"""Split BatchNorm: MoCo's shuffled BatchNorm on one device.

Why: MoCo (He et al. 2020, "Shuffling BN") reports that BatchNorm lets the model cheat. A query and
its key are normalised with statistics of the same images, so the batch statistics leak which key
belongs to which query, and the pretext task is solved without learning good features.
MoCo's fix shuffles the key batch across GPUs before the key encoder, so a query and its key
see the statistics of different subsets. On one device there is no other GPU to shuffle to.
lightly's CIFAR-10 benchmark (the reference the zoo's MoCo v2 is measured against, 84.7%) simulates 8
GPUs instead. Its backbone uses ``SplitBatchNorm`` over 8 splits (cifar10_benchmark.py v1.5.26, L297
"num_splits = 0 if sync_batchnorm else 8"), and it shuffles the key batch before the momentum
encoder (L328 "x1_, shuffle = utils.batch_shuffle(x1_, distributed=distributed)") and restores the
order after it (L334 "x1_ = utils.batch_unshuffle(x1_, shuffle, distributed=distributed)").

This layer normalises sample ``i`` of a batch with the statistics of samples ``j = i (mod splits)``
only. That is the grouping of lightly's ``input.view(-1, C * num_splits, H, W)``, which it adapted
from cifar10-fast's GhostBatchNorm. Unlike lightly's, it keeps plain ``BatchNorm2d`` buffers (one
running mean and variance per channel: the average of the splits' updates, which is what lightly's
buffers collapse to when the module is put in eval mode). So the state dict is a plain BatchNorm's,
a trained backbone exports and loads as the registered architecture, and eval mode is exactly
``BatchNorm2d``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SplitBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are computed per split of the batch (eval: plain BN)."""

    def __init__(self, num_features: int, num_splits: int, **kwargs: object) -> None:
        super().__init__(num_features, **kwargs)  # type: ignore[arg-type]
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        self.num_splits = int(num_splits)

    def forward(self, x: Tensor) -> Tensor:
        s = self.num_splits
        if not self.training or s == 1:
            return super().forward(x)
        self._check_input_dim(x)
        n, c, h, w = x.shape
        if n % s:
            raise ValueError(f"split BatchNorm over {s} splits needs a batch divisible by {s}, got {n} images")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative average, as BatchNorm2d does
                factor = 1.0 / float(self.num_batches_tracked)
        tracked = self.track_running_stats and self.running_mean is not None
        mean = self.running_mean.repeat(s) if tracked else None
        var = self.running_var.repeat(s) if tracked else None
        out = F.batch_norm(
            x.reshape(n // s, s * c, h, w),  # sample a*s + b -> channels of split b
            mean,
            var,
            None if self.weight is None else self.weight.repeat(s),
            None if self.bias is None else self.bias.repeat(s),
            True,
            factor,
            self.eps,
        ).view(n, c, h, w)
        if tracked:
            with torch.no_grad():
                self.running_mean.copy_(mean.view(s, c).mean(0))
                self.running_var.copy_(var.view(s, c).mean(0))
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            out = out.contiguous(memory_format=torch.channels_last)
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_splits={self.num_splits}"


def has_batchnorm(module: nn.Module, kind: type[nn.Module] = nn.modules.batchnorm._BatchNorm) -> bool:
    """Whether any layer of ``module`` is a ``kind`` (by default BatchNorm of any dimension).

    Backbones such as ViTs and ConvNeXts normalise per sample (LayerNorm), so split BatchNorm
    and SyncBatchNorm have nothing to act on there; callers say so instead of silently doing nothing.
    """
    return any(isinstance(m, kind) for m in module.modules())


def convert_split_batchnorm(module: nn.Module, num_splits: int) -> nn.Module:
    """``module`` with every ``BatchNorm2d`` replaced by a :class:`SplitBatchNorm2d` of ``num_splits``
    (in place for children; returns the new root if it was one).

    As ``nn.SyncBatchNorm.convert_sync_batchnorm`` does, the new layer takes the old one's Parameter and
    buffer objects themselves, not copies: device, dtype, ``requires_grad`` and any optimizer or hook
    holding them carry over by construction.
    """
    if isinstance(module, nn.BatchNorm2d) and not isinstance(module, SplitBatchNorm2d):
        split = SplitBatchNorm2d(module.num_features, num_splits, eps=module.eps, momentum=module.momentum,
                                 affine=module.affine, track_running_stats=module.track_running_stats)
        if module.affine:
            split.weight = module.weight
            split.bias = module.bias
        split.running_mean = module.running_mean
        split.running_var = module.running_var
        split.num_batches_tracked = module.num_batches_tracked
        split.train(module.training)
        return split
    for name, child in module.named_children():
        converted = convert_split_batchnorm(child, num_splits)
        if converted is not child:
            setattr(module, name, converted)
    return module


__all__ = ["SplitBatchNorm2d", "convert_split_batchnorm", "has_batchnorm"]
