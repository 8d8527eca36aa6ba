"""torch.hub entry points: every name in the cl-zoo registry.

::

    torch.hub.load("<checkout or owner/cl-zoo>", "resnet50")                       # random weights
    torch.hub.load(..., "dcl_resnet18_cifar__cifar10", pretrained=True)              # a pretrained entry
    torch.hub.load(..., "create_model", "dcl_resnet18_cifar.cifar10", pretrained=True)
    torch.hub.load(..., "load_pretrained", "hf-hub:owner/name@<commit>")

Every registry name is an entry point as written, ``torch.hub.load(..., "dcl_resnet18.imagenette64_cpu")``
included: torch.hub looks entries up with ``dir()``/``getattr`` on this module, which accept any
string. Pretrained names (``<method>_<arch>.<tag>``) contain a dot, which a Python identifier cannot,
so each also has an identifier alias with ``.`` replaced by ``__`` (``dcl_resnet18_cifar__cifar10``)
for ``from hubconf import ...`` and ``torch.hub.list``; ``create_model(name, ...)`` takes the exact
registry name. Pretrained entries default to ``pretrained=True``, architectures to
``pretrained=False`` (an architecture has no weights of its own).
"""

from __future__ import annotations

from typing import Any, Callable

dependencies = ["torch", "torchvision", "safetensors", "huggingface_hub", "yaml"]

import torch.nn as nn  # noqa: E402  (torch.hub checks `dependencies` first)

import cl_zoo  # noqa: E402
from cl_zoo.registry import is_pretrained_name, list_models  # noqa: E402


def entry_name(name: str) -> str:
    """The hub entry point for a registry name (``.`` -> ``__``)."""
    return name.replace(".", "__")


def create_model(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Any registered name, exactly as ``cl_zoo.create_model``."""
    return cl_zoo.create_model(name, pretrained=pretrained, **kwargs)


def load_pretrained(source: str, **kwargs: Any) -> nn.Module:
    """A checkpoint folder, file or ``hf-hub:owner/name[@revision]``, as ``cl_zoo.load_pretrained``."""
    return cl_zoo.load_pretrained(source, **kwargs)


def _entry(name: str) -> Callable[..., nn.Module]:
    default = is_pretrained_name(name)

    def entry(pretrained: bool = default, **kwargs: Any) -> nn.Module:
        return cl_zoo.create_model(name, pretrained=pretrained, **kwargs)

    entry.__name__ = entry.__qualname__ = entry_name(name)
    entry.__doc__ = f"cl-zoo model {name!r} (pretrained={default} by default); see `cl-zoo info {name}`."
    return entry


for _name in list_models():
    globals()[entry_name(_name)] = globals()[_name] = _entry(_name)
del _name
