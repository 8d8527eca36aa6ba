"""Raw pixels as features: the baseline every representation must beat.

Not a network: the (normalised, centre-cropped) image flattened. kNN on CIFAR-10 raw pixels gives
about 30-40% top-1 in the literature; cl-zoo reports it next to learned models.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from cl_zoo.registry import register_model


class Pixels(nn.Module):
    def __init__(self, input_size: int = 32, in_chans: int = 3) -> None:
        super().__init__()
        self.input_size = input_size
        self.num_features = in_chans * input_size * input_size
        # Registered so .to(device) / dtype work like any model; holds no learnable state.
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(x, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)


@register_model  # declared, with its config, in cl_zoo/models/archs.py
def pixels(**kwargs: object) -> Pixels:
    """Identity "model": flattened pixels at the configured input size (3072-d at 32x32)."""
    return Pixels(**kwargs)  # type: ignore[arg-type]
