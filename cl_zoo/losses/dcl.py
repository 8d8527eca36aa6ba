"""Decoupled Contrastive Learning (Yeh et al., "Decoupled Contrastive Learning", ECCV 2022).

NT-Xent's gradient w.r.t. every view is scaled by the negative-positive coupling (NPC) multiplier
``q_{B,i} = 1 - exp(<z_i^1, z_i^2>/tau) / sum_{all} exp(...)`` (Proposition 1): an easy positive or
a small batch shrinks the whole gradient. Removing the positive from the denominator removes that
factor (Proposition 2, appendix A.2)::

    L_DC,i^(k) = -<z_i^(1), z_i^(2)> / tau + log sum_{l in {1,2}, j != i} exp(<z_i^(k), z_j^(l)> / tau)

for k in {1, 2}: each of the 2N views is an anchor, its 2N-2 negatives are the other images' views
in both views. We return the mean over the 2N anchors (the paper sums; the scale only changes the
learning rate).

DCLW (main paper; not in the appendix we follow) weights the positive term by
``w_i = 2 - N * exp(<z_i^1, z_i^2>/sigma) / sum_j exp(<z_j^1, z_j^2>/sigma)`` (sigma = 0.5), so
that harder positives (lower similarity) weigh more; the weights average to 1 and are constants
(computed without gradient).

Inputs are L2-normalised inside unless ``normalize=False`` (see :mod:`cl_zoo.losses.infonce`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cl_zoo.losses._common import check_pair, check_temperature, full_precision, prepare, reduce, upcast


def dcl(
    z1: Tensor,
    z2: Tensor,
    temperature: float = 0.1,
    weight: Tensor | None = None,
    *,
    normalize: bool = True,
    reduction: str = "mean",
) -> Tensor:
    """Symmetric DCL; ``weight`` [N] multiplies each image's positive term (used as given, so pass a
    detached tensor). ``reduction="none"`` gives the 2N per-anchor losses (``z1`` anchors first)."""
    check_pair(z1, z2)
    check_temperature(temperature)
    n = z1.shape[0]
    if n < 2:
        raise ValueError("dcl needs a batch of at least 2 images (the negatives are the other images' views)")
    if weight is not None and weight.shape != (n,):
        raise ValueError(f"weight must have shape ({n},), got {tuple(weight.shape)}")
    with full_precision(z1):
        a = prepare(z1, normalize)
        b = prepare(z2, normalize)
        pos = (a * b).sum(dim=1) / temperature
        if weight is not None:
            pos = pos * upcast(weight)
        z = torch.cat([a, b], dim=0)
        logits = z @ z.T / temperature
        # Anchor i (either view) must not see view 1 or view 2 of image i in its denominator.
        same_image = torch.eye(n, dtype=torch.bool, device=z.device).repeat(2, 2)
        neg = torch.logsumexp(logits.masked_fill(same_image, float("-inf")), dim=1)
        per_anchor = neg - pos.repeat(2)
    return reduce(per_anchor, reduction)


def dclw_weights(z1: Tensor, z2: Tensor, sigma: float = 0.5, *, normalize: bool = True) -> Tensor:
    """DCLW's positive weights ``w_i = 2 - N softmax_i(<z_i^1, z_i^2>/sigma)`` (no gradient; mean 1)."""
    check_pair(z1, z2)
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    with torch.no_grad(), full_precision(z1):
        sim = (prepare(z1, normalize) * prepare(z2, normalize)).sum(dim=1)
        return 2.0 - z1.shape[0] * torch.softmax(sim / sigma, dim=0)


def dclw(
    z1: Tensor,
    z2: Tensor,
    temperature: float = 0.1,
    sigma: float = 0.5,
    *,
    normalize: bool = True,
    reduction: str = "mean",
) -> Tensor:
    """DCL with the von Mises-Fisher positive weighting of DCLW (weights detached)."""
    w = dclw_weights(z1, z2, sigma, normalize=normalize)
    return dcl(z1, z2, temperature, w, normalize=normalize, reduction=reduction)


class DCLLoss(nn.Module):
    """Module form of :func:`dcl` (CIFAR: temperature 0.1-0.2; ImageNet recipe in the paper: 0.1)."""

    def __init__(self, temperature: float = 0.1, normalize: bool = True) -> None:
        super().__init__()
        check_temperature(temperature)
        self.temperature = temperature
        self.normalize = normalize

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        return dcl(z1, z2, self.temperature, normalize=self.normalize)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, normalize={self.normalize}"


class DCLWLoss(nn.Module):
    """Module form of :func:`dclw` (sigma = 0.5 as in the paper)."""

    def __init__(self, temperature: float = 0.1, sigma: float = 0.5, normalize: bool = True) -> None:
        super().__init__()
        check_temperature(temperature)
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        self.temperature = temperature
        self.sigma = sigma
        self.normalize = normalize

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        return dclw(z1, z2, self.temperature, self.sigma, normalize=self.normalize)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, sigma={self.sigma}, normalize={self.normalize}"
