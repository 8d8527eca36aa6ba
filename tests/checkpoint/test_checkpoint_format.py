"""Checkpoint format 2 (issue 22): config.json is a timm config plus cl-zoo's own top-level keys, the
weights are one model.safetensors, and format-1 folders (every field in pretrained_cfg, 15 MB
shards) still load unchanged. The real timm is exercised in tests/checkpoint/test_timm_compat.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import cl_zoo
from cl_zoo.checkpoint import (
    FORMAT_VERSION,
    INDEX_NAME,
    WEIGHTS_NAME,
    config_pretrained_cfg,
    consolidate_weights,
    load_state_dict,
    read_config,
    upgrade_config,
)
from cl_zoo.checkpoint.timm_compat import TIMM_PRETRAINED_FIELDS, ZOO_CFG_KEY, merged_pretrained_cfg


def small_resnet(tmp_path: Path, **save: object) -> Path:
    torch.manual_seed(0)
    model = cl_zoo.create_model("dcl_resnet18.imagenette64_cpu")  # its registered preprocessing and provenance
    return cl_zoo.save_pretrained(model, tmp_path / "ckpt", metrics={"x_knn_k20_top1": 0.5}, **save)


def as_format_1(folder: Path) -> None:
    """Rewrite a folder's config.json as cl-zoo 0.1 wrote it: every field inside pretrained_cfg."""
    config = json.loads((folder / "config.json").read_text())
    old = {k: v for k, v in config.items() if k not in ("num_classes", "pretrained_cfg", ZOO_CFG_KEY)}
    old.update(format_version=1, pretrained_cfg=merged_pretrained_cfg(config))
    (folder / "config.json").write_text(json.dumps(old, indent=2) + "\n")


def test_a_saved_folder_is_a_timm_config_with_one_weights_file(tmp_path: Path) -> None:
    folder = small_resnet(tmp_path)
    config = read_config(folder)
    assert config["format_version"] == FORMAT_VERSION == 2
    assert list(config)[:5] == ["architecture", "num_classes", "num_features", "model_args", "pretrained_cfg"]
    assert config["num_classes"] == 0 and config["num_features"] == 512
    assert set(config["pretrained_cfg"]) <= TIMM_PRETRAINED_FIELDS
    assert config["pretrained_cfg"]["first_conv"] == "conv1" and config["pretrained_cfg"]["classifier"] == "fc"
    assert config[ZOO_CFG_KEY]["bundled"] == "dcl_resnet18.imagenette64_cpu" and config["method"] == "dcl"
    assert config["metrics"]["x_knn_k20_top1"] == 0.5 and "metrics" not in config[ZOO_CFG_KEY]
    assert sorted(p.name for p in folder.glob("*.safetensors")) == [WEIGHTS_NAME]  # 44 MB, under 5 GB
    cfg = config_pretrained_cfg(config)
    assert cfg.method == "dcl" and cfg.input_size == (3, 64, 64) and cfg.metrics["x_knn_k20_top1"] == 0.5
    assert upgrade_config(config) == config


def test_format_1_folders_load_unchanged_and_upgrade_to_the_same_config(tmp_path: Path) -> None:
    folder = small_resnet(tmp_path, max_shard_size="15MB")
    assert (folder / INDEX_NAME).is_file()
    current = read_config(folder)
    expected = cl_zoo.load_pretrained(folder).state_dict()
    as_format_1(folder)
    old = read_config(folder)
    assert old["format_version"] == 1 and "mean" in old["pretrained_cfg"] and "bundled" in old["pretrained_cfg"]
    model = cl_zoo.load_pretrained(folder)
    assert model.pretrained_cfg == config_pretrained_cfg(current)
    for key, value in expected.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert upgrade_config(old) == current


def test_consolidating_shards_keeps_every_tensor(tmp_path: Path) -> None:
    folder = small_resnet(tmp_path, max_shard_size="15MB", dtype=torch.float16)
    before = load_state_dict(folder)
    pins = consolidate_weights(folder)
    assert list(pins) == [WEIGHTS_NAME] and not (folder / INDEX_NAME).exists()
    assert sorted(p.name for p in folder.glob("*.safetensors")) == [WEIGHTS_NAME]
    after = load_state_dict(folder, sha256=pins)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert consolidate_weights(folder) == pins  # a single file is left as it is
