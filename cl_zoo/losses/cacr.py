"""Contrastive Attraction and Contrastive Repulsion (Zheng et al., "Contrastive Attraction and
Contrastive Repulsion for Representation Learning", TMLR 2023).

CACR replaces the one-vs-many softmax of InfoNCE by two conditional transport costs with the
point-to-point cost ``c(a, b) = ||a - b||^2`` (= 2 - 2 a.b on the unit sphere) and the temperature-
scaled distances ``d_t+(a,b) = t+ ||a-b||^2``, ``d_t-(a,b) = t- ||a-b||^2`` (Sec. 3.1). With M
queries per batch and K positives per query, the mini-batch loss of Sec. 3.2 is
``L_CACR = L_CA + L_CR`` with::

    L_CA =  1/M sum_i sum_k   softmax_k( t+ c(z_i, z_ik+)) c(z_i, z_ik+)   (far positives weigh more)
    L_CR = -1/M sum_i sum_j!=i softmax_j(-t- c(z_i, z_j))  c(z_i, z_j)     (near negatives weigh more)

"We optimize theta via SGD using grad L_CACR": in the in-batch form the gradient also flows through
the softmax weights. In the MoCo-v2 form (appendix, Algorithm 3) the positives are momentum-encoder
keys and the attraction weights are computed under ``torch.no_grad()``; the repulsion weights keep
their gradient in both forms; the negatives are the queue plus the other queries of the batch.
:func:`cacr_loss` follows these choices by default (``detach_pos_weights=None``) and lets either be
forced. With K+1 views each view is the query in turn and the losses are averaged
(:func:`cacr_multiview_loss`, as Algorithm 3 does).

Defaults: t+ = 1.0; t- for CIFAR-10 / CIFAR-100 / STL-10 is 2.0 / 3.0 / 3.0 with K = 1 and
0.9 / 2.0 / 2.0 with K = 4.

Queries and positives are L2-normalised inside when ``normalize=True``; a queue is used as stored.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cl_zoo.losses._common import full_precision, prepare, reduce, upcast


def _sq_dist(a: Tensor, b: Tensor) -> Tensor:
    """Pairwise squared Euclidean distances [M, Q] (exact also for non-unit vectors)."""
    return (a.pow(2).sum(1, keepdim=True) + b.pow(2).sum(1).unsqueeze(0) - 2 * a @ b.T).clamp_min(0)


def cacr_loss(
    queries: Tensor,
    positives: Tensor,
    negatives: Tensor | None = None,
    t_pos: float = 1.0,
    t_neg: float = 2.0,
    *,
    in_batch_negatives: bool = True,
    detach_pos_weights: bool | None = None,
    normalize: bool = True,
    reduction: str = "mean",
    return_parts: bool = False,
) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
    """L_CA + L_CR for ``queries`` [M, D] with ``positives`` [M, K, D]. Negatives: the other queries
    (``in_batch_negatives``) and/or a queue ``negatives`` [Q, D]. ``detach_pos_weights`` None means
    the paper's choice: detached when a queue is given (MoCo form), differentiated otherwise.
    ``return_parts=True`` also returns ``{"attraction", "repulsion"}`` (batch means, detached)."""
    if queries.dim() != 2 or positives.dim() != 3 or positives.shape[0] != queries.shape[0] or positives.shape[2] != queries.shape[1]:
        raise ValueError(
            f"queries must be [M, D] and positives [M, K, D], got {tuple(queries.shape)} and {tuple(positives.shape)}"
        )
    if positives.shape[1] < 1:
        raise ValueError("cacr_loss needs at least one positive per query (K >= 1)")
    if t_pos < 0 or t_neg < 0:
        raise ValueError(f"t_pos and t_neg must be >= 0, got {t_pos} and {t_neg}")
    m, d = queries.shape
    if negatives is None and not in_batch_negatives:
        raise ValueError("cacr_loss needs negatives: pass a queue or keep in_batch_negatives=True")
    if in_batch_negatives and negatives is None and m < 2:
        raise ValueError("in-batch CACR needs at least 2 queries (the negatives are the other queries)")
    if negatives is not None and (negatives.dim() != 2 or negatives.shape[1] != d):
        raise ValueError(f"negatives must be [Q, {d}], got {tuple(negatives.shape)}")
    if detach_pos_weights is None:
        detach_pos_weights = negatives is not None
    with full_precision(queries):
        q = prepare(queries, normalize)
        pos = prepare(positives, normalize)

        cost_pos = (q.unsqueeze(1) - pos).pow(2).sum(dim=2)  # [M, K]
        logits_pos = t_pos * (cost_pos.detach() if detach_pos_weights else cost_pos)
        attraction = (torch.softmax(logits_pos, dim=1) * cost_pos).sum(dim=1)

        costs = []
        if negatives is not None:
            costs.append(_sq_dist(q, upcast(negatives)))
        if in_batch_negatives and m > 1:
            off_diagonal = ~torch.eye(m, dtype=torch.bool, device=q.device)
            costs.append(_sq_dist(q, q)[off_diagonal].view(m, m - 1))
        cost_neg = torch.cat(costs, dim=1)
        repulsion = -(torch.softmax(-t_neg * cost_neg, dim=1) * cost_neg).sum(dim=1)

        loss = reduce(attraction + repulsion, reduction)
    if return_parts:
        return loss, {"attraction": attraction.mean().detach(), "repulsion": repulsion.mean().detach()}
    return loss


def cacr_multiview_loss(
    views: list[Tensor],
    keys: list[Tensor] | None = None,
    queue: Tensor | None = None,
    t_pos: float = 1.0,
    t_neg: float = 2.0,
    *,
    in_batch_negatives: bool = True,
    detach_pos_weights: bool | None = None,
    normalize: bool = True,
) -> Tensor:
    """K+1 views of M images ([M, D] each): each view's embeddings are the queries in turn, the
    other K views (``keys`` from a momentum encoder when given, else the views themselves) are the
    positives; the mean over the K+1 turns is returned (Algorithm 3)."""
    if len(views) < 2:
        raise ValueError(f"CACR needs at least 2 views (K >= 1 positive), got {len(views)}")
    if any(v.shape != views[0].shape or v.dim() != 2 for v in views):
        raise ValueError(f"all views must be [M, D] with the same shape, got {[tuple(v.shape) for v in views]}")
    targets = views if keys is None else keys
    if len(targets) != len(views) or any(t.shape != views[0].shape for t in targets):
        raise ValueError("keys must be one [M, D] tensor per view")
    if detach_pos_weights is None:
        detach_pos_weights = keys is not None
    stacked = torch.stack(list(targets), dim=1)  # [M, K+1, D]
    total = None
    for k, query in enumerate(views):
        others = [j for j in range(len(views)) if j != k]
        part = cacr_loss(
            query,
            stacked[:, others],
            queue,
            t_pos,
            t_neg,
            in_batch_negatives=in_batch_negatives,
            detach_pos_weights=detach_pos_weights,
            normalize=normalize,
        )
        total = part if total is None else total + part
    return total / len(views)


class CACRLoss(nn.Module):
    """Module form of :func:`cacr_multiview_loss` holding t+ / t- and the weight-gradient choice."""

    def __init__(
        self,
        t_pos: float = 1.0,
        t_neg: float = 2.0,
        in_batch_negatives: bool = True,
        detach_pos_weights: bool | None = None,
        normalize: bool = True,
    ) -> None:
        super().__init__()
        if t_pos < 0 or t_neg < 0:
            raise ValueError(f"t_pos and t_neg must be >= 0, got {t_pos} and {t_neg}")
        self.t_pos = t_pos
        self.t_neg = t_neg
        self.in_batch_negatives = in_batch_negatives
        self.detach_pos_weights = detach_pos_weights
        self.normalize = normalize

    def forward(self, views: list[Tensor], keys: list[Tensor] | None = None, queue: Tensor | None = None) -> Tensor:
        return cacr_multiview_loss(
            views,
            keys,
            queue,
            self.t_pos,
            self.t_neg,
            in_batch_negatives=self.in_batch_negatives,
            detach_pos_weights=self.detach_pos_weights,
            normalize=self.normalize,
        )

    def extra_repr(self) -> str:
        return (
            f"t_pos={self.t_pos}, t_neg={self.t_neg}, in_batch_negatives={self.in_batch_negatives}, "
            f"detach_pos_weights={self.detach_pos_weights}, normalize={self.normalize}"
        )
