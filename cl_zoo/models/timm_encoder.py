"""Any timm model as a zoo backbone: the architecture ``timm/<name>``.

The encoder is ``timm.create_model(name, pretrained=False, num_classes=0, **model_args)``, so its
state dict is timm's own and a checkpoint folder of it is one that ``timm.create_model("local-dir:
FOLDER")`` loads as it is (:mod:`cl_zoo.checkpoint.timm_compat`). The zoo's contract differs from
timm's in one place: a zoo backbone's ``forward_features`` is the pooled ``[B, num_features]``
representation, where timm's is the unpooled map or token sequence. Rather than wrap the model
(which would prefix every state-dict key and lose timm's layout), the model's class is swapped for
a subclass whose ``forward_features`` is timm's ``forward_features`` followed by its
``forward_head(pre_logits=True)``: exactly what timm's own ``forward`` computes with ``num_classes=0``.

``cmc_lab/timm/<name>`` is CMC's L/ab pair with two such encoders (``in_chans`` 1 and 2).

timm is an extra (``cl-zoo[timm]``): without it, naming a ``timm/`` architecture is one line that
says which extra to install. An unknown name is one line with timm's closest names.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any

import torch
from torch import nn

from cl_zoo.checkpoint.checks import accepted_args
from cl_zoo.errors import ModelArgumentError, ModelNotFoundError
from cl_zoo.optional import require
from cl_zoo.registry import CMC_TIMM_PREFIX, TIMM_PREFIX, ModelEntry, PretrainedCfg

# Arguments the zoo fixes itself: random weights (training starts from scratch, and a folder's
# weights come from its safetensors) and no classifier (every zoo backbone is headless).
_FIXED_ARGS = ("pretrained", "num_classes", "pretrained_cfg", "pretrained_cfg_overlay")


def _timm(name: str) -> Any:
    return require("timm", f"the architecture {name}")


class PooledFeatures:
    """Mixin giving a timm model the zoo's ``forward_features``: pooled, pre-logits features."""

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        unpooled = super().forward_features(x)  # type: ignore[misc]
        return self.forward_head(unpooled, pre_logits=True)  # type: ignore[attr-defined, no-any-return]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)


@functools.cache
def _pooled_class(cls: type) -> type:
    """``cls`` with :class:`PooledFeatures` in front; one per timm class, named like it."""
    return type(cls.__name__, (PooledFeatures, cls), {"__module__": __name__, "__qualname__": cls.__name__})


def timm_name(arch: str) -> str:
    """``timm/vit_small_patch16_224`` -> ``vit_small_patch16_224``."""
    return arch[len(TIMM_PREFIX):]


def _check_known(arch: str) -> str:
    timm = _timm(arch)
    name = timm_name(arch)
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(TIMM_PREFIX + c for c in close)}?" if close else "; see timm.list_models()"
        raise ModelNotFoundError(f"unknown timm model {name!r}{hint}")
    return name


def create_timm_encoder(arch: str, **model_args: Any) -> nn.Module:
    """timm's ``name`` with random weights, no classifier and the zoo's pooled ``forward_features``."""
    timm = _timm(arch)
    name = _check_known(arch)
    fixed = sorted(set(model_args) & set(_FIXED_ARGS))
    if fixed:
        raise ModelArgumentError(f"{arch} does not take {fixed[0]}: the zoo builds timm models with random weights and no classifier")
    model = timm.create_model(name, pretrained=False, num_classes=0, **model_args)
    width = int(getattr(model, "head_hidden_size", model.num_features))
    if width != int(model.num_features):
        raise ModelArgumentError(f"{arch}: its pooled features ({width}) are not its num_features ({model.num_features}); "
                                 "timm models with a pre-logits layer are not supported as backbones yet")
    model.__class__ = _pooled_class(type(model))
    return model


class _Builder:
    """A registry builder for one timm name, whose signature is the timm class's keyword arguments
    (so model_args are checked against them, in recipes and in checkpoint folders alike)."""

    def __init__(self, arch: str, build: Any, accepted: dict[str, Any]) -> None:
        self.arch = arch
        self._build = build
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=v) for k, v in accepted.items()])

    def __call__(self, **model_args: Any) -> nn.Module:
        return self._build(self.arch, **model_args)  # type: ignore[no-any-return]


def _timm_args(arch: str) -> dict[str, Any]:
    """The keyword arguments timm's builder for ``arch`` forwards to its model class, less the fixed ones."""
    timm = _timm(arch)
    entrypoint = timm.models.model_entrypoint(_check_known(arch))
    accepted = accepted_args(entrypoint)
    return {k: Any if v is inspect.Parameter.empty else v for k, v in accepted.items() if k not in _FIXED_ARGS}


def _default_cfg(name: str) -> PretrainedCfg:
    """timm's preprocessing for ``name`` (its own default config), for a model used without training."""
    timm_cfg = _timm(name).models.get_pretrained_cfg(name)
    if timm_cfg is None:
        return PretrainedCfg()
    interpolation = timm_cfg.interpolation if timm_cfg.interpolation in ("bilinear", "bicubic") else "bilinear"
    return PretrainedCfg(mean=tuple(timm_cfg.mean), std=tuple(timm_cfg.std), input_size=tuple(timm_cfg.input_size),
                         interpolation=interpolation, crop_pct=float(timm_cfg.crop_pct))


def create_cmc_timm_pair(arch: str, **model_args: Any) -> nn.Module:
    """CMC's L/ab dual encoder of two timm models, one on L (``in_chans`` 1) and one on ab (2)."""
    from cl_zoo.models.cmc_dual import CMCDualEncoder

    if "in_chans" in model_args:
        raise ModelArgumentError(f"{arch} does not take in_chans: CMC's L encoder has 1 input channel and its ab encoder 2")
    single = TIMM_PREFIX + arch[len(CMC_TIMM_PREFIX):]
    return CMCDualEncoder(create_timm_encoder(single, in_chans=1, **model_args),
                          create_timm_encoder(single, in_chans=2, **model_args))


@functools.cache
def timm_entry(arch: str) -> ModelEntry:
    """The registry entry of ``timm/<name>`` or ``cmc_lab/timm/<name>`` (built on first use, not listed)."""
    if arch.startswith(CMC_TIMM_PREFIX):
        single = TIMM_PREFIX + arch[len(CMC_TIMM_PREFIX):]
        accepted = {k: v for k, v in _timm_args(single).items() if k != "in_chans"}
        # CMC's pairs take RGB in [0, 1] and convert to Lab themselves.
        cfg = PretrainedCfg(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), input_size=_default_cfg(timm_name(single)).input_size)
        return ModelEntry(arch, _Builder(arch, create_cmc_timm_pair, accepted), cfg, "cmc_dual")
    name = _check_known(arch)
    return ModelEntry(arch, _Builder(arch, create_timm_encoder, _timm_args(arch)), _default_cfg(name), "timm")


__all__ = ["PooledFeatures", "create_cmc_timm_pair", "create_timm_encoder", "timm_entry", "timm_name"]
