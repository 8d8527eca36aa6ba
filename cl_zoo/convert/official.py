"""Convert the authors' released checkpoints (JCL, CMC, CACR, MoCo v1/v2) into the zoo format.

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
``checkpoint_0199.pth.tar`` (GitHub release v0.1, CC BY-NC 4.0).

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

Safety: files are read with ``torch.load(weights_only=True)``. The only non-tensor, non-container
type allowed is ``argparse.Namespace`` (CMC's ``opt``): a plain attribute bag whose contents go
through the same restricted unpickler, so it cannot run code. Anything else is refused with the
name of the offending global.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn

from cl_zoo.checkpoint import MismatchMessages, load_state_into
from cl_zoo.errors import CheckpointError, HubError
from cl_zoo.fileio import atomic_path, file_lock

FORMATS = ("jcl", "cmc", "cacr", "moco")
SAFE_GLOBALS: tuple[type, ...] = (argparse.Namespace,)
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
    """``torch.load(weights_only=True)`` plus :data:`SAFE_GLOBALS`, with one-line refusals."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    _sniff(path)
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every refusal or parse error becomes a user-facing error
        message = str(exc)
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", message) or re.search(r"GLOBAL ([\w.]+)", message)
        if found:
            raise CheckpointError(
                f"refusing to load {path}: it contains a pickled {found.group(1)}, and unpickling arbitrary objects "
                "can run code. cl-zoo accepts only tensors, plain containers and argparse.Namespace. If you trust the "
                "file, re-save just its weights: torch.save({'state_dict': torch.load(f, weights_only=False)"
                "['state_dict']}, 'clean.pth')"
            ) from exc
        first = next((line.strip() for line in message.splitlines() if line.strip()), type(exc).__name__)
        raise CheckpointError(f"{path} is not a readable PyTorch checkpoint ({first[:200]})") from exc


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
        raise CheckpointError(f"{path}: '{where}' holds non-tensor entries (first: {bad[0]!r})")
    return dict(value)


def _unwrap(top: Any, keys: tuple[str, ...], path: Path, fmt: str) -> tuple[dict[str, torch.Tensor], str, dict[str, str]]:
    if not isinstance(top, Mapping):
        raise CheckpointError(f"{path} holds a {type(top).__name__}, not the dict a {fmt} checkpoint is")
    for key in keys:
        if key in top:
            state = _tensor_dict(top[key], key, path)
            others = {str(k): _describe(v) for k, v in top.items() if k != key}
            return state, key, others
    if top and all(isinstance(v, torch.Tensor) for v in top.values()):  # a bare state dict
        return _tensor_dict(top, "<top level>", path), "<top level>", {}
    raise CheckpointError(
        f"{path} has no {' or '.join(repr(k) for k in keys)} entry (has: {', '.join(map(str, list(top)[:8]))}); "
        f"is it really a {fmt} checkpoint?"
    )


# --------------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------------


def _strip_dp(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str]:
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


@dataclass(frozen=True)
class Layout:
    state_keys: tuple[str, ...]
    split: Split
    default_arch: str
    method: str


LAYOUTS: dict[str, Layout] = {
    "moco": Layout(("state_dict",), _moco_like("encoder_q.", _MOCO_EXTRAS), "resnet50", "mocov2"),
    "jcl": Layout(("state_dict",), _moco_like("encoder_q.", _MOCO_EXTRAS), "resnet50", "jcl"),
    "cacr": Layout(("state_dict",), _moco_like("base_encoder.", _CACR_EXTRAS), "resnet50", "cacr"),
    "cmc": Layout(("model",), _split_cmc, "cmc_resnet50x1_lab", "cmc"),
}


def _infer_cmc_arch(backbone: Mapping[str, torch.Tensor], path: Path) -> str:
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


def _file_digests(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            sha.update(block)
            md5.update(block)
    return sha.hexdigest(), md5.hexdigest()


def convert_checkpoint(fmt: str, path: str | os.PathLike[str], arch: str | None = None) -> tuple[nn.Module, ConversionReport]:
    """Read an author-released file and return the zoo model holding its backbone, plus a report."""
    from cl_zoo.registry import build_arch, get_arch

    if fmt not in LAYOUTS:
        raise CheckpointError(f"unknown checkpoint format {fmt!r}; choose from {', '.join(FORMATS)}")
    layout = LAYOUTS[fmt]
    path = Path(path)
    top = safe_load(path)
    state, state_key, others = _unwrap(top, layout.state_keys, path, fmt)
    state, prefix = _strip_dp(state)
    backbone, dropped, inner_prefix = layout.split(state, path, fmt)
    if fmt == "cmc" and arch is None:
        arch = _infer_cmc_arch(backbone, path)
    arch = arch or layout.default_arch
    get_arch(arch)  # unknown architecture -> "did you mean" error
    model = build_arch(arch)
    model.model_name = arch
    cast, filled = _load_into(model, backbone, path, arch, fmt)
    sha, _ = _file_digests(path)
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
    from cl_zoo.models.official import OFFICIAL_RELEASES

    return [r for r in OFFICIAL_RELEASES.values() if r.format == fmt and r.arch == arch]


def _card_sections(report: ConversionReport, release: Any | None, origin: str | None, verified: bool) -> dict[str, str]:
    from cl_zoo.registry import get_pretrained

    sections: dict[str, str] = {}
    origin_lines = [f"- Converted file: `{Path(report.source).name}`, sha256 `{report.source_sha256}`."]
    if origin:
        origin_lines.append(f"- Downloaded from: {origin}")
    if release is not None:
        cfg = get_pretrained(release.name).cfg
        origin_lines += [
            f"- Authors' release: {release.page} (file `{release.filename}`); licence: **{cfg.license}** "
            "(the converted weights keep the original licence).",
            f"- Paper: {cfg.paper}",
            f"- Published checksum: md5 prefix `{release.md5_prefix}`." if release.md5_prefix
            else "- Published checksum: none (the authors publish no hash; the sha256 above is what was converted).",
        ]
        if report.matches_release:
            origin_lines.append(f"- This file's checksum matches the registered release `{report.matches_release}`.")
        if cfg.notes:
            origin_lines.append(f"- Notes: {cfg.notes}")
        reported = ", ".join(f"{k.replace('_reported', '')} {v * 100:.1f}%" for k, v in release.reported.items())
        sections["Reported results"] = (
            f"{reported} ({release.reported_source}). These are the authors' numbers for their released file, "
            "not re-measured by cl-zoo."
            + ("" if verified else " This converted file could not be identified as that release (no published "
               "checksum, or a different file), so they are not recorded as its metrics.")
        )
        if release.citation:
            sections["Citation"] = f"```bibtex\n{release.citation}\n```"
    sections["Origin"] = "\n".join(origin_lines)
    dropped = ", ".join(f"{k} ({v} tensors)" for k, v in report.dropped.items()) or "nothing"
    conv = [
        f"`cl-zoo import {report.format}` read the file with `torch.load(weights_only=True)` "
        f"(weights under `{report.state_key}`, key prefix `{report.prefix}`) and kept {report.backbone_tensors} backbone "
        f"tensors, every one of them used by `{report.arch}` with identical names after the prefix and identical shapes.",
        f"Dropped: {dropped}. Other entries in the file (not weights): "
        + (", ".join(f"`{k}` ({v})" for k, v in report.top_level.items()) or "none") + ".",
    ]
    if report.cast_to_float32:
        conv.append(f"{report.cast_to_float32} float16 tensors were cast to float32 (exact).")
    if report.filled:
        conv.append(f"{len(report.filled)} absent BatchNorm `num_batches_tracked` counters were set to 0 (unused in eval).")
    sections["Conversion"] = " ".join(conv)
    return sections


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
    import dataclasses

    from cl_zoo.checkpoint import save_pretrained
    from cl_zoo.models.official import OFFICIAL_RELEASES
    from cl_zoo.registry import get_pretrained

    model, report = convert_checkpoint(fmt, path, arch)
    candidates = [OFFICIAL_RELEASES[release_name]] if release_name else _releases_for(fmt, report.arch)
    _, md5 = _file_digests(Path(path))
    release = None
    for cand in candidates:
        if (cand.sha256 and cand.sha256 == report.source_sha256) or (cand.md5_prefix and md5.startswith(cand.md5_prefix)):
            release, report.matches_release = cand, cand.name
            break
    if release is None and len(candidates) == 1:
        # Unverifiable (no published hash) or another file in the same layout: describe the official
        # release for reference (card), without claiming this file is it (no metrics in config).
        release = candidates[0]
    verified = bool(report.matches_release or release_name)
    if release is not None:
        cfg = dataclasses.replace(get_pretrained(release.name).cfg)
        if not verified:
            cfg.metrics = {}  # the paper's numbers describe the official file, not necessarily this one
        model.pretrained_cfg = cfg
        model.model_name = release.name if verified else f"{report.arch}.imported_{fmt}"
    else:
        model.pretrained_cfg.method = LAYOUTS[fmt].method
        model.model_name = f"{report.arch}.imported_{fmt}"
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} exists and is not a folder")
    # Stage next to the destination, then swap in: an interrupted import leaves no half folder.
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.importing-", dir=out.parent))
    try:
        save_pretrained(
            model,
            staging,
            extra_config={"conversion": report.to_dict(), "origin": origin},
            card_sections=_card_sections(report, release, origin, verified),
        )
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out, report


# --------------------------------------------------------------------------------------------------
# Registry source: download, verify, convert, cache
# --------------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """``$CL_ZOO_CACHE/official`` (default ``~/.cache/cl-zoo/official``)."""
    base = os.environ.get("CL_ZOO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cl-zoo")
    return Path(base) / "official"


def download(url: str, dest: Path, timeout: float = 60.0) -> Path:
    """Fetch ``url`` into ``dest`` atomically; network failures are one-line :class:`HubError`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "cl-zoo"})
        with atomic_path(dest, suffix=".part") as tmp, open(tmp, "wb") as fh, \
                urllib.request.urlopen(request, timeout=timeout) as response:
            shutil.copyfileobj(response, fh, length=1 << 20)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise HubError(f"cannot download {url} ({' '.join(str(reason).split())[:160]}); offline? "
                       "download it by hand and run `cl-zoo import`") from exc
    return dest


def load_official(entry: Any) -> nn.Module:
    """The registry's last source: the authors' file, converted once and cached as a zoo folder."""
    from cl_zoo.models.official import OFFICIAL_RELEASES

    cfg = entry.cfg
    release = OFFICIAL_RELEASES.get(entry.name)
    if release is None or not cfg.url:
        raise HubError(f"{entry.name} has no author-released source")
    folder = cache_root() / entry.name
    # One process downloads, verifies and converts; another asking at the same time waits, then
    # finds the finished folder (the lock file sits next to the cache entry).
    with file_lock(folder.with_name(f".{folder.name}.lock")):
        return _fill_official_cache(entry, release, folder)


def _fill_official_cache(entry: Any, release: Any, folder: Path) -> nn.Module:
    from cl_zoo.checkpoint import CONFIG_NAME, load_folder

    cfg = entry.cfg
    if (folder / CONFIG_NAME).is_file():
        model = load_folder(folder, model_name=entry.name)
        model.checkpoint_source = str(folder)
        return model
    raw = cache_root() / "downloads" / release.filename
    if not raw.is_file():
        if any((os.environ.get(v) or "").strip().upper() in {"1", "ON", "YES", "TRUE"} for v in ("CL_ZOO_OFFLINE", "HF_HUB_OFFLINE")):
            raise HubError(f"{cfg.url} is not cached in {cache_root()} and offline mode (CL_ZOO_OFFLINE/HF_HUB_OFFLINE) forbids downloading it")
        download(cfg.url, raw)
    sha, md5 = _file_digests(raw)
    pinned = cfg.sha256.get(release.filename) or release.sha256
    if (pinned and sha != pinned) or (release.md5_prefix and not md5.startswith(release.md5_prefix)):
        bad = raw.with_name(raw.name + ".bad")
        os.replace(raw, bad)
        expected = f"sha256 {pinned[:16]}..." if pinned else f"md5 {release.md5_prefix}..."
        raise CheckpointError(
            f"checksum mismatch for {cfg.url}: expected {expected}, got sha256 {sha[:16]}... / md5 {md5[:8]}...; "
            f"kept as {bad} for inspection"
        )
    import_checkpoint(release.format, raw, folder, arch=entry.arch, origin=cfg.url, release_name=entry.name)
    model = load_folder(folder, model_name=entry.name)
    model.checkpoint_source = str(folder)
    return model
