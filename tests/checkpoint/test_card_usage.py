"""A checkpoint's card says how to load *that* checkpoint, its Python usage block runs as written,
and `cl-zoo publish` refuses a card whose snippet does not."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint.usage import check_usage, retarget, usage_blocks
from cl_zoo.checkpoint import CARD_NAME, CONFIG_NAME
from cl_zoo.cli import main
from cl_zoo.errors import CheckpointError
from cl_zoo.factory import load_model
from cl_zoo.checkpoint.publish import card_for_repo
from tests.helpers import REPO_ROOT

REPO = REPO_ROOT
BUNDLED = sorted(p for p in (REPO / "model_cards").iterdir() if (p / CONFIG_NAME).is_file())


def embed_model_arg(card: str) -> str:
    """The ``--model`` value of the card's ``cl-zoo embed`` line."""
    line = next((line for line in card.splitlines() if line.startswith("cl-zoo embed ")), None)
    assert line, "the card must show the cl-zoo embed call"
    args = shlex.split(line)
    return args[args.index("--model") + 1]


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k].float(), sb[k].float()) for k in sa)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125)
    return cl_zoo.save_pretrained(model, tmp_path / "my ckpt"), model


@pytest.mark.parametrize("folder", BUNDLED, ids=[p.name for p in BUNDLED])
def test_bundled_card_snippets_load_their_folder(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = (folder / CARD_NAME).read_text(encoding="utf-8")
    check_usage(text, folder)  # the Python block, run as written in a fresh interpreter
    from_folder = cl_zoo.load_pretrained(folder)
    assert_same_weights(load_model(embed_model_arg(text)), from_folder)


def test_saved_folder_card_names_the_folder(saved: tuple[Path, torch.nn.Module], tmp_path: Path, monkeypatch) -> None:
    folder, model = saved
    text = (folder / CARD_NAME).read_text(encoding="utf-8")
    # Not the architecture (create_model('resnet18_cifar', pretrained=True) is refused), but this folder,
    # by its absolute path, so the calls work from any directory.
    assert "create_model('resnet18_cifar', pretrained=True)" not in text
    assert f"load_pretrained({str(folder.resolve())!r})" in text
    monkeypatch.chdir(tmp_path.parent)
    assert_same_weights(load_model(embed_model_arg(text)), model)
    check_usage(text, folder)


def test_publish_points_the_card_at_the_repo_and_runs_it(saved: tuple[Path, torch.nn.Module]) -> None:
    folder, _ = saved
    local = (folder / CARD_NAME).read_text(encoding="utf-8")
    card = card_for_repo(folder, "alice/tiny")  # runs the snippet with hf-hub:alice/tiny -> folder
    assert str(folder.resolve()) not in card
    assert "load_pretrained('hf-hub:alice/tiny')" in card and embed_model_arg(card) == "hf-hub:alice/tiny"
    assert (folder / CARD_NAME).read_text(encoding="utf-8") == local  # the user's folder is untouched
    # A longer path that merely starts with the folder's is left alone.
    assert retarget(f"x {folder.resolve()}-other y", folder, "hf-hub:a/b") == f"x {folder.resolve()}-other y"


def test_publish_refuses_a_card_whose_snippet_fails(saved: tuple[Path, torch.nn.Module], capsys) -> None:
    """An edited How to load is refused without running it; --run-card-code runs it (and catches it failing)."""
    folder, _ = saved
    card = folder / CARD_NAME
    text = card.read_text(encoding="utf-8")
    # An edited card: `image` is never defined, so the snippet raises NameError.
    card.write_text(text.replace("image = Image.open(", "photo = Image.open("), encoding="utf-8")
    with pytest.raises(CheckpointError, match="not the one cl-zoo generates from config.json"):
        card_for_repo(folder, "alice/tiny")
    with pytest.raises(CheckpointError, match="usage snippet fails .*NameError: name 'image' is not defined"):
        card_for_repo(folder, "alice/tiny", run_card_code=True)
    code = main(["publish", str(folder), "--repo-id", "alice/tiny", "--dry-run", "--run-card-code"])
    out, err = capsys.readouterr()
    assert code == 2 and "photo = Image.open(" in out  # the code is shown before it runs
    assert err.startswith("error: ") and err.count("\n") == 1 and "NameError" in err
    # A card whose snippet loads something else than what is uploaded is refused too.
    card.write_text(text.replace(str(folder.resolve()), "resnet18_cifar"), encoding="utf-8")
    with pytest.raises(CheckpointError, match="not the one cl-zoo generates"):
        card_for_repo(folder, "alice/tiny")
    with pytest.raises(CheckpointError, match="does not load hf-hub:alice/tiny"):
        card_for_repo(folder, "alice/tiny", run_card_code=True)
    card.write_text(text.split("## How to load")[0], encoding="utf-8")
    with pytest.raises(CheckpointError, match="has no '## How to load' section"):
        card_for_repo(folder, "alice/tiny")
    with pytest.raises(CheckpointError, match="no Python usage block"):
        card_for_repo(folder, "alice/tiny", run_card_code=True)


def test_fine_tuned_copy_of_a_registered_model_is_not_carded_as_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = cl_zoo.create_model(cl_zoo.registry.DEFAULT_MODEL, pretrained=True)
    with torch.no_grad():
        model.conv1.weight.add_(0.01)  # "fine-tuned": no longer the pinned weights
    folder = cl_zoo.save_pretrained(model, tmp_path / "tuned")
    text = (folder / CARD_NAME).read_text(encoding="utf-8")
    blocks = "\n".join(usage_blocks(text))
    assert "create_model(" not in blocks and str(folder.resolve()) in blocks
    assert json.loads((folder / CONFIG_NAME).read_text())["model_name"] == cl_zoo.registry.DEFAULT_MODEL


def test_publish_runs_only_the_cl_zoo_block_and_points_timm_at_the_repo(tmp_path: Path) -> None:
    """The timm block is retargeted like cl-zoo's call, but never run: publishing must not need timm."""
    torch.manual_seed(0)
    folder = cl_zoo.save_pretrained(cl_zoo.create_model("resnet18"), tmp_path / "r18")
    card = folder / CARD_NAME
    text = card.read_text(encoding="utf-8")
    assert f"'local-dir:{folder.resolve()}'" in text
    # The generated card publishes without timm; the timm block points at the repo.
    published = card_for_repo(folder, "alice/r18")
    assert "timm.create_model('hf-hub:alice/r18', pretrained=True)" in published and "local-dir:" not in published
    assert usage_blocks(published) == [b for b in usage_blocks(published, every=True) if "import cl_zoo" in b]
    # With --run-card-code, a timm block that could not run (timm missing) does not stop publish.
    card.write_text(text.replace("import timm\n", "import timm_is_not_installed\n"), encoding="utf-8")
    assert "hf-hub:alice/r18" in card_for_repo(folder, "alice/r18", run_card_code=True)
    # A card whose only Python block is timm's has no usage snippet publish can check.
    timm_only = "\n".join(line for line in text.splitlines() if line != "import cl_zoo")
    card.write_text(timm_only, encoding="utf-8")
    with pytest.raises(CheckpointError, match="no Python usage block that imports cl_zoo"):
        card_for_repo(folder, "alice/r18", run_card_code=True)
    assert retarget(f"'local-dir:{folder.resolve()}'", folder, "/elsewhere") == "'local-dir:/elsewhere'"
