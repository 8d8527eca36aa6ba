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
from typing import Any, Callable, ItemsView, Iterator, KeysView, ValuesView

import torch.nn as nn

from cl_zoo.errors import ModelArgumentError, ModelNotFoundError

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
        from cl_zoo.checkpoint.timm_compat import SHARED_FIELDS

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


def unregister_pretrained(name: str) -> PretrainedEntry | None:
    """Remove a name registered at run time (a plug-in's or a test's stand-in), so it stops resolving; None if absent."""
    return _PRETRAINED.pop(name, None)


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
    _ensure_loaded()
    return _suggestions(name, list(_PRETRAINED)) or _suggestions(name, list(_PRETRAINED) + list(_ARCHS))


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


# timm's way of asking for no classifier (``create_model(name, num_classes=0)``): what every zoo
# model already is, so the value is accepted and changes nothing.
_HEADLESS = (0, None)


def check_pretrained_kwargs(what: str, kwargs: dict[str, Any], hint: str = "") -> None:
    """Refuse model arguments for a load whose weights already fix the architecture.

    Only ``num_classes=0``/``None`` (timm's "no classifier", which zoo models are) passes; anything
    else would have to change the network the weights were saved from, and silently ignoring it
    would hand back a model that is not what was asked for.
    """
    for key, value in kwargs.items():
        if key == "num_classes":
            if value not in _HEADLESS:
                raise _classifier_refused(what, value)
            continue
        raise ModelArgumentError(f"{what} cannot take {key}={value!r}: the checkpoint fixes the architecture; leave it out{hint}")


def _classifier_refused(what: str, value: Any) -> ModelArgumentError:
    return ModelArgumentError(
        f"{what} cannot take num_classes={value!r}: zoo models are headless feature extractors (forward gives "
        f"[B, model.num_features]); put torch.nn.Linear(model.num_features, {value!r}) on top, or pass num_classes=0"
    )


def _architecture_kwargs(name: str, arch: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for ``arch``'s builder, every one checked against what the builder accepts."""
    from cl_zoo.checkpoint.checks import accepted_args

    accepted = accepted_args(get_arch(arch).builder)
    out = {}
    for key, value in kwargs.items():
        if key == "num_classes" and key not in accepted:
            if value not in _HEADLESS:
                raise _classifier_refused(f"create_model({name!r})", value)
            continue
        if key not in accepted:
            known = ", ".join(sorted(accepted)) or "no arguments"
            raise ModelArgumentError(f"create_model({name!r}) does not take {key}={value!r}; {arch} accepts {known}")
        out[key] = value
    return out


def _build(name: str, arch: str, cfg: PretrainedCfg | None, base: dict[str, Any], kwargs: dict[str, Any]) -> nn.Module:
    """``build_arch`` with the caller's arguments; a builder refusing their values is one line, not a traceback."""
    args = _architecture_kwargs(name, arch, kwargs)
    try:
        model = build_arch(arch, cfg, **{**base, **args})
    except (TypeError, ValueError) as exc:
        if not args:
            raise  # no user argument involved: a bug, keep the traceback
        given = ", ".join(f"{k}={v!r}" for k, v in args.items())
        text = " ".join(str(exc).split())[:200]
        raise ModelArgumentError(f"create_model({name!r}, {given}) cannot build {arch}: {text}") from None
    model.model_name = name
    return model


def create_model(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build a model by architecture or pretrained name.

    ``create_model("resnet50")`` gives random weights; ``create_model("dcl_resnet18_cifar.cifar10",
    pretrained=True)`` downloads (or finds bundled/cached) weights and verifies their checksum.
    ``pretrained=False`` on a pretrained name builds its architecture with its preprocessing config
    but random weights.

    ``kwargs`` go to the architecture's builder (``width=0.5``, ``in_chans=1``...); one it does not
    accept raises :class:`~cl_zoo.errors.ModelArgumentError` naming it, never goes unread. With
    ``pretrained=True`` the weights fix the architecture, so only ``num_classes=0`` (timm's "no
    classifier", which every zoo model is) is accepted. ``num_classes`` > 0 is refused: zoo models
    have no classifier head to replace.
    """
    _ensure_loaded()
    if name in _PRETRAINED:
        entry = _PRETRAINED[name]
        if pretrained:
            from cl_zoo.checkpoint.hub import load_registered

            check_pretrained_kwargs(f"create_model({name!r}, pretrained=True)", kwargs, ", or build random weights with pretrained=False")
            return load_registered(entry)
        return _build(name, entry.arch, entry.cfg, entry.model_kwargs, kwargs)
    if name in _ARCHS:
        if pretrained:
            tags = _pretrained_of(name)
            hint = f" (pretrained: {', '.join(sorted(tags))})" if tags else ""
            raise ModelNotFoundError(
                f"{name!r} is an architecture; pick pretrained weights by their full name{hint}"
            )
        return _build(name, name, None, {}, kwargs)
    raise _not_found(name)
