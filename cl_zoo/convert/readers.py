"""Readers for published checkpoint layouts (JCL, CMC, CACR, MoCo v1/v2, lightly's Lightning files).

Each reader turns one publisher's file into a zoo folder; where the files come from is
:mod:`cl_zoo.models.releases` (the registry entries) and :mod:`cl_zoo.convert.sources` (download).

Every layout below was read from the authors' code (facts only, no code copied):

**MoCo v1/v2** (facebookresearch/moco ``main_moco.py`` + ``moco/builder.py``). File: a dict
``{'epoch': int, 'arch': 'resnet50', 'state_dict': ..., 'optimizer': SGD state dict}`` (no argparse
object). ``state_dict`` is the DDP-wrapped ``MoCo`` module:

* ``module.encoder_q.<torchvision resnet50>``: ``conv1.weight [64,3,7,7]``, ``bn1.*``,
  ``layer1..4.<i>.{conv1,bn1,conv2,bn2,conv3,bn3,downsample.0,downsample.1}.*`` (torchvision names,
  stride on the 3x3 conv), BatchNorm ``weight/bias/running_mean/running_var/num_batches_tracked``;
* ``module.encoder_q.fc``: v1 ``fc.weight [128,2048]``/``fc.bias [128]``; v2 (``--mlp``)
  ``fc.0.weight [2048,2048]``, ``fc.0.bias``, ``fc.2.weight [128,2048]``, ``fc.2.bias`` (``fc.1`` is a ReLU);
* ``module.encoder_k.*``: the momentum copy, same names and shapes;
* ``module.queue [128, 65536]`` (L2-normalised keys, one per column), ``module.queue_ptr [1]`` (int64).

**JCL** (caiqi/Joint-Contrastive-Learning ``main_moco.py`` with ``--model_version
MoCoUnlimitedKeysDefault --mlp``; there is no main_jcl.py). Identical file and state layout to MoCo v2:
``epoch/arch/state_dict/optimizer``, ``module.encoder_q.*`` with the ``fc.0``/``fc.2`` MLP head,
``module.encoder_k.*``, ``module.queue [128, 65536]``, ``module.queue_ptr``. Release:
``checkpoint_0199.pth.tar`` (the README's link, under github.com/anonymouszyx/JCL/releases/download/v1).

**CACR** (JegZheng/CACR-SSL ``imagenet_pretraining``, MoCo v3 code). File: ``{'epoch', 'arch',
'state_dict', 'optimizer' (LARS), 'scaler' (GradScaler state: floats/ints)}``. ``state_dict`` is
the DDP-wrapped ``MoCo_ResNet`` built on ``torchvision.models.resnet50(zero_init_residual=True)``:

* ``module.base_encoder.<torchvision resnet50>`` as above;
* ``module.base_encoder.fc``: projector ``fc.0.weight [4096,2048]`` (no bias), ``fc.1`` BatchNorm1d(4096)
  with affine and running stats, ``fc.3.weight [256,4096]``, ``fc.4`` BatchNorm1d(256, affine=False)
  (``running_mean``, ``running_var``, ``num_batches_tracked`` only);
* ``module.momentum_encoder.*``: same names and shapes;
* ``module.predictor``: ``0.weight [4096,256]``, ``1.*`` BatchNorm1d(4096), ``3.weight [256,4096]``
  (no last BN).

**CMC** (HobbitLong/CMC ``train_CMC.py`` + ``models/resnet.py``). File: ``{'opt': argparse.Namespace
(the training flags), 'model': ..., 'contrast': NCEAverage state ('params', 'memory_l', 'memory_ab'
[n_data, 128]), 'optimizer', 'epoch', 'amp' (only with --amp)}``. ``model`` is the state of
``MyResNetsCMC``, whose ``encoder`` is an ``nn.DataParallel`` of ``ResNetV1/V2/V3`` (width 0.5/1/2
per view), so keys read ``encoder.module.l_to_ab.*`` (1-channel L input) and
``encoder.module.ab_to_l.*`` (2-channel ab input). CMC's own ``ResNet(block, layers, low_dim=128,
in_channel, width)``:

* stem ``conv1 [64, in_channel, 7, 7]`` and ``bn1 (64)`` whatever the width, then max-pool;
* ``base = int(64 * width)``; stages ``layer1..4`` of CMC's ``Bottleneck`` (same parameter names
  and stride placement as torchvision's: 1x1 ``conv1``, strided 3x3 ``conv2``, 1x1 ``conv3`` with
  ``planes*4`` outputs, ``downsample.0`` conv / ``downsample.1`` BN) with planes ``base, 2base,
  4base, 8base``; pooled width ``32 * base`` (1024 / 2048 / 4096 per view);
* ``avgpool = AvgPool2d(7, stride=1)`` (global only for 224x224 input; the zoo's adaptive pool is the
  same there), ``fc [128, 32*base]`` + bias, and a parameter-free ``l2norm``.

So ``l_to_ab.X`` maps to the zoo's ``l_encoder.X`` and ``ab_to_l.X`` to ``ab_encoder.X`` one-to-one
(:class:`cl_zoo.models.resnet.ResNet` with ``stem_width=64``, ``width=w`` has exactly these shapes); the
two ``fc`` layers are projection heads and are dropped. CMC evaluates ``layer=6`` features (pooled,
before ``fc``) of both views concatenated L first, which is what :class:`CMCDualEncoder` returns. The
released files were trained with apex amp O2, which stores convolution weights in float16: they are
cast to float32 (exact) and the report says how many were.

**lightly** (lightly-ai/lightly ``benchmarks/imagenet/resnet50/{simclr,dcl,dclw,mocov2}.py``, trained
with PyTorch Lightning). File: a Lightning ``.ckpt`` ``{'epoch', 'global_step', 'pytorch-lightning_version',
'state_dict', 'loops', 'callbacks', 'optimizer_states', 'lr_schedulers', 'hparams_name',
'hyper_parameters', ...}``. ``state_dict`` is the ``LightningModule``'s: ``backbone.<torchvision
resnet50>`` (``fc`` replaced by ``Identity``, so no ``fc`` keys), ``projection_head.layers.*``,
``online_classifier.classification_head.*``, for MoCo v2 also ``key_backbone.*``,
``key_projection_head.*`` and the loss's memory bank ``criterion.memory_bank.{bank,bank_ptr}``.
Everything outside ``backbone.`` is dropped, counted per top-level module.

Safety: every file is read with ``torch.load(weights_only=True)`` after the archive checks of
:mod:`cl_zoo.convert.restricted_pickle` (stored entries within the file's size, CRC-32, a bounded
pickle). The only non-tensor, non-container type allowed is ``argparse.Namespace`` (CMC's ``opt``):
a plain attribute bag whose contents go through the same restricted unpickler, so it cannot run
code. Lightning checkpoints may also pickle Lightning's ``AttributeDict``, rebuilt as a plain dict
(:data:`~cl_zoo.convert.restricted_pickle.LIGHTNING_GLOBALS`). Anything else is refused in one line
naming the offending globals, before anything is unpickled. Keys read from a file are checked to be
printable names of bounded length before any message or report repeats them.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn

from cl_zoo.checkpoint import MismatchMessages, load_state_into, save_pretrained
from cl_zoo.checkpoint.card import inline_code, inline_text
from cl_zoo.convert.restricted_pickle import LIGHTNING_GLOBALS, shown, weights_only_load
from cl_zoo.errors import CheckpointError
from cl_zoo.fileio import current_umask
from cl_zoo.models.releases import FORMATS, RELEASES
from cl_zoo.registry import build_arch, get_arch, get_pretrained
from cl_zoo.text import listed
from cl_zoo.validation import check_text

SAFE_GLOBALS: tuple[type, ...] = (argparse.Namespace,)
_MAX_KEY = 300  # characters in a state dict key (ResNet-50's longest is 40)
_CMC_ARCH_BY_WIDTH = {0.5: "cmc_resnet50x05_lab", 1.0: "cmc_resnet50x1_lab", 2.0: "cmc_resnet50x2_lab"}


@dataclass
class ConversionReport:
    """What was read, kept, dropped and changed: written into config.json and the model card."""

    format: str
    source: str
    source_sha256: str
    arch: str
    model_args: dict[str, Any]
    top_level: dict[str, str]  # entry -> short description
    state_key: str  # where the weights were ('state_dict', 'model')
    prefix: str
    backbone_tensors: int
    dropped: dict[str, int]  # group -> number of tensors
    cast_to_float32: int = 0
    filled: list[str] = field(default_factory=list)
    matches_release: str | None = None  # registry name whose checksum the source matched

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        dropped = ", ".join(f"{k}: {v}" for k, v in self.dropped.items()) or "nothing"
        lines = [
            f"read {self.source} ({self.format} layout, sha256 {self.source_sha256[:16]}...)",
            f"weights under '{self.state_key}', prefix '{self.prefix}': {self.backbone_tensors} backbone tensors -> {self.arch}",
            f"dropped (not part of the backbone): {dropped}",
            "other entries in the file: " + (", ".join(f"{k} ({v})" for k, v in self.top_level.items()) or "none"),
        ]
        if self.cast_to_float32:
            lines.append(f"{self.cast_to_float32} float16 tensors cast to float32 (exact)")
        if self.filled:
            lines.append(f"filled {len(self.filled)} absent BatchNorm counters with 0 (not used in eval)")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Reading a file safely
# --------------------------------------------------------------------------------------------------


def _sniff(path: Path) -> None:
    """Catch the common download accidents (an HTML page, an empty file) before unpickling."""
    with open(path, "rb") as fh:
        head = fh.read(512)
    if not head:
        raise CheckpointError(f"{path} is empty")
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype", b"<html", b"<?xml", b"{")):
        raise CheckpointError(
            f"{path} is not a PyTorch checkpoint but a web page or JSON ({head[:40]!r}...): the download "
            "was probably redirected to a login, quota or confirmation page; download it in a browser and run "
            "`cl-zoo import FORMAT FILE --out FOLDER`"
        )


def safe_load(path: str | os.PathLike[str]) -> Any:
    """An author's file: ``torch.load(weights_only=True)`` plus :data:`SAFE_GLOBALS`, with one-line refusals."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    _sniff(path)
    return weights_only_load(path, SAFE_GLOBALS, "argparse.Namespace",
                             "; a PyTorch Lightning checkpoint goes through `cl-zoo import lightly`")


def safe_load_lightning(path: str | os.PathLike[str]) -> Any:
    """A Lightning ``.ckpt``: the same load, also accepting Lightning's ``AttributeDict`` (rebuilt as a dict)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    _sniff(path)
    return weights_only_load(path, LIGHTNING_GLOBALS, "Lightning's AttributeDict and argparse.Namespace")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {list(value.shape)}"
    if isinstance(value, Mapping):
        return f"dict with {len(value)} entries"
    if isinstance(value, argparse.Namespace):
        return f"argparse.Namespace with {len(vars(value))} flags"
    if isinstance(value, (int, float, str, bool)) or value is None:
        return repr(value)[:40]
    return type(value).__name__


def _tensor_dict(value: Any, where: str, path: Path) -> dict[str, torch.Tensor]:
    if not isinstance(value, Mapping) or not value:
        raise CheckpointError(f"{path}: '{where}' is not a non-empty state dict ({_describe(value)})")
    bad = [k for k, v in value.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: '{where}' holds non-tensor entries (first: {shown(repr(bad[0]))})")
    # Every later message and report repeats these names: no terminal escapes, no megabyte lines.
    odd = [k for k in value if not k.isprintable() or len(k) > _MAX_KEY]
    if odd:
        raise CheckpointError(f"{path}: '{where}' has a key that is not a printable name of at most {_MAX_KEY} "
                              f"characters ({shown(repr(odd[0]))})")
    return dict(value)


def unwrap_state(top: Any, keys: tuple[str, ...], path: Path, fmt: str) -> tuple[dict[str, torch.Tensor], str, dict[str, str]]:
    if not isinstance(top, Mapping):
        raise CheckpointError(f"{path} holds a {type(top).__name__}, not the dict a {fmt} checkpoint is")
    for key in keys:
        if key in top:
            state = _tensor_dict(top[key], key, path)
            others = {shown(k, 80): _describe(v) for k, v in top.items() if k != key}
            return state, key, others
    if top and all(isinstance(v, torch.Tensor) for v in top.values()):  # a bare state dict
        return _tensor_dict(top, "<top level>", path), "<top level>", {}
    raise CheckpointError(
        f"{path} has no {' or '.join(repr(k) for k in keys)} entry (has: {', '.join(shown(k, 60) for k in list(top)[:8])}); "
        f"is it really a {fmt} checkpoint?"
    )


# --------------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------------


def strip_dp(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str]:
    """Remove the DataParallel/DDP ``module.`` prefix when every key has it."""
    if all(k.startswith("module.") for k in state):
        return {k[len("module."):]: v for k, v in state.items()}, "module."
    return dict(state), ""


def _split(
    state: Mapping[str, torch.Tensor], routes: Mapping[str, str], dropped_groups: Mapping[str, str], path: Path, fmt: str
) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Route every key: backbone (renamed), a known non-backbone group (dropped), or an error."""
    backbone: dict[str, torch.Tensor] = {}
    dropped: dict[str, int] = {}
    unexpected: list[str] = []
    for key, tensor in state.items():
        group = next((g for pattern, g in dropped_groups.items() if re.fullmatch(pattern, key)), None)
        if group is not None:
            dropped[group] = dropped.get(group, 0) + 1
            continue
        target = next((dst + key[len(src):] for src, dst in routes.items() if key.startswith(src)), None)
        if target is None:
            unexpected.append(key)
        else:
            backbone[target] = tensor
    if unexpected:
        raise CheckpointError(
            f"{path}: {len(unexpected)} entries do not belong to a {fmt} checkpoint (first: {unexpected[0]}); "
            "is the format right?"
        )
    if not backbone:
        wanted = " or ".join(repr(s) for s in routes)
        raise CheckpointError(f"{path}: no backbone weights under {wanted}; is it really a {fmt} checkpoint?")
    return backbone, dropped


Split = Callable[[dict[str, torch.Tensor], Path, str], tuple[dict[str, torch.Tensor], dict[str, int], str]]


def _moco_like(query: str, heads: Mapping[str, str]) -> Split:
    def split(state: dict[str, torch.Tensor], path: Path, fmt: str) -> tuple[dict[str, torch.Tensor], dict[str, int], str]:
        groups = {rf"{re.escape(query)}fc\..*": "projection head (fc)", **heads}
        return (*_split(state, {query: ""}, groups, path, fmt), query)

    return split


_MOCO_EXTRAS = {r"encoder_k\..*": "momentum encoder (encoder_k)", r"queue": "queue", r"queue_ptr": "queue pointer"}
_CACR_EXTRAS = {r"momentum_encoder\..*": "momentum encoder", r"predictor\..*": "predictor"}
_CMC_EXTRAS = {r"(l_to_ab|ab_to_l)\.fc\.(weight|bias)": "projection heads (fc)"}


def _split_cmc(state: dict[str, torch.Tensor], path: Path, fmt: str) -> tuple[dict[str, torch.Tensor], dict[str, int], str]:
    # DataParallel sits inside MyResNetsCMC: 'encoder.module.' (also accept re-saved 'encoder.' or bare).
    for wrapper in ("encoder.module.", "encoder.", ""):
        if all(k.startswith(wrapper) for k in state) and any(k.startswith(wrapper + "l_to_ab.") for k in state):
            inner = {k[len(wrapper):]: v for k, v in state.items()}
            routes = {"l_to_ab.": "l_encoder.", "ab_to_l.": "ab_encoder."}
            return (*_split(inner, routes, _CMC_EXTRAS, path, fmt), f"{wrapper}l_to_ab. / {wrapper}ab_to_l.")
    first = next(iter(state))
    raise CheckpointError(f"{path}: expected CMC keys 'encoder.module.l_to_ab.*' / 'ab_to_l.*', found e.g. {first!r}")


def _split_lightly(state: dict[str, torch.Tensor], path: Path, fmt: str) -> tuple[dict[str, torch.Tensor], dict[str, int], str]:
    """lightly's LightningModules keep the encoder at ``backbone.``; every other module is training-only."""
    backbone = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    if not backbone:
        first = next(iter(state))
        raise CheckpointError(f"{path}: no backbone weights under 'backbone.' (found e.g. {first!r}); "
                              "is it really a lightly checkpoint?")
    dropped: dict[str, int] = {}
    for key in state:
        if not key.startswith("backbone."):
            group = key.split(".", 1)[0]
            dropped[group] = dropped.get(group, 0) + 1
    return backbone, dropped, "backbone."


@dataclass(frozen=True)
class Layout:
    state_keys: tuple[str, ...]
    split: Split
    default_arch: str
    method: str | None  # None: the file does not say (lightly's SimCLR, DCL and DCLW files share a layout)


LAYOUTS: dict[str, Layout] = {
    "moco": Layout(("state_dict",), _moco_like("encoder_q.", _MOCO_EXTRAS), "resnet50", "mocov2"),
    "jcl": Layout(("state_dict",), _moco_like("encoder_q.", _MOCO_EXTRAS), "resnet50", "jcl"),
    "cacr": Layout(("state_dict",), _moco_like("base_encoder.", _CACR_EXTRAS), "resnet50", "cacr"),
    "cmc": Layout(("model",), _split_cmc, "cmc_resnet50x1_lab", "cmc"),
    "lightly": Layout(("state_dict",), _split_lightly, "resnet50", None),
}
READS_LIGHTNING = {"lightly"}  # layouts whose files pickle Lightning's training state too: LIGHTNING_GLOBALS


def infer_cmc_arch(backbone: Mapping[str, torch.Tensor], path: Path) -> str:
    """CMC's width is readable from the first block: ``layer1.0.conv1`` has ``int(64*width)`` outputs."""
    weight = backbone.get("l_encoder.layer1.0.conv1.weight")
    if weight is None:
        raise CheckpointError(f"{path}: CMC weights lack l_to_ab.layer1.0.conv1.weight; cannot tell the width")
    width = weight.shape[0] / 64
    if width not in _CMC_ARCH_BY_WIDTH:
        raise CheckpointError(f"{path}: CMC width {width:g} has no zoo architecture; pass --arch explicitly")
    return _CMC_ARCH_BY_WIDTH[width]


_IMPORT_MESSAGES = MismatchMessages(
    keys="{source} does not fit {arch} as a {fmt} checkpoint: {problems}; wrong --arch?",
    missing="{n} backbone weights missing (first: {first})",
    unexpected="{n} weights the architecture does not have (first: {first})",
    shape="{source} does not fit {arch}: {key} has shape {shape}, the architecture expects {expected}; "
          "wrong --arch (width/depth)?",
)


def _load_into(model: nn.Module, backbone: dict[str, torch.Tensor], path: Path, arch: str, fmt: str) -> tuple[int, list[str]]:
    """Strict, shape- and NaN-checked load; absent ``num_batches_tracked`` (pre-1.0 PyTorch) are filled."""
    expected = model.state_dict()
    filled = [k for k in expected if k not in backbone and k.endswith("num_batches_tracked")]
    for key in filled:
        backbone[key] = torch.zeros((), dtype=torch.long)
    cast = load_state_into(model, backbone, str(path), messages=_IMPORT_MESSAGES,
                           context={"arch": arch, "fmt": fmt}, check_finite=True)
    return cast, filled


def file_digests(path: Path) -> tuple[str, str]:
    """sha256 and md5 of a file in one pass (publishers pin one or the other)."""
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            sha.update(block)
            md5.update(block)
    return sha.hexdigest(), md5.hexdigest()


def convert_checkpoint(fmt: str, path: str | os.PathLike[str], arch: str | None = None) -> tuple[nn.Module, ConversionReport]:
    """Read an author-released file and return the zoo model holding its backbone, plus a report."""
    if fmt not in LAYOUTS:
        raise CheckpointError(f"unknown checkpoint format {fmt!r}; choose from {', '.join(FORMATS)}")
    layout = LAYOUTS[fmt]
    path = Path(path)
    top = safe_load_lightning(path) if fmt in READS_LIGHTNING else safe_load(path)
    state, state_key, others = unwrap_state(top, layout.state_keys, path, fmt)
    state, prefix = strip_dp(state)
    backbone, dropped, inner_prefix = layout.split(state, path, fmt)
    if fmt == "cmc" and arch is None:
        arch = infer_cmc_arch(backbone, path)
    arch = arch or layout.default_arch
    get_arch(arch)  # unknown architecture -> "did you mean" error
    model = build_arch(arch)
    model.model_name = arch
    cast, filled = _load_into(model, backbone, path, arch, fmt)
    sha, _ = file_digests(path)
    report = ConversionReport(
        format=fmt,
        source=str(path),
        source_sha256=sha,
        arch=arch,
        model_args={},
        top_level=others,
        state_key=state_key,
        prefix=prefix + inner_prefix,
        backbone_tensors=len(backbone) - len(filled),
        dropped=dropped,
        cast_to_float32=cast,
        filled=filled,
    )
    return model.eval(), report


# --------------------------------------------------------------------------------------------------
# Writing the zoo folder
# --------------------------------------------------------------------------------------------------


def _releases_for(fmt: str, arch: str) -> list[Any]:
    return [r for r in RELEASES.values() if r.format == fmt and r.arch == arch]


def _matches(release: Any, sha256: str, md5: str) -> bool:
    """Does the file carry a checksum one of the release's sources publishes?"""
    return any((src.sha256 and src.sha256 == sha256) or (getattr(src, "md5_prefix", None) and md5.startswith(src.md5_prefix))
               for src in release.sources)


def source_lines(release: Any) -> list[str]:
    """Each source, in the order tried, with the page it was copied from and that page's words."""
    lines = []
    for i, src in enumerate(release.sources, 1):
        pins = []
        if src.sha256:
            pins.append(f"sha256 `{src.sha256}`" + (f" (published at {src.sha256_page})" if getattr(src, "sha256_page", None) else ""))
        if getattr(src, "md5_prefix", None):
            pins.append(f"md5 prefix `{src.md5_prefix}` (published on the page)")
        quote = " / ".join(line.strip() for line in src.quote.splitlines())
        lines.append(
            f"{i}. `{src.describe()}` -- copied from {src.page}, which reads: \"{quote}\""
            + (f"; verified: {', '.join(pins)}" if pins else "; no checksum published")
            + (f" ({src.note})" if src.note else "") + "."
        )
    return lines


def conversion_card_sections(report: ConversionReport, release: Any | None, origin: str | None, verified: bool) -> dict[str, str]:
    sections: dict[str, str] = {}
    origin_lines = [f"- Converted file: `{Path(report.source).name}`, sha256 `{report.source_sha256}`."]
    if origin:
        origin_lines.append(f"- Downloaded from: {origin}")
    if release is not None:
        cfg = get_pretrained(release.name).cfg
        sections["Who trained it"] = (
            f"Trained by {release.trained_by}. Recipe: {release.recipe}. Paper: {cfg.paper}."
            + ("" if release.by_authors else " This is not the paper's own checkpoint: its numbers come from the "
               "publisher's recipe and evaluation, not the paper's.")
        )
        origin_lines += [
            f"- Release `{release.name}`; licence: **{cfg.license}** (the converted weights keep the original licence; "
            f"stated at {release.licence_page}: \"{release.licence_quote}\").",
            "- Sources, in the order cl-zoo tries them:",
            *(f"  {line}" for line in source_lines(release)),
        ]
        if report.matches_release:
            origin_lines.append(f"- This file's checksum matches the registered release `{report.matches_release}`.")
        if cfg.notes:
            origin_lines.append(f"- Notes: {cfg.notes}")
        reported = ", ".join(f"{k.replace('_reported', '')} {v * 100:.1f}%" for k, v in release.reported.items())
        who = "the authors'" if release.by_authors else "the publisher's (not the paper's)"
        quote = " / ".join(line.strip() for line in release.reported_quote.splitlines())
        sections["Reported results"] = (
            f"{reported} ({release.reported_source}; the source reads: \"{quote}\"). These are {who} numbers "
            "for the released file, not re-measured by cl-zoo."
            + ("" if verified else " This converted file could not be identified as that release (no published "
               "checksum, or a different file), so they are not recorded as its metrics.")
        )
        if release.citation:
            sections["Citation"] = f"```bibtex\n{release.citation}\n```"
    sections["Origin"] = "\n".join(origin_lines)
    dropped = ", ".join(f"{k} ({v} tensors)" for k, v in report.dropped.items()) or "nothing"
    reader = ("`torch.load(weights_only=True)` (torch's restricted unpickler: tensors and plain containers only, "
              "Lightning's `AttributeDict` read as a plain dict, nothing imported or called)"
              if report.format in READS_LIGHTNING else "`torch.load(weights_only=True)`")
    conv = [
        f"`cl-zoo import {report.format}` read the file with {reader} "
        f"(weights under {inline_code(report.state_key)}, key prefix {inline_code(report.prefix)}) and kept "
        f"{report.backbone_tensors} backbone tensors, every one of them used by `{report.arch}` with identical names "
        "after the prefix and identical shapes.",
        f"Dropped: {inline_text(dropped, 2000)}. Other entries in the file (not weights): "
        + (", ".join(f"{inline_code(k, 120)} ({inline_text(v, 200)})" for k, v in report.top_level.items()) or "none") + ".",
    ]
    if report.cast_to_float32:
        conv.append(f"{report.cast_to_float32} float16 tensors were cast to float32 (exact).")
    if report.filled:
        conv.append(f"{len(report.filled)} absent BatchNorm `num_batches_tracked` counters were set to 0 (unused in eval).")
    sections["Conversion"] = " ".join(conv)
    return sections


_ZOO_FILE = re.compile(r"(config\.json|README\.md|model\.safetensors|model\.safetensors\.index\.json"
                       r"|model-\d{5}-of-\d{5}\.safetensors)")


def check_replaceable_folder(out: str | os.PathLike[str]) -> Path:
    """``out`` as a Path when an import may write there: absent, empty, or a zoo folder (only the files
    :func:`cl_zoo.save_pretrained` writes), which the import replaces whole. Anything else there is the
    user's (an import used to delete a folder's photos and notes with the folder, and exit 0)."""
    out = Path(out)
    if out.is_symlink():
        raise CheckpointError(f"{out} is a symbolic link; give the folder itself, or a new one")
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} exists and is not a folder")
    if out.is_dir():
        foreign = sorted(e.name for e in os.scandir(out) if not (e.is_file(follow_symlinks=False) and _ZOO_FILE.fullmatch(e.name)))
        if foreign:
            raise CheckpointError(f"{out} holds files that are not a zoo folder's ({listed(foreign, 3)}); an import replaces the "
                                  "whole folder: choose a new or empty one")
    return out


def import_checkpoint(
    fmt: str,
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    arch: str | None = None,
    origin: str | None = None,
    release_name: str | None = None,
) -> tuple[Path, ConversionReport]:
    """Convert ``path`` and write a zoo folder at ``out`` (complete or not at all)."""
    if origin is not None:
        check_text("--origin", origin)  # written into config.json and the card as UTF-8, at the very end
    check_replaceable_folder(out)  # before the checkpoint is read
    model, report = convert_checkpoint(fmt, path, arch)
    candidates = [RELEASES[release_name]] if release_name else _releases_for(fmt, report.arch)
    _, md5 = file_digests(Path(path))
    release = None
    for cand in candidates:
        if _matches(cand, report.source_sha256, md5):
            release, report.matches_release = cand, cand.name
            break
    if release is None and len(candidates) == 1:
        # Unverifiable (no published hash) or another file in the same layout: describe the registered
        # release for reference (card), without claiming this file is it (no metrics in config).
        release = candidates[0]
    verified = bool(report.matches_release or release_name)
    if release is not None:
        cfg = replace(get_pretrained(release.name).cfg)
        if not verified:
            cfg.metrics = {}  # the reported numbers describe the released file, not necessarily this one
        model.pretrained_cfg = cfg
        model.model_name = release.name if verified else f"{report.arch}.imported_{fmt}"
    else:
        model.pretrained_cfg.method = LAYOUTS[fmt].method
        model.model_name = f"{report.arch}.imported_{fmt}"
    out = check_replaceable_folder(out)  # again: the conversion took a while
    # Stage next to the destination, then swap in: an interrupted import leaves no half folder.
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.importing-", dir=out.parent))
    try:
        os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp's 0700 would become the folder's mode
        save_pretrained(
            model,
            staging,
            extra_config={"conversion": report.to_dict(), "origin": origin},
            card_sections=conversion_card_sections(report, release, origin, verified),
            card_folder=out,  # the card names where the folder ends up, not the staging folder
        )
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out, report
