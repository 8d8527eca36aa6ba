"""The model a command evaluates or fine-tunes, or its random-init baseline.

Every pretrained number in the zoo is read against the same architecture with seeded random weights
and the same preprocessing (``--random-init`` on ``knn``, ``linear-eval`` and ``detect``), so that a
gap is the pretraining's and not the architecture's. One function builds that baseline for every
command, so the three cannot disagree about what "random init" means.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

import cl_zoo
from cl_zoo.checkpoint import config_pretrained_cfg, read_config

from cl_zoo.checkpoint.timm_compat import zoo_architecture
from cl_zoo.registry import build_arch

def load_model_or_baseline(model_spec: str, random_init: bool = False, seed: int = 0) -> nn.Module:
    """``cl_zoo.load_model(model_spec)``, or with ``random_init`` its architecture with weights drawn
    under ``torch.manual_seed(seed)`` (named ``"<name> (random init, seed N)"``, source ``random-init``).

    A checkpoint folder gives its own architecture, model arguments and preprocessing, untrained; a
    registry name gives that architecture's defaults. Returned in eval mode.
    """
    if not random_init:
        return cl_zoo.load_model(model_spec)

    torch.manual_seed(seed)
    if Path(model_spec).is_dir():
        config = read_config(model_spec)
        cfg = config_pretrained_cfg(config)
        cfg.metrics = {}
        arch = zoo_architecture(config)
        model = build_arch(arch, cfg, **config["model_args"])
        name = config.get("model_name") or arch
    else:
        model = cl_zoo.create_model(model_spec)
        name = model_spec
    model.model_name = f"{name} (random init, seed {seed})"
    model.checkpoint_source = "random-init"
    return model.eval()
