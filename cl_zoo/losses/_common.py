"""Precision and shape helpers shared by the loss modules.

Contrastive logits are divided by small temperatures (0.07-0.2) and fed to exp/logsumexp; in
bfloat16 (8 mantissa bits) a similarity of 0.9 divided by 0.07 is off by ~0.05, which is as large as
the differences the loss is supposed to learn from. Every loss therefore leaves autocast, upcasts its
inputs to at least float32 (float64 stays float64 for the reference tests) and only then normalises
and takes inner products. The extra cost is one [N, K] matmul in float32, negligible next to the
encoders.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from cl_zoo.precision import autocast_off


def upcast(t: Tensor) -> Tensor:
    """``t`` in float32, or float64 when it already is float64."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


# Autocast off on the reference tensor's device for the body: the loss math is done in fp32+.
full_precision = autocast_off


def prepare(t: Tensor, normalize: bool) -> Tensor:
    """Upcast and (optionally) L2-normalise along the last dimension."""
    t = upcast(t)
    return F.normalize(t, dim=-1) if normalize else t


def reduce(per_sample: Tensor, reduction: str) -> Tensor:
    """``"mean"`` (the default everywhere), ``"sum"`` or ``"none"`` (per-anchor losses)."""
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "sum":
        return per_sample.sum()
    if reduction == "none":
        return per_sample
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def check_pair(a: Tensor, b: Tensor, names: str = "z1, z2") -> None:
    """Two batches of embeddings of the same shape [N, D] with N >= 2 (one negative at least)."""
    if a.dim() != 2 or a.shape != b.shape:
        raise ValueError(f"{names} must both be [N, D] with equal shapes, got {tuple(a.shape)} and {tuple(b.shape)}")


def check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
