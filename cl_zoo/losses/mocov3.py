"""MoCo v3's symmetric contrastive loss (Chen, Xie, He, "An Empirical Study of Training
Self-Supervised Vision Transformers", ICCV 2021, arXiv 2104.02057; facebookresearch/moco-v3).

Two crops ``x1``, ``x2`` of each image give queries ``q1, q2`` (the query encoder, projector and
predictor) and keys ``k1, k2`` (the momentum encoder and its projector). The keys of the whole
(gathered) batch are the candidates, the same image's key is the positive, no queue::

    ctr(q, k) = -(2 tau) / N sum_i log exp(q_i . k_i / tau) / sum_j exp(q_i . k_j / tau)
    L = ctr(q1, k2) + ctr(q2, k1)

The factor ``2 tau`` is the authors' (``moco/builder.py`` ``contrastive_loss``: the cross-entropy
``* (2 * self.T)``), which keeps the gradient's scale independent of the temperature. With keys
gathered over ``R`` ranks each rank scores its ``N`` local queries against all ``R N`` keys and
the positive of local query ``i`` is key ``offset + i`` (``offset = rank * N``, the builder's
labels). Queries and keys are L2-normalised inside with ``normalize=True``, as the builder does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_zoo.losses._common import check_temperature, full_precision, prepare, reduce


def mocov3_contrast(q: Tensor, k: Tensor, temperature: float = 1.0, *, offset: int = 0, normalize: bool = True,
                    reduction: str = "mean") -> Tensor:
    """``ctr(q, k)``: ``2 tau`` times the cross-entropy of queries ``q`` [N, D] over keys ``k`` [M, D]
    (M >= N, the positive of ``q[i]`` is ``k[offset + i]``)."""
    check_temperature(temperature)
    if q.dim() != 2 or k.dim() != 2 or q.shape[1] != k.shape[1]:
        raise ValueError(f"q and k must be [N, D] and [M, D], got {tuple(q.shape)} and {tuple(k.shape)}")
    if not 0 <= offset <= k.shape[0] - q.shape[0]:
        raise ValueError(f"the positives k[{offset}:{offset + q.shape[0]}] are outside the {k.shape[0]} keys")
    if k.shape[0] < 2:
        raise ValueError("the MoCo v3 loss needs at least 2 keys (the negatives are the other images' keys)")
    with full_precision(q):
        q, k = prepare(q, normalize), prepare(k, normalize)
        logits = q @ k.T / temperature
        targets = torch.arange(q.shape[0], device=q.device) + offset
        per_query = F.cross_entropy(logits, targets, reduction="none") * (2 * temperature)
    return reduce(per_query, reduction)


def mocov3_loss(q1: Tensor, q2: Tensor, k1: Tensor, k2: Tensor, temperature: float = 1.0, *, offset: int = 0,
                normalize: bool = True) -> Tensor:
    """``ctr(q1, k2) + ctr(q2, k1)``, MoCo v3's symmetrised loss (``moco/builder.py`` ``forward``)."""
    if q1.shape != q2.shape or k1.shape != k2.shape:
        raise ValueError(f"both views need the same shapes, got q {tuple(q1.shape)}/{tuple(q2.shape)}, "
                         f"k {tuple(k1.shape)}/{tuple(k2.shape)}")
    return (mocov3_contrast(q1, k2, temperature, offset=offset, normalize=normalize)
            + mocov3_contrast(q2, k1, temperature, offset=offset, normalize=normalize))


class MoCoV3Loss(nn.Module):
    """Module form of :func:`mocov3_loss` holding the temperature (the authors' ViT runs: 0.2)."""

    def __init__(self, temperature: float = 1.0, normalize: bool = True) -> None:
        super().__init__()
        check_temperature(temperature)
        self.temperature = temperature
        self.normalize = normalize

    def forward(self, q1: Tensor, q2: Tensor, k1: Tensor, k2: Tensor, offset: int = 0) -> Tensor:
        return mocov3_loss(q1, q2, k1, k2, self.temperature, offset=offset, normalize=self.normalize)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, normalize={self.normalize}"
