"""Model registry in the style of timm's ``_registry`` / ``_pretrained``: a leaf.

Two kinds of names:

* an *architecture* (``resnet50``, ``resnet18_cifar``, ``cmc_resnet50x05_lab``...) builds a randomly
  initialised backbone. The zoo's own are declared with :func:`declare_model` in a torch-free table
  (:mod:`cl_zoo.models.archs`: name -> ``"module:function"``, default config, size), resolved on
  first build; :func:`register_model` registers any other builder function (decorator);
* a *pretrained model* (``<method>_<arch>.<tag>``, e.g. ``dcl_resnet18_cifar.cifar10``) is an
  architecture plus a :class:`PretrainedCfg` saying where its weights live and how they were made,
  registered with :func:`register_pretrained`.

This module holds the config class, the tables and the look-ups only; it imports no torch, no
:mod:`cl_zoo.models` and no :mod:`cl_zoo.checkpoint`, so ``cl-zoo models`` / ``info`` list the zoo
without torch and nothing below the factory has to import upwards. The tables are filled in one
place, :mod:`cl_zoo.models` (imported by ``import cl_zoo``). Building from a name and loading
weights is :mod:`cl_zoo.factory`'s job (``create_model`` etc. are re-exported here lazily, for the
old import path).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import fnmatch
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ItemsView, Iterator, KeysView, ValuesView

from cl_zoo.constants import CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD
from cl_zoo.errors import ModelNotFoundError
from cl_zoo.deprecations import retired_exports

if TYPE_CHECKING:
    import torch.nn as nn

__all__ = [
    "CIFAR10_MEAN", "CIFAR10_STD", "IMAGENET_MEAN", "IMAGENET_STD", "DEFAULT_MODEL", "ZOO_NAMESPACE",
    "SHARED_FIELDS", "PretrainedCfg", "ModelEntry", "PretrainedEntry", "register_model", "declare_model",
    "register_pretrained", "list_models", "suggest_models", "get_arch", "get_pretrained", "is_pretrained_name",
    "is_architecture", "is_timm_arch", "TIMM_PREFIX", "CMC_TIMM_PREFIX", "pretrained_of", "find_pretrained", "find_arch", "build_arch", "SUGGESTION_CUTOFF",
]

# The bundled checkpoint `cl-zoo embed` uses when no --model is given (works offline).
DEFAULT_MODEL: str = "cacr_resnet18.imagenette64_cpu"
# The Hub namespace (user or organisation) of the zoo's own checkpoints: every registered zoo model
# ``NAME`` lives in the repo ``<namespace>/NAME``, pinned by the sha256 of its weight files (never by
# a revision, which would have to exist before the registry could name it). A fork or a company
# mirror publishes the zoo elsewhere with ``cl-zoo publish --all --namespace X`` and points cl-zoo at
# it with CL_ZOO_HUB_NAMESPACE (:func:`cl_zoo.checkpoint.hub.zoo_namespace`).
ZOO_NAMESPACE = "cl-zoo"

# The cl-zoo PretrainedCfg fields that are timm's too, with the same meaning, and so are written
# into config.json's pretrained_cfg. ``hf_hub_id`` and ``url`` are timm fields but mean "load from
# here" to timm, which would send a local-dir load elsewhere: they stay in cl-zoo's part.
# (Defined here, beside the dataclass whose fields it names; cl_zoo.checkpoint.timm_compat re-exports it.)
SHARED_FIELDS: tuple[str, ...] = ("mean", "std", "input_size", "interpolation", "crop_pct", "license")

# Architectures resolved through timm rather than declared here (``timm/vit_small_patch16_224``, and
# CMC's L/ab pair of two of them): any of timm's names works, so they are built on first use by
# :mod:`cl_zoo.models.timm_encoder` (which imports timm, the ``timm`` extra) and are not listed.
TIMM_PREFIX = "timm/"
CMC_TIMM_PREFIX = "cmc_lab/timm/"


@dataclass
class PretrainedCfg:
    """Where a checkpoint comes from, how to feed it, and how it was made and measured.

    Preprocessing fields travel with the weights so that ``embed``, ``knn`` and ``linear-eval``
    use exactly the statistics the model was trained with. Read as a mapping (``cfg["mean"]``,
    ``cfg.get("crop_mode")``, ``dict(cfg)``) it is the dict timm keeps in ``model.pretrained_cfg``,
    so ``timm.data.resolve_model_data_config(model)`` works on zoo models (see ``_timm_view``).
    """

    # --- source -------------------------------------------------------------------------------
    hf_hub_id: str | None = None  # "owner/name" on the Hugging Face Hub
    revision: str | None = None  # pinned commit/tag on the Hub
    filename: str = "model.safetensors"  # weights file (or the shard index's stem)
    sha256: dict[str, str] = field(default_factory=dict)  # file name -> hex digest
    url: str | None = None  # an author-released file (converted on first use)
    bundled: str | None = None  # folder name under model_cards/ shipped with the repository
    # --- preprocessing -------------------------------------------------------------------------
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    input_size: tuple[int, int, int] = (3, 224, 224)
    interpolation: str = "bilinear"
    crop_pct: float = 0.875
    # --- provenance ----------------------------------------------------------------------------
    method: str | None = None
    paper: str | None = None
    dataset: str | None = None
    epochs: int | None = None
    license: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    notes: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("mean", "std", "input_size"):
            d[key] = list(d[key])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PretrainedCfg":
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        for key in ("mean", "std", "input_size"):
            if key in kwargs and kwargs[key] is not None:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)

    @property
    def resize_size(self) -> int:
        """Shorter-side resize before the centre crop (input / crop_pct, as timm does)."""
        return int(round(self.input_size[-1] / self.crop_pct))

    # --- timm's dict view ---------------------------------------------------------------------
    # timm keeps ``model.pretrained_cfg`` as a plain dict and reads it as one
    # (timm/data/config.py ``resolve_data_config``: ``pretrained_cfg.get('input_size')``,
    # ``pretrained_cfg['mean']``; timm/models/_hub.py ``save_for_hf``: ``.items()``). The mapping
    # protocol below serves exactly what timm would find in such a dict: the fields cl-zoo shares
    # with timm's PretrainedCfg (the same ones a checkpoint folder writes into config.json's
    # ``pretrained_cfg``), ``crop_mode`` (cl-zoo always centre-crops) and ``num_classes`` 0 (every
    # zoo model is headless). cl-zoo's own fields stay attributes only, so ``dict(cfg)`` is a
    # pretrained_cfg timm's dataclass accepts (it refuses unknown keys).

    def _timm_view(self) -> dict[str, Any]:
        view = {key: getattr(self, key) for key in SHARED_FIELDS if getattr(self, key) is not None}
        view["crop_mode"] = "center"
        view["num_classes"] = 0
        return view

    def __getitem__(self, key: str) -> Any:
        return self._timm_view()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._timm_view().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._timm_view()

    def __iter__(self) -> Iterator[str]:
        return iter(self._timm_view())

    def __len__(self) -> int:
        return len(self._timm_view())

    def keys(self) -> KeysView[str]:
        return self._timm_view().keys()

    def items(self) -> ItemsView[str, Any]:
        return self._timm_view().items()

    def values(self) -> ValuesView[Any]:
        return self._timm_view().values()


@dataclass(frozen=True)
class ModelEntry:
    """An architecture: its builder (a function, or ``"module:function"`` imported on first build),
    default config and, where declared, its size, so listings need not build it."""

    name: str
    entry_point: "str | Callable[..., nn.Module]"
    default_cfg: PretrainedCfg
    family: str
    params: int | None = None  # parameter count with the builder's defaults
    num_features: int | None = None  # feature dimension with the builder's defaults

    @property
    def builder(self) -> "Callable[..., nn.Module]":
        """The builder function; a declared entry point imports its family module (and torch) here."""
        if callable(self.entry_point):
            return self.entry_point
        module, _, function = self.entry_point.partition(":")
        return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class PretrainedEntry:
    name: str  # "<method>_<arch>.<tag>"
    arch: str
    cfg: PretrainedCfg
    model_kwargs: dict[str, Any] = field(default_factory=dict)


_ARCHS: dict[str, ModelEntry] = {}
_PRETRAINED: dict[str, PretrainedEntry] = {}


def register_model(
    fn: "Callable[..., nn.Module] | None" = None, *, default_cfg: PretrainedCfg | None = None
) -> Any:
    """Register an architecture builder under its function name (decorator).

    A name already declared with :func:`declare_model` pointing at this very function keeps its
    declared config and size: the family module confirms the declaration when it is imported.
    """

    def wrap(builder: "Callable[..., nn.Module]") -> "Callable[..., nn.Module]":
        name = builder.__name__
        family = builder.__module__.rsplit(".", 1)[-1]
        declared = _ARCHS.get(name)
        if declared is not None and declared.entry_point == f"{builder.__module__}:{name}" and default_cfg is None:
            _ARCHS[name] = dataclasses.replace(declared, entry_point=builder)
        else:
            _ARCHS[name] = ModelEntry(name, builder, default_cfg or PretrainedCfg(), family)
        return builder

    return wrap(fn) if fn is not None else wrap


def declare_model(
    name: str, entry_point: str, default_cfg: PretrainedCfg, *, params: int | None = None, num_features: int | None = None
) -> ModelEntry:
    """Declare an architecture by entry point (``"cl_zoo.models.resnet:resnet18"``) without importing it.

    ``params``/``num_features`` are the built model's, with its defaults, so ``cl-zoo models`` can
    show them without torch (``tests/models/test_models.py`` builds each one and compares).
    """
    module, sep, function = entry_point.partition(":")
    if not sep or function != name:
        raise ValueError(f"entry point of {name!r} must be 'module:{name}', got {entry_point!r}")
    entry = ModelEntry(name, entry_point, default_cfg, module.rsplit(".", 1)[-1], params, num_features)
    _ARCHS[name] = entry
    return entry


def register_pretrained(
    name: str, arch: str, cfg: PretrainedCfg, **model_kwargs: Any
) -> PretrainedEntry:
    """Register pretrained weights for an architecture under ``<method>_<arch>.<tag>``."""
    if "." not in name:
        raise ValueError(f"pretrained names look like '<method>_<arch>.<tag>', got {name!r}")
    entry = PretrainedEntry(name, arch, cfg, dict(model_kwargs))
    _PRETRAINED[name] = entry
    return entry


def unregister_pretrained(name: str) -> PretrainedEntry | None:
    """Remove a name registered at run time (a plug-in's or a test's stand-in), so it stops resolving; None if absent."""
    return _PRETRAINED.pop(name, None)


def list_models(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Names matching a glob pattern: pretrained entries, plus architectures unless ``pretrained``."""
    names = list(_PRETRAINED)
    if not pretrained:
        names += list(_ARCHS)
    return sorted(n for n in set(names) if fnmatch.fnmatch(n, pattern))


def pretrained_of(arch: str) -> list[str]:
    """The pretrained names registered for ``arch``, for messages that point from an architecture to its weights."""
    return sorted(n for n, e in _PRETRAINED.items() if e.arch == arch)


def _similarity(typed: str, candidate: str) -> float:
    """How close ``typed`` is to ``candidate``, compared part by part: the whole name, and its stem
    (``dcl_resnet18`` of ``dcl_resnet18.imagenette64_cpu``) when the user typed no ``.<tag>``.

    A whole-name ratio alone ranks ``resnet18`` above ``dcl_resnet18.imagenette64_cpu`` for the
    typo ``dcl_resnet81``: the tag the user never typed lowers the long name's ratio.
    """
    whole = difflib.SequenceMatcher(None, typed, candidate).ratio()
    if "." in typed:
        return whole
    stem = candidate.split(".", 1)[0]
    return max(whole, difflib.SequenceMatcher(None, typed, stem).ratio())


# Below this, a "did you mean" names unrelated models (difflib's own default is 0.6).
SUGGESTION_CUTOFF = 0.75


def _suggestions(name: str, candidates: list[str]) -> list[str]:
    """Close names, the pretrained entries of a stem first: ``dcl_resnet18`` -> ``dcl_resnet18.<tag>``.

    Then names whose prefix the user typed, then typos by :func:`_similarity` (``dcl_resnet81`` ->
    ``dcl_resnet18.<tag>``, ``cacr_resnet18.imagenete64_cpu`` -> ``cacr_resnet18.imagenette64_cpu``).
    """
    key = name.lower()
    exact_stem = [c for c in candidates if c.lower().split(".", 1)[0] == key or c.lower().startswith(key + ".")]
    prefixed = [c for c in candidates if c.lower().startswith(key) and c not in exact_stem and c != name]
    scored = sorted(((_similarity(key, c.lower()), c) for c in candidates if c != name), key=lambda sc: (-sc[0], sc[1]))
    close = [c for score, c in scored if score >= SUGGESTION_CUTOFF]
    ordered = list(dict.fromkeys(sorted(exact_stem) + sorted(prefixed) + close))
    return ordered[:3]


def suggest_models(name: str) -> list[str]:
    """Up to three registered names close to ``name`` (pretrained names first), for a "did you
    mean" wherever a model name is typed (``cl-zoo embed --model``, ``cl-zoo info``)."""
    return _suggestions(name, list(_PRETRAINED)) or _suggestions(name, list(_PRETRAINED) + list(_ARCHS))


def _not_found(name: str, pretrained_only: bool = False) -> ModelNotFoundError:
    if pretrained_only and name in _ARCHS:
        tags = pretrained_of(name)
        weights = f"its pretrained weights: {', '.join(tags)}" if tags else "no pretrained weights are registered for it"
        return ModelNotFoundError(
            f"{name!r} is an architecture, not a checkpoint: cl_zoo.create_model({name!r}) builds it with random "
            f"weights; {weights} (or load a checkpoint folder or hf-hub:owner/name)"
        )
    close = _suggestions(name, list(_PRETRAINED)) if pretrained_only else []
    close = close or _suggestions(name, list(_PRETRAINED) + list(_ARCHS))
    hint = f"; did you mean {', '.join(close)}?" if close else "; run `cl-zoo models` for the list"
    return ModelNotFoundError(f"unknown model {name!r}{hint}")


def is_timm_arch(name: str) -> bool:
    """Whether ``name`` names an architecture through timm (``timm/<name>``, ``cmc_lab/timm/<name>``)."""
    return name.startswith((TIMM_PREFIX, CMC_TIMM_PREFIX))


def _timm_arch(name: str) -> ModelEntry:
    """The entry of a timm architecture; its one-line errors name the missing extra or timm's close names."""
    return importlib.import_module("cl_zoo.models.timm_encoder").timm_entry(name)  # type: ignore[no-any-return]


def get_arch(name: str) -> ModelEntry:
    if is_timm_arch(name):
        return _timm_arch(name)
    if name not in _ARCHS:
        raise _not_found(name)
    return _ARCHS[name]


def get_pretrained(name: str) -> PretrainedEntry:
    if name not in _PRETRAINED:
        raise _not_found(name, pretrained_only=True)
    return _PRETRAINED[name]


def is_pretrained_name(name: str) -> bool:
    return name in _PRETRAINED


def is_architecture(name: str) -> bool:
    """Whether ``name`` is a registered architecture (random weights), not a pretrained name."""
    return find_arch(name) is not None


def find_pretrained(name: str) -> PretrainedEntry | None:
    """The pretrained entry registered under ``name``, or None (no error, no suggestions)."""
    return _PRETRAINED.get(name)


def find_arch(name: str) -> ModelEntry | None:
    """The architecture registered under ``name``, or None (a timm name without timm installed still
    raises the one line naming the extra: the user asked for timm)."""
    if is_timm_arch(name):
        try:
            return _timm_arch(name)
        except ModelNotFoundError:
            return None
    return _ARCHS.get(name)


def build_arch(arch: str, cfg: PretrainedCfg | None = None, **kwargs: Any) -> "nn.Module":
    """Instantiate an architecture and attach its pretrained config (``model.pretrained_cfg``)."""
    entry = get_arch(arch)
    model = entry.builder(**kwargs)
    # A deep copy: dataclasses.replace would share the metrics/sha256 dicts, so a caller recording
    # metrics on one model would silently edit the registry's defaults for every later model.
    model.pretrained_cfg = copy.deepcopy(cfg if cfg is not None else entry.default_cfg)
    model.arch_name = arch
    model.model_kwargs = dict(kwargs)
    return model


# Building from a name and loading weights live in the factory, above the registry; the old import
# path (``from cl_zoo.registry import create_model``) still works, with a DeprecationWarning.
__getattr__, __dir__ = retired_exports(globals())
