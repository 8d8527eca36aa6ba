"""JCL (Cai et al., "Joint Contrastive Learning with Infinite Possibilities", NeurIPS 2020).

MoCo v2 with M' positive keys per query: view 0 is the query, views 1..M' go through the momentum
key encoder (no gradient), and the loss is the closed-form upper bound of Eq. 8
(:func:`cl_zoo.losses.jcl.jcl_loss`) built on the keys' mean and covariance. The queue receives the
mean key of each instance (supplementary: "we enqueue the average values of keys"), gathered over
ranks. All views use the same augmentation preset (the paper draws the M'+1 crops identically).

lambda: the paper's 4.0 fixed (``lambda_ramp=False``, default), or the authors' code's linear ramp
``lambda * (epoch + 1) / epochs`` over whole epochs (``lambda_ramp=True``, lambda 2.0), which needs
``epochs``. The M' key crops are encoded in one concatenated forward (BatchNorm sees M' x B keys).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_zoo.losses.jcl import jcl_loss, lambda_schedule
from cl_zoo.methods.momentum import MomentumMethod
from cl_zoo.methods.queue import EmbeddingQueue, queue_health


class JCL(MomentumMethod):
    """JCL: 1 query + ``num_keys`` (M') key views, queue of mean keys."""

    name = "jcl"
    default_augment = "mocov2"
    default_sync_bn = True

    def __init__(
        self,
        backbone: nn.Module,
        *,
        temperature: float = 0.2,
        lam: float = 4.0,
        lambda_ramp: bool = False,
        num_keys: int = 5,
        queue_size: int = 65536,
        **base_kwargs: object,
    ) -> None:
        if num_keys < 1:
            raise ValueError(f"num_keys (M') must be >= 1, got {num_keys}")
        super().__init__(backbone, num_views=1 + num_keys, **base_kwargs)  # type: ignore[arg-type]
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if lam < 0:
            raise ValueError(f"lam must be >= 0, got {lam}")
        if lambda_ramp and self.total_epochs is None:
            raise ValueError("lambda_ramp=True needs epochs= (the ramp spans the whole run)")
        self.temperature = float(temperature)
        self.lam = float(lam)
        self.lambda_ramp = bool(lambda_ramp)
        self.num_keys = num_keys
        self.build_key_encoder()
        self.queue = EmbeddingQueue(queue_size, self.head.out_dim, normalize=False)

    def lambda_at(self, epoch_progress: float) -> float:
        """lambda for the (0-based, fractional) epoch: fixed, or the per-epoch linear ramp."""
        if not self.lambda_ramp:
            return self.lam
        epochs = self.require_epochs("lambda_ramp")
        epoch = min(max(int(math.floor(epoch_progress)), 0), epochs - 1)
        return lambda_schedule(self.lam, epoch, epochs, ramp=True)

    def training_step(
        self, views: list[Tensor], index: Tensor, epoch_progress: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        self.check_views(views)
        batch = views[0].shape[0]
        q = self.query(views[0])
        keys = self.key(torch.cat(list(views[1:]), dim=0))  # [M' B, D], unit rows
        keys = keys.view(self.num_keys, batch, -1).transpose(0, 1)  # [B, M', D]
        lam = self.lambda_at(epoch_progress)
        negatives = self.queue.negatives()
        loss, mu = jcl_loss(q, keys, negatives, self.temperature, lam)
        with torch.no_grad():
            pos = (F.normalize(q.detach().float(), dim=1) * mu).sum(dim=1).mean()
        health = queue_health(q, negatives)
        self.queue.enqueue(mu)
        return loss, self.logs(loss=loss, pos_sim=pos, lam=lam, **health)

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, lam={self.lam}, lambda_ramp={self.lambda_ramp}, "
            f"num_keys={self.num_keys}, " + super().extra_repr()
        )
