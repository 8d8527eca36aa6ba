"""Importing published checkpoints: exact original layouts, lossless conversion, same features.

The reference encoders below re-implement, with the authors' parameter names and wrapping, the
networks their training scripts save (see the docstring of :mod:`cl_zoo.convert.readers`):
MoCo/JCL (torchvision ResNet + fc or MLP head, momentum encoder, queue, DDP ``module.``), CACR
(MoCo v3: projector with BatchNorm1d, predictor, momentum encoder, GradScaler state) and CMC (its
own ResNet with a 64-channel stem and width-scaled stages, AvgPool2d(7), fc, l2norm; two of them
inside DataParallel). Most tests use ResNet-18 for MoCo-style layouts (same naming logic, much
faster); the full ResNet-50 names and shapes are checked on the meta device.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint import load_folder
from cl_zoo.convert import readers as conv
from cl_zoo.convert import sources
from cl_zoo.errors import CheckpointError, HubError
from cl_zoo.models.releases import RELEASES, Release, UrlSource
from cl_zoo.ops.color import normalize_lab, rgb_to_lab
from cl_zoo.registry import PretrainedCfg, build_arch, get_pretrained, register_pretrained, unregister_pretrained
from cl_zoo.validation import InvalidValueError
from tests.helpers import run_cli
from tests.official_checkpoints import MoCoRef, MoCoV3Ref, MyResNetsCMC, cacr_file, cmc_file, moco_file


def images(n: int = 2, size: int = 224, seed: int = 3) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------------
# Lossless conversion and equal features
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,mlp", [("moco", False), ("jcl", True)])  # v1 linear head; v2/JCL MLP head
def test_moco_and_jcl_layouts(tmp_path: Path, fmt: str, mlp: bool, capsys: pytest.CaptureFixture[str]) -> None:
    path, ref = moco_file(tmp_path, mlp=mlp)
    out = tmp_path / "zoo"
    assert run_cli("import", fmt, path, "--out", out, "--arch", "resnet18") == 0
    assert "backbone tensors" in capsys.readouterr().out
    model = load_folder(out)
    src = ref.encoder_q.state_dict()
    converted = model.state_dict()
    assert set(converted) == {k for k in src if not k.startswith("fc.")}
    for key, value in converted.items():
        assert value.dtype == src[key].dtype and torch.equal(value, src[key]), key
    x = images(size=64)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), ref.backbone_features(x), rtol=0, atol=1e-6)
    config = json.loads((out / "config.json").read_text())
    report = config["conversion"]
    head = 4 if mlp else 2
    assert report["dropped"] == {"projection head (fc)": head, "momentum encoder (encoder_k)": len(ref.encoder_k.state_dict()),
                                 "queue": 1, "queue pointer": 1}
    assert report["state_key"] == "state_dict" and report["prefix"] == "module.encoder_q."
    assert set(report["top_level"]) == {"epoch", "arch", "optimizer"}
    assert report["source_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    card = (out / "README.md").read_text()
    assert "## Conversion" in card and "## Origin" in card and report["source_sha256"] in card


def test_jcl_card_names_the_release_licence_and_paper_numbers(tmp_path: Path) -> None:
    path, _ = moco_file(tmp_path, mlp=True)
    # JCL's release is a ResNet-50; with --arch resnet50 absent this ResNet-18 file must not be
    # described as it, so check the card through the registry's own import path instead.
    out, report = conv.import_checkpoint("jcl", path, tmp_path / "zoo", arch="resnet18", release_name="jcl_resnet50.in1k_official")
    card = (out / "README.md").read_text()
    assert "license: other" in card and "CC-BY-NC 4.0" in card and "no LICENSE file" in card  # honest, not invented
    assert "https://github.com/anonymouszyx/JCL/releases/download/v1/checkpoint_0199.pth.tar" in card
    assert "https://github.com/caiqi/Joint-Contrastive-Learning/blob/" in card  # the page it was copied from
    assert "68.7%" in card and "no checksum published" in card
    assert "Trained by the paper's authors" in card
    config = json.loads((out / "config.json").read_text())
    assert config["metrics"]["imagenet1k_linear_top1_reported"] == pytest.approx(0.687)
    assert config["cl_zoo_pretrained_cfg"]["url"] == RELEASES["jcl_resnet50.in1k_official"].sources[0].url


def test_cacr_layout(tmp_path: Path) -> None:
    path, ref = cacr_file(tmp_path)
    out = tmp_path / "zoo"
    assert run_cli("import", "cacr", path, "--out", out, "--arch", "resnet18") == 0
    model = load_folder(out)
    src = ref.base_encoder.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(value, src[key]), key
    x = images(size=64)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), ref.backbone_features(x), rtol=0, atol=1e-6)
    report = json.loads((out / "config.json").read_text())["conversion"]
    assert report["prefix"] == "module.base_encoder."
    assert report["dropped"]["projection head (fc)"] == 1 + 5 + 1 + 3  # fc.0, fc.1 (BN), fc.3, fc.4 (BN, no affine)
    assert report["dropped"]["predictor"] == 1 + 5 + 1
    assert set(report["top_level"]) == {"epoch", "arch", "optimizer", "scaler"}


def test_cmc_layout_with_namespace_fp16_and_width_inference(tmp_path: Path) -> None:
    path, ref = cmc_file(tmp_path, width=0.5)
    out = tmp_path / "zoo"
    assert run_cli("import", "cmc", path, "--out", out) == 0  # width 0.5 read from the file
    model = load_folder(out)
    assert model.arch_name == "cmc_resnet50x05_lab"
    pair = ref.encoder.module
    for ours, theirs in (("l_encoder.", pair.l_to_ab), ("ab_encoder.", pair.ab_to_l)):
        src = theirs.state_dict()
        for key, value in src.items():
            if key.startswith("fc."):
                continue
            assert value.dtype == model.state_dict()[ours + key].dtype
            assert torch.equal(model.state_dict()[ours + key], value), ours + key
    rgb = images(size=224)
    with torch.no_grad():
        lab = normalize_lab(rgb_to_lab(rgb))  # CMC's data loader: skimage rgb2lab, then Normalize
        feat_l, feat_ab = ref(lab, layer=6)
        expected = torch.cat([feat_l, feat_ab], dim=1)  # LinearProbing.py's concatenation
        torch.testing.assert_close(model.forward_features(rgb), expected, rtol=1e-5, atol=1e-5)
    report = json.loads((out / "config.json").read_text())["conversion"]
    assert report["prefix"] == "encoder.module.l_to_ab. / encoder.module.ab_to_l."
    assert report["dropped"] == {"projection heads (fc)": 4}
    assert report["cast_to_float32"] > 50  # every conv weight was stored in half
    assert report["top_level"]["opt"].startswith("argparse.Namespace")
    assert set(report["top_level"]) == {"opt", "contrast", "optimizer", "epoch", "amp"}
    card = (out / "README.md").read_text()
    assert "57.5%" in card and "bsd-2-clause" in card and "could not be identified" in card
    assert "CMC_resnet50v1.pth is not named on the page" in card  # the one name the page does not print


# --------------------------------------------------------------------------------------------------
# Full-size names and shapes (meta device: no memory, no compute)
# --------------------------------------------------------------------------------------------------


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


@pytest.mark.parametrize("fmt", ["moco", "jcl", "cacr"])
def test_full_resnet50_layouts_route_every_key(fmt: str) -> None:
    with torch.device("meta"):
        ref = MoCoV3Ref(depth=50, dim=256, mlp_dim=4096) if fmt == "cacr" else MoCoRef(depth=50, K=65536, mlp=True)
        ours = build_arch("resnet50")
    state = {"module." + k: v for k, v in ref.state_dict().items()}
    stripped, _ = conv.strip_dp(state)
    backbone, dropped, _ = conv.LAYOUTS[fmt].split(stripped, Path("x"), fmt)
    assert _shapes(backbone) == _shapes(ours.state_dict())
    assert sum(dropped.values()) + len(backbone) == len(state)
    if fmt != "cacr":
        assert tuple(state["module.queue"].shape) == (128, 65536)


@pytest.mark.parametrize("width,arch,features", [(0.5, "cmc_resnet50x05_lab", 2048), (1.0, "cmc_resnet50x1_lab", 4096),
                                                 (2.0, "cmc_resnet50x2_lab", 8192)])
def test_full_cmc_layouts_every_width(width: float, arch: str, features: int) -> None:
    with torch.device("meta"):
        ref = MyResNetsCMC(width)
        ours = build_arch(arch)
    backbone, dropped, _ = conv.LAYOUTS["cmc"].split(ref.state_dict(), Path("x"), "cmc")
    assert conv.infer_cmc_arch(backbone, Path("x")) == arch
    assert _shapes(backbone) == _shapes(ours.state_dict())
    assert dropped == {"projection heads (fc)": 4}
    assert tuple(ref.state_dict()["encoder.module.l_to_ab.conv1.weight"].shape) == (64, 1, 7, 7)  # stem stays 64 wide
    assert tuple(ref.state_dict()["encoder.module.ab_to_l.fc.weight"].shape) == (128, features // 2)
    assert ours.num_features == features


# --------------------------------------------------------------------------------------------------
# Refusals: unsafe pickles, tampered or mismatched files; nothing is written
# --------------------------------------------------------------------------------------------------


class NotAllowed:
    """A class outside the allowlist (unpickling it would import and call arbitrary code)."""

    def __init__(self) -> None:
        self.flag = 1


def _fails(capsys: pytest.CaptureFixture[str], *args: Any) -> str:
    assert run_cli("import", *args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert "weights_only=False" not in err and "weights_only" not in err.replace("weights_only=True", "")
    return err


def test_arbitrary_pickle_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, ref = moco_file(tmp_path, mlp=True)
    top = torch.load(path, weights_only=True)
    top["args"] = NotAllowed()
    torch.save(top, path)
    err = _fails(capsys, "moco", path, "--out", tmp_path / "zoo", "--arch", "resnet18")
    assert "refusing to load" in err and "NotAllowed" in err and "can run code" in err
    assert not (tmp_path / "zoo").exists()


def _edit_state(path: Path, edit: Any) -> None:
    with torch.serialization.safe_globals([argparse.Namespace]):
        top = torch.load(path, weights_only=True)
    edit(top)
    torch.save(top, path)


def test_tampered_and_mismatched_files_are_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "zoo"
    path, _ = moco_file(tmp_path, mlp=True)
    good = path.read_bytes()

    path.write_bytes(good[: len(good) // 2])  # truncated download
    assert "not a readable PyTorch checkpoint" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(b"<!DOCTYPE html><html><body>Google Drive can't scan this file for viruses</body></html>")
    assert "web page" in _fails(capsys, "jcl", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)
    _edit_state(path, lambda t: t["state_dict"].__setitem__("module.extra_head.weight", torch.zeros(3)))
    assert "do not belong to a moco checkpoint (first: extra_head.weight)" in _fails(
        capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)
    _edit_state(path, lambda t: t["state_dict"].pop("module.encoder_q.layer2.0.bn1.running_var"))
    assert "missing (first: layer2.0.bn1.running_var)" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)
    _edit_state(path, lambda t: t["state_dict"].__setitem__("module.encoder_q.layer3.1.conv2.weight", torch.zeros(256, 256, 1, 1)))
    assert "layer3.1.conv2.weight has shape (256, 256, 1, 1)" in _fails(
        capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)
    _edit_state(path, lambda t: t["state_dict"]["module.encoder_q.conv1.weight"].view(-1)[0:1].fill_(float("nan")))
    assert "NaN" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet18")

    path.write_bytes(good)  # right file, wrong depth
    assert "wrong --arch" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet50")
    assert "has no 'model' entry (has: epoch, arch, state_dict, optimizer)" in _fails(capsys, "cmc", path, "--out", out)
    assert "unknown model 'resnet5'" in _fails(capsys, "moco", path, "--out", out, "--arch", "resnet5")

    cacr, _ = cacr_file(tmp_path)  # a MoCo v3 file is not a MoCo v2 one
    assert "do not belong to a moco checkpoint (first: base_encoder.conv1.weight)" in _fails(
        capsys, "moco", cacr, "--out", out, "--arch", "resnet18")
    assert not out.exists()


def test_cmc_width_mismatch_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = cmc_file(tmp_path, width=0.5, fp16=False)
    err = _fails(capsys, "cmc", path, "--out", tmp_path / "zoo", "--arch", "cmc_resnet50x1_lab")
    assert "l_encoder.layer1.0.conv1.weight has shape (32, 64, 1, 1)" in err and "(64, 64, 1, 1)" in err
    assert not (tmp_path / "zoo").exists()


# --------------------------------------------------------------------------------------------------
# Registry entries: download, verify, convert, cache; offline errors
# --------------------------------------------------------------------------------------------------


def test_registry_entries_are_honest() -> None:
    names = cl_zoo.list_models("*.in1k*", pretrained=True)
    assert {"jcl_resnet50.in1k_official", "cmc_resnet50x05_lab.in1k_official", "cmc_resnet50x1_lab.in1k_official",
            "cmc_resnet50x2_lab.in1k_official", "cacr_resnet50.in1k_official", "mocov2_resnet50.in1k_official",
            "mocov2_resnet50.in1k_800ep_official", "mocov1_resnet50.in1k_official", "dcl_resnet50.in1k_lightly",
            "dclw_resnet50.in1k_lightly", "simclr_resnet50.in1k_lightly", "mocov2_resnet50.in1k_100ep_lightly"} <= set(names)
    for name, release in RELEASES.items():
        cfg = get_pretrained(name).cfg
        assert cfg.url and release.sources and cfg.sha256 == {}
        assert cfg.license and cfg.metrics and cfg.paper and release.recipe and release.trained_by
        assert cfg.notes.startswith(f"Trained by {release.trained_by}")
        assert release.by_authors == name.endswith("_official")  # lightly's runs never pass for the authors'
    moco = RELEASES["mocov2_resnet50.in1k_official"].sources[0]
    assert isinstance(moco, UrlSource) and moco.md5_prefix == "59fd9945"
    assert RELEASES["jcl_resnet50.in1k_official"].sources[0].url == (
        "https://github.com/anonymouszyx/JCL/releases/download/v1/checkpoint_0199.pth.tar")
    assert get_pretrained("cmc_resnet50x05_lab.in1k_official").cfg.mean == (0.0, 0.0, 0.0)  # the model converts to Lab


def test_offline_error_is_one_line_and_names_the_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    # Independent of the caller's environment (CI exports HF_HUB_OFFLINE=1): each half sets the
    # offline state it tests.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("CL_ZOO_OFFLINE", "1")
    with pytest.raises(HubError) as info:
        cl_zoo.create_model("jcl_resnet50.in1k_official", pretrained=True)
    message = str(info.value)
    assert "\n" not in message and RELEASES["jcl_resnet50.in1k_official"].sources[0].url in message
    monkeypatch.delenv("CL_ZOO_OFFLINE")

    # The published host, unreachable: its address is swapped for a port nothing listens on, so the
    # real download client (torch.hub) gets a refused connection, at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(sources, "direct_url", lambda url, member=None: f"http://127.0.0.1:{port}/{url.rsplit('/', 1)[-1]}")
    with pytest.raises(HubError) as info:
        cl_zoo.create_model("mocov2_resnet50.in1k_official", pretrained=True)
    message = str(info.value)
    assert "\n" not in message and "refused" in message.lower() and "moco_v2_200ep_pretrain.pth.tar" in message
    assert not list((tmp_path / "cache" / "releases" / "downloads").glob("*"))  # no partial file left


@pytest.fixture
def file_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A registered entry whose 'URL' is a local file, to exercise download -> verify -> convert -> cache."""
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CL_ZOO_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    path, ref = moco_file(tmp_path, mlp=True, name="moco_v2_test.pth.tar")
    md5 = hashlib.md5(path.read_bytes()).hexdigest()[:8]
    created: list[str] = []

    def make(md5_prefix: str) -> str:
        name = f"mocov2_resnet18.test_official_{len(created)}"
        source = UrlSource(url=path.as_uri(), page=path.as_uri(), quote=path.as_uri(), md5_prefix=md5_prefix)
        release = Release(name=name, format="moco", arch="resnet18", filename=f"{name}.pth.tar", sources=(source,),
                          trained_by="the paper's authors (test)", recipe="test", licence_page="", licence_quote="",
                          reported={"imagenet1k_linear_top1_reported": 0.5}, reported_source="test")
        monkeypatch.setitem(RELEASES, name, release)
        register_pretrained(name, "resnet18", PretrainedCfg(url=source.url, method="mocov2", license="test", metrics=release.reported))
        created.append(name)
        return name

    yield make, md5, ref
    for name in created:
        unregister_pretrained(name)


def test_registered_source_downloads_verifies_converts_and_caches(tmp_path: Path, file_release: Any) -> None:
    make, md5, ref = file_release
    name = make(md5)
    model = cl_zoo.create_model(name, pretrained=True)
    folder = tmp_path / "cache" / "releases" / name
    assert model.checkpoint_source == str(folder) and (folder / "config.json").is_file()
    for key, value in model.state_dict().items():
        assert torch.equal(value, ref.encoder_q.state_dict()[key]), key
    config = json.loads((folder / "config.json").read_text())
    assert config["conversion"]["matches_release"] == name and config["origin"].startswith("file://")
    (tmp_path / "cache" / "releases" / "downloads" / f"{name}.pth.tar").unlink()  # second load: cache only
    again = cl_zoo.create_model(name, pretrained=True)
    assert torch.equal(again.state_dict()["conv1.weight"], model.state_dict()["conv1.weight"])


def test_registered_source_with_wrong_checksum_is_rejected(tmp_path: Path, file_release: Any) -> None:
    make, md5, _ = file_release
    name = make("00000000" if md5 != "00000000" else "11111111")
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        cl_zoo.create_model(name, pretrained=True)
    assert not (tmp_path / "cache" / "releases" / name).exists()


def test_an_import_replaces_a_zoo_folder_but_never_a_folder_of_the_users(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``import --out`` onto a folder of photos and notes deleted them with the folder and exited 0; and every
    folder it wrote was mode 0700 (mkdtemp's), unreadable to the group a shared zoo is for."""
    path, _ = moco_file(tmp_path, mlp=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep\n")
    (mine / "model.safetensors").write_bytes(b"not a zoo file, but named like one")
    err = _fails(capsys, "moco", path, "--out", mine, "--arch", "resnet18")
    assert "holds files that are not a zoo folder's (notes.txt)" in err
    assert sorted(p.name for p in mine.iterdir()) == ["model.safetensors", "notes.txt"]
    out = tmp_path / "zoo"
    old = os.umask(0o022)
    try:
        for _ in range(2):  # the second import replaces the first one's folder
            assert run_cli("import", "moco", path, "--out", out, "--arch", "resnet18") == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    link = tmp_path / "link"
    link.symlink_to(out)
    assert "is a symbolic link" in _fails(capsys, "moco", path, "--out", link, "--arch", "resnet18")


@pytest.mark.parametrize("origin", ["https://example.org/\udcff.pth", "https://example.org/\ud800"], ids=["byte-0xff", "lone-surrogate"])
def test_origin_that_is_not_text_is_one_line_before_the_checkpoint_is_read(
        tmp_path: Path, origin: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Byte 0xff in --origin (argv decodes it to a lone surrogate) was a UnicodeEncodeError traceback as the card was written."""
    path = tmp_path / "checkpoint_0199.pth.tar"
    path.write_bytes(b"never read")
    monkeypatch.setattr(conv, "convert_checkpoint", lambda *a, **k: pytest.fail("the checkpoint was read first"))
    assert run_cli("import", "moco", path, "--out", tmp_path / "zoo", "--origin", origin) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "error: --origin is not valid text (character 20 is an undecodable byte); pass it as UTF-8\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    with pytest.raises(InvalidValueError, match="--origin"):
        conv.import_checkpoint("moco", path, tmp_path / "zoo", origin=origin)  # the Python API too
