"""Model registry in the style of timm.

Two kinds of names:

* an *architecture* (``resnet50``, ``resnet18_cifar``, ``cmc_resnet50x05_lab``...) is a function
  registered with :func:`register_model` that builds a randomly initialised backbone;
* a *pretrained model* (``<method>_<arch>.<tag>``, e.g. ``dcl_resnet18_cifar.cifar10``) is an
  architecture plus a :class:`PretrainedCfg` saying where its weights live and how they were made,
  registered with :func:`register_pretrained`.

``create_model(name, pretrained=True)`` resolves the weights through :mod:`cl_zoo.checkpoint.hub`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable

import torch.nn as nn

from cl_zoo.errors import ModelNotFoundError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
# The bundled checkpoint `cl-zoo embed` uses when no --model is given (works offline).
DEFAULT_MODEL: str = "cacr_resnet18.imagenette64_cpu"


@dataclass
class PretrainedCfg:
    """Where a checkpoint comes from, how to feed it, and how it was made and measured.

    Preprocessing fields travel with the weights so that ``embed``, ``knn`` and ``linear-eval``
    use exactly the statistics the model was trained with.
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


@dataclass(frozen=True)
class ModelEntry:
    name: str
    builder: Callable[..., nn.Module]
    default_cfg: PretrainedCfg
    family: str


@dataclass(frozen=True)
class PretrainedEntry:
    name: str  # "<method>_<arch>.<tag>"
    arch: str
    cfg: PretrainedCfg
    model_kwargs: dict[str, Any] = field(default_factory=dict)


_ARCHS: dict[str, ModelEntry] = {}
_PRETRAINED: dict[str, PretrainedEntry] = {}


def register_model(
    fn: Callable[..., nn.Module] | None = None, *, default_cfg: PretrainedCfg | None = None
) -> Any:
    """Register an architecture builder under its function name (decorator)."""

    def wrap(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        name = builder.__name__
        family = builder.__module__.rsplit(".", 1)[-1]
        _ARCHS[name] = ModelEntry(name, builder, default_cfg or PretrainedCfg(), family)
        return builder

    return wrap(fn) if fn is not None else wrap


def register_pretrained(
    name: str, arch: str, cfg: PretrainedCfg, **model_kwargs: Any
) -> PretrainedEntry:
    """Register pretrained weights for an architecture under ``<method>_<arch>.<tag>``."""
    if "." not in name:
        raise ValueError(f"pretrained names look like '<method>_<arch>.<tag>', got {name!r}")
    entry = PretrainedEntry(name, arch, cfg, dict(model_kwargs))
    _PRETRAINED[name] = entry
    return entry


def _ensure_loaded() -> None:
    # Importing the models package runs every @register_model and the pretrained table.
    import cl_zoo.models  # noqa: F401


def list_models(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Names matching a glob pattern: pretrained entries, plus architectures unless ``pretrained``."""
    _ensure_loaded()
    names = list(_PRETRAINED)
    if not pretrained:
        names += list(_ARCHS)
    return sorted(n for n in set(names) if fnmatch.fnmatch(n, pattern))


def _pretrained_of(arch: str) -> list[str]:
    return sorted(n for n, e in _PRETRAINED.items() if e.arch == arch)


def _suggestions(name: str, candidates: list[str]) -> list[str]:
    """Close names, the pretrained entries of a stem first: ``dcl_resnet18`` -> ``dcl_resnet18.<tag>``.

    difflib alone ranks short architecture names (``resnet18``) above the full pretrained name
    whose prefix the user typed, because the ``.<tag>`` suffix lowers the similarity ratio.
    """
    key = name.lower()
    exact_stem = [c for c in candidates if c.lower().split(".", 1)[0] == key or c.lower().startswith(key + ".")]
    prefixed = [c for c in candidates if c.lower().startswith(key) and c not in exact_stem and c != name]
    close = difflib.get_close_matches(name, [c for c in candidates if c != name], n=3, cutoff=0.5)
    ordered = list(dict.fromkeys(sorted(exact_stem) + sorted(prefixed) + close))
    return ordered[:3]


def _not_found(name: str, pretrained_only: bool = False) -> ModelNotFoundError:
    if pretrained_only and name in _ARCHS:
        tags = _pretrained_of(name)
        weights = f"its pretrained weights: {', '.join(tags)}" if tags else "no pretrained weights are registered for it"
        return ModelNotFoundError(
            f"{name!r} is an architecture, not a checkpoint: cl_zoo.create_model({name!r}) builds it with random "
            f"weights; {weights} (or load a checkpoint folder or hf-hub:owner/name)"
        )
    close = _suggestions(name, list(_PRETRAINED)) if pretrained_only else []
    close = close or _suggestions(name, list(_PRETRAINED) + list(_ARCHS))
    hint = f"; did you mean {', '.join(close)}?" if close else "; run `cl-zoo models` for the list"
    return ModelNotFoundError(f"unknown model {name!r}{hint}")


def get_arch(name: str) -> ModelEntry:
    _ensure_loaded()
    if name not in _ARCHS:
        raise _not_found(name)
    return _ARCHS[name]


def get_pretrained(name: str) -> PretrainedEntry:
    _ensure_loaded()
    if name not in _PRETRAINED:
        raise _not_found(name, pretrained_only=True)
    return _PRETRAINED[name]


def is_pretrained_name(name: str) -> bool:
    _ensure_loaded()
    return name in _PRETRAINED


def is_architecture(name: str) -> bool:
    """Whether ``name`` is a registered architecture (random weights), not a pretrained name."""
    _ensure_loaded()
    return name in _ARCHS


def find_pretrained(name: str) -> PretrainedEntry | None:
    """The pretrained entry registered under ``name``, or None (no error, no suggestions)."""
    _ensure_loaded()
    return _PRETRAINED.get(name)


def find_arch(name: str) -> ModelEntry | None:
    """The architecture registered under ``name``, or None."""
    _ensure_loaded()
    return _ARCHS.get(name)


def build_arch(arch: str, cfg: PretrainedCfg | None = None, **kwargs: Any) -> nn.Module:
    """Instantiate an architecture and attach its pretrained config (``model.pretrained_cfg``)."""
    entry = get_arch(arch)
    model = entry.builder(**kwargs)
    # A deep copy: dataclasses.replace would share the metrics/sha256 dicts, so a caller recording
    # metrics on one model would silently edit the registry's defaults for every later model.
    model.pretrained_cfg = copy.deepcopy(cfg if cfg is not None else entry.default_cfg)
    model.arch_name = arch
    model.model_kwargs = dict(kwargs)
    return model


def create_model(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build a model by architecture or pretrained name.

    ``create_model("resnet50")`` gives random weights; ``create_model("dcl_resnet18_cifar.cifar10",
    pretrained=True)`` downloads (or finds bundled/cached) weights and verifies their checksum.
    ``pretrained=False`` on a pretrained name builds its architecture with its preprocessing config
    but random weights.
    """
    _ensure_loaded()
    if name in _PRETRAINED:
        entry = _PRETRAINED[name]
        if pretrained:
            from cl_zoo.checkpoint.hub import load_registered

            return load_registered(entry, **kwargs)
        model = build_arch(entry.arch, entry.cfg, **{**entry.model_kwargs, **kwargs})
        model.model_name = name
        return model
    if name in _ARCHS:
        if pretrained:
            tags = _pretrained_of(name)
            hint = f" (pretrained: {', '.join(sorted(tags))})" if tags else ""
            raise ModelNotFoundError(
                f"{name!r} is an architecture; pick pretrained weights by their full name{hint}"
            )
        model = build_arch(name, **kwargs)
        model.model_name = name
        return model
    raise _not_found(name)
