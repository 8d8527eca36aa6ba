"""Importing published checkpoints: exact original layouts, lossless conversion, same features.

The reference encoders below re-implement, with the authors' parameter names and wrapping, the
networks their training scripts save (see the docstring of :mod:`cl_zoo.convert.readers`):
MoCo/JCL (torchvision ResNet + fc or MLP head, momentum encoder, queue, DDP ``module.``), CACR
(MoCo v3: projector with BatchNorm1d, predictor, momentum encoder, GradScaler state) and CMC (its
own ResNet with a 64-channel stem and width-scaled stages, AvgPool2d(7), fc, l2norm; two of them
inside DataParallel). Most tests use ResNet-18 for MoCo-style layouts (same naming logic, much
faster); the full ResNet-50 names and shapes are checked on the meta device.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torchvision.models import resnet as tv

import cl_zoo
from cl_zoo.checkpoint import load_folder
from cl_zoo.cli import main
from cl_zoo.convert import readers as conv
from cl_zoo.convert import sources
from cl_zoo.errors import CheckpointError, HubError
from cl_zoo.models.releases import RELEASES, Release, UrlSource
from cl_zoo.ops.color import normalize_lab, rgb_to_lab
from cl_zoo.registry import _PRETRAINED, PretrainedCfg, build_arch, register_pretrained


# --------------------------------------------------------------------------------------------------
# Reference architectures, as the authors define them
# --------------------------------------------------------------------------------------------------


def _randomize_bn(module: nn.Module) -> None:
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.num_batches_tracked.fill_(1234)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)


class DDP(nn.Module):
    """Stands for DistributedDataParallel: only the ``module.`` prefix matters in the file."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


class MoCoRef(nn.Module):
    """facebookresearch/moco ``MoCo`` (also JCL's ``MoCoUnlimitedKeysDefault``)."""

    def __init__(self, depth: int = 18, dim: int = 128, K: int = 64, mlp: bool = True) -> None:
        super().__init__()
        arch = {18: tv.resnet18, 50: tv.resnet50}[depth]
        self.encoder_q = arch(num_classes=dim)
        self.encoder_k = arch(num_classes=dim)
        if mlp:
            d = self.encoder_q.fc.weight.shape[1]
            self.encoder_q.fc = nn.Sequential(nn.Linear(d, d), nn.ReLU(), self.encoder_q.fc)
            self.encoder_k.fc = nn.Sequential(nn.Linear(d, d), nn.ReLU(), self.encoder_k.fc)
        self.encoder_k.load_state_dict(self.encoder_q.state_dict())
        self.register_buffer("queue", nn.functional.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def backbone(self) -> nn.Module:
        return self.encoder_q

    def backbone_features(self, x: torch.Tensor) -> torch.Tensor:
        e = self.backbone()
        x = e.maxpool(e.relu(e.bn1(e.conv1(x))))
        x = e.layer4(e.layer3(e.layer2(e.layer1(x))))
        return torch.flatten(e.avgpool(x), 1)


def _mlp(num_layers: int, din: int, dhid: int, dout: int, last_bn: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(num_layers):
        a, b = (din if i == 0 else dhid), (dout if i == num_layers - 1 else dhid)
        layers.append(nn.Linear(a, b, bias=False))
        if i < num_layers - 1:
            layers += [nn.BatchNorm1d(b), nn.ReLU(inplace=True)]
        elif last_bn:
            layers.append(nn.BatchNorm1d(b, affine=False))
    return nn.Sequential(*layers)


class MoCoV3Ref(MoCoRef):
    """CACR-SSL ``MoCo_ResNet`` (MoCo v3): base/momentum encoders with projector, and a predictor."""

    def __init__(self, depth: int = 18, dim: int = 16, mlp_dim: int = 64) -> None:
        nn.Module.__init__(self)
        arch = {18: tv.resnet18, 50: tv.resnet50}[depth]
        self.base_encoder = arch(num_classes=mlp_dim, zero_init_residual=True)
        self.momentum_encoder = arch(num_classes=mlp_dim, zero_init_residual=True)
        hidden = self.base_encoder.fc.weight.shape[1]
        del self.base_encoder.fc, self.momentum_encoder.fc
        self.base_encoder.fc = _mlp(2, hidden, mlp_dim, dim)
        self.momentum_encoder.fc = _mlp(2, hidden, mlp_dim, dim)
        self.predictor = _mlp(2, dim, mlp_dim, dim, last_bn=False)

    def backbone(self) -> nn.Module:
        return self.base_encoder


class CMCBottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + residual)


class CMCResNet(nn.Module):
    """HobbitLong/CMC models/resnet.py ``ResNet(Bottleneck, [3,4,6,3], low_dim, in_channel, width)``."""

    def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), low_dim: int = 128, in_channel: int = 3, width: float = 1) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(in_channel, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.base = int(64 * width)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(self.base, layers[0])
        self.layer2 = self._make_layer(self.base * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(self.base * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(self.base * 8, layers[3], stride=2)
        self.avgpool = nn.AvgPool2d(7, stride=1)
        self.fc = nn.Linear(self.base * 8 * 4, low_dim)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * 4, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes * 4)
            )
        layers = [CMCBottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [CMCBottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, layer: int = 7) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x).view(x.size(0), -1)
        if layer == 6:
            return x
        return nn.functional.normalize(self.fc(x), dim=1)


class CMCPair(nn.Module):
    """CMC ``ResNetV1/V2/V3``: ``l_to_ab`` on L (1 channel), ``ab_to_l`` on ab (2 channels)."""

    def __init__(self, width: float) -> None:
        super().__init__()
        self.l_to_ab = CMCResNet(in_channel=1, width=width)
        self.ab_to_l = CMCResNet(in_channel=2, width=width)

    def forward(self, x: torch.Tensor, layer: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
        l, ab = torch.split(x, [1, 2], dim=1)
        return self.l_to_ab(l, layer), self.ab_to_l(ab, layer)


class MyResNetsCMC(nn.Module):
    def __init__(self, width: float) -> None:
        super().__init__()
        self.encoder = nn.DataParallel(CMCPair(width))  # -> 'encoder.module.l_to_ab.*'

    def forward(self, x: torch.Tensor, layer: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder.module(x, layer)


def _sgd_state(model: nn.Module) -> dict[str, Any]:
    params = list(model.parameters())
    return {
        "state": {i: {"momentum_buffer": torch.randn_like(p)} for i, p in enumerate(params[:3])},
        "param_groups": [{"lr": 0.03, "momentum": 0.9, "weight_decay": 1e-4, "nesterov": False,
                          "dampening": 0, "params": list(range(len(params)))}],
    }


# --------------------------------------------------------------------------------------------------
# Files in the authors' wrapping
# --------------------------------------------------------------------------------------------------


def moco_file(tmp_path: Path, mlp: bool, name: str = "checkpoint_0199.pth.tar", depth: int = 18) -> tuple[Path, MoCoRef]:
    torch.manual_seed(0)
    ref = MoCoRef(depth=depth, mlp=mlp)
    _randomize_bn(ref)
    wrapped = DDP(ref)
    top = {"epoch": 200, "arch": f"resnet{depth}", "state_dict": wrapped.state_dict(), "optimizer": _sgd_state(ref)}
    path = tmp_path / name
    torch.save(top, path)
    return path, ref.eval()


def cacr_file(tmp_path: Path) -> tuple[Path, MoCoV3Ref]:
    torch.manual_seed(1)
    ref = MoCoV3Ref()
    _randomize_bn(ref)
    scaler = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 17}
    top = {"epoch": 1000, "arch": "resnet18", "state_dict": DDP(ref).state_dict(), "optimizer": _sgd_state(ref), "scaler": scaler}
    path = tmp_path / "cacr.pth.tar"
    torch.save(top, path)
    return path, ref.eval()


def cmc_file(tmp_path: Path, width: float = 0.5, fp16: bool = True) -> tuple[Path, MyResNetsCMC]:
    torch.manual_seed(2)
    ref = MyResNetsCMC(width)
    _randomize_bn(ref)
    state = ref.state_dict()
    if fp16:  # apex amp O2 keeps conv/linear weights in half, BatchNorm in float
        with torch.no_grad():
            for m in ref.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    m.weight.copy_(m.weight.half().float())
        state = {k: (v.half() if v.dim() in (2, 4) else v) for k, v in ref.state_dict().items()}
    opt = argparse.Namespace(model="resnet50v1", nce_k=4096, nce_t=0.07, nce_m=0.5, feat_dim=128, amp=True,
                             opt_level="O2", view="Lab", lr_decay_epochs=[120, 160, 200], learning_rate=0.03)
    contrast = {"params": torch.tensor([4096.0, 0.07, -1.0, -1.0, 0.5]),
                "memory_l": torch.randn(32, 128), "memory_ab": torch.randn(32, 128)}
    top = {"opt": opt, "model": state, "contrast": contrast, "optimizer": _sgd_state(ref), "epoch": 240,
           "amp": {"loss_scaler0": {"loss_scale": 65536.0, "unskipped": 12}}}
    path = tmp_path / "CMC_resnet50v1.pth"
    torch.save(top, path)
    return path, ref.eval()


def run_cli(*args: str) -> int:
    return main(["import", *map(str, args)])


def images(n: int = 2, size: int = 224, seed: int = 3) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------------
# Lossless conversion and equal features
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,mlp", [("moco", False), ("jcl", True)])  # v1 linear head; v2/JCL MLP head
def test_moco_and_jcl_layouts(tmp_path: Path, fmt: str, mlp: bool, capsys: pytest.CaptureFixture[str]) -> None:
    path, ref = moco_file(tmp_path, mlp=mlp)
    out = tmp_path / "zoo"
    assert run_cli(fmt, path, "--out", out, "--arch", "resnet18") == 0
    assert "backbone tensors" in capsys.readouterr().out
    model = load_folder(out)
    src = ref.encoder_q.state_dict()
    converted = model.state_dict()
    assert set(converted) == {k for k in src if not k.startswith("fc.")}
    for key, value in converted.items():
        assert value.dtype == src[key].dtype and torch.equal(value, src[key]), key
    x = images(size=64)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), ref.backbone_features(x), rtol=0, atol=1e-6)
    config = json.loads((out / "config.json").read_text())
    report = config["conversion"]
    head = 4 if mlp else 2
    assert report["dropped"] == {"projection head (fc)": head, "momentum encoder (encoder_k)": len(ref.encoder_k.state_dict()),
                                 "queue": 1, "queue pointer": 1}
    assert report["state_key"] == "state_dict" and report["prefix"] == "module.encoder_q."
    assert set(report["top_level"]) == {"epoch", "arch", "optimizer"}
    assert report["source_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    card = (out / "README.md").read_text()
    assert "## Conversion" in card and "## Origin" in card and report["source_sha256"] in card


def test_jcl_card_names_the_release_licence_and_paper_numbers(tmp_path: Path) -> None:
    path, _ = moco_file(tmp_path, mlp=True)
    # JCL's release is a ResNet-50; with --arch resnet50 absent this ResNet-18 file must not be
    # described as it, so check the card through the registry's own import path instead.
    out, report = conv.import_checkpoint("jcl", path, tmp_path / "zoo", arch="resnet18", release_name="jcl_resnet50.in1k_official")
    card = (out / "README.md").read_text()
    assert "license: other" in card and "CC-BY-NC 4.0" in card and "no LICENSE file" in card  # honest, not invented
    assert "https://github.com/anonymouszyx/JCL/releases/download/v1/checkpoint_0199.pth.tar" in card
    assert "https://github.com/caiqi/Joint-Contrastive-Learning/blob/" in card  # the page it was copied from
    assert "68.7%" in card and "no checksum published" in card
    assert "Trained by the paper's authors" in card
    config = json.loads((out / "config.json").read_text())
    assert config["metrics"]["imagenet1k_linear_top1_reported"] == pytest.approx(0.687)
    assert config["cl_zoo_pretrained_cfg"]["url"] == RELEASES["jcl_resnet50.in1k_official"].sources[0].url


def test_cacr_layout(tmp_path: Path) -> None:
    path, ref = cacr_file(tmp_path)
    out = tmp_path / "zoo"
    assert run_cli("cacr", path, "--out", out, "--arch", "resnet18") == 0
    model = load_folder(out)
    src = ref.base_encoder.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(value, src[key]), key
    x = images(size=64)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), ref.backbone_features(x), rtol=0, atol=1e-6)
    report = json.loads((out / "config.json").read_text())["conversion"]
    assert report["prefix"] == "module.base_encoder."
    assert report["dropped"]["projection head (fc)"] == 1 + 5 + 1 + 3  # fc.0, fc.1 (BN), fc.3, fc.4 (BN, no affine)
    assert report["dropped"]["predictor"] == 1 + 5 + 1
    assert set(report["top_level"]) == {"epoch", "arch", "optimizer", "scaler"}


def test_cmc_layout_with_namespace_fp16_and_width_inference(tmp_path: Path) -> None:
    path, ref = cmc_file(tmp_path, width=0.5)
    out = tmp_path / "zoo"
    assert run_cli("cmc", path, "--out", out) == 0  # width 0.5 read from the file
    model = load_folder(out)
    assert model.arch_name == "cmc_resnet50x05_lab"
    pair = ref.encoder.module
    for ours, theirs in (("l_encoder.", pair.l_to_ab), ("ab_encoder.", pair.ab_to_l)):
        src = theirs.state_dict()
        for key, value in src.items():
            if key.startswith("fc."):
                continue
            assert value.dtype == model.state_dict()[ours + key].dtype
            assert torch.equal(model.state_dict()[ours + key], value), ours + key
    rgb = images(size=224)
    with torch.no_grad():
        lab = normalize_lab(rgb_to_lab(rgb))  # CMC's data loader: skimage rgb2lab, then Normalize
        feat_l, feat_ab = ref(lab, layer=6)
        expected = torch.cat([feat_l, feat_ab], dim=1)  # LinearProbing.py's concatenation
        torch.testing.assert_close(model.forward_features(rgb), expected, rtol=1e-5, atol=1e-5)
    report = json.loads((out / "config.json").read_text())["conversion"]
    assert report["prefix"] == "encoder.module.l_to_ab. / encoder.module.ab_to_l."
    assert report["dropped"] == {"projection heads (fc)": 4}
    assert report["cast_to_float32"] > 50  # every conv weight was stored in half
    assert report["top_level"]["opt"].startswith("argparse.Namespace")
    assert set(report["top_level"]) == {"opt", "contrast", "optimizer", "epoch", "amp"}
    card = (out / "README.md").read_text()
    assert "57.5%" in card and "bsd-2-clause" in card and "could not be identified" in card
    assert "CMC_resnet50v1.pth is not named on the page" in card  # the one name the page does not print


# --------------------------------------------------------------------------------------------------
# Full-size names and shapes (meta device: no memory, no compute)
# --------------------------------------------------------------------------------------------------


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


@pytest.mark.parametrize("fmt", ["moco", "jcl", "cacr"])
def test_full_resnet50_layouts_route_every_key(fmt: str) -> None:
    with torch.device("meta"):
        ref = MoCoV3Ref(depth=50, dim=256, mlp_dim=4096) if fmt == "cacr" else MoCoRef(depth=50, K=65536, mlp=True)
        ours = build_arch("resnet50")
    state = {"module." + k: v for k, v in ref.state_dict().items()}
    stripped, _ = conv._strip_dp(state)
    backbone, dropped, _ = conv.LAYOUTS[fmt].split(stripped, Path("x"), fmt)
    assert _shapes(backbone) == _shapes(ours.state_dict())
    assert sum(dropped.values()) + len(backbone) == len(state)
    if fmt != "cacr":
        assert tuple(state["module.queue"].shape) == (128, 65536)


@pytest.mark.parametrize("width,arch,features", [(0.5, "cmc_resnet50x05_lab", 2048), (1.0, "cmc_resnet50x1_lab", 4096),
                                                 (2.0, "cmc_resnet50x2_lab", 8192)])
def test_full_cmc_layouts_every_width(width: float, arch: str, features: int) -> None:
    with torch.device("meta"):
        ref = MyResNetsCMC(width)
        ours = build_arch(arch)
    backbone, dropped, _ = conv.LAYOUTS["cmc"].split(ref.state_dict(), Path("x"), "cmc")
    assert conv._infer_cmc_arch(backbone, Path("x")) == arch
    assert _shapes(backbone) == _shapes(ours.state_dict())
    assert dropped == {"projection heads (fc)": 4}
    assert tuple(ref.state_dict()["encoder.module.l_to_ab.conv1.weight"].shape) == (64, 1, 7, 7)  # stem stays 64 wide
    assert tuple(ref.state_dict()["encoder.module.ab_to_l.fc.weight"].shape) == (128, features // 2)
    assert ours.num_features == features


# --------------------------------------------------------------------------------------------------
# Refusals: unsafe pickles, tampered or mismatched files; nothing is written
# --------------------------------------------------------------------------------------------------


class NotAllowed:
    """A class outside the allowlist (unpickling it would import and call arbitrary code)."""

    def __init__(self) -> None:
        self.flag = 1


def _fails(capsys: pytest.CaptureFixture[str], *args: Any) -> str:
    assert run_cli(*args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert "weights_only=False" not in err and "weights_only" not in err.replace("weights_only=True", "")
    return err


def test_arbitrary_pickle_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, ref = moco_file(tmp_path, mlp=True)
    top = torch.load(path, weights_only=True)
    top["args"] = NotAllowed()
    torch.save(top, path)
    err = _fails(capsys, "moco", path, "--out", tmp_path / "zoo", "--arch", "resnet18")
    assert "refusing to load" in err and "NotAllowed" in err and "can run code" in err
    assert not (tmp_path / "zoo").exists()


def _edit_state(path: Path, edit: Any) -> None:
    with torch.serialization.safe_globals([argparse.Namespace]):
        top = torch.load(path, weights_only=True)
    edit(top)
    torch.save(top, path)


def test_tampered_and_mismatched_files_are_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "zoo"
    path, _ = moco_file(tmp_path, mlp=True)
    good = path.read_bytes()

    path.write_bytes(good[: len(good) // 2])  # truncated download
    assert "not a readable PyTorch checkpoint" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(b"<!DOCTYPE html><html><body>Google Drive can't scan this file for viruses</body></html>")
    assert "web page" in _fails(capsys, "jcl", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)
    _edit_state(path, lambda t: t["state_dict"].__setitem__("module.extra_head.weight", torch.zeros(3)))
    assert "do not belong to a moco checkpoint (first: extra_head.weight)" in _fails(
        capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)
    _edit_state(path, lambda t: t["state_dict"].pop("module.encoder_q.layer2.0.bn1.running_var"))
    assert "missing (first: layer2.0.bn1.running_var)" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)
    _edit_state(path, lambda t: t["state_dict"].__setitem__("module.encoder_q.layer3.1.conv2.weight", torch.zeros(256, 256, 1, 1)))
    assert "layer3.1.conv2.weight has shape (256, 256, 1, 1)" in _fails(
        capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)
    _edit_state(path, lambda t: t["state_dict"]["module.encoder_q.conv1.weight"].view(-1)[0:1].fill_(float("nan")))
    assert "NaN" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)  # right file, wrong depth
    assert "wrong --arch" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet50")
    assert "has no 'model' entry (has: epoch, arch, state_dict, optimizer)" in _fails(capsys, "cmc", path, "--out", out)
    assert "unknown model 'resnet5'" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet5")

    cacr, _ = cacr_file(tmp_path)  # a MoCo v3 file is not a MoCo v2 one
    assert "do not belong to a moco checkpoint (first: base_encoder.conv1.weight)" in _fails(
        capsys, "moco", cacr, "--out", out, "--arch", "resnet18")
    assert not out.exists()


def test_cmc_width_mismatch_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = cmc_file(tmp_path, width=0.5, fp16=False)
    err = _fails(capsys, "cmc", path, "--out", tmp_path / "zoo", "--arch", "cmc_resnet50x1_lab")
    assert "l_encoder.layer1.0.conv1.weight has shape (32, 64, 1, 1)" in err and "(64, 64, 1, 1)" in err
    assert not (tmp_path / "zoo").exists()


# --------------------------------------------------------------------------------------------------
# Registry entries: download, verify, convert, cache; offline errors
# --------------------------------------------------------------------------------------------------


def test_registry_entries_are_honest() -> None:
    names = cl_zoo.list_models("*.in1k*", pretrained=True)
    assert {"jcl_resnet50.in1k_official", "cmc_resnet50x05_lab.in1k_official", "cmc_resnet50x1_lab.in1k_official",
            "cmc_resnet50x2_lab.in1k_official", "cacr_resnet50.in1k_official", "mocov2_resnet50.in1k_official",
            "mocov2_resnet50.in1k_800ep_official", "mocov1_resnet50.in1k_official", "dcl_resnet50.in1k_lightly",
            "dclw_resnet50.in1k_lightly", "simclr_resnet50.in1k_lightly", "mocov2_resnet50.in1k_100ep_lightly"} <= set(names)
    for name, release in RELEASES.items():
        cfg = _PRETRAINED[name].cfg
        assert cfg.url and release.sources and cfg.sha256 == {}
        assert cfg.license and cfg.metrics and cfg.paper and release.recipe and release.trained_by
        assert cfg.notes.startswith(f"Trained by {release.trained_by}")
        assert release.by_authors == name.endswith("_official")  # lightly's runs never pass for the authors'
    moco = RELEASES["mocov2_resnet50.in1k_official"].sources[0]
    assert isinstance(moco, UrlSource) and moco.md5_prefix == "59fd9945"
    assert RELEASES["jcl_resnet50.in1k_official"].sources[0].url == (
        "https://github.com/anonymouszyx/JCL/releases/download/v1/checkpoint_0199.pth.tar")
    assert _PRETRAINED["cmc_resnet50x05_lab.in1k_official"].cfg.mean == (0.0, 0.0, 0.0)  # the model converts to Lab


def test_offline_error_is_one_line_and_names_the_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    # Independent of the caller's environment (CI exports HF_HUB_OFFLINE=1): each half sets the
    # offline state it tests.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("CL_ZOO_OFFLINE", "1")
    with pytest.raises(HubError) as info:
        cl_zoo.create_model("jcl_resnet50.in1k_official", pretrained=True)
    message = str(info.value)
    assert "\n" not in message and RELEASES["jcl_resnet50.in1k_official"].sources[0].url in message
    monkeypatch.delenv("CL_ZOO_OFFLINE")

    # The published host, unreachable: its address is swapped for a port nothing listens on, so the
    # real download client (torch.hub) gets a refused connection, at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(sources, "direct_url", lambda url, member=None: f"http://127.0.0.1:{port}/{url.rsplit('/', 1)[-1]}")
    with pytest.raises(HubError) as info:
        cl_zoo.create_model("mocov2_resnet50.in1k_official", pretrained=True)
    message = str(info.value)
    assert "\n" not in message and "refused" in message.lower() and "moco_v2_200ep_pretrain.pth.tar" in message
    assert not list((tmp_path / "cache" / "releases" / "downloads").glob("*"))  # no partial file left


@pytest.fixture
def file_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A registered entry whose 'URL' is a local file, to exercise download -> verify -> convert -> cache."""
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CL_ZOO_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    path, ref = moco_file(tmp_path, mlp=True, name="moco_v2_test.pth.tar")
    md5 = hashlib.md5(path.read_bytes()).hexdigest()[:8]
    created: list[str] = []

    def make(md5_prefix: str) -> str:
        name = f"mocov2_resnet18.test_official_{len(created)}"
        source = UrlSource(url=path.as_uri(), page=path.as_uri(), quote=path.as_uri(), md5_prefix=md5_prefix)
        release = Release(name=name, format="moco", arch="resnet18", filename=f"{name}.pth.tar", sources=(source,),
                          trained_by="the paper's authors (test)", recipe="test", licence_page="", licence_quote="",
                          reported={"imagenet1k_linear_top1_reported": 0.5}, reported_source="test")
        monkeypatch.setitem(RELEASES, name, release)
        register_pretrained(name, "resnet18", PretrainedCfg(url=source.url, method="mocov2", license="test", metrics=release.reported))
        created.append(name)
        return name

    yield make, md5, ref
    for name in created:
        _PRETRAINED.pop(name, None)


def test_registered_source_downloads_verifies_converts_and_caches(tmp_path: Path, file_release: Any) -> None:
    make, md5, ref = file_release
    name = make(md5)
    model = cl_zoo.create_model(name, pretrained=True)
    folder = tmp_path / "cache" / "releases" / name
    assert model.checkpoint_source == str(folder) and (folder / "config.json").is_file()
    for key, value in model.state_dict().items():
        assert torch.equal(value, ref.encoder_q.state_dict()[key]), key
    config = json.loads((folder / "config.json").read_text())
    assert config["conversion"]["matches_release"] == name and config["origin"].startswith("file://")
    (tmp_path / "cache" / "releases" / "downloads" / f"{name}.pth.tar").unlink()  # second load: cache only
    again = cl_zoo.create_model(name, pretrained=True)
    assert torch.equal(again.state_dict()["conv1.weight"], model.state_dict()["conv1.weight"])


def test_registered_source_with_wrong_checksum_is_rejected(tmp_path: Path, file_release: Any) -> None:
    make, md5, _ = file_release
    name = make("00000000" if md5 != "00000000" else "11111111")
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        cl_zoo.create_model(name, pretrained=True)
    assert not (tmp_path / "cache" / "releases" / name).exists()
