"""Pretraining methods: how many views, which encoders, which loss, which queue or memory bank.

``build_method(name, backbone_arch, **hparams)`` builds the backbone from the model registry and
wraps it in the method; :data:`METHODS` maps every name to its class. The training loop only uses
the :class:`~cl_zoo.methods.base.ContrastiveMethod` interface.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from torch import nn

from cl_zoo.errors import ClZooError
from cl_zoo.factory import create_model
from cl_zoo.methods.base import ContrastiveMethod, ViewConfig

# name -> "module:Class"; modules are imported on first use so a broken optional method cannot
# break the others, and importing the package stays cheap.
_METHOD_PATHS: dict[str, str] = {
    "simclr": "cl_zoo.methods.simclr:SimCLR",
    "mocov2": "cl_zoo.methods.mocov2:MoCoV2",
    "mocov3": "cl_zoo.methods.mocov3:MoCoV3",
    "dcl": "cl_zoo.methods.dcl:DCL",
    "dclw": "cl_zoo.methods.dcl:DCLW",
    "simo": "cl_zoo.methods.simo:SiMo",
    "jcl": "cl_zoo.methods.jcl:JCL",
    "cmc": "cl_zoo.methods.cmc:CMC",
    "cacr": "cl_zoo.methods.cacr:CACR",
}


class _MethodTable(dict):
    """``METHODS[name]`` -> the method class (imported lazily)."""

    def __getitem__(self, name: str) -> type[ContrastiveMethod]:
        path = dict.__getitem__(self, name)
        module, _, cls = path.partition(":")
        return getattr(importlib.import_module(module), cls)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[name] if name in self else default

    def values(self) -> list[type[ContrastiveMethod]]:  # type: ignore[override]
        return [self[k] for k in self]

    def items(self) -> list[tuple[str, type[ContrastiveMethod]]]:  # type: ignore[override]
        return [(k, self[k]) for k in self]


METHODS: dict[str, type[ContrastiveMethod]] = _MethodTable(_METHOD_PATHS)


def list_methods() -> list[str]:
    return sorted(METHODS)


def get_method_class(name: str) -> type[ContrastiveMethod]:
    if name not in METHODS:
        import difflib

        close = difflib.get_close_matches(name, list(METHODS), n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(list_methods())}"
        raise ClZooError(f"unknown method {name!r}{hint}")
    return METHODS[name]


def _accepted_kwargs(cls: type) -> set[str]:
    """Keyword names the class's constructors accept along the MRO (they forward ``**kwargs``)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is nn.Module:
            continue
        params = inspect.signature(init).parameters
        # Required positionals (backbone; the bases' num_views) are filled by the class hierarchy, not
        # by a recipe; CMC's keyword num_views is a real hyperparameter.
        names.update(
            n for n, p in params.items()
            if p.kind is p.KEYWORD_ONLY or (p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty)
        )
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return names


def build_method(
    name: str,
    backbone_arch: str | nn.Module,
    *,
    model_args: dict[str, Any] | None = None,
    **hparams: Any,
) -> ContrastiveMethod:
    """Build method ``name`` around a fresh ``backbone_arch`` (a registry architecture name, or an
    already built backbone module).

    ``hparams`` are the recipe's ``method_args`` plus optional ``epochs`` (needed by JCL's lambda
    ramp and cosine momentum schedules), ``augment`` (the recipe's ``data.augment`` preset) and
    ``sync_bn``. Unknown or ill-typed hyperparameters raise :class:`ClZooError` with one line.
    """
    cls = get_method_class(name)
    if isinstance(backbone_arch, nn.Module):
        if model_args:
            raise ClZooError("model_args only apply when the backbone is given by architecture name")
        backbone = backbone_arch
    else:
        backbone = create_model(backbone_arch, **(model_args or {}))
    accepted = _accepted_kwargs(cls)
    unknown = sorted(set(hparams) - accepted)
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(accepted), n=1)
        hint = f" (did you mean {close[0]}?)" if close else f" (accepted: {', '.join(sorted(accepted))})"
        raise ClZooError(f"method {name!r}: unknown method_args key {unknown[0]!r}{hint}")
    try:
        return cls(backbone, **hparams)
    except ValueError as exc:
        raise ClZooError(f"method {name!r}: {exc}") from None


def build_method_from_recipe(recipe: Any) -> ContrastiveMethod:
    """Build the method a :class:`cl_zoo.train.recipe.Recipe` describes (arch, model_args,
    method_args, epochs, augment preset and sync_bn)."""
    return build_method(
        recipe.method,
        recipe.arch,
        model_args=dict(recipe.model_args),
        epochs=recipe.epochs,
        augment=recipe.data.augment,
        sync_bn=recipe.sync_bn,
        **dict(recipe.method_args),
    )


__all__ = [
    "METHODS",
    "ContrastiveMethod",
    "ViewConfig",
    "build_method",
    "build_method_from_recipe",
    "get_method_class",
    "list_methods",
]
