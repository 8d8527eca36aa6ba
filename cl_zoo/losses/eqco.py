"""EqCo and SiMo (Zhu et al., "EqCo: Equivalent Rules for Self-supervised Contrastive Learning").

EqCo is InfoNCE with a margin on the positive logit (Eq. 1) chosen by the equivalent condition
(Eq. 5, Theorem 1)::

    m = tau * log(alpha / K),
    L = -log( e^{(q.k0 - m)/tau} / (e^{(q.k0 - m)/tau} + sum_{i=1..K} e^{q.ki/tau}) )
      = -log( s0 / (s0 + alpha/K * sum_i s_i) )            (appendix A.1, s_i = e^{q.ki/tau})

so that the mutual-information bound and the gradient-norm bound (Eq. 7) depend on the constant
alpha, not on the physical number of negatives K: K negatives "mimic" alpha of them. K is always the
number of negatives actually in the denominator (queue length, or per-query sample size).
With alpha == K the margin is 0 and the loss is plain InfoNCE.

SiMo (Sec. 3) is MoCo v2 without the queue: query and key encoders as in MoCo, but the positive
and the negatives are the current batch's momentum keys; the negatives of ``q_i`` are ``k_j``,
``j != i`` (K = N-1), or a random subset of K of them. The authors' loss is one-directional
(queries from view 1, keys from view 2); ``symmetric=True`` averages both directions.

Two departures of the authors' released SiMo code (V2AI/SelfSup,
``examples/simo/simo.res50.scratch.imagenet.224size.256bs.200e/simo.py``) from the paper are
offered as options, the paper's form staying the default:

* ``negative_sampling="shared"``: the code draws one ``torch.randperm(batch_size - 1)[:K]`` per
  step and indexes every query's row of off-diagonal similarities with it, so all queries use the
  same K *slots* among their N-1 other keys (slot s is key s for queries after it, key s+1 for
  queries up to it). The paper (Sec. 3.2) samples "K negative keys for each query independently"
  (``"per_query"``, the default) and notes in Remark 2 that sharing does not change results much.
* ``margin=False``: the code ships with the alpha/K factor commented out ("uncomment this when
  negatives != bs"), i.e. plain InfoNCE over the K sampled negatives. The paper's EqCo loss
  (``margin=True``, the default) applies ``m = tau log(alpha/K)``.

Normalisation follows :mod:`cl_zoo.losses.infonce`: ``q`` and ``k`` are L2-normalised inside when
``normalize=True``; explicit ``negatives`` are used as given unless ``normalize_negatives=True``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_zoo.losses._common import check_pair, check_temperature, full_precision, prepare, reduce, upcast


def eqco_margin(temperature: float, alpha: float, num_negatives: int) -> float:
    """Eq. 5: ``m = tau * log(alpha / K)``."""
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if num_negatives < 1:
        raise ValueError(f"EqCo needs at least one negative per query, got K={num_negatives}")
    return temperature * math.log(alpha / num_negatives)


def _margin_cross_entropy(pos: Tensor, neg: Tensor, temperature: float, alpha: float) -> Tensor:
    """Per-query ``-log(s0 / (s0 + alpha/K sum s_i))`` from raw similarities pos [N], neg [N, K]."""
    num_negatives = neg.shape[1]
    pos_logit = (pos - eqco_margin(temperature, alpha, num_negatives)) / temperature
    logits = torch.cat([pos_logit.unsqueeze(1), neg / temperature], dim=1)
    targets = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, targets, reduction="none")


def eqco_loss(
    q: Tensor,
    k: Tensor,
    negatives: Tensor,
    temperature: float = 0.2,
    alpha: float = 256.0,
    *,
    normalize: bool = True,
    normalize_negatives: bool = False,
    reduction: str = "mean",
) -> Tensor:
    """EqCo InfoNCE; ``negatives`` is a shared [K, D] queue or per-query [N, K, D] negatives."""
    check_pair(q, k, "q, k")
    check_temperature(temperature)
    n, d = q.shape
    with full_precision(q):
        q = prepare(q, normalize)
        k = prepare(k, normalize)
        negs = prepare(negatives, True) if normalize_negatives else upcast(negatives)
        pos = (q * k).sum(dim=1)
        if negs.dim() == 2 and negs.shape[1] == d:
            neg = q @ negs.T
        elif negs.dim() == 3 and negs.shape[0] == n and negs.shape[2] == d:
            neg = torch.einsum("nd,nkd->nk", q, negs)
        else:
            raise ValueError(f"negatives must be [K, {d}] or [{n}, K, {d}], got {tuple(negatives.shape)}")
        per_query = _margin_cross_entropy(pos, neg, temperature, alpha)
    return reduce(per_query, reduction)


def sample_other_indices(n: int, num: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """For each row i, ``num`` distinct column indices drawn uniformly from {0..n-1} minus {i}."""
    rand_device = generator.device if generator is not None else device
    scores = torch.rand(n, n - 1, generator=generator, device=rand_device)
    slots = scores.argsort(dim=1)[:, :num].to(device)  # positions in the n-1 "other" candidates
    rows = torch.arange(n, device=device).unsqueeze(1)
    return slots + (slots >= rows).long()  # skip the diagonal


def shared_other_indices(n: int, num: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """The released code's sampling: ``num`` slots drawn once among the n-1 "other" positions and
    used by every row (row i's slot s is column s, or s+1 from the diagonal on)."""
    rand_device = generator.device if generator is not None else device
    slots = torch.randperm(n - 1, generator=generator, device=rand_device)[:num].to(device)
    rows = torch.arange(n, device=device).unsqueeze(1)
    slots = slots.unsqueeze(0).expand(n, num)
    return slots + (slots >= rows).long()


NEGATIVE_SAMPLING = ("per_query", "shared")


def _check_negative_sampling(negative_sampling: str) -> None:
    if negative_sampling not in NEGATIVE_SAMPLING:
        raise ValueError(
            f"negative_sampling must be 'per_query' (paper) or 'shared' (authors' released code), got {negative_sampling!r}"
        )


def _simo_one_direction(
    q: Tensor,
    k: Tensor,
    temperature: float,
    alpha: float,
    num_negatives: int | None,
    generator: torch.Generator | None,
    negative_sampling: str = "per_query",
    margin: bool = True,
) -> Tensor:
    n = q.shape[0]
    sim = q @ k.T
    pos = sim.diagonal()
    if num_negatives is None or num_negatives == n - 1:
        off_diagonal = ~torch.eye(n, dtype=torch.bool, device=q.device)
        neg = sim[off_diagonal].view(n, n - 1)
    elif negative_sampling == "shared":
        neg = sim.gather(1, shared_other_indices(n, num_negatives, generator, q.device))
    else:
        neg = sim.gather(1, sample_other_indices(n, num_negatives, generator, q.device))
    # margin=False: alpha = K makes the margin 0, i.e. plain InfoNCE over the K negatives.
    return _margin_cross_entropy(pos, neg, temperature, alpha if margin else float(neg.shape[1]))


def simo_loss(
    q: Tensor,
    k: Tensor,
    temperature: float = 0.2,
    alpha: float = 256.0,
    num_negatives: int | None = None,
    generator: torch.Generator | None = None,
    symmetric: bool = False,
    *,
    negative_sampling: str = "per_query",
    margin: bool = True,
    normalize: bool = True,
    reduction: str = "mean",
) -> Tensor:
    """SiMo's in-batch EqCo loss: positive ``k[i]``, negatives K = ``num_negatives`` of the other
    keys (all N-1 when None), sampled per query with ``generator`` (``negative_sampling="shared"``:
    one draw of slots for the whole batch, as the released code does). ``margin=False`` drops the
    EqCo margin (the released code's default). ``symmetric=True`` averages the loss with queries and
    keys swapped (``reduction="none"`` then gives 2N values, q-side first)."""
    check_pair(q, k, "q, k")
    check_temperature(temperature)
    _check_negative_sampling(negative_sampling)
    n = q.shape[0]
    if n < 2:
        raise ValueError("simo_loss needs a batch of at least 2 (the negatives are the other images' keys)")
    if num_negatives is not None and not 1 <= num_negatives <= n - 1:
        raise ValueError(
            f"num_negatives must be between 1 and batch size - 1 = {n - 1} (SiMo samples the negatives "
            f"from the other keys of the batch), got {num_negatives}"
        )
    with full_precision(q):
        q = prepare(q, normalize)
        k = prepare(k, normalize)
        per_query = _simo_one_direction(
            q, k, temperature, alpha, num_negatives, generator, negative_sampling, margin
        )
        if symmetric:
            other = _simo_one_direction(k, q, temperature, alpha, num_negatives, generator, negative_sampling, margin)
            per_query = torch.cat([per_query, other])
    return reduce(per_query, reduction)


class EqCoLoss(nn.Module):
    """Module form of :func:`eqco_loss` (MoCo/MoCo v2 + EqCo: alpha = 65536; SimCLR: 256)."""

    def __init__(self, temperature: float = 0.2, alpha: float = 65536.0, normalize: bool = True) -> None:
        super().__init__()
        check_temperature(temperature)
        eqco_margin(temperature, alpha, 1)
        self.temperature = temperature
        self.alpha = alpha
        self.normalize = normalize

    def forward(self, q: Tensor, k: Tensor, negatives: Tensor) -> Tensor:
        return eqco_loss(q, k, negatives, self.temperature, self.alpha, normalize=self.normalize)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, alpha={self.alpha}, normalize={self.normalize}"


class SiMoLoss(nn.Module):
    """Module form of :func:`simo_loss` (paper: tau 0.2, alpha 256 or 65536, K = 16..256)."""

    def __init__(
        self,
        temperature: float = 0.2,
        alpha: float = 256.0,
        num_negatives: int | None = None,
        symmetric: bool = False,
        normalize: bool = True,
        negative_sampling: str = "per_query",
        margin: bool = True,
    ) -> None:
        super().__init__()
        check_temperature(temperature)
        eqco_margin(temperature, alpha, 1)
        _check_negative_sampling(negative_sampling)
        if num_negatives is not None and num_negatives < 1:
            raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
        self.temperature = temperature
        self.alpha = alpha
        self.num_negatives = num_negatives
        self.symmetric = symmetric
        self.normalize = normalize
        self.negative_sampling = negative_sampling
        self.margin = margin

    def forward(self, q: Tensor, k: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return simo_loss(
            q,
            k,
            self.temperature,
            self.alpha,
            self.num_negatives,
            generator,
            self.symmetric,
            negative_sampling=self.negative_sampling,
            margin=self.margin,
            normalize=self.normalize,
        )

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, alpha={self.alpha}, num_negatives={self.num_negatives}, "
            f"symmetric={self.symmetric}, negative_sampling={self.negative_sampling!r}, margin={self.margin}, "
            f"normalize={self.normalize}"
        )
