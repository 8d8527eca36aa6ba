"""Exports: detectron2 names/shapes from detectron2's own naming rules, torchvision/timm loadability."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torchvision

from cl_zoo.cli import main
from cl_zoo.export import export_detectron2, export_timm, export_torchvision, resnet_weights
from cl_zoo.errors import CheckpointError
from cl_zoo.factory import create_model

BN = ("weight", "bias", "running_mean", "running_var")


def detectron2_r50_expected() -> dict[str, tuple[int, ...]]:
    """What detectron2's build_resnet_backbone (DEPTH 50, STRIDE_IN_1X1 False, NORM SyncBN) holds:
    BasicStem conv1 7x7 (64) with norm; BottleneckBlocks [3, 4, 6, 3], bottleneck width 64 * 2^i,
    output 256 * 2^i; a shortcut (1x1 conv + norm) only in the first block of each stage, where
    input and output widths differ. Written from those rules, not from the exporter."""
    names: dict[str, tuple[int, ...]] = {"stem.conv1.weight": (64, 3, 7, 7)}
    names.update({f"stem.conv1.norm.{b}": (64,) for b in BN})
    in_ch = 64
    for i, blocks in enumerate([3, 4, 6, 3]):
        stage, mid, out = f"res{i + 2}", 64 * 2**i, 256 * 2**i
        for j in range(blocks):
            p = f"{stage}.{j}"
            cin = in_ch if j == 0 else out
            for k, shape in ((1, (mid, cin, 1, 1)), (2, (mid, mid, 3, 3)), (3, (out, mid, 1, 1))):
                names[f"{p}.conv{k}.weight"] = shape
                names.update({f"{p}.conv{k}.norm.{b}": (shape[0],) for b in BN})
            if cin != out:
                names[f"{p}.shortcut.weight"] = (out, cin, 1, 1)
                names.update({f"{p}.shortcut.norm.{b}": (out,) for b in BN})
        in_ch = out
    return names


@pytest.fixture(scope="module")
def r50() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("resnet50")


def test_detectron2_r50_exact_keys_shapes_values(r50, tmp_path):
    out = tmp_path / "r50.pkl"
    summary = export_detectron2(r50, out)
    with open(out, "rb") as f:
        payload = pickle.load(f, encoding="latin1")  # as detectron2's DetectionCheckpointer reads it
    assert payload["__author__"] == "cl-zoo" and payload["matching_heuristics"] is True
    model = payload["model"]
    expected = detectron2_r50_expected()
    assert set(model) == set(expected)
    assert len(model) == 265
    for name, shape in expected.items():
        assert isinstance(model[name], np.ndarray) and model[name].shape == shape, name
    sd = r50.state_dict()
    np.testing.assert_array_equal(model["stem.conv1.norm.running_var"], sd["bn1.running_var"].numpy())
    np.testing.assert_array_equal(model["res4.0.shortcut.norm.weight"], sd["layer3.0.downsample.1.weight"].numpy())
    np.testing.assert_array_equal(model["res5.2.conv3.weight"], sd["layer4.2.conv3.weight"].numpy())
    assert all(k.endswith("num_batches_tracked") for k in summary.dropped) and len(summary.dropped) == 53


def test_extracted_weights_export_like_the_model(r50, tmp_path):
    """cl-zoo detect reads the backbone once (its depth picks the config) and exports what it read."""
    weights = resnet_weights(r50)
    assert resnet_weights(weights) is weights
    export_detectron2(weights, tmp_path / "from_weights.pkl")
    export_detectron2(r50, tmp_path / "from_model.pkl")
    assert (tmp_path / "from_weights.pkl").read_bytes() == (tmp_path / "from_model.pkl").read_bytes()


def test_raw_moco_checkpoint_keeps_query_encoder(r50, tmp_path):
    sd = r50.state_dict()
    raw = {f"module.encoder_q.{k}": v for k, v in sd.items()}
    raw.update({f"module.encoder_k.{k}": torch.zeros_like(v) for k, v in sd.items()})
    raw["module.encoder_q.fc.0.weight"] = torch.zeros(8, 2048)
    raw["module.encoder_q.fc.2.weight"] = torch.zeros(4, 8)
    raw["module.queue"] = torch.zeros(4, 16)
    path = tmp_path / "moco.pth.tar"
    torch.save({"epoch": 200, "arch": "resnet50", "state_dict": raw}, path)
    summary = export_detectron2(str(path), tmp_path / "out.pkl")
    assert summary.prefix == "module.encoder_q."
    groups = dict(summary.dropped_groups())
    assert groups["module.encoder_k.*"] == 265 and groups["module.encoder_q.fc.*"] == 2
    assert groups["module.queue"] == 1
    with open(tmp_path / "out.pkl", "rb") as f:
        model = pickle.load(f)["model"]
    np.testing.assert_array_equal(model["res3.1.conv2.weight"], sd["layer2.1.conv2.weight"].numpy())
    # "backbone." and "encoder." prefixes work the same way.
    w = resnet_weights({f"backbone.{k}": v for k, v in sd.items()} | {"projector.0.weight": torch.zeros(2, 2)})
    assert w.prefix == "backbone." and w.depth == 50 and w.dropped == ["projector.0.weight"]


def test_torchvision_export_loads_strict_apart_from_fc(r50, tmp_path):
    out = tmp_path / "r50.pth"
    export_torchvision(r50, out)
    tv = torchvision.models.resnet50()
    result = tv.load_state_dict(torch.load(out, weights_only=True), strict=False)
    assert set(result.missing_keys) == {"fc.weight", "fc.bias"} and not result.unexpected_keys
    x = torch.rand(1, 3, 64, 64)
    r50.eval(), tv.eval()
    tv.fc = torch.nn.Identity()
    torch.testing.assert_close(tv(x), r50(x))


def test_timm_export_is_torchvision_names_in_safetensors(tmp_path):
    from safetensors.torch import load_file

    model = create_model("resnet18")
    out = tmp_path / "r18.safetensors"
    summary = export_timm(model, out)
    state = load_file(str(out))
    # timm's resnet18 names: torchvision's (conv1, bn1, layerN.M.convK/bnK, downsample.0/1) + fc.
    expected = {k for k in torchvision.models.resnet18().state_dict() if not k.startswith("fc.")}
    assert set(state) == expected and summary.depth == 18


@pytest.mark.parametrize("arch", ["resnet18_cifar", "cmc_resnet50x05_lab", "cmc_resnet18_lab"])
def test_non_exportable_backbones_are_refused_without_output(arch, tmp_path):
    out = tmp_path / "x.pkl"
    with pytest.raises(CheckpointError) as info:
        export_detectron2(create_model(arch), out)
    assert "\n" not in str(info.value)
    if arch.startswith("cmc_"):  # says why, instead of sending the user to --prefix and a second refusal
        assert "L/ab pair" in str(info.value) and "--prefix" not in str(info.value)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_non_resnet_is_a_one_line_cli_error(tmp_path, capsys):
    path = tmp_path / "vit.pth"
    torch.save({"patch_embed.proj.weight": torch.zeros(8, 3, 16, 16), "blocks.0.attn.qkv.weight": torch.zeros(24, 8)}, path)
    assert main(["export", "detectron2", str(path), str(tmp_path / "o.pkl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "not a ResNet backbone" in err and "\n" not in err
    assert not (tmp_path / "o.pkl").exists()


def test_cli_export_from_checkpoint_file(r50, tmp_path, capsys):
    path = tmp_path / "enc.pth"
    torch.save({"state_dict": {f"encoder.{k}": v for k, v in r50.state_dict().items()}}, path)
    assert main(["export", "torchvision", str(path), str(tmp_path / "tv.pth")]) == 0
    text = capsys.readouterr().out
    assert "ResNet-50" in text and "encoder." in text
    assert (tmp_path / "tv.pth").is_file()


@pytest.mark.parametrize(("target", "name", "line"), [
    ("timm", "x", "error: OUT {d}/x must end in .safetensors, the name timm reads this format by; name it {d}/x.safetensors"),
    ("timm", "x.pth", "error: OUT {d}/x.pth must end in .safetensors, the name timm reads this format by; name it {d}/x.safetensors"),
    ("detectron2", "x.pth", "error: OUT {d}/x.pth must end in .pkl, the name detectron2 reads this format by; name it {d}/x.pkl"),
])
def test_an_out_name_the_target_would_misread_is_refused_before_the_model_loads(target, name, line, tmp_path, monkeypatch,
                                                                                capsys):
    """timm unpickles any file not named .safetensors: `export timm NAME out/x` wrote a file timm then could not read."""
    import cl_zoo.export as export

    monkeypatch.setattr(export, "resnet_weights", lambda *a, **k: pytest.fail("the model was read before OUT was checked"))
    assert main(["export", target, "resnet18", str(tmp_path / name)]) == 2
    out, err = capsys.readouterr()
    assert (err, out) == (line.format(d=tmp_path) + "\n", "")
    assert not list(tmp_path.iterdir())
    with pytest.raises(CheckpointError, match="must end in .safetensors"):
        export_timm(create_model("resnet18"), tmp_path / name)  # the Python API too
    assert not list(tmp_path.iterdir())
