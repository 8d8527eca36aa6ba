"""cl-zoo's ResNet blocks are torchvision's: same names, same seeded weights, same outputs, and no torchvision import.

The reference below is cl-zoo's ResNet as it was built on ``torchvision.models.resnet`` until
2026-12 (every tier checkpoint was trained from it): a seed must give the very same tensors, or a
``cl-zoo pretrain`` run with a recorded seed would no longer reproduce.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from torchvision.models import resnet as tv_resnet

from cl_zoo.models.resnet import ResNet

_TV_DEPTHS = {18: (tv_resnet.BasicBlock, [2, 2, 2, 2]), 34: (tv_resnet.BasicBlock, [3, 4, 6, 3]),
              50: (tv_resnet.Bottleneck, [3, 4, 6, 3]), 101: (tv_resnet.Bottleneck, [3, 4, 23, 3])}


class TorchvisionBuilt(tv_resnet.ResNet):
    """The former cl_zoo.models.resnet.ResNet.__init__, on torchvision's blocks and _make_layer."""

    def __init__(self, depth: int, in_chans: int = 3, stem: str = "imagenet", width: float = 1.0, stem_width: int = 64,
                 zero_init_residual: bool = False) -> None:
        block, layers = _TV_DEPTHS[depth]
        nn.Module.__init__(self)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes, self.dilation, self.groups, self.base_width = stem_width, 1, 1, 64
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(in_chans, stem_width, kernel_size=7, stride=2, padding=3, bias=False)
            self.maxpool: nn.Module = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        else:
            self.conv1 = nn.Conv2d(in_chans, stem_width, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(stem_width)
        self.relu = nn.ReLU(inplace=True)
        planes = [max(1, int(round(64 * width * 2**i))) for i in range(4)]
        self.layer1 = self._make_layer(block, planes[0], layers[0])
        self.layer2 = self._make_layer(block, planes[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, planes[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, planes[3], layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, tv_resnet.Bottleneck):
                    nn.init.zeros_(m.bn3.weight)
                elif isinstance(m, tv_resnet.BasicBlock):
                    nn.init.zeros_(m.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return torch.flatten(self.avgpool(self.layer4(self.layer3(self.layer2(self.layer1(x))))), 1)


CONFIGS = [
    dict(depth=18), dict(depth=34, stem="cifar"), dict(depth=50), dict(depth=50, width=0.5, in_chans=1),
    dict(depth=18, stem="cifar", zero_init_residual=True), dict(depth=50, zero_init_residual=True, stem_width=32),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_a_seed_gives_torchvisions_weights_and_outputs(config: dict) -> None:
    torch.manual_seed(3)
    ours = ResNet(**config)
    torch.manual_seed(3)
    reference = TorchvisionBuilt(**config)
    a, b = ours.state_dict(), reference.state_dict()
    assert list(a) == list(b)  # names and order: what checkpoints and exports rely on
    for name in a:
        assert torch.equal(a[name], b[name]), name
    torch.manual_seed(4)
    ours.train()
    reference.train()
    x = torch.randn(2, config.get("in_chans", 3), 32 if config.get("stem") == "cifar" else 64, 64)
    assert torch.equal(ours(x), reference(x))  # train mode: batch statistics, and the running ones they update
    assert all(torch.equal(u, v) for u, v in zip(ours.state_dict().values(), reference.state_dict().values()))
    ours.eval()
    reference.eval()
    assert torch.equal(ours(x), reference(x))


def test_embedding_with_the_bundled_model_imports_no_torchvision() -> None:
    """torchvision's __init__ imports torch._dynamo (1.4-1.6 s on 2 cores): embedding needs none of it."""
    code = ("import sys, cl_zoo, numpy as np; from cl_zoo.embedding import extract_features, load_embedding_model; "
            "m = load_embedding_model(None); import cl_zoo.embedding.api, cl_zoo.cli.embed; "
            "bad = sorted(n for n in sys.modules if n.split('.')[0] == 'torchvision' or n.startswith('torch._dynamo')); "
            "print(bad[:5]); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
