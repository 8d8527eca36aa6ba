"""SimCLR (Chen et al., ICML 2020): two views, in-batch negatives, NT-Xent (Eq. 1).

Both views of the local batch go through backbone + 2-layer MLP head in one concatenated forward
(BatchNorm sees 2B samples, as in SimCLR's code); the embeddings are gathered from every rank with
gradient (:func:`cl_zoo.distributed.gather`) and every rank evaluates the identical global loss over
the 2 x global batch views, which with the gather's gradient rule equals single-device training on
the global batch.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_zoo.losses.infonce import nt_xent
from cl_zoo.methods.base import ContrastiveMethod
from cl_zoo.methods.heads import ProjectionHead, feature_dim
from cl_zoo.distributed import gather


class TwoViewInBatchMethod(ContrastiveMethod):
    """Shared body of SimCLR and DCL: ``loss(z1, z2)`` over globally gathered embeddings.

    Subclasses set ``default_temperature`` (their paper's value) and implement :meth:`pair_loss`.
    """

    default_temperature: ClassVar[float]

    def __init__(
        self,
        backbone: nn.Module,
        *,
        temperature: float | None = None,
        head_hidden_dim: int | None = 2048,
        head_out_dim: int = 128,
        head_layers: int = 2,
        head_bn: bool = False,
        **base_kwargs: object,
    ) -> None:
        super().__init__(backbone, num_views=2, **base_kwargs)  # type: ignore[arg-type]
        if temperature is None:
            temperature = self.default_temperature
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self.head = ProjectionHead(
            feature_dim(backbone), head_hidden_dim, head_out_dim, num_layers=head_layers, batch_norm=head_bn
        )

    def pair_loss(self, z1: Tensor, z2: Tensor) -> Tensor:
        raise NotImplementedError

    def training_step(
        self, views: list[Tensor], index: Tensor, epoch_progress: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        self.check_views(views)
        z = self.head(self.backbone.forward_features(torch.cat(list(views), dim=0)))
        z1, z2 = z.chunk(2, dim=0)
        z1, z2 = gather(z1, grad=True), gather(z2, grad=True)
        loss = self.pair_loss(z1, z2)
        with torch.no_grad():
            pos = F.cosine_similarity(z1.float(), z2.float(), dim=1).mean()
        return loss, self.logs(loss=loss, pos_sim=pos)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, " + super().extra_repr()


class SimCLR(TwoViewInBatchMethod):
    """SimCLR with NT-Xent; ``temperature`` 0.5 on CIFAR (SimCLR B.9), 0.1 on ImageNet (Table 5)."""

    name = "simclr"
    default_augment = "simclr"
    default_temperature = 0.5

    def pair_loss(self, z1: Tensor, z2: Tensor) -> Tensor:
        return nt_xent(z1, z2, self.temperature)
