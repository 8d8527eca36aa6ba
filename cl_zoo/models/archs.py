"""The zoo's architectures as a torch-free table: name -> builder entry point, default config, size.

Why a table rather than only ``@register_model`` in each family module: listing and describing
models (``cl-zoo models``, ``cl-zoo info``, ``cl_zoo.list_models()``) must not import torch, and
the family modules are torch modules. Each entry point (``"module:function"``) is imported on the
first build; the family modules keep ``@register_model`` on each builder, which confirms the
declaration when imported. ``tests/models/test_models.py`` imports every family module and checks that
the table and the decorated functions agree, and builds each one to check ``params`` and
``num_features`` (the defaults' sizes, which ``cl-zoo models`` shows without building).
"""

from __future__ import annotations

from cl_zoo.constants import CIFAR10_MEAN, CIFAR10_STD
from cl_zoo.registry import PretrainedCfg, declare_model

_IMAGENET_CFG = PretrainedCfg(input_size=(3, 224, 224), interpolation="bilinear", crop_pct=0.875)
_CIFAR_CFG = PretrainedCfg(mean=CIFAR10_MEAN, std=CIFAR10_STD, input_size=(3, 32, 32), interpolation="bilinear", crop_pct=1.0)
# CMC's L/ab pairs take RGB in [0, 1] and convert to Lab themselves.
_RGB01 = dict(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
_IMAGENET_LAB = PretrainedCfg(input_size=(3, 224, 224), crop_pct=0.875, **_RGB01)  # type: ignore[arg-type]
_CIFAR_LAB = PretrainedCfg(input_size=(3, 32, 32), crop_pct=1.0, **_RGB01)  # type: ignore[arg-type]

# name, family module, default config, parameters, feature dimension
ARCHITECTURES: tuple[tuple[str, str, PretrainedCfg, int, int], ...] = (
    ("resnet18", "resnet", _IMAGENET_CFG, 11_176_512, 512),
    ("resnet34", "resnet", _IMAGENET_CFG, 21_284_672, 512),
    ("resnet50", "resnet", _IMAGENET_CFG, 23_508_032, 2048),
    ("resnet18_cifar", "resnet", _CIFAR_CFG, 11_168_832, 512),
    ("resnet34_cifar", "resnet", _CIFAR_CFG, 21_276_992, 512),
    ("resnet50_cifar", "resnet", _CIFAR_CFG, 23_500_352, 2048),
    ("cmc_resnet50x05_lab", "cmc_dual", _IMAGENET_LAB, 11_795_648, 2048),
    ("cmc_resnet50x1_lab", "cmc_dual", _IMAGENET_LAB, 47_006_656, 4096),
    ("cmc_resnet50x2_lab", "cmc_dual", _IMAGENET_LAB, 187_703_744, 8192),
    ("cmc_resnet18_lab", "cmc_dual", _IMAGENET_LAB, 11_319_008, 728),
    ("cmc_resnet18_cifar_lab", "cmc_dual", _CIFAR_LAB, 12_588_544, 768),
    ("cmc_alexnet_cifar_lab", "cmc_dual", _CIFAR_LAB, 13_357_776, 4096),
    ("alexnet_cifar", "alexnet", _CIFAR_CFG, 26_696_672, 4096),
    ("pixels", "pixels", _CIFAR_CFG, 0, 3072),
)

for _name, _family, _cfg, _params, _features in ARCHITECTURES:
    declare_model(_name, f"cl_zoo.models.{_family}:{_name}", _cfg, params=_params, num_features=_features)
