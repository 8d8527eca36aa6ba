"""The authors' checkpoint files, rebuilt: reference encoders with the authors' parameter names and
wrapping, saved the way their training scripts save them.

Shared by the import tests (``tests/convert/``) and the release and cache tests that need a real
authors' file to download; see ``tests/convert/test_import_official.py`` for what each layout is.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torchvision.models import resnet as tv


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
