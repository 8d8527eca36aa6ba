"""MoCo v3 (Chen, Xie, He, "An Empirical Study of Training Self-Supervised Vision Transformers",
ICCV 2021, arXiv 2104.02057), the CACR paper's ViT baseline.

Values from the authors' code (facebookresearch/moco-v3), each where it is set:

* query encoder = backbone + projector + predictor; key encoder = the momentum copy of backbone +
  projector (``moco/builder.py``: ``base_encoder``/``momentum_encoder`` carry the projector as their
  head, only the query side has ``predictor``);
* heads (``_build_mlp``): linear layers without bias, BN + ReLU after each hidden layer, a BN
  without affine after the last; hidden width ``mlp_dim`` 4096, output ``dim`` 256 (``--moco-mlp-dim``,
  ``--moco-dim``). ``MoCo_ViT``: 3-layer projector, 2-layer predictor with the last BN;
  ``MoCo_ResNet``: 2-layer projector, 2-layer predictor without the last BN. ``head_layers`` and
  ``predictor_last_bn`` default to the ViT form for a backbone with a patch embedding, else ResNet's;
* loss: :func:`cl_zoo.losses.mocov3.mocov3_loss`, keys of the whole batch gathered over ranks (no
  queue); temperature ``--moco-t`` 1.0 (the code's default, its ResNet-50 runs), 0.2 in every ViT
  run of ``CONFIG.md``;
* momentum ``--moco-m`` 0.99 with ``--moco-m-cos`` (every run in ``CONFIG.md``):
  ``m = 1 - (1 - m0)(1 + cos(pi t / T)) / 2`` per iteration (``adjust_moco_momentum``), which is
  :func:`cl_zoo.methods.momentum.momentum_at`'s cosine schedule. The authors update the momentum
  encoder at the start of each step; here it follows the optimizer step, the same update one
  iteration's schedule value apart;
* ``freeze_patch_embed`` (``--stop-grad-conv1``, in every ViT run of ``CONFIG.md``; the paper's
  Sec. 4.2 "random patch projection"): the patch projection keeps its random initialisation,
  drawn as ``vits.py`` draws it (uniform in +-sqrt(6 / (C p p + D)), bias 0: Xavier over the
  flattened patch), and is left out of the optimizer;
* views: BYOL's asymmetric pair (``main_moco.py`` ``augmentation1``/``augmentation2``: presets
  ``mocov3`` and ``mocov3_second``); SyncBatchNorm across ranks (``main_moco.py`` converts the model).

The AdamW/LARS settings, warm-up and lr scaling (lr x batch / 256) are the recipe's, not the method's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from cl_zoo.distributed import gather, get_rank
from cl_zoo.losses.mocov3 import mocov3_loss
from cl_zoo.methods.heads import ProjectionHead
from cl_zoo.methods.momentum import MomentumMethod


def is_vit(backbone: nn.Module) -> bool:
    """Whether ``backbone`` embeds patches with a projection (timm's ViTs: ``patch_embed.proj``)."""
    return isinstance(getattr(getattr(backbone, "patch_embed", None), "proj", None), nn.Conv2d)


def freeze_random_patch_projection(backbone: nn.Module) -> None:
    """Redraw the patch projection as MoCo v3's ``vits.py`` does and stop its gradient."""
    proj: nn.Conv2d = backbone.patch_embed.proj  # type: ignore[union-attr, assignment]
    fan_in = proj.in_channels * math.prod(proj.kernel_size)
    bound = math.sqrt(6.0 / float(fan_in + proj.out_channels))
    with torch.no_grad():
        nn.init.uniform_(proj.weight, -bound, bound)
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)
    for param in proj.parameters():
        param.requires_grad_(False)


class MoCoV3(MomentumMethod):
    """MoCo v3: momentum encoder, projector and predictor with BN, symmetric in-batch InfoNCE."""

    name = "mocov3"
    default_augment = "mocov3"
    default_sync_bn = True
    default_head_bn = True

    def __init__(
        self,
        backbone: nn.Module,
        *,
        temperature: float = 1.0,
        momentum: float = 0.99,
        momentum_schedule: str = "cosine",
        head_hidden_dim: int | None = 4096,
        head_out_dim: int = 256,
        head_layers: int | None = None,
        predictor_last_bn: bool | None = None,
        freeze_patch_embed: bool = False,
        **base_kwargs: Any,
    ) -> None:
        vit = is_vit(backbone)
        if freeze_patch_embed and not vit:
            arch = getattr(backbone, "arch_name", type(backbone).__name__)
            raise ValueError(f"freeze_patch_embed freezes a ViT's patch projection and {arch} has none (patch_embed.proj)")
        base_kwargs.setdefault("view_overrides", {1: "mocov3_second"})
        super().__init__(backbone, 2, momentum=momentum, momentum_schedule=momentum_schedule,
                         head_hidden_dim=head_hidden_dim, head_out_dim=head_out_dim,
                         head_layers=(3 if vit else 2) if head_layers is None else head_layers,
                         head_bn=True, **base_kwargs)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self.freeze_patch_embed = bool(freeze_patch_embed)
        if self.freeze_patch_embed:  # before the key encoder is copied: both keep the same frozen projection
            freeze_random_patch_projection(self.backbone)
        self.predictor = ProjectionHead(head_out_dim, head_hidden_dim, head_out_dim, num_layers=2, batch_norm=True,
                                        last_bn=vit if predictor_last_bn is None else bool(predictor_last_bn))
        self.build_key_encoder()

    def query(self, x: Tensor) -> Tensor:
        return self.predictor(super().query(x))

    def training_step(
        self, views: list[Tensor], index: Tensor, epoch_progress: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        self.check_views(views)
        q1, q2 = self.query(views[0]), self.query(views[1])
        k1, k2 = self.key(views[0]), self.key(views[1])
        offset = get_rank() * q1.shape[0]
        loss = mocov3_loss(q1, q2, gather(k1, grad=False), gather(k2, grad=False), self.temperature, offset=offset)
        with torch.no_grad():
            pos = (torch.nn.functional.normalize(q1.detach().float(), dim=1) * k2).sum(dim=1).mean()
        return loss, self.logs(loss=loss, pos_sim=pos)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, freeze_patch_embed={self.freeze_patch_embed}, " + super().extra_repr()
