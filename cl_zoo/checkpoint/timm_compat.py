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


def timm_architecture(config: Mapping[str, Any]) -> str | None:
    """The timm model name that loads this folder's weights as they are, or None.

    Only an architecture in :data:`TIMM_ARCHITECTURES` built with no extra ``model_args`` (timm
    would receive them as its own keyword arguments).
    """
    arch = config.get("architecture")
    if isinstance(arch, str) and arch in TIMM_ARCHITECTURES and not config.get("model_args"):
        return arch
    return None
