"""CACR (Zheng et al., "Contrastive Attraction and Contrastive Repulsion for Representation
Learning", TMLR 2023).

K+1 augmented views per image; each view's embedding is the query in turn, the other K views are
its positives (contrastive attraction: far positives weigh more, ``t_pos``) and the other images'
embeddings its negatives (contrastive repulsion: near negatives weigh more, ``t_neg``); see
:mod:`cl_zoo.losses.cacr`. Two forms:

* ``form="in_batch"`` (small-scale experiments, Sec. 4.1 / appendix C.1): one encoder; the
  positives are the other views and the negatives the other queries; gradient through all weights.
* ``form="moco"`` (appendix C.2, Algorithm 3): MoCo v2 framework; positives are momentum-encoder
  keys (attraction weights without gradient), negatives the queue (65536) plus the other queries;
  the last view's keys are enqueued, as in Algorithm 3.

``repulsion="cross_view"`` (in-batch form only) is the authors' released small-scale loss, which
repels a query from the other view's samples for view pairs x < y instead of from the other queries
of its own view (see :mod:`cl_zoo.losses.cacr`); the default ``"same_view"`` is the paper's.

Under DDP the queries (with gradient) and keys are gathered so that in-batch negatives span the
global batch and every rank evaluates the same global loss.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cl_zoo.losses.cacr import REPULSION_FORMS, cacr_multiview_loss
from cl_zoo.methods.momentum import MomentumMethod
from cl_zoo.methods.queue import EmbeddingQueue
from cl_zoo.distributed import gather


class CACR(MomentumMethod):
    """CACR with ``num_positives`` = K (``num_views = K + 1``)."""

    name = "cacr"
    default_augment = "mocov2"

    def __init__(
        self,
        backbone: nn.Module,
        *,
        num_positives: int = 1,
        t_pos: float = 1.0,
        t_neg: float = 2.0,
        form: str = "in_batch",
        queue_size: int = 65536,
        repulsion: str = "same_view",
        **base_kwargs: object,
    ) -> None:
        if num_positives < 1:
            raise ValueError(f"num_positives (K) must be >= 1, got {num_positives}")
        if form not in ("in_batch", "moco"):
            raise ValueError(f"form must be 'in_batch' or 'moco', got {form!r}")
        if repulsion not in REPULSION_FORMS:
            raise ValueError(
                f"repulsion must be 'same_view' (paper) or 'cross_view' (authors' released small-scale code), got {repulsion!r}"
            )
        if repulsion == "cross_view" and form != "in_batch":
            raise ValueError("repulsion='cross_view' is the released small-scale loss: it needs form='in_batch'")
        super().__init__(backbone, num_views=num_positives + 1, **base_kwargs)  # type: ignore[arg-type]
        if t_pos < 0 or t_neg < 0:
            raise ValueError(f"t_pos and t_neg must be >= 0, got {t_pos} and {t_neg}")
        self.num_positives = num_positives
        self.t_pos, self.t_neg = float(t_pos), float(t_neg)
        self.form = form
        self.repulsion = repulsion
        self.queue: EmbeddingQueue | None = None
        if form == "moco":
            self.build_key_encoder()
            self.queue = EmbeddingQueue(queue_size, self.head.out_dim)

    def training_step(
        self, views: list[Tensor], index: Tensor, epoch_progress: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        self.check_views(views)
        queries = [gather(self.query(v), grad=True) for v in views]
        if self.queue is None:
            loss = cacr_multiview_loss(queries, None, None, self.t_pos, self.t_neg, repulsion=self.repulsion)
        else:
            negatives = self.queue.negatives()
            keys = [gather(self.key(v), grad=False) for v in views]
            loss = cacr_multiview_loss(queries, keys, negatives, self.t_pos, self.t_neg)
            self.queue.enqueue(keys[-1], gathered=True)
        with torch.no_grad():
            q0 = torch.nn.functional.normalize(queries[0].detach().float(), dim=1)
            q1 = torch.nn.functional.normalize(queries[1].detach().float(), dim=1)
            pos = (q0 * q1).sum(dim=1).mean()
        return loss, self.logs(loss=loss, pos_sim=pos)

    @torch.no_grad()
    def after_optimizer_step(self, epoch_progress: float) -> None:
        if self.form == "moco":
            super().after_optimizer_step(epoch_progress)

    def extra_repr(self) -> str:
        return f"K={self.num_positives}, t_pos={self.t_pos}, t_neg={self.t_neg}, form={self.form!r}, repulsion={self.repulsion!r}, " + super().extra_repr()
