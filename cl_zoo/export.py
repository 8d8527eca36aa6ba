"""Export a zoo ResNet backbone for detectron2, torchvision or timm.

Every exporter starts from the same place: a torchvision-named ResNet state dict (``conv1``,
``bn1``, ``layer1``..``layer4``) pulled out of whatever the user points at: a zoo model, a
checkpoint folder, or a raw training checkpoint whose keys carry prefixes such as
``module.encoder_q.``, ``backbone.`` or ``encoder.``. Projection heads, classifiers, momentum
(key/target/EMA) encoders and queues are dropped and listed in the summary, so a user can see that
the query encoder, and nothing else, went out.

detectron2 (facts checked against ``detectron2/modeling/backbone/resnet.py`` and
``detectron2/checkpoint/{detection_checkpoint,c2_model_loading}.py``):

* ``build_resnet_backbone`` names the stem ``stem.conv1`` (a 7x7 stride-2 conv followed by a
  fixed 3x3 max-pool) and the stages ``res2``..``res5``; each block holds ``conv1``..``conv3``
  (``conv1``/``conv2`` for R18/R34) and a ``shortcut`` only when its input and output widths
  differ, exactly where torchvision has ``downsample``. detectron2's ``Conv2d`` carries its
  normalisation as a submodule, hence ``convK.norm.*`` and ``shortcut.norm.*``.
* With ``RESNETS.NORM: SyncBN`` (or naiveSyncBN, BN) the norms are BatchNorm subclasses whose
  state is ``weight``, ``bias``, ``running_mean``, ``running_var``; we drop
  ``num_batches_tracked`` so FrozenBN configs load the same file.
* ``STRIDE_IN_1X1: False`` puts the stride in the 3x3 conv, which is torchvision's (v1.5) layout;
  the MoCo configs set it, and so do ours.
* ``DetectionCheckpointer._load_file`` returns a ``.pkl`` holding ``"model"`` and ``"__author__"``
  as is. Only ``__author__ == "Caffe2"`` triggers the C2 renaming (``*_bn_s`` -> ``norm.weight``
  etc.), so our names must already be detectron2's. ``matching_heuristics: True`` makes it match
  each model key to the longest checkpoint key that is a dot-suffix of it, which is how
  ``res5.*`` lands in ``roi_heads.res5.*`` for the C4 head and ``res2.*`` in
  ``backbone.bottom_up.res2.*`` for FPN; the C4 head's extra ``res5.norm`` stays freshly
  initialised, as in the MoCo protocol.

timm (checked against ``timm/models/resnet.py``): the plain ``resnet18/34/50/101`` use
torchvision's names, including ``downsample.0``/``downsample.1``; the classifier is ``fc``.
Our backbones have no classifier, so load the file into ``timm.create_model(name, num_classes=0)``
(``fc`` becomes Identity) or with ``strict=False`` apart from ``fc``.
"""

from __future__ import annotations

import os
import pickle
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torchvision.models import resnet as tv

from cl_zoo.errors import CheckpointError
from cl_zoo.factory import load_model
from cl_zoo.models.cmc_dual import CMCDualEncoder
from cl_zoo.fileio import atomic_path
from cl_zoo.registry import is_timm_arch

# A key of a torchvision ResNet backbone (no classifier), relative to the backbone.
_BN = r"(weight|bias|running_mean|running_var|num_batches_tracked)"
_RESNET_KEY = re.compile(
    rf"^(conv1\.weight|bn1\.{_BN}|layer[1-4]\.\d+\.(conv[1-3]\.weight|bn[1-3]\.{_BN}"
    rf"|downsample\.0\.weight|downsample\.1\.{_BN}))$"
)
# Sub-networks that are never the encoder to transfer: momentum/key/target/teacher copies.
_MOMENTUM = re.compile(r"(encoder_k|key_encoder|momentum|target|teacher|ema|_k\.|\bk_encoder)", re.I)

# (block kind, blocks per stage) -> depth, as in torchvision and detectron2.
_DEPTH_BY_LAYOUT: dict[tuple[str, tuple[int, ...]], int] = {
    ("basic", (2, 2, 2, 2)): 18,
    ("basic", (3, 4, 6, 3)): 34,
    ("bottleneck", (3, 4, 6, 3)): 50,
    ("bottleneck", (3, 4, 23, 3)): 101,
    ("bottleneck", (3, 8, 36, 3)): 152,
}

TARGETS = ("detectron2", "torchvision", "timm")


@dataclass
class ResNetWeights:
    """A torchvision-named ResNet state dict and where it came from."""

    state: dict[str, torch.Tensor]
    depth: int
    source: str
    prefix: str = ""
    dropped: list[str] = field(default_factory=list)  # original keys left out


@dataclass
class ExportSummary:
    """What an export wrote, renamed and left out, for the CLI and for tests."""

    target: str
    path: str
    depth: int
    source: str
    prefix: str
    renamed: dict[str, str]  # source key (without prefix) -> written key
    dropped: list[str]

    def dropped_groups(self) -> list[tuple[str, int]]:
        """Dropped keys grouped as the user thinks of them (a momentum encoder, a head, BN counters)."""
        depth = max(1, self.prefix.count("."))

        def group(key: str) -> str:
            if key.endswith("num_batches_tracked"):
                return "*.num_batches_tracked"
            parts = key.split(".")
            n = depth + 1 if key.startswith(self.prefix) else depth
            return ".".join(parts[:n]) + (".*" if len(parts) > n else "")

        return Counter(group(k) for k in self.dropped).most_common()

    def text(self) -> str:
        lines = [
            f"wrote {self.path} ({self.target}, ResNet-{self.depth}, {len(self.renamed)} tensors)",
            f"source: {self.source}" + (f" (encoder prefix {self.prefix!r})" if self.prefix else ""),
        ]
        examples = list(self.renamed.items())[:3]
        if any(src != dst for src, dst in examples):
            lines.append("renamed, e.g. " + ", ".join(f"{s} -> {d}" for s, d in examples))
        if self.dropped:
            groups = ", ".join(f"{g} ({n})" for g, n in self.dropped_groups()[:8])
            more = "" if len(self.dropped_groups()) <= 8 else ", ..."
            lines.append(f"dropped {len(self.dropped)} keys: {groups}{more}")
        else:
            lines.append("dropped nothing")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Finding the backbone
# --------------------------------------------------------------------------------------------


def _unwrap_checkpoint(obj: Any, source: str) -> dict[str, torch.Tensor]:
    """A training checkpoint's weights: the mapping of tensors, possibly under a known key."""
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model", "model_state", "module", "network", "net"):
            inner = obj.get(key)
            if isinstance(inner, Mapping) and any(isinstance(v, torch.Tensor) for v in inner.values()):
                return _unwrap_checkpoint(inner, source)
        tensors = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if tensors:
            return tensors
    raise CheckpointError(f"{source} holds no tensors (expected a state dict or a dict with 'state_dict')")


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from exc
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad or unsafe pickle
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot read {path} as a PyTorch checkpoint ({first})") from exc
    return _unwrap_checkpoint(obj, str(path))


def _load_model(spec: str) -> nn.Module:
    """The user's ``--model`` string as a model, through the one resolver every command uses."""
    return load_model(spec)


def _depth(state: Mapping[str, torch.Tensor], source: str) -> int:
    blocks = []
    for stage in range(1, 5):
        ids = {int(k.split(".")[1]) for k in state if k.startswith(f"layer{stage}.")}
        if not ids or ids != set(range(len(ids))):
            raise CheckpointError(f"{source}: ResNet stage layer{stage} is missing or has gaps")
        blocks.append(len(ids))
    kind = "bottleneck" if "layer1.0.conv3.weight" in state else "basic"
    depth = _DEPTH_BY_LAYOUT.get((kind, tuple(blocks)))
    if depth is None:
        raise CheckpointError(f"{source}: {kind} blocks {blocks} are not a standard ResNet depth")
    return depth


def resnet_weights(
    source: str | nn.Module | Mapping[str, torch.Tensor] | ResNetWeights, prefix: str | None = None
) -> ResNetWeights:
    """Extract the (query) encoder's torchvision-named ResNet weights from a model or checkpoint.

    The encoder is found by prefix: every key is split into ``<prefix><resnet key>``; prefixes
    that name a momentum/target copy are ignored, and of the rest the one with the most keys wins.
    Two equally large candidates (e.g. CMC's two halves) are ambiguous and need ``prefix``.
    Weights already extracted pass through, so a caller that needs the depth first (``cl-zoo
    detect``) reads a checkpoint once, not once per step.
    """
    if isinstance(source, ResNetWeights):
        return source
    if isinstance(source, nn.Module):
        name = getattr(source, "model_name", None) or type(source).__name__
        if isinstance(source, CMCDualEncoder) and prefix is None:
            # Saying "choose one with --prefix" would send the user to a second refusal: neither half
            # takes RGB (the L half has a 1-channel stem, the ab half a 2-channel one).
            raise CheckpointError(
                f"{name} is CMC's L/ab pair (a ResNet on the L channel and one on ab, features concatenated), "
                "not an RGB ResNet: torchvision, timm and detectron2 cannot hold it; use it with cl-zoo embed/knn/linear-eval"
            )
        state = dict(source.state_dict())
        label = f"{name} ({type(source).__name__})"
    elif isinstance(source, Mapping):
        state, label = _unwrap_checkpoint(source, "state dict"), "state dict"
    else:
        path = Path(source)
        if path.is_file():
            state, label = _read_file(path), str(path)
        else:
            model = _load_model(str(source))
            return resnet_weights(model, prefix)

    by_prefix: dict[str, list[str]] = {}
    for key in state:
        match = None
        for start in range(len(key) + 1):
            if (start == 0 or key[start - 1] == ".") and _RESNET_KEY.match(key[start:]):
                match = key[:start]
                break
        if match is not None:
            by_prefix.setdefault(match, []).append(key)
    if prefix is not None:
        if prefix and not prefix.endswith("."):
            prefix += "."
        if prefix not in by_prefix:
            found = ", ".join(repr(p) for p in sorted(by_prefix)) or "none"
            raise CheckpointError(f"{label}: no ResNet weights under prefix {prefix!r} (found: {found})")
        chosen = prefix
    else:
        candidates = {p: ks for p, ks in by_prefix.items() if not _MOMENTUM.search(p) and any(
            k.endswith("conv1.weight") and k[len(p):] == "conv1.weight" for k in ks)}
        if not candidates:
            if isinstance(source, nn.Module) and is_timm_arch(str(getattr(source, "arch_name", ""))):
                raise CheckpointError(
                    f"{label} is not a ResNet backbone, and its checkpoint folder already loads in timm as it is: "
                    "timm.create_model('local-dir:FOLDER', pretrained=True) (cl-zoo export writes ResNet weights only)")
            raise CheckpointError(f"{label} is not a ResNet backbone: no torchvision-style conv1/bn1/layer1..4 weights found")
        ranked = sorted(candidates, key=lambda p: (-len(candidates[p]), len(p)))
        if len(ranked) > 1 and len(candidates[ranked[0]]) == len(candidates[ranked[1]]):
            names = ", ".join(repr(p) for p in ranked[:4])
            raise CheckpointError(f"{label} holds several ResNets ({names}); choose one with --prefix")
        chosen = ranked[0]
    kept = set(by_prefix[chosen])
    backbone = {k[len(chosen):]: v for k, v in state.items() if k in kept}
    dropped = [k for k in state if k not in kept]
    depth = _depth(backbone, label)
    return ResNetWeights(backbone, depth, label, chosen, dropped)


def check_standard_layout(weights: ResNetWeights, target: str) -> None:
    """Refuse weights that the target's stock ResNet could not hold (CIFAR stem, widths, channels)."""
    with torch.device("meta"):
        reference = getattr(tv, f"resnet{weights.depth}")().state_dict()
    conv1 = weights.state.get("conv1.weight")
    if conv1 is not None and tuple(conv1.shape[-2:]) != (7, 7):
        raise CheckpointError(
            f"{weights.source}: {target} needs the ImageNet stem (7x7 stride-2 conv + max-pool); this "
            f"backbone has a {conv1.shape[-2]}x{conv1.shape[-1]} stem (a CIFAR ResNet) and cannot be exported"
        )
    for key, tensor in weights.state.items():
        ref = reference.get(key)
        if ref is None:
            raise CheckpointError(f"{weights.source}: {key} has no counterpart in a ResNet-{weights.depth}")
        if tuple(tensor.shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{weights.source}: {key} has shape {tuple(tensor.shape)} but a stock ResNet-{weights.depth} "
                f"has {tuple(ref.shape)} (non-standard width or input channels); {target} cannot load it"
            )
    missing = [k for k in reference if not k.startswith("fc.") and not k.endswith("num_batches_tracked")
               and k not in weights.state]
    if missing:
        raise CheckpointError(f"{weights.source}: incomplete ResNet-{weights.depth}, {len(missing)} tensors "
                              f"missing (first: {missing[0]})")


# --------------------------------------------------------------------------------------------
# Renaming
# --------------------------------------------------------------------------------------------


def detectron2_name(key: str) -> str | None:
    """detectron2's name for a torchvision ResNet key; None for what detectron2 does not keep."""
    if key.endswith("num_batches_tracked"):
        return None
    if key == "conv1.weight":
        return "stem.conv1.weight"
    if key.startswith("bn1."):
        return "stem.conv1.norm." + key[len("bn1."):]
    m = re.match(r"^layer([1-4])\.(\d+)\.(.+)$", key)
    if m is None:
        raise CheckpointError(f"unexpected ResNet key {key!r}")
    stage, block, rest = int(m.group(1)) + 1, m.group(2), m.group(3)
    rest = re.sub(r"^bn([1-3])\.", r"conv\1.norm.", rest)
    rest = re.sub(r"^downsample\.0\.", "shortcut.", rest)
    rest = re.sub(r"^downsample\.1\.", "shortcut.norm.", rest)
    return f"res{stage}.{block}.{rest}"


# The suffix each target's loader recognises its format by: timm's load_checkpoint reads only a
# ``.safetensors`` name as safetensors (any other it unpickles with torch.load), detectron2's
# checkpointer applies its name matching only to a ``.pkl``. torch.load reads any name.
REQUIRED_SUFFIX: dict[str, str] = {"detectron2": ".pkl", "timm": ".safetensors"}


def check_export_path(target: str, out: str | os.PathLike[str]) -> Path:
    """``out`` when its name is one ``target``'s loader reads as what is written, else one line naming the fix."""
    out = Path(out)
    suffix = REQUIRED_SUFFIX.get(target)
    if suffix and out.suffix != suffix:
        raise CheckpointError(f"OUT {out} must end in {suffix}, the name {target} reads this format by; "
                              f"name it {out.with_suffix(suffix)}")
    return out


def _atomic_write(out: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
    """Refuse a folder as the output, then let ``write`` fill a same-folder temporary (see fileio)."""
    out = Path(out)
    if out.is_dir():
        raise CheckpointError(f"{out} is a folder; give a file name")
    with atomic_path(out) as tmp:
        write(str(tmp))
    return out


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.is_floating_point():
        t = t.float()
    return np.ascontiguousarray(t.numpy())


def detectron2_state(weights: ResNetWeights) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """(detectron2 name -> array, source -> detectron2 name, keys dropped in renaming)."""
    model: dict[str, np.ndarray] = {}
    renamed: dict[str, str] = {}
    dropped: list[str] = []
    for key, tensor in weights.state.items():
        name = detectron2_name(key)
        if name is None:
            dropped.append(weights.prefix + key)
            continue
        model[name] = _to_numpy(tensor)
        renamed[key] = name
    return model, renamed, dropped


def export_detectron2(
    source: str | nn.Module | Mapping[str, torch.Tensor] | ResNetWeights,
    out: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    author: str = "cl-zoo",
) -> ExportSummary:
    """Write ``{"model": {name: ndarray}, "__author__": author, "matching_heuristics": True}`` to a ``.pkl`` ``out``."""
    check_export_path("detectron2", out)
    weights = resnet_weights(source, prefix)
    check_standard_layout(weights, "detectron2")
    model, renamed, dropped = detectron2_state(weights)
    payload = {"model": model, "__author__": author, "matching_heuristics": True}

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            pickle.dump(payload, f, protocol=4)

    path = _atomic_write(out, write)
    return ExportSummary("detectron2", str(path), weights.depth, weights.source, weights.prefix, renamed,
                         weights.dropped + dropped)


def torchvision_state(weights: ResNetWeights) -> dict[str, torch.Tensor]:
    """Float32 torchvision ResNet state without ``fc``; BN counters added where a checkpoint lacks them."""
    state: dict[str, torch.Tensor] = {}
    for key, tensor in weights.state.items():
        t = tensor.detach().cpu()
        state[key] = (t.float() if t.is_floating_point() else t).contiguous().clone()
    for key in list(state):
        if key.endswith(".running_var"):
            counter = key[: -len("running_var")] + "num_batches_tracked"
            state.setdefault(counter, torch.tensor(0, dtype=torch.long))
    return state


def export_torchvision(
    source: str | nn.Module | Mapping[str, torch.Tensor], out: str | os.PathLike[str], *, prefix: str | None = None
) -> ExportSummary:
    """A ``.pth`` state dict for ``torchvision.models.resnetNN()`` (strict apart from ``fc``)."""
    weights = resnet_weights(source, prefix)
    check_standard_layout(weights, "torchvision")
    state = torchvision_state(weights)
    path = _atomic_write(out, lambda tmp: torch.save(state, tmp))
    return ExportSummary("torchvision", str(path), weights.depth, weights.source, weights.prefix,
                         {k: k for k in state}, weights.dropped)


def export_timm(
    source: str | nn.Module | Mapping[str, torch.Tensor], out: str | os.PathLike[str], *, prefix: str | None = None
) -> ExportSummary:
    """A ``.safetensors`` file for timm's ``resnetNN`` (same names as torchvision; no ``fc``)."""
    check_export_path("timm", out)
    weights = resnet_weights(source, prefix)
    check_standard_layout(weights, "timm")
    state = torchvision_state(weights)
    metadata = {"format": "pt", "architecture": f"resnet{weights.depth}", "exported_by": "cl-zoo"}
    path = _atomic_write(out, lambda tmp: save_file(state, tmp, metadata=metadata))
    return ExportSummary("timm", str(path), weights.depth, weights.source, weights.prefix,
                         {k: k for k in state}, weights.dropped)


EXPORTERS: dict[str, Callable[..., ExportSummary]] = {
    "detectron2": export_detectron2,
    "torchvision": export_torchvision,
    "timm": export_timm,
}
