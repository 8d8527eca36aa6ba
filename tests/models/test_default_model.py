"""The bundled default model: real weights trained with `cl-zoo pretrain`, loadable offline, and the
README quick start (`cl-zoo embed examples/photos`) working on it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

import cl_zoo
from cl_zoo.checkpoint.card import parse_front_matter
from cl_zoo.checkpoint import sha256_file
from cl_zoo.cli import main
from cl_zoo.registry import DEFAULT_MODEL, get_pretrained
from tests.helpers import REPO_ROOT

REPO = REPO_ROOT
EXAMPLES = REPO / "examples" / "photos"


def _bundled_folder() -> Path:
    entry = get_pretrained(DEFAULT_MODEL)
    assert entry.cfg.bundled, "the default model must be bundled so the quick start works offline"
    folder = REPO / "model_cards" / entry.cfg.bundled
    assert (folder / "config.json").is_file(), f"{folder} is missing"
    return folder


def test_registry_pins_match_the_bundled_files() -> None:
    entry = get_pretrained(DEFAULT_MODEL)
    folder = _bundled_folder()
    assert entry.cfg.sha256, "the registry must pin the bundled weights"
    for name, digest in entry.cfg.sha256.items():
        assert sha256_file(folder / name) == digest, f"{name} differs from the registry's pin"
    # One model.safetensors, as timm and the Hub expect (the wheel ships it: it must stay small).
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
    assert (folder / "model.safetensors").stat().st_size <= 30_000_000


def test_default_model_loads_offline_and_is_trained(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = cl_zoo.create_model(DEFAULT_MODEL, pretrained=True)
    assert Path(model.checkpoint_source).resolve() == _bundled_folder().resolve()
    config = json.loads((_bundled_folder() / "config.json").read_text())
    assert config["method"] == get_pretrained(DEFAULT_MODEL).cfg.method and config["recipe"]["epochs"] >= 1
    # Standard width, so `cl-zoo export` can hand it to torchvision/timm/detectron2.
    assert config["architecture"] == "resnet18" and config["model_args"] == {}
    # Trained weights are not the initialisation: BN statistics moved away from (0, 1).
    bn = model.bn1
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))


def test_default_model_card_is_honest() -> None:
    text = (_bundled_folder() / "README.md").read_text()
    meta = parse_front_matter(text)
    assert meta["library_name"] == "timm" and "cl-zoo" in meta["tags"]  # timm loads it as it is
    assert meta["model-index"][0]["results"][0]["metrics"], "the card must carry measured metrics"
    assert "CPU" in text, "the card must say the model was trained on a CPU"
    metrics = get_pretrained(DEFAULT_MODEL).cfg.metrics
    # Well above the 10-class chance level on Imagenette val (measured with `cl-zoo knn`).
    assert metrics["imagenette_knn_k200_top1"] > 0.3


def test_readme_quick_start_embeds_the_examples(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "embeddings.npy"
    assert main(["embed", str(EXAMPLES), "--out", str(out), "--workers", "0"]) == 0
    vectors = np.load(out)
    paths = [json.loads(line) for line in (tmp_path / "embeddings.paths.jsonl").read_text().splitlines()]
    photos = sorted(p for p in EXAMPLES.iterdir() if p.suffix == ".jpg")
    assert vectors.shape == (len(photos), cl_zoo.create_model(DEFAULT_MODEL).num_features)
    assert [Path(p).name for p in paths] == [p.name for p in photos]
    assert np.isfinite(vectors).all()
    # Different photos get different embeddings.
    normed = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = normed @ normed.T
    assert sims[~np.eye(len(photos), dtype=bool)].max() < 0.999
