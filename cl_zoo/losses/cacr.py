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

Fidelity option for the authors' released small-scale code (JegZheng/CACR-SSL,
``small_scale_experiments/losses/__init__.py``): ``repulsion="cross_view"``. There ``our_loss2``
loops over view pairs ``x < y`` only and ``forward_negative_loss(z_x, z_y)`` repels each query
``z_x[i]`` from the *other view's* samples ``z_y[j]``, ``j != i``, averaging over the pairs; so
with two views only view 0's queries are repelled. The paper (Sec. 3.2) and the default
(``repulsion="same_view"``) repel each query from the other queries of its own view. The
attraction term is the same in both (``our_loss1``: each view is the query in turn, weights with
gradient).
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
        repulsion = _weighted_repulsion(cost_neg, t_neg)

        loss = reduce(attraction + repulsion, reduction)
    if return_parts:
        return loss, {"attraction": attraction.mean().detach(), "repulsion": repulsion.mean().detach()}
    return loss


REPULSION_FORMS = ("same_view", "cross_view")


def _weighted_repulsion(cost_neg: Tensor, t_neg: float) -> Tensor:
    """Per-query ``-sum_j softmax_j(-t- c_j) c_j`` (near negatives weigh more)."""
    return -(torch.softmax(-t_neg * cost_neg, dim=1) * cost_neg).sum(dim=1)


def cacr_cross_view_loss(views: list[Tensor], t_pos: float = 1.0, t_neg: float = 2.0, *, normalize: bool = True) -> Tensor:
    """The released small-scale loss: attraction as in the paper (each view the query in turn, the
    other views' samples of the same image its positives), repulsion of view ``x``'s query ``i`` from
    view ``y``'s samples ``j != i`` for every pair ``x < y``, averaged over the pairs."""
    m = views[0].shape[0]
    if m < 2:
        raise ValueError("in-batch CACR needs at least 2 queries (the negatives are the other images)")
    with full_precision(views[0]):
        z = [prepare(v, normalize) for v in views]
        stacked = torch.stack(z, dim=1)  # [M, V, D]
        attraction = None
        for x in range(len(z)):
            others = stacked[:, [y for y in range(len(z)) if y != x]]
            cost_pos = (z[x].unsqueeze(1) - others).pow(2).sum(dim=2)
            part = (torch.softmax(t_pos * cost_pos, dim=1) * cost_pos).sum(dim=1).mean()
            attraction = part if attraction is None else attraction + part
        off_diagonal = ~torch.eye(m, dtype=torch.bool, device=z[0].device)
        repulsion, pairs = None, 0
        for x in range(len(z)):
            for y in range(x + 1, len(z)):
                cost_neg = _sq_dist(z[x], z[y])[off_diagonal].view(m, m - 1)
                part = _weighted_repulsion(cost_neg, t_neg).mean()
                repulsion = part if repulsion is None else repulsion + part
                pairs += 1
        assert attraction is not None and repulsion is not None  # len(views) >= 2 is checked by the caller
        return attraction / len(z) + repulsion / pairs


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
    repulsion: str = "same_view",
) -> Tensor:
    """K+1 views of M images ([M, D] each): each view's embeddings are the queries in turn, the
    other K views (``keys`` from a momentum encoder when given, else the views themselves) are the
    positives; the mean over the K+1 turns is returned (Algorithm 3). ``repulsion="cross_view"``
    is the authors' released small-scale form (:func:`cacr_cross_view_loss`, in-batch only)."""
    if len(views) < 2:
        raise ValueError(f"CACR needs at least 2 views (K >= 1 positive), got {len(views)}")
    if any(v.shape != views[0].shape or v.dim() != 2 for v in views):
        raise ValueError(f"all views must be [M, D] with the same shape, got {[tuple(v.shape) for v in views]}")
    _check_repulsion(repulsion)
    if repulsion == "cross_view":
        if keys is not None or queue is not None or not in_batch_negatives or detach_pos_weights:
            raise ValueError(
                "repulsion='cross_view' is the released small-scale (in-batch) loss: no momentum keys, "
                "queue or detached attraction weights"
            )
        return cacr_cross_view_loss(views, t_pos, t_neg, normalize=normalize)
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


def _check_repulsion(repulsion: str) -> None:
    if repulsion not in REPULSION_FORMS:
        raise ValueError(
            f"repulsion must be 'same_view' (paper) or 'cross_view' (authors' released small-scale code), got {repulsion!r}"
        )


class CACRLoss(nn.Module):
    """Module form of :func:`cacr_multiview_loss` holding t+ / t- and the weight-gradient choice."""

    def __init__(
        self,
        t_pos: float = 1.0,
        t_neg: float = 2.0,
        in_batch_negatives: bool = True,
        detach_pos_weights: bool | None = None,
        normalize: bool = True,
        repulsion: str = "same_view",
    ) -> None:
        super().__init__()
        if t_pos < 0 or t_neg < 0:
            raise ValueError(f"t_pos and t_neg must be >= 0, got {t_pos} and {t_neg}")
        _check_repulsion(repulsion)
        self.repulsion = repulsion
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
            repulsion=self.repulsion,
        )

    def extra_repr(self) -> str:
        return (
            f"t_pos={self.t_pos}, t_neg={self.t_neg}, in_batch_negatives={self.in_batch_negatives}, "
            f"detach_pos_weights={self.detach_pos_weights}, normalize={self.normalize}, repulsion={self.repulsion!r}"
        )
