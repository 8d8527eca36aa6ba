"""DCL and DCLW (Yeh et al., ECCV 2022): SimCLR's two-view pipeline with the decoupled loss.

The only change from SimCLR is the loss (:mod:`cl_zoo.losses.dcl`): the positive pair leaves the
denominator (DCL, Proposition 2), and DCLW additionally weights the positive term by
``w_i = 2 - N softmax_i(<z_i^1, z_i^2>/sigma)``. Under DDP the weights are computed over the
global batch, exactly as on one device with that batch.
"""

from __future__ import annotations

from torch import Tensor, nn

from cl_zoo.losses.dcl import dcl, dclw
from cl_zoo.methods.simclr import TwoViewInBatchMethod


class DCL(TwoViewInBatchMethod):
    """Decoupled contrastive learning; ``temperature`` 0.1 (ImageNet, appendix A.4) to 0.2 (CIFAR)."""

    name = "dcl"
    default_augment = "dcl"
    default_temperature = 0.1

    def pair_loss(self, z1: Tensor, z2: Tensor) -> Tensor:
        return dcl(z1, z2, self.temperature)


class DCLW(TwoViewInBatchMethod):
    """DCL with von Mises-Fisher positive weighting (``sigma`` 0.5, the paper's value)."""

    name = "dclw"
    default_augment = "dcl"
    default_temperature = 0.1

    def __init__(self, backbone: nn.Module, *, sigma: float = 0.5, **kwargs: object) -> None:
        super().__init__(backbone, **kwargs)  # type: ignore[arg-type]
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        self.sigma = float(sigma)

    def pair_loss(self, z1: Tensor, z2: Tensor) -> Tensor:
        return dclw(z1, z2, self.temperature, self.sigma)
