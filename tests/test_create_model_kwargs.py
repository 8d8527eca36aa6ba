"""create_model / load_pretrained keyword arguments reach the model or are refused in one line (issue 43).

They used to be passed to ``load_registered`` with ``pretrained=True`` and never read.
"""

from __future__ import annotations

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint.hub import find_bundled
from cl_zoo.errors import ModelArgumentError
from cl_zoo.registry import DEFAULT_MODEL


def one_line(call, match: str) -> ModelArgumentError:  # noqa: ANN001
    with pytest.raises(ModelArgumentError, match=match) as info:
        call()
    assert isinstance(info.value, cl_zoo.ClZooError) and isinstance(info.value, TypeError)
    assert "\n" not in str(info.value)
    return info.value


def test_architecture_kwargs_reach_the_model() -> None:
    model = cl_zoo.create_model("resnet18", width=0.25, in_chans=1)
    assert model.model_kwargs == {"width": 0.25, "in_chans": 1}
    assert model.conv1.in_channels == 1 and model.num_features == 128
    random_weights = cl_zoo.create_model(DEFAULT_MODEL, width=0.5)  # a pretrained name, pretrained=False
    assert random_weights.num_features == 256 and random_weights.pretrained_cfg.input_size == (3, 64, 64)
    # timm's "no classifier": what zoo models are; accepted and not passed on.
    headless = cl_zoo.create_model("resnet18_cifar", width=0.125, num_classes=0)
    assert headless.model_kwargs == {"width": 0.125} and headless(torch.zeros(1, 3, 32, 32)).shape == (1, 64)


def test_unsupported_kwargs_are_refused_by_name() -> None:
    one_line(lambda: cl_zoo.create_model("resnet18", drop_path_rate=0.1), r"does not take drop_path_rate=0.1; resnet18 accepts .*width")
    one_line(lambda: cl_zoo.create_model("cmc_alexnet_cifar_lab", width=2.0), "accepts no arguments")
    one_line(lambda: cl_zoo.create_model("resnet18", stem="deep"), r"stem='deep'\) cannot build resnet18: unknown stem")
    message = one_line(lambda: cl_zoo.create_model("resnet18", num_classes=10), "num_classes=10")
    assert "torch.nn.Linear(model.num_features, 10)" in str(message)


def test_pretrained_kwargs_are_refused_not_dropped() -> None:
    one_line(lambda: cl_zoo.create_model(DEFAULT_MODEL, pretrained=True, num_classes=10), "headless feature extractors")
    one_line(lambda: cl_zoo.create_model(DEFAULT_MODEL, pretrained=True, width=0.5), "cannot take width=0.5: the checkpoint fixes")
    model = cl_zoo.create_model(DEFAULT_MODEL, pretrained=True, num_classes=0)
    assert model.model_name == DEFAULT_MODEL and model.num_features == 512


def test_load_pretrained_kwargs() -> None:
    folder = find_bundled(DEFAULT_MODEL)
    assert folder is not None
    one_line(lambda: cl_zoo.load_pretrained(folder, width=0.5), "cannot take width=0.5")
    one_line(lambda: cl_zoo.load_pretrained(DEFAULT_MODEL, in_chans=1), "cannot take in_chans=1")
    one_line(lambda: cl_zoo.load_pretrained(folder / "config.json", arch="resnet50"), "cannot take arch='resnet50'")
    assert cl_zoo.load_pretrained(folder, num_classes=0).num_features == 512


def test_load_registered_refuses_model_arguments() -> None:
    """``load_registered`` (the factory's loader behind ``pretrained=True``) reads its kwargs: a model
    argument is refused in one line, timm's ``num_classes=0`` passes."""
    from cl_zoo.factory import load_registered
    from cl_zoo.registry import get_pretrained

    entry = get_pretrained(DEFAULT_MODEL)
    one_line(lambda: load_registered(entry, width=0.5), "cannot take width=0.5: the checkpoint fixes")
    assert load_registered(entry, num_classes=0).num_features == 512
