"""torch.hub loading from a local checkout, for architectures and pretrained entries."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterator

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint import WEIGHTS_NAME, sha256_file
from cl_zoo.registry import PretrainedCfg, register_pretrained, unregister_pretrained
from tests.helpers import REPO_ROOT

NAME = "dcl_resnet18_cifar.hubconftest"


@pytest.fixture
def pretrained_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[torch.nn.Module]:
    torch.manual_seed(3)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125)
    folder = cl_zoo.save_pretrained(model, tmp_path / "cards" / "hubconf-tiny")
    monkeypatch.setenv("CL_ZOO_MODEL_CARDS", str(tmp_path / "cards"))
    register_pretrained(NAME, "resnet18_cifar", PretrainedCfg(
        bundled="hubconf-tiny", sha256={WEIGHTS_NAME: sha256_file(folder / WEIGHTS_NAME)}), width=0.125)
    yield model
    unregister_pretrained(NAME)


def load_hubconf() -> object:
    spec = importlib.util.spec_from_file_location("hubconf_under_test", REPO_ROOT / "hubconf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_every_registered_name_is_an_entry_point(pretrained_entry: torch.nn.Module) -> None:
    hubconf = load_hubconf()
    assert "torch" in hubconf.dependencies
    for name in cl_zoo.list_models():
        entry = getattr(hubconf, name.replace(".", "__"))
        assert callable(entry) and entry.__doc__ and name in entry.__doc__
    assert callable(hubconf.create_model) and callable(hubconf.load_pretrained)


def test_torch_hub_load_architecture() -> None:
    model = torch.hub.load(str(REPO_ROOT), "resnet18_cifar", source="local", width=0.125)
    assert model.num_features == 64 and model(torch.rand(1, 3, 32, 32)).shape == (1, 64)
    with pytest.raises(cl_zoo.ModelNotFoundError, match="architecture"):
        torch.hub.load(str(REPO_ROOT), "resnet18_cifar", source="local", pretrained=True)


def test_torch_hub_load_pretrained(pretrained_entry: torch.nn.Module, tmp_path: Path) -> None:
    expected = pretrained_entry.state_dict()
    by_entry = torch.hub.load(str(REPO_ROOT), NAME.replace(".", "__"), source="local")
    by_dotted_name = torch.hub.load(str(REPO_ROOT), NAME, source="local")  # the registry name as written
    generic = torch.hub.load(str(REPO_ROOT), "create_model", NAME, source="local", pretrained=True)
    random = torch.hub.load(str(REPO_ROOT), NAME.replace(".", "__"), source="local", pretrained=False)
    for model in (by_entry, by_dotted_name, generic):
        assert model.model_name == NAME
        assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
    assert not torch.equal(random.conv1.weight, expected["conv1.weight"])
    folder = cl_zoo.save_pretrained(pretrained_entry, tmp_path / "folder")
    from_folder = torch.hub.load(str(REPO_ROOT), "load_pretrained", str(folder), source="local")
    assert torch.equal(from_folder.conv1.weight, expected["conv1.weight"])
