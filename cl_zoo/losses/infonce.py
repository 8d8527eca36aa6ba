"""InfoNCE in its two common forms: SimCLR's NT-Xent and MoCo's query/key/queue loss.

NT-Xent (Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations",
ICML 2020, Eq. 1): the 2N augmented views of a batch of N images are all anchors; the positive of
``z_i^(1)`` is ``z_i^(2)`` and vice versa, and the negatives are the other 2N-2 views::

    l(a, p) = -log exp(s_ap / tau) / sum_{b != a} exp(s_ab / tau),    s = cosine similarity,

averaged over the 2N anchors (the paper's symmetric form). This is also Eq. 2 of the DCL paper,
whose gradient carries the negative-positive coupling factor that :mod:`cl_zoo.losses.dcl` removes.

MoCo form (He et al., "Momentum Contrast for Unsupervised Visual Representation Learning",
CVPR 2020, Eq. 1; also CMC Eq. 2-4): each query ``q_i`` has one positive key ``k_i`` and the
negatives are the rows of a queue [K, D]::

    L_i = -log exp(q_i.k_i / tau) / (exp(q_i.k_i / tau) + sum_j exp(q_i.n_j / tau)).

Without a queue the other keys of the batch are the negatives (N-1 per query).

Normalisation convention (all of ``cl_zoo.losses``): embeddings computed in this step (``z1``,
``z2``, ``q``, ``k``) are L2-normalised inside when ``normalize=True`` (the default); stored state
(queues, memory banks) is used exactly as given, because the methods store normalised keys there
(JCL deliberately stores un-renormalised means). Gradients flow into every argument that has them:
detach the keys yourself when they come from a momentum encoder (MoCo computes them under no_grad).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_zoo.losses._common import check_pair, check_temperature, full_precision, prepare, reduce, upcast


def nt_xent(
    z1: Tensor,
    z2: Tensor,
    temperature: float = 0.5,
    *,
    normalize: bool = True,
    reduction: str = "mean",
) -> Tensor:
    """SimCLR's symmetric NT-Xent over 2N views; ``reduction="none"`` gives the 2N per-anchor losses
    (anchors ``z1[0..N-1]`` then ``z2[0..N-1]``)."""
    check_pair(z1, z2)
    check_temperature(temperature)
    n = z1.shape[0]
    if n < 2:
        raise ValueError("nt_xent needs a batch of at least 2 images (the negatives are the other images' views)")
    with full_precision(z1):
        z = torch.cat([prepare(z1, normalize), prepare(z2, normalize)], dim=0)
        logits = z @ z.T / temperature
        self_mask = torch.eye(2 * n, dtype=torch.bool, device=z.device)
        logits = logits.masked_fill(self_mask, float("-inf"))
        idx = torch.arange(n, device=z.device)
        targets = torch.cat([idx + n, idx])
        per_anchor = F.cross_entropy(logits, targets, reduction="none")
    return reduce(per_anchor, reduction)


def info_nce(
    q: Tensor,
    k: Tensor,
    queue: Tensor | None = None,
    temperature: float = 0.2,
    *,
    normalize: bool = True,
    reduction: str = "mean",
) -> Tensor:
    """MoCo's InfoNCE: positive ``k[i]`` for ``q[i]``; negatives are ``queue`` [K, D] (used as
    stored) or, when ``queue`` is None, the other keys of the batch."""
    check_pair(q, k, "q, k")
    check_temperature(temperature)
    with full_precision(q):
        q = prepare(q, normalize)
        k = prepare(k, normalize)
        if queue is None:
            if q.shape[0] < 2:
                raise ValueError("info_nce without a queue needs a batch of at least 2 (negatives are the other keys)")
            logits = q @ k.T / temperature
            targets = torch.arange(q.shape[0], device=q.device)
        else:
            if queue.dim() != 2 or queue.shape[1] != q.shape[1]:
                raise ValueError(f"queue must be [K, {q.shape[1]}], got {tuple(queue.shape)}")
            pos = (q * k).sum(dim=1, keepdim=True)
            neg = q @ upcast(queue).T
            logits = torch.cat([pos, neg], dim=1) / temperature
            targets = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        per_query = F.cross_entropy(logits, targets, reduction="none")
    return reduce(per_query, reduction)


class NTXentLoss(nn.Module):
    """Module form of :func:`nt_xent` holding the temperature (SimCLR: 0.5 on CIFAR, 0.1 on ImageNet)."""

    def __init__(self, temperature: float = 0.5, normalize: bool = True) -> None:
        super().__init__()
        check_temperature(temperature)
        self.temperature = temperature
        self.normalize = normalize

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        return nt_xent(z1, z2, self.temperature, normalize=self.normalize)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, normalize={self.normalize}"


class InfoNCELoss(nn.Module):
    """Module form of :func:`info_nce` (MoCo v2: temperature 0.2)."""

    def __init__(self, temperature: float = 0.2, normalize: bool = True) -> None:
        super().__init__()
        check_temperature(temperature)
        self.temperature = temperature
        self.normalize = normalize

    def forward(self, q: Tensor, k: Tensor, queue: Tensor | None = None) -> Tensor:
        return info_nce(q, k, queue, self.temperature, normalize=self.normalize)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, normalize={self.normalize}"
