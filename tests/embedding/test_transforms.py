"""One-call preprocessing: PretrainedCfg as timm's dict, resolve_data_config and create_transform.

The transform must be what ``cl-zoo embed`` feeds the model (checked bit for bit with the ``pixels``
model, whose features are its input), and agree with timm's own transform for the same model up to
the documented one-level resampling difference (cl_zoo/embedding/transforms.py).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

import cl_zoo
from cl_zoo.checkpoint.hub import find_bundled
from cl_zoo.registry import DEFAULT_MODEL, PretrainedCfg, find_arch, get_pretrained, list_models
from tests.helpers import EXAMPLE_PHOTOS_DIR

PHOTOS = sorted(EXAMPLE_PHOTOS_DIR.glob("*.jpg"))
# One uint8 level after normalisation, for the channel with the smallest std.
ONE_LEVEL = 1.0 / (255 * min(PretrainedCfg().std)) + 1e-5


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return cl_zoo.create_model(DEFAULT_MODEL, pretrained=True).eval()


def pixels_model(cfg: PretrainedCfg) -> torch.nn.Module:
    """Features = the normalised input itself, so embedding shows exactly what a model is fed."""
    net = cl_zoo.create_model("pixels", input_size=cfg.input_size[-1])
    net.pretrained_cfg = copy.deepcopy(cfg)
    return net.eval()


def one_level_apart(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    diff = (a - b).abs()
    assert diff.max().item() <= ONE_LEVEL
    assert (diff > 1e-5).float().mean().item() < 0.01  # about 0.2% of values in practice


def test_photos_present() -> None:
    assert len(PHOTOS) == 8


# ---------------------------------------------------------------------------------------------
# PretrainedCfg as the dict timm keeps in model.pretrained_cfg
# ---------------------------------------------------------------------------------------------


def test_pretrained_cfg_reads_as_timm_dict(model: torch.nn.Module) -> None:
    from cl_zoo.checkpoint.timm_compat import TIMM_PRETRAINED_FIELDS

    cfg = model.pretrained_cfg
    assert isinstance(cfg, PretrainedCfg) and dataclasses.is_dataclass(cfg)
    assert cfg["input_size"] == cfg.input_size == (3, 64, 64)
    assert cfg["mean"] == cfg.mean and cfg.get("std") == cfg.std and cfg["interpolation"] == "bilinear"
    assert cfg["crop_pct"] == 0.875 and cfg.get("crop_mode") == "center" and cfg["num_classes"] == 0
    assert cfg.get("test_input_size") is None and cfg.get("test_input_size", 1) == 1
    assert "mean" in cfg and "test_input_size" not in cfg and bool(cfg)
    # Only timm's fields: dict(cfg) is a pretrained_cfg timm's dataclass accepts.
    assert set(dict(cfg)) <= TIMM_PRETRAINED_FIELDS and list(cfg) == list(cfg.keys()) and len(cfg) == len(dict(cfg.items()))
    assert "bundled" not in cfg and cfg.bundled == DEFAULT_MODEL
    with pytest.raises(KeyError):
        cfg["bundled"]
    # The dataclass is untouched: its own dict, replace, equality.
    assert cfg.to_dict()["bundled"] == DEFAULT_MODEL and cfg.to_dict()["mean"] == list(cfg.mean)
    assert dataclasses.replace(cfg, crop_pct=1.0)["crop_pct"] == 1.0 and cfg == copy.deepcopy(cfg)


def test_timm_reads_the_dict_view(model: torch.nn.Module) -> None:
    timm = pytest.importorskip("timm", reason="timm is in the test extra; this checks timm's own functions on zoo models")
    from timm.models._pretrained import PretrainedCfg as TimmCfg

    TimmCfg(**dict(model.pretrained_cfg))  # refuses unknown keys
    config = timm.data.resolve_model_data_config(model)  # used to fail: 'PretrainedCfg' object has no attribute 'get'
    assert config == cl_zoo.resolve_data_config(model) == cl_zoo.resolve_data_config(DEFAULT_MODEL)
    assert config == {
        "input_size": (3, 64, 64), "interpolation": "bilinear", "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225), "crop_pct": 0.875, "crop_mode": "center",
    }
    # A timm model's plain-dict pretrained_cfg resolves the same way in both.
    theirs = timm.create_model("resnet18", pretrained=False)
    assert cl_zoo.resolve_data_config(theirs) == timm.data.resolve_model_data_config(theirs)


# ---------------------------------------------------------------------------------------------
# create_transform: cl-zoo embed's preprocessing, and timm's
# ---------------------------------------------------------------------------------------------


def test_transform_is_what_embed_feeds_the_model(model: torch.nn.Module) -> None:
    probe = pixels_model(model.pretrained_cfg)
    fed, paths = cl_zoo.embed(PHOTOS, probe, device="cpu", precision="fp32", backend="torch", workers=0)
    assert paths == [str(p) for p in PHOTOS]
    tf = cl_zoo.create_transform(model)
    ours = torch.stack([tf(Image.open(p)) for p in PHOTOS])
    assert ours.shape == (8, 3, 64, 64) and ours.dtype == torch.float32
    assert np.array_equal(ours.flatten(1).numpy(), fed)  # bit for bit
    # Name, config dict, checkpoint folder: the same transform.
    folder = find_bundled(DEFAULT_MODEL)
    assert folder is not None
    for spec in (DEFAULT_MODEL, cl_zoo.resolve_data_config(model), folder, model.pretrained_cfg):
        assert torch.equal(cl_zoo.create_transform(spec)(Image.open(PHOTOS[0])), ours[0])


def test_transform_matches_timm_on_real_photos(model: torch.nn.Module) -> None:
    timm = pytest.importorskip("timm", reason="timm is in the test extra; the comparison needs its transform")
    theirs_tf = timm.data.create_transform(**timm.data.resolve_model_data_config(model))
    ours_tf = cl_zoo.create_transform(model)
    ours = torch.stack([ours_tf(Image.open(p).convert("RGB")) for p in PHOTOS])
    theirs = torch.stack([theirs_tf(Image.open(p).convert("RGB")) for p in PHOTOS])
    one_level_apart(ours, theirs)
    with torch.no_grad():
        a, b = model(ours), model(theirs)
    assert torch.nn.functional.cosine_similarity(a, b).min().item() > 0.9999


def test_transform_matches_torchvision_without_timm(model: torch.nn.Module) -> None:
    cfg = model.pretrained_cfg
    reference = T.Compose([T.Resize(73), T.CenterCrop(64), T.ToTensor(), T.Normalize(cfg.mean, cfg.std)])
    tf = cl_zoo.create_transform(model)
    one_level_apart(torch.stack([tf(Image.open(p)) for p in PHOTOS]), torch.stack([reference(Image.open(p).convert("RGB")) for p in PHOTOS]))


def test_every_registered_model_resizes_as_timm_does() -> None:
    """timm resizes to floor(W / crop_pct), cl-zoo to round(...): equal for every registered config."""
    cfgs = [get_pretrained(n).cfg for n in list_models(pretrained=True)]
    cfgs += [find_arch(n).default_cfg for n in list_models() if find_arch(n) is not None]
    for cfg in cfgs:
        _, h, w = cfg.input_size
        assert h == w and math.floor(w / cfg.crop_pct) == cfg.resize_size, cfg
    # Where they would differ, cl-zoo's own size wins (what stored embeddings were made with).
    odd = {"input_size": (3, 96, 96), "crop_pct": 0.875, "interpolation": "bilinear"}
    assert cl_zoo.create_transform(odd).transforms[1].preprocess.resize_size == 110 != math.floor(96 / 0.875)


def test_in_memory_kinds_match_files(tmp_path: Path, model: torch.nn.Module) -> None:
    """RGBA, palette-with-transparency and greyscale files read like the same PIL images in memory."""
    probe = pixels_model(model.pretrained_cfg)
    base = Image.open(PHOTOS[0]).convert("RGB")
    rgba = base.convert("RGBA")
    rgba.putalpha(128)
    palette = base.convert("P")
    palette.info["transparency"] = 0
    made = {"rgba.png": rgba, "palette.png": palette, "grey.png": base.convert("L")}
    for name, img in made.items():
        img.save(tmp_path / name)
    files, paths = cl_zoo.embed([tmp_path / n for n in made], probe, device="cpu", precision="fp32", backend="torch", workers=0)
    assert len(paths) == 3
    tf = cl_zoo.create_transform(probe)
    in_memory = np.stack([tf(Image.open(p)).flatten().numpy() for p in paths])
    assert np.array_equal(in_memory, files)


# ---------------------------------------------------------------------------------------------
# resolve_data_config: overrides and refusals
# ---------------------------------------------------------------------------------------------


def test_resolve_overrides(model: torch.nn.Module) -> None:
    config = cl_zoo.resolve_data_config(model, img_size=96, mean=(0.5,), interpolation="bicubic", crop_pct=None)
    assert config["input_size"] == (3, 96, 96) and config["mean"] == (0.5, 0.5, 0.5)
    assert config["interpolation"] == "bicubic" and config["crop_pct"] == 0.875  # None leaves a value alone
    tf = cl_zoo.create_transform(config)
    assert tf(Image.open(PHOTOS[0])).shape == (3, 96, 96)
    assert cl_zoo.resolve_data_config(model, input_size=[3, 48, 40])["input_size"] == (3, 48, 40)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: cl_zoo.resolve_data_config(m, size=3), "does not take size"),
        (lambda m: cl_zoo.resolve_data_config(m, crop_mode="squash"), "crop_mode='squash'"),
        (lambda m: cl_zoo.resolve_data_config(m, crop_pct=2.0), "crop_pct=2.0"),
        (lambda m: cl_zoo.resolve_data_config(m, interpolation="cubic"), "interpolation"),
        (lambda m: cl_zoo.create_transform(m, is_training=True), "is_training=True"),
        (lambda m: cl_zoo.create_transform(42), "from a int"),
        (lambda m: cl_zoo.create_transform("resnet5"), "unknown model 'resnet5'"),
        (lambda m: cl_zoo.create_transform(m)(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)), "one image at a time"),
    ],
)
def test_refusals_are_one_line(model: torch.nn.Module, call, match: str) -> None:  # noqa: ANN001
    with pytest.raises(cl_zoo.ClZooError, match=match) as info:
        call(model)
    assert "\n" not in str(info.value)


def test_transform_takes_tensors_and_arrays(model: torch.nn.Module) -> None:
    tf = cl_zoo.create_transform(model)
    img = Image.open(PHOTOS[1]).convert("RGB")
    expected = tf(img)
    assert torch.equal(tf(np.asarray(img)), expected)
    assert torch.equal(tf(T.functional.pil_to_tensor(img)), expected)
    assert torch.equal(tf(T.functional.to_tensor(img)), expected)  # float 0-1, rounded back to the same 8 bits
