"""The checkpoint folder: round trips (single file and shards) and every malformed-input error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import cl_zoo
from cl_zoo import checkpoint
from cl_zoo.checkpoint.card import parse_front_matter
from cl_zoo.checkpoint import CARD_NAME, CONFIG_NAME, INDEX_NAME, WEIGHTS_NAME, load_folder
from cl_zoo.errors import CheckpointError


def tiny(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_var.uniform_(0.5, 2)
    return model


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_round_trip_single_file(tmp_path: Path) -> None:
    model = tiny()
    model.pretrained_cfg.method = "dcl"
    folder = cl_zoo.save_pretrained(model, tmp_path / "ckpt", recipe={"epochs": 1}, metrics={"knn_top1": 0.42})
    assert files_in(folder) == {CONFIG_NAME, WEIGHTS_NAME, CARD_NAME}
    config = json.loads((folder / CONFIG_NAME).read_text())
    assert config["architecture"] == "resnet18_cifar" and config["model_args"] == {"width": 0.125}
    assert config["files"][WEIGHTS_NAME] == checkpoint.sha256_file(folder / WEIGHTS_NAME)
    assert config["metrics"] == {"knn_top1": 0.42} and config["recipe"] == {"epochs": 1}
    meta = parse_front_matter((folder / CARD_NAME).read_text())
    assert meta["library_name"] == "cl-zoo" and "dcl" in meta["tags"]
    loaded = cl_zoo.load_pretrained(folder)
    assert same(model, loaded) and not loaded.training
    assert loaded.pretrained_cfg.method == "dcl" and loaded.pretrained_cfg.metrics["knn_top1"] == 0.42
    # A weights file beside its config loads the folder; so does load_model.
    assert same(model, cl_zoo.load_pretrained(folder / WEIGHTS_NAME))
    assert same(model, cl_zoo.load_model(str(folder)))


def test_round_trip_sharded_and_resave(tmp_path: Path) -> None:
    model = tiny(1)
    folder = cl_zoo.save_pretrained(model, tmp_path / "ckpt", max_shard_size="60KB")
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) >= 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((folder / INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(model.state_dict()) and set(index["weight_map"].values()) == set(shards)
    assert not (folder / WEIGHTS_NAME).exists()
    assert same(model, cl_zoo.load_pretrained(folder))
    # Saving again unsharded removes the stale shards and index.
    cl_zoo.save_pretrained(model, folder)
    assert files_in(folder) == {CONFIG_NAME, WEIGHTS_NAME, CARD_NAME}
    assert same(model, cl_zoo.load_pretrained(folder))


def test_shards_are_huggingface_hubs_split(tmp_path: Path) -> None:
    """The weight map is exactly huggingface_hub's split of the state dict, a tensor larger than the
    shard size included (the Hub puts it alone in its shard and goes on filling the current one)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    model = tiny(1)
    state = model.state_dict()
    sizes = {name: t.numel() * t.element_size() for name, t in state.items()}
    limit = max(sizes.values()) - 1  # the largest tensors (layer4 convs, BatchNorms between them) are over it
    folder = cl_zoo.save_pretrained(model, tmp_path / "ckpt", max_shard_size=limit)
    expected = split_torch_state_dict_into_shards(
        {k: v.clone() for k, v in state.items()}, filename_pattern="model{suffix}.safetensors", max_shard_size=limit)
    index = json.loads((folder / INDEX_NAME).read_text())
    assert index["weight_map"] == expected.tensor_to_filename
    assert index["metadata"]["total_size"] == expected.metadata["total_size"] == sum(sizes.values())
    assert same(model, cl_zoo.load_pretrained(folder))


def test_half_precision_storage_loads_as_float32(tmp_path: Path) -> None:
    model = tiny()
    folder = cl_zoo.save_pretrained(model, tmp_path / "half", dtype=torch.float16)
    loaded = cl_zoo.load_pretrained(folder)
    assert loaded.conv1.weight.dtype == torch.float32
    assert torch.allclose(loaded.conv1.weight, model.conv1.weight, atol=1e-3, rtol=1e-3)


def test_bare_files(tmp_path: Path) -> None:
    model = tiny()
    pth = tmp_path / "weights.pth"
    torch.save({"state_dict": model.state_dict()}, pth)
    with pytest.raises(CheckpointError, match="bare weights file"):
        cl_zoo.load_pretrained(pth)
    assert same(model, cl_zoo.load_pretrained(pth, arch="resnet18_cifar", width=0.125))
    evil = tmp_path / "evil.pth"
    torch.save({"obj": object()}, evil)  # not loadable with weights_only=True
    with pytest.raises(CheckpointError, match="weights_only"):
        cl_zoo.load_pretrained(evil, arch="resnet18_cifar")
    with pytest.raises(CheckpointError, match="does not exist"):
        cl_zoo.load_pretrained(tmp_path / "missing.safetensors")


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return cl_zoo.save_pretrained(tiny(), tmp_path / "ckpt")


def test_malformed_config(saved: Path) -> None:
    (saved / CONFIG_NAME).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_folder(saved)
    (saved / CONFIG_NAME).write_text(json.dumps({"architecture": "resnet18_cifar"}))
    with pytest.raises(CheckpointError, match="lacks 'model_args'"):
        load_folder(saved)
    (saved / CONFIG_NAME).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="JSON object"):
        load_folder(saved)


def test_unknown_architecture_in_config(saved: Path) -> None:
    config = json.loads((saved / CONFIG_NAME).read_text())
    config["architecture"] = "resnet19_cifar"
    (saved / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="architecture: unknown model 'resnet19_cifar'; did you mean"):
        load_folder(saved)


def test_shape_mismatch(saved: Path) -> None:
    config = json.loads((saved / CONFIG_NAME).read_text())
    config["model_args"] = {"width": 0.25}
    (saved / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="do not match the architecture: .* has shape"):
        load_folder(saved)
    config["architecture"], config["model_args"] = "resnet34_cifar", {"width": 0.125}
    (saved / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="missing"):
        load_folder(saved)


def test_sha256_mismatch(saved: Path) -> None:
    data = bytearray((saved / WEIGHTS_NAME).read_bytes())
    data[-1] ^= 0xFF
    (saved / WEIGHTS_NAME).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 mismatch"):
        load_folder(saved)


def test_missing_weights_and_shards(saved: Path, tmp_path: Path) -> None:
    (saved / WEIGHTS_NAME).unlink()
    with pytest.raises(CheckpointError, match="weights missing"):
        load_folder(saved)
    sharded = cl_zoo.save_pretrained(tiny(), tmp_path / "sharded", max_shard_size="60KB")
    next(sharded.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="listed in the shard index but missing"):
        load_folder(sharded)
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        load_folder(tmp_path / "nowhere")


def test_truncated_weights_without_recorded_hash(saved: Path) -> None:
    config = json.loads((saved / CONFIG_NAME).read_text())
    del config["files"]
    (saved / CONFIG_NAME).write_text(json.dumps(config))
    (saved / WEIGHTS_NAME).write_bytes((saved / WEIGHTS_NAME).read_bytes()[:100])
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_folder(saved)


def test_failed_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CheckpointError, match="arch_name"):
        cl_zoo.save_pretrained(torch.nn.Linear(2, 2), tmp_path / "plain")
    assert not (tmp_path / "plain").exists()

    folder = cl_zoo.save_pretrained(tiny(), tmp_path / "ckpt")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def broken_card(*args: object, **kwargs: object) -> str:
        raise RuntimeError("disk full")

    monkeypatch.setattr("cl_zoo.checkpoint.card.render_card", broken_card)
    with pytest.raises(RuntimeError, match="disk full"):
        cl_zoo.save_pretrained(tiny(5), folder, max_shard_size="60KB")
    # The earlier checkpoint is intact and no staging folder or shard is left behind.
    assert files_in(folder) == set(before)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
