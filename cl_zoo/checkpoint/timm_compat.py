"""What makes a checkpoint folder a timm Hub repo as well as a cl-zoo one.

timm (1.0) reads ``config.json`` as ``{"architecture", "num_classes", "num_features", "model_args",
"pretrained_cfg"}``: ``architecture`` and ``model_args`` go to ``timm.create_model`` and every key of
``pretrained_cfg`` to timm's ``PretrainedCfg`` dataclass, which refuses unknown keys. So a folder
timm can load keeps ``pretrained_cfg`` to timm's own fields and puts everything cl-zoo adds in
top-level keys, which timm ignores. These definitions are shared by the folder writer/reader
(:mod:`cl_zoo.checkpoint.folder`) and the card (:mod:`cl_zoo.checkpoint.card`).
"""

from __future__ import annotations

from typing import Any, Mapping

# The PretrainedCfg fields shared with timm (written into config.json's pretrained_cfg) are defined
# beside the dataclass, in the registry (a leaf); re-exported here for the folder and card code.
from cl_zoo.errors import CheckpointError
from cl_zoo.registry import SHARED_FIELDS, TIMM_PREFIX

# timm 1.0's PretrainedCfg fields (timm/models/_pretrained.py); only these may sit in pretrained_cfg.
TIMM_PRETRAINED_FIELDS: frozenset[str] = frozenset({
    "url", "file", "state_dict", "hf_hub_id", "hf_hub_filename", "source", "architecture", "tag",
    "custom_load", "input_size", "test_input_size", "min_input_size", "fixed_input_size", "interpolation",
    "crop_pct", "test_crop_pct", "crop_mode", "mean", "std", "num_classes", "label_offset", "label_names",
    "label_descriptions", "pool_size", "test_pool_size", "first_conv", "classifier", "license",
    "description", "origin_url", "paper_name", "paper_ids", "notes",
})

# cl-zoo architectures that timm builds under the same name with the same state-dict keys
# (timm's ResNet uses torchvision's names; with num_classes=0 its fc is an Identity, as ours is
# absent). The CIFAR-stem ResNets (3x3 stride-1 stem, no max-pool) and CMC's L/ab pairs have no
# timm counterpart.
TIMM_ARCHITECTURES: frozenset[str] = frozenset({"resnet18", "resnet34", "resnet50"})

# What timm's own cfgs for those architectures say about their layers (timm/models/resnet.py
# ``_cfg``): the stem timm adapts when ``in_chans`` differs, and the head it drops for num_classes=0.
TIMM_LAYER_NAMES: dict[str, dict[str, str]] = {arch: {"first_conv": "conv1", "classifier": "fc"} for arch in TIMM_ARCHITECTURES}


# Top-level config.json key holding the rest of cl-zoo's PretrainedCfg (source pins and provenance);
# ``method`` and ``metrics`` are top-level keys of their own.
ZOO_CFG_KEY = "cl_zoo_pretrained_cfg"
TOP_LEVEL_FIELDS: tuple[str, ...] = ("method", "metrics")


def split_pretrained_cfg(cfg: Mapping[str, Any], architecture: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """cl-zoo's PretrainedCfg as a dict -> (timm's ``pretrained_cfg``, cl-zoo's ``cl_zoo_pretrained_cfg``).

    ``method`` and ``metrics`` are in neither: config.json keeps them as top-level keys.
    """
    timm_part: dict[str, Any] = {key: cfg[key] for key in SHARED_FIELDS if cfg.get(key) is not None}
    timm_part["num_classes"] = 0
    timm_part.update(TIMM_LAYER_NAMES.get(architecture, {}))
    zoo_part = {key: value for key, value in cfg.items() if key not in SHARED_FIELDS and key not in TOP_LEVEL_FIELDS}
    return timm_part, zoo_part


def merged_pretrained_cfg(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every cl-zoo PretrainedCfg field a config.json holds, in either layout, as one dict.

    format_version 1 kept them all in ``pretrained_cfg``; version 2 splits them (see
    :func:`split_pretrained_cfg`). timm-only keys (``num_classes``, ``first_conv``...) are dropped.
    """
    timm_part = config.get("pretrained_cfg")
    merged: dict[str, Any] = dict(timm_part) if isinstance(timm_part, Mapping) else {}
    zoo_part = config.get(ZOO_CFG_KEY)
    if isinstance(zoo_part, Mapping):
        merged.update(zoo_part)
        for key in TOP_LEVEL_FIELDS:
            if key in config:
                merged[key] = config[key]
    for key in ("num_classes", "first_conv", "classifier"):
        merged.pop(key, None)
    return merged


# A backbone built by timm itself (the zoo's ``timm/<name>``) is written with timm's own name in
# ``architecture``, which is what timm builds from, and the zoo's name in this key, so cl-zoo
# builds the same model the same way (its pooled ``forward_features``).
ZOO_ARCH_KEY = "cl_zoo_architecture"


def written_architecture(arch: str) -> dict[str, str]:
    """config.json's architecture keys for the zoo architecture ``arch``."""
    if arch.startswith(TIMM_PREFIX):
        return {"architecture": arch[len(TIMM_PREFIX):], ZOO_ARCH_KEY: arch}
    return {"architecture": arch}


def zoo_architecture(config: Mapping[str, Any]) -> str:
    """The zoo architecture a config.json describes (``architecture`` unless timm built the backbone)."""
    arch = str(config["architecture"])
    zoo = config.get(ZOO_ARCH_KEY)
    if zoo is None:
        return arch
    if zoo != TIMM_PREFIX + arch:
        raise CheckpointError(f"config.json: '{ZOO_ARCH_KEY}' must be {TIMM_PREFIX + arch!r} (its architecture through timm), "
                              f"got {str(zoo)[:80]!r}")
    return str(zoo)


def timm_architecture(config: Mapping[str, Any]) -> str | None:
    """The timm model name that loads this folder's weights as they are, or None.

    A backbone timm built (its ``model_args`` are timm's own arguments), or an architecture in
    :data:`TIMM_ARCHITECTURES` built with no extra ``model_args`` (timm would receive them as its
    own keyword arguments).
    """
    arch = config.get("architecture")
    if isinstance(arch, str) and config.get(ZOO_ARCH_KEY) == TIMM_PREFIX + arch:
        return arch
    if isinstance(arch, str) and arch in TIMM_ARCHITECTURES and not config.get("model_args"):
        return arch
    return None
