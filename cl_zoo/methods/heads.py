"""Projection heads: the small network between the pooled features and the contrastive loss.

SimCLR (Sec. 2.1, Appendix B.4) and MoCo v2 use Linear-ReLU-Linear; SiMo ("MLP head with BN",
EqCo Sec. 3) and MoCo v2+ put a BatchNorm after each linear layer. CMC's original head is a single
linear layer. The head is discarded after pretraining: only the backbone is exported.

The head runs in float32 even inside a bf16/fp16 training step. Its output is what the loss
compares, at temperatures of 0.07-0.2: the losses upcast their inputs (:mod:`cl_zoo.losses._common`),
but an output already rounded to bf16's 8 mantissa bits has lost what they upcast for. In the CPU
A/B of ``benchmarks/lightly_ab.py`` (DCL, CIFAR-10 subset) bf16 with the head under autocast
trailed fp32's kNN on every seed, by more the longer it trained, while bf16 with the head in fp32
matched fp32 (docs/results.md, "bf16 and the projection head"). The cost is two small matmuls in
fp32 next to the backbone's convolutions: epochs took the same time with either head.
"""

from __future__ import annotations

from torch import Tensor, nn

from cl_zoo.precision import autocast_off


class ProjectionHead(nn.Module):
    """``num_layers`` linear layers (1 = linear projection), ReLU between them.

    ``batch_norm=True`` puts BN after every linear layer (the last one without affine, as MoCo v2+
    and SiMo's code do, so the output scale is not learned away before L2 normalisation); the linear
    layers carry no bias then, since BN's shift makes it redundant. ``last_bn=False`` leaves the last
    linear layer without BN (and still without bias): MoCo v3's ResNet predictor.
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int | None = 2048,
        out_dim: int = 128,
        *,
        num_layers: int = 2,
        batch_norm: bool = False,
        last_bn: bool = True,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if num_layers > 1 and not hidden_dim:
            raise ValueError("a projection head with more than one layer needs hidden_dim")
        dims = [in_dim] + [int(hidden_dim or 0)] * (num_layers - 1) + [out_dim]
        layers: list[nn.Module] = []
        for i in range(num_layers):
            last = i == num_layers - 1
            layers.append(nn.Linear(dims[i], dims[i + 1], bias=not batch_norm))
            if batch_norm and (last_bn or not last):
                layers.append(nn.BatchNorm1d(dims[i + 1], affine=not last))
            if not last:
                layers.append(nn.ReLU(inplace=True))
        self.net = nn.Sequential(*layers)
        self.in_dim, self.hidden_dim, self.out_dim = in_dim, hidden_dim, out_dim
        self.num_layers, self.batch_norm = num_layers, batch_norm

    def forward(self, x: Tensor) -> Tensor:
        """``[B, out_dim]`` embeddings in the head's own dtype (float32 in training), outside autocast."""
        with autocast_off(x):
            return self.net(x.to(self.net[0].weight.dtype))


def feature_dim(backbone: nn.Module) -> int:
    """The pooled feature width of a registry backbone (``num_features``)."""
    dim = getattr(backbone, "num_features", None)
    if not isinstance(dim, int):
        raise ValueError(f"backbone {type(backbone).__name__} has no integer num_features")
    return dim


class Encoder(nn.Module):
    """Backbone followed by a projection head: the query (or, copied, the key) network."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone.forward_features(x))
