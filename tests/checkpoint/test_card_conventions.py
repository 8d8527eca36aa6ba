"""Model cards follow the Hub's conventions (pipeline_tag, standard metric types, base_model for
mirrors) and say how timm loads a folder it can load, or in one line why it cannot."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint import CARD_NAME
from cl_zoo.checkpoint.card import describe_metric, front_matter, parse_front_matter, render_card
from cl_zoo.checkpoint.folder import model_config, read_config
from cl_zoo.checkpoint.usage import usage_blocks, uses_cl_zoo

METRICS = {
    "imagenette_knn_k200_top1": 0.6074,
    "imagenette_knn_k200_top5": 0.9368,
    "imagenette_linear_fast_top1": 0.6492,
    "cifar10_knn_k20_top1": 0.41,
    "monitor_knn_k200_top1": 0.5975,
    "knn_top1": 0.3,
    "train_loss": 4.2,  # not an accuracy: left out of the model-index
}
KNN_EVALUATION = {
    "protocol": "knn",
    "data": "imagenette",
    "hyperparameters": {"k": [200], "temperature": 0.1},
    "metrics": {"imagenette_knn_k200_top1": 0.6074, "imagenette_knn_k200_top5": 0.9368},
}


@pytest.fixture(scope="module")
def resnet18_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random ResNet-18 written by save_pretrained (format_version 2, one model.safetensors)."""
    torch.manual_seed(0)
    model = cl_zoo.create_model("resnet18")
    model.pretrained_cfg.method = "simclr"
    model.pretrained_cfg.dataset = "imagenette"
    model.pretrained_cfg.input_size = (3, 64, 64)
    return cl_zoo.save_pretrained(model, tmp_path_factory.mktemp("cards") / "r18 ckpt", metrics=METRICS)


def config_of(arch: str, **model_args: Any) -> dict[str, Any]:
    model = cl_zoo.create_model(arch, **model_args)
    model.pretrained_cfg.method = "cmc" if arch.startswith("cmc_") else "dcl"
    return model_config(model)


def how_to_load(card: str) -> str:
    return card.split("## How to load", 1)[1].split("\n## ", 1)[0]


def test_front_matter_of_a_timm_loadable_folder(resnet18_folder: Path) -> None:
    meta = parse_front_matter((resnet18_folder / CARD_NAME).read_text(encoding="utf-8"))
    # timm loads it as it is: the Hub shows timm's "Use this model" snippet; cl-zoo stays in the tags.
    assert meta["library_name"] == "timm" and meta["pipeline_tag"] == "image-feature-extraction"
    assert meta["license"] == "apache-2.0" and meta["datasets"] == ["frgfm/imagenette"]  # a Hub dataset id
    assert {"cl-zoo", "simclr", "timm", "self-supervised", "contrastive-learning"} <= set(meta["tags"])
    assert "base_model" not in meta
    # What huggingface_hub reads back is what was written.
    from huggingface_hub import ModelCard

    data = ModelCard((resnet18_folder / CARD_NAME).read_text(encoding="utf-8")).data
    assert data.library_name == "timm" and data.datasets == ["frgfm/imagenette"] and data.eval_results


@pytest.mark.parametrize(
    "arch, model_args, reason",
    [
        ("resnet18_cifar", {"width": 0.125}, "`resnet18_cifar` has a 3x3 stride-1 stem without max-pool, which timm's `resnet18` does not."),
        ("cmc_resnet18_cifar_lab", {"width": 0.125}, "`cmc_resnet18_cifar_lab` is CMC's pair of encoders"),
        ("resnet18", {"width": 0.125}, "`resnet18` was built with `{'width': 0.125}`, which timm's `resnet18` does not take."),
    ],
)
def test_a_folder_timm_cannot_load_says_why_in_one_line(arch: str, model_args: dict, reason: str) -> None:
    config = config_of(arch, **model_args)
    meta = front_matter(config)
    assert "timm" not in meta["tags"] and meta["library_name"] == "cl-zoo" and "cl-zoo" in meta["tags"]
    card = render_card(config, folder="/tmp/some ckpt")
    section = how_to_load(card)
    lines = [line for line in section.splitlines() if "timm" in line]
    assert len(lines) == 1 and lines[0].startswith("timm cannot load this checkpoint: ") and reason in lines[0]
    assert len(usage_blocks(card, every=True)) == 1  # only cl-zoo's block


def test_format_version_1_config_is_still_read() -> None:
    """Version 1 kept every field in pretrained_cfg: the card still finds them, and timm cannot load it."""
    config = config_of("resnet18")
    v1 = {k: v for k, v in config.items() if k != "cl_zoo_pretrained_cfg"}
    v1["format_version"] = 1
    v1["pretrained_cfg"] = {**config["cl_zoo_pretrained_cfg"], "mean": [0.5] * 3, "std": [0.25] * 3,
                            "input_size": [3, 32, 32], "license": "mit", "dataset": "cifar10", "method": "dcl",
                            "epochs": 7, "metrics": {"cifar10_knn_k20_top1": 0.5}}
    v1.pop("metrics")
    meta = front_matter(v1)
    assert meta["license"] == "mit" and meta["datasets"] == ["uoft-cs/cifar10"] and "dcl" in meta["tags"] and "timm" not in meta["tags"]
    assert meta["model-index"][0]["results"][0]["metrics"][0]["name"] == "kNN top-1 (k=20) on cifar10 test"
    card = render_card(v1, folder="/tmp/v1")
    assert "for 7 epochs" in card and "centre-crop 32x32" in card
    assert "timm cannot load this checkpoint: its config.json is format_version 1" in card


def test_model_index_uses_standard_types_and_names_the_protocol() -> None:
    config = config_of("resnet18")
    config["cl_zoo_pretrained_cfg"]["dataset"] = "imagenette"
    config["metrics"] = dict(METRICS)
    config["evaluations"] = [KNN_EVALUATION]
    index = front_matter(config)["model-index"]
    assert len(index) == 1
    results = {r["dataset"]["name"]: r for r in index[0]["results"]}
    entries = [m for r in results.values() for m in r["metrics"]]
    assert {m["type"] for m in entries} == {"accuracy"}
    assert len(entries) == len(METRICS) - 1  # train_loss has no accuracy type: left out, not invented
    # One result per dataset, with the split named datasets are evaluated on.
    imagenette = results["imagenette"]
    assert imagenette["dataset"] == {"type": "frgfm/imagenette", "name": "imagenette", "split": "val"}
    names = {m["name"]: m["value"] for m in imagenette["metrics"]}
    assert names == {
        "kNN top-1 (k=200, T=0.1) on imagenette val": 0.6074,  # T from the recorded evaluation
        "kNN top-5 (k=200, T=0.1) on imagenette val": 0.9368,
        "Linear probe top-1 (fast protocol) on imagenette val": 0.6492,
    }
    assert results["cifar10"]["dataset"] == {"type": "uoft-cs/cifar10", "name": "cifar10", "split": "test"}
    assert [m["name"] for m in results["cifar10"]["metrics"]] == ["kNN top-1 (k=20) on cifar10 test"]
    monitor = next(r for name, r in results.items() if "monitor" in name)
    assert monitor["dataset"]["type"] == "frgfm/imagenette" and "split" not in monitor["dataset"]
    assert monitor["metrics"][0]["name"] == "kNN top-1 (k=200) on held-out images, monitored during pretraining"
    assert results["unknown"]["metrics"] == [{"type": "accuracy", "value": 0.3, "name": "knn_top1"}]
    # huggingface_hub reads it back as evaluation results (what the Hub's widget shows).
    from huggingface_hub import ModelCard

    card = ModelCard(render_card(config, folder="/tmp/x"))
    assert {r.metric_type for r in card.data.eval_results} == {"accuracy"}
    assert len(card.data.eval_results) == len(entries)


def test_metric_key_parsing() -> None:
    assert describe_metric("imagenet1k_linear_top1_reported").name == (
        "Linear probe top-1 on imagenet1k, as reported by the original release"
    )
    assert describe_metric("my_data_knn_k5_top1").data == "my_data"
    assert describe_metric("loss") is None and describe_metric("imagenette_knn_k20_top3") is not None
    assert describe_metric("seconds_per_epoch") is None


def test_base_model_for_a_mirror() -> None:
    config = config_of("resnet18")
    mirror = {"release": "mocov2_800ep", "base_model": "facebook/moco-v2", "pages": [], "licence_page": "u", "licence_quote": "q"}
    assert front_matter({**config, "mirror": mirror})["base_model"] == "facebook/moco-v2"
    assert "base_model" not in front_matter({**config, "mirror": {**mirror, "base_model": None}})
    assert "base_model" not in front_matter(config)


def test_how_to_load_shows_cl_zoo_then_timm_then_torch_hub(resnet18_folder: Path) -> None:
    card = (resnet18_folder / CARD_NAME).read_text(encoding="utf-8")
    section = how_to_load(card)
    blocks = usage_blocks(card, every=True)
    assert len(blocks) == 2 and uses_cl_zoo(blocks[0]) and not uses_cl_zoo(blocks[1])
    assert usage_blocks(card) == blocks[:1]  # the usage snippet publish runs is cl-zoo's alone
    folder = str(resnet18_folder.resolve())
    assert f"timm.create_model({'local-dir:' + folder!r}, pretrained=True)" in blocks[1]
    assert "num_classes: 0" in section and "same weights" in section
    assert section.index("import cl_zoo") < section.index("import timm") < section.index("torch.hub.load")
    # For the Hub the timm call names the repo, as cl-zoo's does.
    hub = how_to_load(render_card(read_config(resnet18_folder), source="hf-hub:alice/r18"))
    assert "timm.create_model('hf-hub:alice/r18', pretrained=True)" in hub


def test_both_snippets_push_a_real_photo_through_the_same_preprocessing_to_the_same_features(
    resnet18_folder: Path, tmp_path: Path
) -> None:
    """The card's two blocks, as written (the sample photo served from a local file): the same photo
    becomes (to one 8-bit level) the same input tensor, and the same network gives the same features."""
    pytest.importorskip("timm", reason="timm is an optional extra (pip install cl-zoo[timm])")
    from cl_zoo.checkpoint.card import SAMPLE_IMAGE_URL
    from cl_zoo.checkpoint.usage import local_sample_image

    card = (resnet18_folder / CARD_NAME).read_text(encoding="utf-8")
    ours, theirs = usage_blocks(card, every=True)
    assert SAMPLE_IMAGE_URL in ours and SAMPLE_IMAGE_URL in theirs and "torch.rand" not in card
    assert "timm.data.resolve_model_data_config(model)" in theirs and "is_training=False" in theirs
    run: list[dict[str, Any]] = []
    for block in (ours, theirs):
        namespace: dict[str, Any] = {}
        exec(compile(local_sample_image(block, tmp_path), "card block", "exec"), namespace)  # the card's text
        run.append(namespace)
    zoo, tm = run
    assert not zoo["model"].training and not tm["model"].training
    assert zoo["features"].shape == tm["features"].shape == (1, 512)
    # The same resize, crop and normalisation: pixels agree to within one 8-bit level (PIL rounds its
    # resized image to uint8, a float resize need not), so the features agree to 1e-3 of their scale.
    one_level = 1.0 / 255 / min(tm["config"]["std"])
    assert (zoo["transform"](zoo["image"]) - tm["transform"](tm["image"])).abs().max() <= 1.01 * one_level
    x = tm["transform"](tm["image"]).unsqueeze(0)
    with torch.no_grad():  # the same network: one input tensor, the same features
        assert torch.allclose(zoo["model"](x), tm["model"](x), atol=1e-5)
    assert torch.nn.functional.cosine_similarity(zoo["features"], tm["features"]).item() > 0.9999


def test_datasets_are_hub_ids_and_unknown_ones_are_left_out() -> None:
    from cl_zoo.checkpoint.card import hub_dataset_id

    assert [hub_dataset_id(n) for n in ("cifar10", "CIFAR100", "imagenette", "imagenet-1k", "imagenet1k")] == [
        "uoft-cs/cifar10", "uoft-cs/cifar100", "frgfm/imagenette", "ILSVRC/imagenet-1k", "ILSVRC/imagenet-1k"]
    assert hub_dataset_id("data/my-photos") is None  # a path, never taken for a Hub id
    assert hub_dataset_id("stl10") is None and hub_dataset_id("my_folder") is None and hub_dataset_id(None) is None
    config = config_of("resnet18")
    config["cl_zoo_pretrained_cfg"]["dataset"] = "my_folder"
    config["metrics"] = {"my_folder_knn_k20_top1": 0.5}
    meta = front_matter(config)
    assert "datasets" not in meta  # no link to a dataset the Hub does not have
    assert meta["model-index"][0]["results"][0]["dataset"] == {"type": "my_folder", "name": "my_folder"}


def test_publish_accepts_the_library_names_cards_are_written_with(resnet18_folder: Path, tmp_path: Path) -> None:
    import shutil

    from cl_zoo.checkpoint.publish import validate_folder
    from cl_zoo.errors import CheckpointError

    assert validate_folder(resnet18_folder).front_matter["library_name"] == "timm"
    folder = Path(shutil.copytree(resnet18_folder, tmp_path / "copy"))
    card = folder / CARD_NAME
    card.write_text(card.read_text(encoding="utf-8").replace("library_name: timm", "library_name: cl-zoo"), encoding="utf-8")
    assert validate_folder(folder).front_matter["library_name"] == "cl-zoo"
    card.write_text(card.read_text(encoding="utf-8").replace("library_name: cl-zoo", "library_name: transformers"),
                    encoding="utf-8")
    with pytest.raises(CheckpointError, match="library_name is 'transformers', expected 'timm' or 'cl-zoo'"):
        validate_folder(folder)


def test_v2_config_with_cl_zoo_keys_in_pretrained_cfg_is_not_carded_as_timm_loadable() -> None:
    config = copy.deepcopy(config_of("resnet18"))
    assert "timm" in front_matter(config)["tags"]
    config["pretrained_cfg"]["metrics"] = {"x_knn_k5_top1": 0.5}  # timm's PretrainedCfg has no 'metrics'
    assert "timm" not in front_matter(config)["tags"]
    assert "pretrained_cfg has keys timm refuses (metrics)" in render_card(config, folder="/tmp/x")
