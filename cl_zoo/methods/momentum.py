"""Momentum (EMA) encoders: MoCo's slowly moving key network, also used by SiMo, JCL and CACR.

The key encoder is a deep copy of the query encoder (backbone + head) whose parameters never
receive gradients; after each optimizer step ``theta_k <- m theta_k + (1 - m) theta_q`` (MoCo Eq. 2).
Only parameters are averaged: the key encoder's BatchNorm running statistics come from its own
forward passes, as in MoCo's code. ``momentum_at`` gives BYOL's cosine schedule
``m_t = 1 - (1 - m_0) (cos(pi t / T) + 1) / 2`` as an option (MoCo/SiMo/JCL use a constant).
"""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

import torch
from torch import nn

from cl_zoo.methods.base import ContrastiveMethod
from cl_zoo.methods.heads import Encoder, ProjectionHead, feature_dim


def momentum_at(base: float, progress: float, total: float | None, schedule: str = "constant") -> float:
    """Momentum at fractional epoch ``progress`` of ``total``: constant, or cosine-increasing to 1."""
    if schedule == "constant":
        return base
    if schedule == "cosine":
        if not total:
            raise ValueError("the cosine momentum schedule needs the total number of epochs")
        t = min(max(progress / total, 0.0), 1.0)
        return 1.0 - (1.0 - base) * (math.cos(math.pi * t) + 1.0) / 2.0
    raise ValueError(f"momentum schedule must be 'constant' or 'cosine', got {schedule!r}")


def make_momentum_copy(module: nn.Module) -> nn.Module:
    """A frozen deep copy of ``module`` (same initial weights, no gradients)."""
    twin = copy.deepcopy(module)
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


@torch.no_grad()
def ema_update(target: nn.Module, source: nn.Module, momentum: float) -> None:
    """``target <- momentum * target + (1 - momentum) * source`` over parameters, in place."""
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"momentum must be in [0, 1], got {momentum}")
    t_params = list(target.parameters())
    s_params = list(source.parameters())
    if len(t_params) != len(s_params):
        raise ValueError("momentum encoder and query encoder have different parameter lists")
    if t_params:
        torch._foreach_lerp_(t_params, [p.detach() for p in s_params], 1.0 - momentum)


class MomentumEncoder(nn.Module):
    """Holds the key-encoder copy and its schedule; ``update`` is called after each optimizer step."""

    def __init__(self, source: nn.Module, momentum: float = 0.999, schedule: str = "constant") -> None:
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {momentum}")
        momentum_at(momentum, 0.0, 1.0, schedule)  # validates the schedule name
        self.encoder = make_momentum_copy(source)
        self.base_momentum = momentum
        self.schedule = schedule

    def momentum(self, epoch_progress: float, total_epochs: float | None) -> float:
        return momentum_at(self.base_momentum, epoch_progress, total_epochs, self.schedule)

    def update(self, source: nn.Module, epoch_progress: float, total_epochs: float | None) -> float:
        m = self.momentum(epoch_progress, total_epochs)
        ema_update(self.encoder, source, m)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def extra_repr(self) -> str:
        return f"momentum={self.base_momentum}, schedule={self.schedule!r}"


class MomentumMethod(ContrastiveMethod):
    """Base of methods with a query encoder (backbone + head) and its momentum key twin.

    ``__init__`` builds the projection head from the hyperparameters every such method shares
    (``head_*``; ``head_bn`` defaults to the class's :attr:`default_head_bn`) and keeps the
    momentum settings; subclasses call :meth:`build_key_encoder` once their own arguments are
    validated (CACR's in-batch form has no key encoder and never calls it). :meth:`query` and
    :meth:`key` embed a view (keys under ``no_grad``, L2-normalised in float32), and
    ``after_optimizer_step`` performs the EMA. The key encoder's parameters have
    ``requires_grad=False``, so :meth:`~cl_zoo.methods.base.ContrastiveMethod.parameter_groups`
    leaves them out.
    """

    default_head_bn: ClassVar[bool] = False

    head: nn.Module
    key_encoder: MomentumEncoder

    def __init__(
        self,
        backbone: nn.Module,
        num_views: int,
        *,
        momentum: float = 0.999,
        momentum_schedule: str = "constant",
        head_hidden_dim: int | None = 2048,
        head_out_dim: int = 128,
        head_layers: int = 2,
        head_bn: bool | None = None,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(backbone, num_views, **base_kwargs)
        self.head = ProjectionHead(
            feature_dim(backbone),
            head_hidden_dim,
            head_out_dim,
            num_layers=head_layers,
            batch_norm=self.default_head_bn if head_bn is None else head_bn,
        )
        self.base_momentum, self.momentum_schedule = momentum, momentum_schedule

    def build_key_encoder(self) -> None:
        """The frozen momentum copy of backbone + head (validates the momentum settings)."""
        self.key_encoder = MomentumEncoder(Encoder(self.backbone, self.head), self.base_momentum, self.momentum_schedule)
        if self.momentum_schedule == "cosine" and self.total_epochs is None:
            raise ValueError("momentum_schedule='cosine' needs epochs= (the run length)")

    def query(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone.forward_features(x))

    @torch.no_grad()
    def key(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(self.key_encoder(x).float(), dim=1)

    @torch.no_grad()
    def after_optimizer_step(self, epoch_progress: float) -> None:
        self.key_encoder.update(Encoder(self.backbone, self.head), epoch_progress, self.total_epochs)
