"""The contract between a contrastive method and the training loop.

The trainer knows nothing about queues, momentum encoders or losses: it builds a
:class:`ContrastiveMethod`, asks it how many augmented views per image it needs
(:attr:`~ContrastiveMethod.num_views`, :attr:`~ContrastiveMethod.view_config`), feeds those views to
``method(views, index, epoch_progress)`` (``forward`` is ``training_step``, so the call goes
through DistributedDataParallel's hooks), steps the optimizer, then calls
:meth:`~ContrastiveMethod.after_optimizer_step`. At the end it exports ``method.backbone``.

Everything a method must carry across a resume (queues, memory banks, momentum encoders, queue
pointers) is a submodule, parameter or buffer, so ``method.state_dict()`` is the whole state. Random
choices inside a step (SiMo's negative sampling, CMC's bank sampling) use torch's global RNG, which
the trainer seeds and checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class ViewConfig:
    """Which :mod:`cl_zoo.data.augment` preset produces each view.

    ``preset`` is used for every view unless ``overrides`` maps a view index to another preset name
    (e.g. an asymmetric pipeline). The recipe's ``data.augment`` replaces ``preset``; the overrides
    stay, because they are part of the method (how its views differ), not of the dataset.
    """

    preset: str
    num_views: int
    overrides: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_views < 1:
            raise ValueError(f"num_views must be >= 1, got {self.num_views}")
        bad = [i for i in self.overrides if not 0 <= i < self.num_views]
        if bad:
            raise ValueError(f"view override index {bad[0]} outside 0..{self.num_views - 1}")

    def preset_for(self, view: int) -> str:
        """The preset name for view ``view`` (0-based)."""
        if not 0 <= view < self.num_views:
            raise IndexError(f"view {view} outside 0..{self.num_views - 1}")
        return self.overrides.get(view, self.preset)

    def presets(self) -> list[str]:
        """One preset name per view, in view order."""
        return [self.preset_for(i) for i in range(self.num_views)]


def is_no_decay(name: str, param: nn.Parameter) -> bool:
    """Biases and normalisation weights (all 1-d parameters): the usual "no weight decay" set."""
    return param.ndim <= 1 or name.endswith(".bias")


class ContrastiveMethod(nn.Module):
    """Base class of every pretraining method.

    Attributes the trainer reads:

    * ``name``: the registry name (``"simclr"``, ``"mocov2"``, ...);
    * ``backbone``: the encoder exported at the end (a registry model with ``pretrained_cfg``,
      ``arch_name`` and ``forward_features``);
    * ``num_views``: augmented views per image that ``training_step`` expects;
    * ``view_config``: a :class:`ViewConfig` naming the augmentation preset of each view;
    * ``sync_bn``: whether this method's recipe converts BatchNorm to SyncBatchNorm by default
      (the recipe's ``sync_bn`` has the last word);
    * ``total_epochs``: set at construction (or by the trainer) for schedules that need the run
      length (JCL's lambda ramp, cosine momentum);
    * ``ddp_find_unused_parameters``: passed to DistributedDataParallel. DDP waits for a gradient
      of every trainable parameter, so a method whose steps can leave some unused must say so
      (it costs an extra graph traversal per step, hence off by default; no built-in method needs it).

    The trainer also calls :meth:`check_batch_size` before it loads any data.

    Subclasses implement :meth:`training_step` and, when they have momentum encoders,
    :meth:`after_optimizer_step`.
    """

    name: ClassVar[str] = ""
    default_augment: ClassVar[str] = "simclr"
    default_sync_bn: ClassVar[bool] = False
    ddp_find_unused_parameters: ClassVar[bool] = False

    backbone: nn.Module
    num_views: int
    view_config: ViewConfig

    def __init__(
        self,
        backbone: nn.Module,
        num_views: int,
        *,
        augment: str | None = None,
        view_overrides: dict[int, str] | None = None,
        sync_bn: bool | None = None,
        no_decay_norm_bias: bool = False,
        epochs: int | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.num_views = num_views
        self.view_config = ViewConfig(augment or self.default_augment, num_views, dict(view_overrides or {}))
        self.sync_bn = self.default_sync_bn if sync_bn is None else bool(sync_bn)
        self.no_decay_norm_bias = no_decay_norm_bias
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        self.total_epochs = epochs

    # ------------------------------------------------------------------ the interface
    def training_step(
        self, views: list[Tensor], index: Tensor, epoch_progress: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """One forward pass and loss.

        ``views``: ``num_views`` tensors [B, 3, H, W], normalised, on the method's device;
        ``index``: dataset indices [B] (memory banks are addressed by them);
        ``epoch_progress``: fractional epoch (3.25 = a quarter into the fourth epoch), 0-based.
        Returns the scalar loss to back-propagate and a few scalar statistics for logging
        (:meth:`logs`: 0-d tensors left on the device, so the step makes no host sync).
        """
        raise NotImplementedError

    def forward(
        self, views: list[Tensor], index: Tensor, epoch_progress: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``training_step``: DDP only synchronises gradients of work done inside ``forward``."""
        return self.training_step(views, index, epoch_progress)

    def check_batch_size(self, global_batch: int) -> None:
        """Raise ``ValueError`` (one line) if this method cannot train on ``global_batch`` images.

        Default: no constraint beyond the trainer's own (at least 2 images). Queues (MoCo v2, JCL,
        CACR's moco form) and CMC's memory bank take their negatives outside the batch, and the
        in-batch forms only need a second image, so only SiMo overrides this.
        """

    def check_dataset_size(self, num_images: int) -> None:
        """Raise ``ValueError`` (one line) if this method cannot address ``num_images`` training images.

        Checked once by the trainer before the first step, so ``training_step`` need not compare
        dataset indices on the host every step (a device sync on a GPU). Default: no constraint;
        CMC's memory bank holds one entry per image, so it overrides this.
        """

    @torch.no_grad()
    def after_optimizer_step(self, epoch_progress: float) -> None:
        """Work that must follow the parameter update (momentum encoders' EMA). Default: nothing."""

    def parameter_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Optimizer parameter groups over the trainable parameters.

        Frozen parameters (momentum encoders, which have ``requires_grad=False``) are left out. With
        ``no_decay_norm_bias`` (LARS recipes: SimCLR, DCL on ImageNet) biases and BN weights get
        ``weight_decay=0`` and ``lars_exclude=True`` (the trainer's LARS skips adaptation there).
        """
        decay: list[nn.Parameter] = []
        no_decay: list[nn.Parameter] = []
        for name, param in self.named_parameters():
            if not param.requires_grad:
                continue
            if self.no_decay_norm_bias and is_no_decay(name, param):
                no_decay.append(param)
            else:
                decay.append(param)
        groups: list[dict[str, Any]] = [{"params": decay, "weight_decay": weight_decay, "name": "decay"}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0, "lars_exclude": True, "name": "no_decay"})
        return groups

    # ------------------------------------------------------------------ helpers for subclasses
    def check_views(self, views: list[Tensor] | tuple[Tensor, ...]) -> None:
        if len(views) != self.num_views:
            raise ValueError(f"{self.name} expects {self.num_views} views per image, got {len(views)}")
        shape0 = views[0].shape[0]
        if any(v.shape[0] != shape0 for v in views):
            raise ValueError(f"all views must have the same batch size, got {[v.shape[0] for v in views]}")

    def require_epochs(self, what: str) -> int:
        if self.total_epochs is None:
            raise ValueError(f"{self.name}: {what} needs the run length; pass epochs= to build_method")
        return self.total_epochs

    @staticmethod
    def logs(**values: Tensor | float) -> dict[str, Tensor]:
        """Detached float32 scalars on the step's device, with no host sync.

        Why tensors and not floats: turning a CUDA value into a Python number waits for the GPU to
        finish the step, and doing that every step starves it. The trainer keeps these on the device
        and reads them (all in one transfer) only on the steps it logs; ``float(v)`` reads one here.
        """
        tensors = {k: v.detach().float().reshape(()) for k, v in values.items() if isinstance(v, Tensor)}
        device = next((t.device for t in tensors.values() if t.device.type != "cpu"), torch.device("cpu"))
        return {k: tensors[k].to(device) if k in tensors else torch.tensor(float(v), device=device)
                for k, v in values.items()}

    def extra_repr(self) -> str:
        return f"num_views={self.num_views}, view_config={self.view_config}, sync_bn={self.sync_bn}"
