"""Joint Contrastive Learning (Cai et al., "Joint Contrastive Learning with Infinite
Possibilities", NeurIPS 2020).

Each query ``q_i`` has M' positive keys ``k_{i,m}`` (momentum-encoder embeddings of M' further
augmentations). Averaging the per-key InfoNCE losses (Eq. 3) over infinitely many keys gives an
expectation (Eq. 4) that Jensen's inequality bounds from above (Eq. 7); under a Gaussian model of
the keys, ``k ~ N(mu_i, Sigma_i)``, the bound has the closed form of Eq. 8::

    L_i = log[ exp(q_i.mu_i/tau + lambda/(2 tau^2) q_i^T Sigma_i q_i) + sum_j exp(q_i.k_j^-/tau) ]
          - q_i.mu_i/tau,                                   L = mean_i L_i  (Eq. 9)

with ``mu_i`` the mean of the M' L2-normalised keys (not renormalised) and ``Sigma_i`` their biased
covariance (divide by M', Algorithm 1). Since ``q^T Sigma q = mean_m (q.(k_m - mu))^2`` no d x d
matrix is formed. ``mu`` and ``Sigma`` come from the key encoder and are constants (no gradient);
the queue receives ``mu`` (supplementary: "we enqueue the average values of keys"), which is why
:func:`jcl_loss` returns it.

lambda scales the covariance term; the paper uses 4.0 fixed, the authors' code ramps
``lambda * (epoch + 1) / epochs`` (:func:`lambda_schedule`).

Normalisation: ``q`` and ``keys`` are L2-normalised inside when ``normalize=True``; the queue is used
as stored.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cl_zoo.losses._common import check_temperature, full_precision, prepare, reduce, upcast


def jcl_loss(
    q: Tensor,
    keys: Tensor,
    queue: Tensor | None,
    temperature: float = 0.2,
    lam: float = 4.0,
    *,
    normalize: bool = True,
    reduction: str = "mean",
) -> tuple[Tensor, Tensor]:
    """Eq. 8 averaged over the batch. ``q`` [N, D], ``keys`` [N, M', D], ``queue`` [K, D] of
    negatives (None: the other instances' mean keys). Returns ``(loss, mu)``; ``mu`` [N, D] is the
    detached mean key to enqueue."""
    if q.dim() != 2 or keys.dim() != 3 or keys.shape[0] != q.shape[0] or keys.shape[2] != q.shape[1]:
        raise ValueError(f"q must be [N, D] and keys [N, M', D], got {tuple(q.shape)} and {tuple(keys.shape)}")
    if keys.shape[1] < 1:
        raise ValueError("keys must hold at least one positive key per query (M' >= 1)")
    check_temperature(temperature)
    if lam < 0:
        raise ValueError(f"lam must be >= 0 (it scales a covariance), got {lam}")
    n, d = q.shape
    with full_precision(q):
        q = prepare(q, normalize)
        with torch.no_grad():
            k = prepare(keys.detach(), normalize)
            mu = k.mean(dim=1)
            centered = k - mu.unsqueeze(1)
        quad = torch.einsum("nd,nmd->nm", q, centered).pow(2).mean(dim=1)  # q^T Sigma q
        pos = (q * mu).sum(dim=1) / temperature
        pos_logit = pos + lam / (2 * temperature**2) * quad
        if queue is None:
            if n < 2:
                raise ValueError("jcl_loss without a queue needs a batch of at least 2 (negatives are the other means)")
            neg = q @ mu.T / temperature
            neg = neg.masked_fill(torch.eye(n, dtype=torch.bool, device=q.device), float("-inf"))
        else:
            if queue.dim() != 2 or queue.shape[1] != d:
                raise ValueError(f"queue must be [K, {d}], got {tuple(queue.shape)}")
            neg = q @ upcast(queue).T / temperature
        per_query = torch.logsumexp(torch.cat([pos_logit.unsqueeze(1), neg], dim=1), dim=1) - pos
    return reduce(per_query, reduction), mu


def lambda_schedule(lam: float, epoch: int, epochs: int, ramp: bool = True) -> float:
    """The authors' linear ramp ``lam * (epoch + 1) / epochs`` (0-based ``epoch``), or ``lam``."""
    if epochs < 1 or not 0 <= epoch < epochs:
        raise ValueError(f"epoch must be in [0, epochs) with epochs >= 1, got epoch={epoch}, epochs={epochs}")
    return lam * (epoch + 1) / epochs if ramp else lam


class JCLLoss(nn.Module):
    """Module form of :func:`jcl_loss`; ``set_epoch`` applies :func:`lambda_schedule`.

    Defaults are the paper's (tau 0.2, lambda 4.0, no ramp); the authors' code uses lambda 2.0 with
    ``ramp=True``.
    """

    def __init__(self, temperature: float = 0.2, lam: float = 4.0, ramp: bool = False, normalize: bool = True) -> None:
        super().__init__()
        check_temperature(temperature)
        self.temperature = temperature
        self.base_lam = lam
        self.lam = lam
        self.ramp = ramp
        self.normalize = normalize

    def set_epoch(self, epoch: int, epochs: int) -> None:
        self.lam = lambda_schedule(self.base_lam, epoch, epochs, self.ramp)

    def forward(self, q: Tensor, keys: Tensor, queue: Tensor | None) -> tuple[Tensor, Tensor]:
        return jcl_loss(q, keys, queue, self.temperature, self.lam, normalize=self.normalize)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, lam={self.base_lam}, ramp={self.ramp}, normalize={self.normalize}"

