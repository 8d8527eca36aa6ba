"""Registry: names, lookup errors with suggestions, pretrained entries and their sources."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint import WEIGHTS_NAME, sha256_file
from cl_zoo.errors import CheckpointError, HubError, ModelNotFoundError
from cl_zoo.registry import PretrainedCfg, get_pretrained, is_pretrained_name, register_pretrained, unregister_pretrained

ARCHS = {"resnet18", "resnet34", "resnet50", "resnet18_cifar", "resnet50_cifar", "cmc_resnet50x05_lab",
         "cmc_resnet50x1_lab", "cmc_resnet50x2_lab", "cmc_resnet18_lab", "cmc_resnet18_cifar_lab", "cmc_alexnet_cifar_lab",
         "alexnet_cifar", "pixels"}


@pytest.fixture
def bundled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, torch.nn.Module, Path]]:
    """A pretrained entry whose folder is 'bundled' under CL_ZOO_MODEL_CARDS (removed afterwards)."""
    torch.manual_seed(0)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125)
    folder = cl_zoo.save_pretrained(model, tmp_path / "cards" / "tiny-dcl")
    monkeypatch.setenv("CL_ZOO_MODEL_CARDS", str(tmp_path / "cards"))
    name = "dcl_resnet18_cifar.regtest"
    cfg = PretrainedCfg(bundled="tiny-dcl", sha256={WEIGHTS_NAME: sha256_file(folder / WEIGHTS_NAME)},
                        method="dcl", dataset="cifar10", metrics={"knn_top1": 0.5})
    register_pretrained(name, "resnet18_cifar", cfg, width=0.125)
    yield name, model, folder
    unregister_pretrained(name)


def test_list_models_patterns() -> None:
    names = cl_zoo.list_models()
    assert ARCHS <= set(names) and names == sorted(names)
    assert set(cl_zoo.list_models("resnet*_cifar")) == {"resnet18_cifar", "resnet34_cifar", "resnet50_cifar"}
    assert cl_zoo.list_models("no-such-*") == []
    assert not set(cl_zoo.list_models(pretrained=True)) & ARCHS


def test_unknown_name_suggests_close_names() -> None:
    with pytest.raises(ModelNotFoundError, match="did you mean resnet50") as info:
        cl_zoo.create_model("resnet5")
    assert str(info.value).count("\n") == 0 and not str(info.value).startswith('"')
    with pytest.raises(ModelNotFoundError, match="cl-zoo models"):
        cl_zoo.create_model("qqqqqqqqqqqqqq")


def test_a_stem_suggests_its_pretrained_names_first() -> None:
    # The typed prefix of a pretrained name must lead to it, not to the bare architectures that
    # difflib ranks higher because the ".<tag>" suffix lowers the similarity ratio.
    for call in (cl_zoo.create_model, cl_zoo.load_pretrained):
        with pytest.raises(ModelNotFoundError, match=r"did you mean dcl_resnet18\.imagenette64_cpu"):
            call("dcl_resnet18")


def test_loading_an_architecture_says_what_it_is() -> None:
    with pytest.raises(ModelNotFoundError) as info:
        cl_zoo.load_pretrained("resnet18_cifar")
    message = str(info.value)
    assert "did you mean resnet18_cifar" not in message
    assert "is an architecture" in message and "create_model('resnet18_cifar')" in message
    with pytest.raises(ModelNotFoundError, match="dcl_resnet18.imagenette64_cpu"):
        cl_zoo.load_pretrained("resnet18")  # names the pretrained weights of that architecture


def test_architecture_with_pretrained_true_is_refused() -> None:
    with pytest.raises(ModelNotFoundError, match="architecture"):
        cl_zoo.create_model("resnet50", pretrained=True)


def test_create_model_attaches_config_and_kwargs() -> None:
    model = cl_zoo.create_model("resnet18_cifar", width=0.25)
    assert model.arch_name == model.model_name == "resnet18_cifar"
    assert model.model_kwargs == {"width": 0.25} and model.num_features == 128
    assert model.pretrained_cfg.input_size == (3, 32, 32) and model.pretrained_cfg.resize_size == 32
    # Each model owns its config: editing one never leaks into the registry's defaults.
    model.pretrained_cfg.metrics["x"] = 1.0
    assert "x" not in cl_zoo.create_model("resnet18_cifar", width=0.25).pretrained_cfg.metrics
    assert cl_zoo.create_model("resnet50").pretrained_cfg.resize_size == 256


def test_pretrained_cfg_round_trip() -> None:
    cfg = PretrainedCfg(hf_hub_id="a/b", revision="r", method="cmc", metrics={"top1": 61.2}, input_size=(3, 64, 64))
    again = PretrainedCfg.from_dict({**cfg.to_dict(), "unknown_future_field": 1})
    assert again == cfg and isinstance(again.mean, tuple)


def test_register_pretrained_requires_dotted_name() -> None:
    with pytest.raises(ValueError, match="<method>_<arch>.<tag>"):
        register_pretrained("dcl_resnet18_cifar", "resnet18_cifar", PretrainedCfg())


def test_pretrained_entry_loads_bundled_folder(bundled: tuple[str, torch.nn.Module, Path]) -> None:
    name, model, folder = bundled
    assert name in cl_zoo.list_models(pretrained=True)
    assert name in cl_zoo.list_models("dcl_*")
    random = cl_zoo.create_model(name)  # pretrained=False: architecture + config, random weights
    assert random.model_name == name and random.pretrained_cfg.method == "dcl"
    loaded = cl_zoo.create_model(name, pretrained=True)
    assert loaded.model_name == name and not loaded.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    assert cl_zoo.load_model(name).model_name == name


def test_bundled_checksum_mismatch_falls_through_then_fails(bundled: tuple[str, torch.nn.Module, Path]) -> None:
    name, _, folder = bundled
    entry = get_pretrained(name)
    register_pretrained(name, entry.arch, dataclasses.replace(entry.cfg, sha256={WEIGHTS_NAME: "1" * 64}), **entry.model_kwargs)
    with pytest.raises(CheckpointError, match="sha256 mismatch") as info:
        cl_zoo.create_model(name, pretrained=True)
    assert str(folder) in str(info.value)


def test_unregister_pretrained_removes_a_run_time_name() -> None:
    entry = register_pretrained("dcl_resnet18_cifar.scratch", "resnet18_cifar", PretrainedCfg(bundled="scratch"))
    assert "dcl_resnet18_cifar.scratch" in cl_zoo.list_models(pretrained=True)
    assert unregister_pretrained("dcl_resnet18_cifar.scratch") == entry
    assert not is_pretrained_name("dcl_resnet18_cifar.scratch") and "dcl_resnet18_cifar.scratch" not in cl_zoo.list_models(pretrained=True)
    assert unregister_pretrained("dcl_resnet18_cifar.scratch") is None  # absent: nothing to do


def test_no_source_is_a_hub_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CL_ZOO_MODEL_CARDS", str(tmp_path))
    register_pretrained("dcl_resnet18_cifar.absent", "resnet18_cifar", PretrainedCfg(bundled="absent"))
    try:
        with pytest.raises(HubError, match="model_cards/absent"):
            cl_zoo.create_model("dcl_resnet18_cifar.absent", pretrained=True)
    finally:
        unregister_pretrained("dcl_resnet18_cifar.absent")


def test_load_model_refuses_random_architecture() -> None:
    with pytest.raises(cl_zoo.ClZooError, match="random weights"):
        cl_zoo.load_model("resnet18_cifar")
    assert cl_zoo.load_model("pixels").num_features == 3072


# --------------------------------------------------------------------------------------------
# The registry is a leaf; the factory sits above it; old import paths keep working
# --------------------------------------------------------------------------------------------


def test_registry_imports_nothing_above_it() -> None:
    """registry.py imports no torch, no cl_zoo.models and no cl_zoo.checkpoint, at any level
    (type annotations under ``if TYPE_CHECKING:`` aside: they are never run)."""
    import ast

    import cl_zoo.registry as registry

    tree = ast.parse(Path(registry.__file__).read_text())
    tree.body = [n for n in tree.body if not (isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")]
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    forbidden = [m for m in imported if m.split(".")[0] == "torch" or m.startswith(("cl_zoo.models", "cl_zoo.checkpoint", "cl_zoo.factory"))]
    assert not forbidden, forbidden


def test_public_api_names_resolve_and_unknown_names_raise() -> None:
    import cl_zoo.factory as factory
    import cl_zoo.registry as registry

    assert cl_zoo.load_pretrained is factory.load_pretrained and cl_zoo.load_model is factory.load_model
    assert cl_zoo.create_model is factory.create_model
    assert set(cl_zoo.__all__) <= set(dir(cl_zoo))
    with pytest.raises(AttributeError):
        registry.no_such_name  # noqa: B018


def test_normalisation_constants_have_one_home() -> None:
    import importlib

    import cl_zoo.constants as constants
    import cl_zoo.registry as registry

    augment = importlib.import_module("cl_zoo.data.augment")  # the package's ``augment`` is the function

    for name in ("IMAGENET_MEAN", "IMAGENET_STD", "CIFAR10_MEAN", "CIFAR10_STD"):
        assert getattr(augment, name) is getattr(constants, name) is getattr(registry, name), name
