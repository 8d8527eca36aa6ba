"""Training recipes: one YAML file per method and setting, overridable from the command line.

A recipe is the complete, typed description of a pretraining run. It is validated before anything
expensive happens (an unknown key or a wrong type is a one-line :class:`ClZooError`), and its full
dictionary form is what the exported checkpoint's config carries, so a published model says exactly
how it was made.

YAML shape (every key optional; defaults below)::

    method: dcl                 # a name known to cl_zoo.methods.build_method
    arch: resnet18_cifar        # a registered architecture
    model_args: {}              # extra kwargs for create_model (e.g. width: 0.5)
    method_args: {}             # method hyperparameters (temperature, queue size, ...)
    data: {image_size: 32, augment: cifar, dataset: cifar10}   # augment null: the method's default
    optim: {name: sgd, lr: 0.03, lr_scaling: linear, base_batch: 256, momentum: 0.9,
            weight_decay: 5.0e-4, nesterov: false}
    schedule: {name: cosine, warmup_epochs: 0, milestones: [], gamma: 0.1}
    epochs: 200
    batch_size: 256
    precision: auto             # auto | bf16 | fp16 | fp32
    sync_bn: null               # null: the method's default
    compile: false
    knn_every: 10               # 0 disables the online kNN monitor
    checkpoint_every: 0         # also checkpoint every N steps inside an epoch (0: at epoch ends only)
    seed: 0
    workers: 8                  # DataLoader workers on the streaming path / decode threads
"""

from __future__ import annotations

import copy
import math
import re
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

import yaml

from cl_zoo.bundled import bundled_folder
from cl_zoo.errors import ClZooError
from cl_zoo.validation import (
    InvalidValueError,
    check_count,
    check_nesting,
    check_number,
    check_numbers,
    check_seed,
    check_yaml_nesting,
    decode_text,
)

# Upper bounds far past any real run, low enough that a typo (an extra zero or five) is caught before
# it allocates a batch of 10^12 pixels or schedules a million-year run.
MAX_EPOCHS = 100_000
MAX_BATCH = 1 << 20
MAX_IMAGE_SIZE = 4096  # pixels a side; contrastive recipes train at 32-224
MAX_STEPS = 1_000_000_000
MAX_WORKERS = 1024
MAX_LR = 100.0  # the base lr, before batch-size scaling (LARS recipes use 0.3-4.8)
MAX_TEMPERATURE = 100.0
MAX_RECIPE_BYTES = 1 << 20  # recipes are a few hundred bytes; a bigger file is not one
MAX_NUMBER_CHARS = 64  # digits in a YAML number: Python refuses to convert past 4,300 with a traceback

# Where bare recipe names (``--recipe dcl_cifar10``) are looked up: the bundled recipes/ folder,
# inside the installed package or, in a checkout, the repository's own.
RECIPES_DIR = bundled_folder("recipes")


@dataclass
class DataConfig:
    """How images are sized and augmented; ``augment`` names an AugmentConfig preset."""

    image_size: int = 32
    augment: str | None = None  # None: the method's default preset
    dataset: str | None = None  # provenance only: recorded as pretrained_cfg.dataset


@dataclass
class OptimConfig:
    """Optimizer; with ``lr_scaling: linear`` the effective lr is ``lr * batch_size / base_batch``."""

    name: Literal["sgd", "lars", "adam", "adamw"] = "sgd"
    lr: float = 0.03
    lr_scaling: Literal["linear", "none"] = "linear"
    base_batch: int = 256
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False


@dataclass
class ScheduleConfig:
    """Learning-rate schedule, stepped per iteration (warmup is linear from ~0)."""

    name: Literal["cosine", "step"] = "cosine"
    warmup_epochs: float = 0.0
    # epochs, for ``step``; fractional values are fine (the lr is looked up per step), which keeps a
    # schedule shortened by ``--epochs`` in proportion instead of rounding its steps together
    milestones: list[float] = field(default_factory=list)
    gamma: float = 0.1


@dataclass
class Recipe:
    """A complete pretraining configuration."""

    method: str = "dcl"
    arch: str = "resnet18_cifar"
    model_args: dict[str, Any] = field(default_factory=dict)
    method_args: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    epochs: int = 200
    batch_size: int = 256
    # auto: bf16 on CUDA and on CPUs with AMX, else fp32 (cl_zoo.precision); the
    # precision that actually ran is recorded in the checkpoint and the exported config.
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    sync_bn: bool | None = None  # None: the method's default (MoCo-style methods: true)
    compile: bool = False
    knn_every: int = 10
    checkpoint_every: int = 0  # steps between mid-epoch checkpoints; 0: only at the end of each epoch
    seed: int = 0
    workers: int = 8

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, source: str = "recipe") -> "Recipe":
        """Build and validate a recipe from a plain mapping (e.g. parsed YAML)."""
        check_nesting(data, source)
        recipe = _build(cls, data or {}, source)
        recipe.validate(source)
        return recipe

    @classmethod
    def load(cls, path_or_name: str | Path) -> "Recipe":
        """Read a YAML recipe: a path, or a bare name of a bundled recipe (``dcl_cifar10``)."""
        path = resolve_recipe_path(path_or_name)
        source = f"recipe {path}"
        try:
            with path.open("rb") as fh:
                raw = fh.read(MAX_RECIPE_BYTES + 1)
        except OSError as exc:
            raise ClZooError(f"{source}: cannot read: {exc.strerror or exc}") from None
        if len(raw) > MAX_RECIPE_BYTES:
            raise InvalidValueError(f"{source}: larger than {MAX_RECIPE_BYTES >> 20} MiB; a recipe is a short YAML file")
        data = parse_recipe_yaml(decode_text(raw, source), source)
        if data is not None and not isinstance(data, dict):
            raise ClZooError(f"recipe {path}: expected a mapping at the top level, got {type(data).__name__}")
        return cls.from_dict(data, source=f"recipe {path}")

    def to_dict(self) -> dict[str, Any]:
        """The full recipe as plain YAML/JSON-able data (what exported checkpoints record)."""
        return copy.deepcopy(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def with_overrides(self, overrides: Mapping[str, Any], *, source: str = "command line") -> "Recipe":
        """A copy with dotted-key overrides applied (``{"optim.lr": 0.1, "epochs": 5}``).

        ``None`` values are skipped so CLI options that were not given leave the recipe alone.
        """
        data = self.to_dict()
        for dotted, value in overrides.items():
            if value is None:
                continue
            parts = dotted.split(".")
            node = data
            for part in parts[:-1]:
                if part not in node or not isinstance(node[part], dict):
                    raise ClZooError(f"{source}: unknown recipe key {dotted!r}")
                node = node[part]
            if parts[-1] not in node and parts[0] not in ("model_args", "method_args"):
                raise ClZooError(f"{source}: unknown recipe key {dotted!r}")
            node[parts[-1]] = value
        given = {key for key, value in overrides.items() if value is not None}
        epochs = data["epochs"]
        if "epochs" in given and isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 \
                and epochs != self.epochs:
            # A shorter (or longer) run keeps the recipe's shape: warm-up and step milestones move in
            # proportion unless they were set in the same breath. Without this, ``--epochs 1`` on a
            # recipe with 10 warm-up epochs was refused, and a shortened run that kept them would
            # spend most of itself warming up. The scripts' ``scaled_warmup`` did this by hand.
            scale = epochs / self.epochs
            if "schedule" in given:  # the whole schedule was given: it is the user's, as written
                given |= {"schedule.warmup_epochs", "schedule.milestones"}
            if "schedule.warmup_epochs" not in given:
                data["schedule"]["warmup_epochs"] = round(self.schedule.warmup_epochs * scale, 4)
            if "schedule.milestones" not in given:
                data["schedule"]["milestones"] = [round(m * scale, 4) for m in self.schedule.milestones]
        return Recipe.from_dict(data, source=source)

    # ------------------------------------------------------------------ checks
    def validate(self, source: str = "recipe") -> None:
        """Range checks that types alone cannot express: every number finite and inside what it can
        mean, so a NaN momentum or a 5,000-epoch warm-up is refused before a model is built."""
        try:
            self._check_ranges()
        except InvalidValueError as exc:
            raise InvalidValueError(f"{source}: {exc}") from None

    def _check_ranges(self) -> None:
        for key, value, high in (
            ("epochs", self.epochs, MAX_EPOCHS),
            ("batch_size", self.batch_size, MAX_BATCH),
            ("data.image_size", self.data.image_size, MAX_IMAGE_SIZE),
            ("optim.base_batch", self.optim.base_batch, MAX_BATCH),
        ):
            check_count(key, value, high=high)
        check_number("knn_every", self.knn_every, low=0, high=MAX_EPOCHS, integer=True)
        check_number("checkpoint_every", self.checkpoint_every, low=0, high=MAX_STEPS, integer=True)
        check_number("workers", self.workers, low=0, high=MAX_WORKERS, integer=True)
        check_seed("seed", self.seed)
        o, s = self.optim, self.schedule
        check_number("optim.lr", o.lr, low=0, low_open=True, high=MAX_LR)
        check_number("optim.momentum", o.momentum, low=0, high=1, high_open=True)
        check_number("optim.weight_decay", o.weight_decay, low=0, high=1)
        check_number("schedule.warmup_epochs", s.warmup_epochs, low=0)
        check_number("schedule.gamma", s.gamma, low=0, low_open=True, high=1)
        check_numbers("schedule.milestones", s.milestones, low=0)
        if sorted(s.milestones) != list(s.milestones):
            raise InvalidValueError(f"schedule.milestones must be increasing, got {s.milestones}")
        if s.warmup_epochs > self.epochs:
            raise InvalidValueError(f"schedule.warmup_epochs ({s.warmup_epochs}) exceeds epochs ({self.epochs})")
        if o.nesterov and o.name != "sgd":
            raise InvalidValueError(f"optim.nesterov only applies to sgd, not {o.name}")
        for group in ("model_args", "method_args"):
            _check_finite_numbers(group, getattr(self, group))
        temperature = self.method_args.get("temperature")
        if temperature is not None:
            check_number("method_args.temperature", temperature, low=0, low_open=True, high=MAX_TEMPERATURE)

    @property
    def effective_lr(self) -> float:
        """Peak learning rate after batch-size scaling."""
        if self.optim.lr_scaling == "linear":
            return self.optim.lr * self.batch_size / self.optim.base_batch
        return self.optim.lr


def schedule_rescale_note(before: Recipe, after: Recipe) -> str | None:
    """One line saying how a change of ``epochs`` moved the schedule, or ``None`` when it did not."""
    if before.epochs == after.epochs:
        return None
    moved = []
    if before.schedule.warmup_epochs != after.schedule.warmup_epochs:
        moved.append(f"warm-up {before.schedule.warmup_epochs:g} -> {after.schedule.warmup_epochs:g} epochs")
    if before.schedule.milestones != after.schedule.milestones:
        old = ", ".join(f"{m:g}" for m in before.schedule.milestones)
        new = ", ".join(f"{m:g}" for m in after.schedule.milestones)
        moved.append(f"lr steps at epochs [{old}] -> [{new}]")
    if not moved:  # a cosine without warm-up spans whatever epochs it is given: nothing to say
        return None
    how = "shortened" if after.epochs < before.epochs else "stretched"
    return f"epochs {before.epochs} -> {after.epochs}: the schedule is {how} in proportion ({'; '.join(moved)})"


def parse_overrides(items: Iterable[str]) -> dict[str, object]:
    """``KEY=VALUE`` strings (``--set``) as recipe overrides, values read as YAML scalars; a malformed
    item is a one-line :class:`ClZooError`. Shared by ``cl-zoo pretrain`` and the scripts that build a
    recipe from the same options, so they all accept and refuse the same things."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ClZooError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = parse_recipe_yaml(value, f"--set {key}")
    return out


def parse_recipe_yaml(text: str, source: str) -> Any:
    """``text`` read as recipe YAML: nesting bounded before parsing, no anchors or aliases, no
    number too long to convert; every failure is one line naming ``source`` (and the line)."""
    check_yaml_nesting(text, source)
    try:
        return yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 - a SafeLoader
    except _AliasRefused as exc:
        raise ClZooError(
            f"{source}: YAML anchors and aliases are not allowed (line {exc.line}: {exc.what}); write the values out"
        ) from None
    except _NumberTooLong as exc:
        raise InvalidValueError(f"{source}: line {exc.line}: a number of {exc.length} characters; no recipe value needs "
                                f"more than {MAX_NUMBER_CHARS}") from None
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" (line {line + 1})" if line is not None else ""
        raise ClZooError(f"{source}: invalid YAML{where}: {getattr(exc, 'problem', exc)}") from None


def resolve_recipe_path(path_or_name: str | Path) -> Path:
    """A recipe file from a path, or from the name of a bundled recipe.

    ``dcl_cifar10``, ``dcl_cifar10.yaml`` and ``recipes/dcl_cifar10.yaml`` (the repository path the
    docs and model cards quote) all name the bundled file when no such file exists where the user
    runs, so those commands work from an installed wheel too.
    """
    path = Path(path_or_name).expanduser()
    if path.is_file():
        return path
    if path.parent in (Path("."), Path("recipes")) and path.suffix in ("", ".yaml"):
        candidate = RECIPES_DIR / f"{path.stem}.yaml"
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")) if RECIPES_DIR.is_dir() else []
    hint = f" (bundled recipes: {', '.join(known)})" if known else ""
    raise ClZooError(f"recipe not found: {path_or_name}{hint}")


# ---------------------------------------------------------------------- YAML without aliases
class _AliasRefused(yaml.YAMLError):
    """An anchor or alias in a recipe; ``line`` is 1-based."""

    def __init__(self, what: str, line: int) -> None:
        super().__init__(what)
        self.what = what
        self.line = line


class _NumberTooLong(yaml.YAMLError):
    """A YAML int or float literal longer than ``MAX_NUMBER_CHARS``; ``line`` is 1-based."""

    def __init__(self, length: int, line: int) -> None:
        super().__init__(f"number of {length} characters")
        self.length = length
        self.line = line


class _RecipeLoader(yaml.SafeLoader):
    """``safe_load`` that refuses anchors (``&a``) and aliases (``*a``) before building anything.

    Aliases let a few hundred bytes name exponentially many nodes (nested "billion laughs"):
    PyYAML shares them while parsing, but validating and copying the recipe expands every one, so
    a 452-byte file cost 19 s and 500 MB, tenfold per level. Recipes never need them, so they are
    refused outright at the first event that carries one.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _AliasRefused(f"alias *{event.anchor}", event.start_mark.line + 1)
        if getattr(event, "anchor", None) is not None:
            raise _AliasRefused(f"anchor &{event.anchor}", event.start_mark.line + 1)
        return super().compose_node(parent, index)

    def construct_bounded_number(self, node: yaml.ScalarNode) -> Any:
        """An int or float scalar, refused when longer than any real value (a 5,000-digit int is a
        ``ValueError`` traceback inside PyYAML, past Python's int conversion limit)."""
        if len(node.value) > MAX_NUMBER_CHARS:
            raise _NumberTooLong(len(node.value), node.start_mark.line + 1)
        if node.tag.endswith(":int"):
            return self.construct_yaml_int(node)
        return self.construct_yaml_float(node)


_RecipeLoader.add_constructor("tag:yaml.org,2002:int", _RecipeLoader.construct_bounded_number)
_RecipeLoader.add_constructor("tag:yaml.org,2002:float", _RecipeLoader.construct_bounded_number)


def _check_finite_numbers(name: str, data: Mapping[str, Any]) -> None:
    """Every number in ``data`` (method or model kwargs, at any depth) finite: no hyperparameter
    means anything as NaN or infinity, and the method's own checks compare with ``>``, which NaN passes."""
    stack: list[tuple[str, Any]] = [(name, data)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend((f"{key}.{k}", v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidValueError(f"{key} must be a finite number, got {value!r}")


# ---------------------------------------------------------------------- typed construction
_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return getattr(origin, "__name__", str(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check ``value`` against ``tp``; ints are accepted where floats are expected, bools never as numbers."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ClZooError(f"{source}: {key} must be a mapping, got {type(value).__name__}")
        return _build(tp, value, source, prefix=f"{key}.")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices or isinstance(value, bool):
            raise ClZooError(f"{source}: {key} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:  # Optional[X]: X's own message, which names the expected values
            return _coerce(value, non_none[0], key, source)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ClZooError:
                continue
        raise ClZooError(f"{source}: {key} must be {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ClZooError(f"{source}: {key} must be a list, got {type(value).__name__} {value!r}")
        return [_coerce(v, item_tp, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ClZooError(f"{source}: {key} must be a mapping, got {type(value).__name__} {value!r}")
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise ClZooError(f"{source}: {key} keys must be strings, got {bad[0]!r}")
        return copy.deepcopy(dict(value))
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ClZooError(f"{source}: {key} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ClZooError(f"{source}: {key} must be an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
            # PyYAML follows YAML 1.1, which reads ``5e-4`` (no dot) as a string.
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ClZooError(f"{source}: {key} must be a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ClZooError(f"{source}: {key} must be a string, got {type(value).__name__} {value!r}")
        return value
    raise TypeError(f"unsupported recipe field type {tp!r} for {key}")  # a bug in this module


def _build(cls: type, data: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        import difflib

        close = difflib.get_close_matches(str(unknown[0]), names, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ClZooError(f"{source}: unknown key {prefix}{unknown[0]}{hint}")
    kwargs = {name: _coerce(data[name], hints[name], prefix + name, source) for name in names if name in data}
    return cls(**kwargs)
