"""SiMo (Zhu et al., "EqCo: Equivalent Rules for Self-supervised Contrastive Learning", Sec. 3).

SiMo is MoCo v2 without the queue: a query encoder and its momentum key encoder (beta 0.999), an MLP
head with BatchNorm after each linear layer, SyncBN instead of shuffle BN, and the EqCo loss whose
positive and K negatives all come from the current (global) batch's keys. K may be smaller than the
batch (sampled per query, K = 16 in Table 5) and alpha (the number of negatives imitated, Eq. 5) is a
free constant: K=256/alpha=256 gives 68.0, K=16/alpha=256 68.1, K=256/alpha=65536 68.5 ImageNet
linear top-1 (200 epochs).

Under DDP the queries are gathered with gradient and the keys without, so the negatives span the
global batch (the authors' concat_all_gather) and every rank evaluates the loss over all queries.
The authors' loss is one-directional (query view 0, key view 1); ``symmetric=True`` also uses view 1
as query against view 0's keys and averages (the MoCo v3-style symmetrisation).

Fidelity options for the authors' released code (see :mod:`cl_zoo.losses.eqco`):
``negative_sampling="shared"`` (one negative subset for the whole batch instead of one per query)
and ``margin=False`` (the released default: the alpha/K factor is commented out). Defaults follow
the paper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_zoo.losses.eqco import NEGATIVE_SAMPLING, simo_loss
from cl_zoo.methods.momentum import MomentumMethod
from cl_zoo.distributed import gather


class SiMo(MomentumMethod):
    """SiMo; ``num_negatives`` None uses all N-1 other keys of the global batch."""

    name = "simo"
    default_augment = "mocov2"
    default_sync_bn = True
    default_head_bn = True  # "MLP head with BN" (EqCo Sec. 3)

    def __init__(
        self,
        backbone: nn.Module,
        *,
        temperature: float = 0.2,
        alpha: float = 256.0,
        num_negatives: int | None = None,
        symmetric: bool = False,
        negative_sampling: str = "per_query",
        margin: bool = True,
        **base_kwargs: object,
    ) -> None:
        super().__init__(backbone, num_views=2, **base_kwargs)  # type: ignore[arg-type]
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if num_negatives is not None and num_negatives < 1:
            raise ValueError(f"num_negatives (K) must be >= 1, got {num_negatives}")
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.num_negatives = num_negatives
        self.symmetric = bool(symmetric)
        if negative_sampling not in NEGATIVE_SAMPLING:
            raise ValueError(
                f"negative_sampling must be 'per_query' (paper) or 'shared' (authors' released code), got {negative_sampling!r}"
            )
        self.negative_sampling = negative_sampling
        self.margin = bool(margin)
        self.build_key_encoder()

    def check_batch_size(self, global_batch: int) -> None:
        """K negatives are sampled from the other keys of the global batch."""
        k = self.num_negatives
        if k is not None and k >= global_batch:
            raise ValueError(
                f"batch size {global_batch} is too small: its K={k} negatives are sampled from the other "
                f"images of the batch, so the batch must be at least K+1={k + 1}"
            )

    def _contrast(self, q: Tensor, k: Tensor) -> Tensor:
        q_all, k_all = gather(q, grad=True), gather(k, grad=False)
        n = k_all.shape[0]
        if self.num_negatives is not None and self.num_negatives >= n:
            raise ValueError(
                f"SiMo samples its K negatives from the other keys of the batch: K={self.num_negatives} "
                f"needs a global batch of at least K+1={self.num_negatives + 1}, got {n}"
            )
        return simo_loss(
            q_all,
            k_all,
            self.temperature,
            self.alpha,
            self.num_negatives,
            negative_sampling=self.negative_sampling,
            margin=self.margin,
        )

    def training_step(
        self, views: list[Tensor], index: Tensor, epoch_progress: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        self.check_views(views)
        q1 = self.query(views[0])
        k2 = self.key(views[1])
        loss = self._contrast(q1, k2)
        if self.symmetric:
            loss = (loss + self._contrast(self.query(views[1]), self.key(views[0]))) / 2
        with torch.no_grad():
            pos = (F.normalize(q1.detach().float(), dim=1) * k2).sum(dim=1).mean()
        return loss, self.logs(loss=loss, pos_sim=pos)

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, alpha={self.alpha}, num_negatives={self.num_negatives}, "
            f"symmetric={self.symmetric}, negative_sampling={self.negative_sampling!r}, margin={self.margin}, "
            + super().extra_repr()
        )
