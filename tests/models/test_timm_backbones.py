"""timm models as backbones (``--arch timm/<name>``): every method trains on them, the run's folder is
one timm loads natively with the same features, and the user mistakes around them are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import cl_zoo
from cl_zoo.cli import main
from tests.helpers import hide, make_folder, one_error_line

timm = pytest.importorskip("timm", reason="timm is in the test extra: pip install -e '.[test]'")

pytestmark = pytest.mark.usefixtures("isolated_cache", "one_thread")

# Small enough to train a step in a second or two: 32 px images, a ViT with 8 px patches (16 tokens).
ARCHS = {
    "timm/resnet50": [],
    "timm/convnext_atto": [],
    "timm/vit_small_patch16_224": ["--set", "model_args.img_size=32", "--set", "model_args.patch_size=8"],
}
METHOD_ARGS = {"mocov2": ["--set", "method_args.queue_size=8"], "jcl": ["--set", "method_args.queue_size=8"]}
FAST_METHODS = ("simclr", "mocov2", "cacr")
SLOW_METHODS = ("dcl", "dclw", "jcl", "simo", "cmc", "mocov3")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("timm") / "train", classes=2, per_class=2, size=32)


def pretrain(method: str, arch: str, images: Path, out: Path, *extra: str) -> int:
    """One step (4 images, batch 4) of ``method`` on ``arch``; the exit code."""
    return main(["pretrain", "--no-progress", "--method", method, "--arch", arch, *ARCHS.get(arch, []),
                 *METHOD_ARGS.get(method, []), *extra, "--image-size", "32", "--set", "data.augment=cifar",
                 "--batch-size", "4", "--epochs", "1", "--knn-every", "0", "--data", str(images), "--out", str(out)])


def check_trained(folder: Path) -> None:
    model = cl_zoo.load_pretrained(str(folder))
    with torch.no_grad():
        feats = model.forward_features(torch.rand(2, 3, 32, 32))
    assert feats.shape == (2, model.num_features) and torch.isfinite(feats).all()


@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory: pytest.TempPathFactory, images: Path) -> Path:
    out = tmp_path_factory.mktemp("vit") / "run"
    assert pretrain("simclr", "timm/vit_small_patch16_224", images, out) == 0
    return out / "model"


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("method", FAST_METHODS)
def test_methods_train_a_step_on_timm_backbones(method: str, arch: str, images: Path, tmp_path: Path) -> None:
    assert pretrain(method, arch, images, tmp_path / "run") == 0
    check_trained(tmp_path / "run" / "model")


@pytest.mark.slow
@pytest.mark.parametrize(("method", "arch"), [*((m, a) for m in SLOW_METHODS for a in ARCHS), ("cmc", "cmc_lab/timm/convnext_atto")])
def test_the_other_methods_train_on_timm_backbones(method: str, arch: str, images: Path, tmp_path: Path) -> None:
    assert pretrain(method, arch, images, tmp_path / "run") == 0
    check_trained(tmp_path / "run" / "model")


def test_cmc_on_a_pair_of_timm_encoders_takes_one_and_two_channels() -> None:
    pair = cl_zoo.create_model("cmc_lab/timm/vit_small_patch16_224", img_size=32, patch_size=8, depth=1)
    assert pair.l_encoder.patch_embed.proj.in_channels == 1 and pair.ab_encoder.patch_embed.proj.in_channels == 2
    assert pair.num_features == 2 * 384 and pair(torch.rand(2, 3, 32, 32)).shape == (2, 768)


def test_timm_loads_the_vit_folder_natively_with_the_same_features(vit_folder: Path) -> None:
    config = json.loads((vit_folder / "config.json").read_text())
    assert config["architecture"] == "vit_small_patch16_224" and config["model_args"] == {"img_size": 32, "patch_size": 8}
    assert "library_name: timm" in (vit_folder / "README.md").read_text()
    theirs = timm.create_model(f"local-dir:{vit_folder}", pretrained=True).eval()
    ours = cl_zoo.load_pretrained(str(vit_folder))
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        diff = (theirs(x) - ours.forward_features(x)).abs().max().item()
    assert diff == 0.0
    assert type(theirs).__name__ == "VisionTransformer" and ours.arch_name == "timm/vit_small_patch16_224"


def test_embed_takes_a_vit_folder(vit_folder: Path, tmp_path: Path, images: Path) -> None:
    assert main(["embed", "--model", str(vit_folder), str(images), "--out", str(tmp_path / "emb.npy")]) == 0
    import numpy as np

    assert np.load(tmp_path / "emb.npy").shape == (4, 384)


def test_detect_says_vit_backbones_are_not_supported(vit_folder: Path, tiny_coco_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "det"
    code = main(["detect", "--model", str(vit_folder), "--data", str(tiny_coco_dir / "tiny-coco"), "--train-split",
                 "train2017", "--val-split", "none", "--output", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == ("error: timm/vit_small_patch16_224 is a Vision Transformer: ViT backbones are not "
                                     "supported by detect yet (it needs a ResNet backbone: conv1/bn1/layer1..4)")
    assert not out.exists()


def test_without_timm_the_error_names_the_extra(monkeypatch, images: Path, tmp_path: Path, capsys) -> None:
    from cl_zoo.models.timm_encoder import timm_entry

    timm_entry.cache_clear()  # an entry resolved while timm was importable would skip the check
    hide(monkeypatch, "timm")
    try:
        code = pretrain("simclr", "timm/resnet50", images, tmp_path / "run")
        assert code == 2 and one_error_line(capsys) == (
            "error: the architecture timm/resnet50 needs timm, which is not installed: pip install 'cl-zoo[timm]'")
        assert not (tmp_path / "run").exists()
    finally:
        timm_entry.cache_clear()


def test_an_unknown_timm_name_is_one_line_with_close_names(images: Path, tmp_path: Path, capsys) -> None:
    code = pretrain("simclr", "timm/vit_smal_patch16_224", images, tmp_path / "run")
    assert code == 2
    assert one_error_line(capsys).startswith("error: unknown timm model 'vit_smal_patch16_224'; did you mean "
                                             "timm/vit_small_patch16_224")
    assert not (tmp_path / "run").exists()


def test_split_bn_on_a_backbone_without_batchnorm_is_refused(images: Path, tmp_path: Path, capsys) -> None:
    code = pretrain("mocov2", "timm/convnext_atto", images, tmp_path / "run", "--set", "method_args.split_bn=2")
    assert code == 2 and "split_bn=2 splits the backbone's BatchNorm2d layers and timm/convnext_atto has none" in (
        one_error_line(capsys))
    assert not (tmp_path / "run").exists()


def test_model_args_are_checked_against_the_timm_class() -> None:
    with pytest.raises(cl_zoo.errors.ModelArgumentError, match="does not take patch_sise=8; timm/vit_small_patch16_224 accepts"):
        cl_zoo.create_model("timm/vit_small_patch16_224", patch_sise=8)
    with pytest.raises(cl_zoo.errors.ModelArgumentError, match="does not take pretrained"):
        cl_zoo.create_model("timm/resnet50", pretrained_cfg={})


def test_export_of_a_vit_folder_points_to_timms_own_load(vit_folder: Path, tmp_path: Path, capsys) -> None:
    code = main(["export", "timm", str(vit_folder), str(tmp_path / "out.safetensors")])
    assert code == 2 and one_error_line(capsys) == (
        "error: timm/vit_small_patch16_224 (VisionTransformer) is not a ResNet backbone, and its checkpoint folder "
        "already loads in timm as it is: timm.create_model('local-dir:FOLDER', pretrained=True) (cl-zoo export writes "
        "ResNet weights only)")
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_timm_loads_the_vit_folder_from_the_hub_with_the_same_features(vit_folder: Path, tmp_path: Path, monkeypatch) -> None:
    """``timm.create_model("hf-hub:...")`` through the local Hub test server; timm reads the endpoint at
    import, so the load runs in a child interpreter (as tests/checkpoint/test_timm_compat.py does)."""
    import os
    import subprocess
    import sys

    from huggingface_hub import HfApi

    from tests.hub_server import FakeHub, online

    online(monkeypatch)
    token = "hf_timm_vit_token"
    script = """
import sys, timm, torch, cl_zoo
torch.manual_seed(0)
x = torch.rand(2, 3, 32, 32)
with torch.no_grad():
    a = timm.create_model("hf-hub:" + sys.argv[1], pretrained=True).eval()(x)
    b = cl_zoo.load_pretrained(sys.argv[2]).forward_features(x)
print(float((a - b).abs().max()))
"""
    with FakeHub(tmp_path / "hub", token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("timm-test/vit", exist_ok=True)
        api.upload_folder(repo_id="timm-test/vit", folder_path=str(vit_folder))
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "cache"),
               "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_TOKEN": token}
        done = subprocess.run([sys.executable, "-c", script, "timm-test/vit", str(vit_folder)], env=env, check=False,
                              capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) == 0.0


def test_info_describes_a_timm_architecture(capsys) -> None:
    code = main(["info", "timm/convnext_atto"])
    out = capsys.readouterr().out
    assert code == 0 and "timm/convnext_atto (architecture)" in out and "features     : 320" in out
    assert main(["info", "timm/convnext_atta"]) == 2
    assert one_error_line(capsys).startswith("error: unknown timm model 'convnext_atta'; did you mean timm/convnext_atto")


def test_a_folder_whose_two_architecture_names_disagree_is_one_line(vit_folder: Path, images: Path, tmp_path: Path,
                                                                   capsys) -> None:
    import shutil

    folder = tmp_path / "edited"
    shutil.copytree(vit_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["cl_zoo_architecture"] = "timm/resnet50"
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["embed", "--model", str(folder), str(images), "--out", str(tmp_path / "e.npy")]) == 2
    assert "'cl_zoo_architecture' must be 'timm/vit_small_patch16_224'" in one_error_line(capsys)
    assert not (tmp_path / "e.npy").exists()
