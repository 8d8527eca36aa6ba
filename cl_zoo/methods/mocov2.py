"""MoCo v2 (Chen et al., "Improved Baselines with Momentum Contrastive Learning", 2020).

Query encoder = backbone + 2-layer MLP head; key encoder = its momentum copy (m = 0.999, MoCo
Eq. 2); negatives = a FIFO queue of K = 65536 past keys; InfoNCE with tau = 0.2. The keys of the
current step are gathered over all ranks and enqueued after the loss.

Shuffle BN replaced by SyncBN: MoCo shuffles the key batch across GPUs so that BatchNorm statistics
cannot leak which key matches which query. Here, as in SiMo (EqCo Sec. 3), BatchNorm is synchronised
across ranks instead (``sync_bn = True`` by default; the trainer converts the modules), which removes
the per-GPU statistic that the shuffle was hiding. On a single device there is nothing to shuffle.

Options: ``symmetric`` (both views as queries, loss averaged, both keys enqueued; the common CIFAR
variant), ``split_bn`` (one device: the backbone's BatchNorm computes its statistics over that many
splits of the batch and the key batch is shuffled before the key encoder and put back after it,
MoCo's shuffled BN simulated as lightly's CIFAR-10 benchmark does; :mod:`cl_zoo.methods.split_bn`)
and ``eqco_alpha`` (EqCo, Eq. 5: the queue's K negatives imitate ``alpha`` negatives via the
margin ``tau log(alpha/K)``; ``alpha == queue_size`` is plain InfoNCE).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cl_zoo.losses.eqco import eqco_loss
from cl_zoo.losses.infonce import info_nce
from cl_zoo.methods.momentum import MomentumMethod
from cl_zoo.methods.queue import EmbeddingQueue, queue_health
from cl_zoo.methods.split_bn import convert_split_batchnorm, has_batchnorm


class MoCoV2(MomentumMethod):
    """MoCo v2 with queue; ``eqco_alpha`` turns the loss into EqCo's margin InfoNCE."""

    name = "mocov2"
    default_augment = "mocov2"
    default_sync_bn = True

    def __init__(
        self,
        backbone: nn.Module,
        *,
        temperature: float = 0.2,
        queue_size: int = 65536,
        symmetric: bool = False,
        eqco_alpha: float | None = None,
        split_bn: int = 1,
        **base_kwargs: object,
    ) -> None:
        if isinstance(split_bn, bool) or not isinstance(split_bn, int) or split_bn < 1:
            raise ValueError(f"split_bn must be an integer >= 1 (1: plain BatchNorm), got {split_bn!r}")
        if split_bn > 1 and base_kwargs.get("sync_bn") is None:
            base_kwargs["sync_bn"] = False  # the class default (SyncBN) gives way to the split asked for
        super().__init__(backbone, num_views=2, **base_kwargs)  # type: ignore[arg-type]
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if split_bn > 1 and self.sync_bn:
            raise ValueError("split_bn simulates shuffled BatchNorm on one device and sync_bn synchronises it across "
                             "devices: set sync_bn: false with split_bn, or split_bn: 1 with sync_bn")
        self.split_bn = split_bn
        if split_bn > 1 and not has_batchnorm(self.backbone, nn.BatchNorm2d):
            arch = getattr(self.backbone, "arch_name", type(self.backbone).__name__)
            raise ValueError(f"split_bn={split_bn} splits the backbone's BatchNorm2d layers and {arch} has none (no statistic "
                             "crosses the batch there, so shuffled BN has nothing to hide): set split_bn: 1")
        if split_bn > 1:  # before the key encoder is copied from it: both encoders split alike (as lightly's)
            self.backbone = convert_split_batchnorm(self.backbone, split_bn)
        if eqco_alpha is not None and not eqco_alpha > 0:
            raise ValueError(f"eqco_alpha must be > 0, got {eqco_alpha}")
        self.temperature = float(temperature)
        self.symmetric = bool(symmetric)
        self.eqco_alpha = None if eqco_alpha is None else float(eqco_alpha)
        self.build_key_encoder()
        self.queue = EmbeddingQueue(queue_size, self.head.out_dim)

    def check_batch_size(self, global_batch: int) -> None:
        if self.split_bn > 1 and global_batch % self.split_bn:
            raise ValueError(f"batch size {global_batch} is not divisible by split_bn={self.split_bn}: every BatchNorm "
                             "split needs the same number of images")

    @torch.no_grad()
    def key(self, x: Tensor) -> Tensor:
        """Keys of ``x`` in its order; with ``split_bn`` computed on a shuffled batch, so that a key's
        BatchNorm split holds other images than its query's (MoCo's shuffled BN on one device)."""
        if self.split_bn == 1:
            return super().key(x)
        order = torch.randperm(len(x), device=x.device)
        shuffled = super().key(x[order])
        keys = torch.empty_like(shuffled)
        keys[order] = shuffled
        return keys

    def contrast(self, q: Tensor, k: Tensor, negatives: Tensor) -> Tensor:
        if self.eqco_alpha is None:
            return info_nce(q, k, negatives, self.temperature)
        return eqco_loss(q, k, negatives, self.temperature, self.eqco_alpha)

    def training_step(
        self, views: list[Tensor], index: Tensor, epoch_progress: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        self.check_views(views)
        negatives = self.queue.negatives()
        q1 = self.query(views[0])
        k2 = self.key(views[1])
        loss = self.contrast(q1, k2, negatives)
        keys = k2
        if self.symmetric:
            q2 = self.query(views[1])
            k1 = self.key(views[0])
            loss = (loss + self.contrast(q2, k1, negatives)) / 2
            keys = torch.cat([k1, k2], dim=0)
        with torch.no_grad():
            pos = (torch.nn.functional.normalize(q1.detach().float(), dim=1) * k2).sum(dim=1).mean()
        health = queue_health(q1, negatives)
        self.queue.enqueue(keys)
        return loss, self.logs(loss=loss, pos_sim=pos, **health)

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, symmetric={self.symmetric}, eqco_alpha={self.eqco_alpha}, "
            + super().extra_repr()
        )
