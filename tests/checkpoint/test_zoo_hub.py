"""The zoo's own checkpoints from their Hub repos (issue 22): what a wheel, which bundles only the
default, does for every other name. Served by the local Hub test server (tests/hub_server.py) with
the real ``huggingface_hub`` client; pins are the registry's sha256, never a revision."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest
import torch
from huggingface_hub import HfApi

import cl_zoo
import cl_zoo.checkpoint.hub as hub_module
from cl_zoo.checkpoint.hub import ZOO_NAMESPACE, zoo_repo_id
from cl_zoo.errors import CheckpointError, HubError
from cl_zoo.registry import DEFAULT_MODEL, get_pretrained, list_models

from tests.hub_server import FakeHub, serve
from tests.helpers import EXAMPLE_PHOTOS_DIR, REPO_ROOT

TOKEN = "hf_zoo_hub_token"
CARDS = REPO_ROOT / "model_cards"
NAME = "dcl_resnet18.imagenette64_cpu"  # not the default: a wheel does not bundle it


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve(tmp_path, monkeypatch, TOKEN) as server:
        yield server


@pytest.fixture
def as_from_a_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """No bundled copy of anything but the default, as in an installed wheel."""
    real = hub_module.find_bundled
    monkeypatch.setattr(hub_module, "find_bundled", lambda name: real(name) if name == DEFAULT_MODEL else None)


def upload(hub: FakeHub, folder: Path, repo_id: str) -> None:
    api = HfApi(endpoint=hub.endpoint, token=TOKEN)
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder))


def test_every_zoo_entry_names_its_repo_and_no_revision() -> None:
    zoo = [n for n in list_models(pretrained=True) if get_pretrained(n).cfg.bundled]
    assert DEFAULT_MODEL in zoo and NAME in zoo
    for name in zoo:
        cfg = get_pretrained(name).cfg
        assert cfg.hf_hub_id == f"{ZOO_NAMESPACE}/{name}" and cfg.revision is None, name
        assert cfg.sha256 and all(len(d) == 64 for d in cfg.sha256.values()), name


def test_a_non_bundled_name_comes_from_its_hub_repo_with_pins_verified(
    hub: FakeHub, as_from_a_wheel: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CL_ZOO_HUB_NAMESPACE", "zoo-mirror")
    assert zoo_repo_id(NAME) == f"zoo-mirror/{NAME}"
    upload(hub, CARDS / NAME, f"zoo-mirror/{NAME}")
    model = cl_zoo.create_model(NAME, pretrained=True)
    assert model.checkpoint_source == f"hf-hub:zoo-mirror/{NAME}@main" and model.model_name == NAME
    bundled = cl_zoo.load_pretrained(CARDS / NAME)
    for key, value in bundled.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key

    # Another repo's weights under the name: the registry's sha256 refuses them.
    tampered = tmp_path / "tampered"
    shutil.copytree(CARDS / NAME, tampered)
    shutil.copy2(CARDS / DEFAULT_MODEL / "model.safetensors", tampered / "model.safetensors")
    monkeypatch.setenv("CL_ZOO_HUB_NAMESPACE", "evil")
    upload(hub, tampered, f"evil/{NAME}")
    with pytest.raises(CheckpointError, match="sha256 mismatch"):
        cl_zoo.create_model(NAME, pretrained=True)


def test_offline_and_not_cached_says_where_it_comes_from_in_one_line(
    as_from_a_wheel: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("CL_ZOO_HUB_NAMESPACE", raising=False)
    with pytest.raises(HubError) as info:
        cl_zoo.create_model(NAME, pretrained=True)
    message = str(info.value)
    assert "\n" not in message
    assert f"hf-hub:{ZOO_NAMESPACE}/{NAME}" in message and "HF_HUB_OFFLINE" in message
    assert "download it once with network access" in message  # what to do, not only what failed
    assert "CL_ZOO_MODEL_CARDS" in message and DEFAULT_MODEL in message
    from cl_zoo.cli import main

    photos = EXAMPLE_PHOTOS_DIR
    assert main(["embed", str(photos), "--model", NAME, "--out", str(tmp_path / "x.npy")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "CL_ZOO_MODEL_CARDS" in err[0]
    assert not (tmp_path / "x.npy").exists()


def test_the_default_loads_offline_from_the_install(as_from_a_wheel: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = cl_zoo.create_model(DEFAULT_MODEL, pretrained=True)
    assert Path(model.checkpoint_source).name == DEFAULT_MODEL


def test_a_bad_namespace_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CL_ZOO_HUB_NAMESPACE", "a/b")
    with pytest.raises(HubError, match="CL_ZOO_HUB_NAMESPACE"):
        zoo_repo_id(NAME)


def test_a_zoo_card_published_under_another_namespace_names_that_repo() -> None:
    from cl_zoo.checkpoint.publish import card_for_repo

    card = card_for_repo(CARDS / NAME, f"zoo-mirror/{NAME}")
    assert f"timm.create_model('hf-hub:zoo-mirror/{NAME}'" in card
    assert f"hf-hub:{ZOO_NAMESPACE}/" not in card


def test_info_lists_the_sources_in_the_order_they_are_tried(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from cl_zoo.cli import main
    from cl_zoo.models import releases

    monkeypatch.setenv("CL_ZOO_HUB_NAMESPACE", "zoo-mirror")
    assert main(["info", NAME]) == 0
    out = capsys.readouterr().out
    assert out.index("1. bundled: ") < out.index(f"2. hf-hub:zoo-mirror/{NAME} (sha256-pinned)")
    release = "cacr_resnet50.in1k_official"
    monkeypatch.setitem(releases.MIRRORS, release, releases.Mirror(repo_id="zoo-mirror/cacr", sha256={"model.safetensors": "0" * 64}))
    assert main(["info", release]) == 0
    out = capsys.readouterr().out
    assert out.index("https://drive.google.com") < out.index("mirror hf-hub:zoo-mirror/cacr (sha256-pinned)")
