"""cl-zoo embed: discovery, robust decoding, preprocessing parity, outputs, resume, bad input."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import cl_zoo
from cl_zoo.data import images as images_mod
from cl_zoo.data.images import ImageDecodeError, discover_images, load_image
from cl_zoo.embedding import Preprocess, extract_features, load_embeddings
from cl_zoo.errors import DataError
from tests.helpers import DATA, EXAMPLE_PHOTOS_DIR, GOOD, REPO_ROOT, free_port, run_cli, tiny_model

BROKEN = {
    "empty.jpg": "empty file",
    "truncated.jpg": "truncated",
    "notanimage.png": "not an image",
    "bomb.png": "decompression bomb",
}


@pytest.fixture()
def photos(tmp_path: Path) -> Path:
    """Four small real photos in nested folders, plus a two-frame GIF and a non-image file."""
    root = tmp_path / "photos"
    (root / "sub" / "deeper").mkdir(parents=True)
    shutil.copy(DATA / GOOD[0], root / GOOD[0])
    shutil.copy(DATA / GOOD[1], root / "sub" / GOOD[1])
    shutil.copy(DATA / GOOD[2], root / "sub" / "deeper" / GOOD[2])
    shutil.copy(DATA / GOOD[3], root / GOOD[3])
    first = Image.open(DATA / GOOD[0]).convert("RGB")
    second = Image.new("RGB", first.size, (255, 0, 0))
    first.save(root / "anim.GIF", save_all=True, append_images=[second])
    (root / "notes.txt").write_text("not an image extension\n")
    (root / ".hidden.jpg").write_bytes(b"")
    return root


@pytest.fixture()
def mixed(photos: Path) -> Path:
    """The photos folder plus every deliberately broken file."""
    for name in BROKEN:
        shutil.copy(DATA / name, photos / name)
    return photos


# ---------------------------------------------------------------------------------------------
# discovery and decoding
# ---------------------------------------------------------------------------------------------


def test_discover_folder_recursive_sorted_case_insensitive(photos: Path) -> None:
    found = discover_images([photos])
    names = [os.path.relpath(p, photos) for p in found]
    assert names == sorted(names)
    assert set(names) == {"anim.GIF", GOOD[0], GOOD[3], f"sub/{GOOD[1]}", f"sub/deeper/{GOOD[2]}"}
    # Files and folders together, with overlaps, give each path once.
    assert discover_images([photos / GOOD[0], photos]) == found


def test_discover_list_file_relative_to_list(photos: Path, tmp_path: Path) -> None:
    listing = photos / "list.txt"
    listing.write_text(f"# comment\n{GOOD[0]}\n\nsub\nmissing.jpg\n")
    found = discover_images([listing])
    assert found == sorted(
        [str(photos / GOOD[0]), str(photos / "sub" / GOOD[1]), str(photos / "sub/deeper" / GOOD[2]), str(photos / "missing.jpg")]
    )


def test_discover_user_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        discover_images([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no images"):
        discover_images([tmp_path / "empty"])


@pytest.mark.parametrize("name,reason", sorted(BROKEN.items()))
def test_load_image_reasons(name: str, reason: str) -> None:
    with pytest.raises(ImageDecodeError) as info:
        load_image(DATA / name)
    assert reason in info.value.reason
    assert isinstance(info.value, DataError)


def test_load_image_missing_and_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImageDecodeError, match="file not found"):
        load_image(tmp_path / "missing.jpg")
    locked = tmp_path / "locked.jpg"
    shutil.copy(DATA / GOOD[0], locked)
    locked.chmod(0)
    if os.geteuid() == 0:  # root reads mode-000 files; make the open fail as it would for a user
        real = images_mod._open_file

        def refuse(path: str):  # noqa: ANN202
            if path == str(locked):
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return real(path)

        monkeypatch.setattr(images_mod, "_open_file", refuse)
    with pytest.raises(ImageDecodeError, match="permission denied"):
        load_image(locked)


def test_load_image_bomb_limit_between_warning_and_error(monkeypatch: pytest.MonkeyPatch) -> None:
    w, h = Image.open(DATA / GOOD[0]).size
    # Between 1x and 2x the limit PIL only warns; load_image still refuses.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", int(w * h * 0.75))
    with pytest.warns(Image.DecompressionBombWarning), pytest.raises(ImageDecodeError, match="decompression bomb"):
        load_image(DATA / GOOD[0])


def test_load_image_gif_first_frame_and_modes(photos: Path, tmp_path: Path) -> None:
    frame = load_image(photos / "anim.GIF")
    assert frame.mode == "RGB"
    assert np.asarray(frame)[..., 0].mean() < 250  # the photo, not the all-red second frame
    grey = tmp_path / "grey16.png"
    Image.fromarray((np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)).save(grey)
    pixels = np.asarray(load_image(grey))
    assert pixels.shape == (64, 64, 3) and 0 < pixels.mean() < 255


def test_load_image_draft_decodes_large_jpeg_at_reduced_scale(tmp_path: Path) -> None:
    big = tmp_path / "big.jpg"
    Image.open(DATA / GOOD[0]).convert("RGB").resize((800, 600)).save(big, quality=90)
    assert load_image(big).size == (800, 600)
    reduced = load_image(big, min_short_side=100)
    assert min(reduced.size) >= 100 and reduced.size == (200, 150)  # 1/4 DCT scale, not 1/8 (too small)


def test_preprocess_matches_torchvision() -> None:
    from torchvision import transforms as T

    img = Image.open(DATA / GOOD[1]).convert("RGB")
    for resize, crop in [(36, (32, 32)), (64, (64, 64)), (100, (80, 90)), (90, (100, 100))]:
        ours = Preprocess(resize, crop)(img).astype(int)
        ref = np.asarray(T.Compose([T.Resize(resize), T.CenterCrop(crop)])(img)).astype(int)
        assert ours.shape == ref.shape == (crop[0], crop[1], 3)
        assert np.abs(ours - ref).max() <= 1


# ---------------------------------------------------------------------------------------------
# extract_features / embed
# ---------------------------------------------------------------------------------------------


def test_extract_features_matches_plain_forward_and_reports_failures(mixed: Path) -> None:
    from torchvision import transforms as T

    torch.manual_seed(0)
    model = tiny_model()
    files = discover_images([mixed])
    result = extract_features(model, files, batch_size=3, workers=0, device="cpu")
    assert [os.path.basename(p) for p, _ in result.failures] == sorted(BROKEN)
    for path, reason in result.failures:
        assert BROKEN[os.path.basename(path)] in reason
    assert len(result.paths) == 5 and result.features.shape == (5, model.num_features)
    assert result.features.dtype == np.float32
    assert [files[i] for i in result.indices] == result.paths
    cfg = model.pretrained_cfg
    tf = T.Compose([T.Resize(cfg.resize_size), T.CenterCrop(32), T.ToTensor(), T.Normalize(cfg.mean, cfg.std)])
    x = torch.stack([tf(Image.open(p).convert("RGB")) for p in result.paths])
    with torch.no_grad():
        ref = model(x).numpy()
    cos = (ref * result.features).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(result.features, axis=1)
    assert cos.min() > 0.999
    # Worker processes compute the very same batches.
    again = extract_features(model, files, batch_size=3, workers=2, device="cpu")
    assert again.features.tobytes() == result.features.tobytes() and again.paths == result.paths


def test_embed_python_api(photos: Path, model_dir: Path) -> None:
    (photos / "empty.jpg").write_bytes(b"")
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        features, paths = cl_zoo.embed(photos, model=model_dir, batch_size=4, workers=0, device="cpu")
    assert features.shape == (5, 128) and len(paths) == 5 and paths == sorted(paths)
    with pytest.raises(DataError, match="none of the"):
        cl_zoo.embed([photos / "empty.jpg"], model=tiny_model(), workers=0)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def test_cli_npy_outputs_and_failures(mixed: Path, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out" / "emb.npy"
    out.parent.mkdir()
    assert run_cli("embed", mixed, "-m", model_dir, "-o", out, "-b", "4", "-j", "0", "-q") == 0
    err = capsys.readouterr().err
    assert "embedded 5 images" in err and "skipped 4" in err and "images/s" in err and "warning:" in err
    features, paths, meta = load_embeddings(out)
    assert features.shape == (5, 128) and paths == sorted(paths)
    assert [json.loads(line) for line in (out.parent / "emb.paths.jsonl").read_text().splitlines()] == paths
    assert not (out.parent / "emb.csv").exists()  # one path-list sidecar: the rows are named once (issue 42)
    assert meta["model"] == str(model_dir) and meta["dims"] == 128 and meta["revision"].startswith("sha256:")
    failures = (out.parent / "emb.failures.csv").read_text().splitlines()
    assert failures[0] == "path,reason" and len(failures) == 1 + len(BROKEN)
    assert not (out.parent / "emb.parts").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        ["emb.npy", "emb.paths.jsonl", "emb.meta.json", "emb.failures.csv"]
    )  # no temporary files left behind


def test_cli_parquet_and_half(photos: Path, model_dir: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    assert run_cli("embed", photos, "-m", model_dir, "-o", tmp_path / "e.parquet", "-j", "0", "-q") == 0
    table = pq.read_table(tmp_path / "e.parquet")
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert meta["cl_zoo.model"] == str(model_dir) and meta["cl_zoo.dims"] == "128"
    assert meta["cl_zoo.model_name"] == "resnet18" and meta["cl_zoo.cl_zoo_version"] == cl_zoo.__version__
    features, paths, meta = load_embeddings(tmp_path / "e.parquet")
    assert meta["count"] == len(paths) and meta["dims"] == features.shape[1]  # numbers, as in .meta.json
    assert run_cli("embed", photos, "-m", model_dir, "-o", tmp_path / "e.npy", "-j", "0", "-q", "--half") == 0
    half = np.load(tmp_path / "e.npy")
    assert half.dtype == np.float16 and paths == load_embeddings(tmp_path / "e.npy")[1]
    np.testing.assert_allclose(half.astype(np.float32), features, rtol=2e-3, atol=2e-3)


def test_cli_resume_gives_identical_bytes(photos: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fresh = tmp_path / "fresh.npy"
    assert run_cli("embed", photos, "-m", model_dir, "-o", fresh, "-b", "1", "-j", "0", "-q") == 0
    out = tmp_path / "resumed.npy"
    common = ["embed", photos, "-m", model_dir, "-o", out, "-b", "1", "--save-every", "1", "-j", "0", "-q"]
    monkeypatch.setenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES", "2")
    assert run_cli(*common) == 130  # interrupted
    assert not out.exists() and len(list((tmp_path / "resumed.parts").glob("part-*.npz"))) == 2
    # Changing the batching would change the result: refused instead of silently mixing.
    assert run_cli(*common[:-5], "-b", "2", "--save-every", "1", "--resume", "-j", "0", "-q") == 2
    assert "cannot resume" in capsys.readouterr().err
    monkeypatch.delenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES")
    assert run_cli(*common, "--resume") == 0
    assert "resumed 2" in capsys.readouterr().err
    assert out.read_bytes() == fresh.read_bytes()
    assert (tmp_path / "resumed.paths.jsonl").read_bytes() == (tmp_path / "fresh.paths.jsonl").read_bytes()
    assert not (tmp_path / "resumed.parts").exists()


def test_cli_user_errors_are_one_line(photos: Path, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["embed", photos, "-m", model_dir, "-o", tmp_path / "missing" / "e.npy"], "missing does not exist; create it first"),
        (["embed", tmp_path / "nope", "-m", model_dir, "-o", tmp_path / "e.npy"], "path does not exist"),
        (["embed", photos, "-m", model_dir, "-o", tmp_path / "e.txt"], "must end in .npy or .parquet"),
    ]
    (tmp_path / "empty").mkdir()
    cases.append((["embed", tmp_path / "empty", "-m", model_dir, "-o", tmp_path / "e.npy"], "no images"))
    for args, message in cases:
        assert run_cli(*args, "-j", "0", "-q") == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "e.npy").exists()


def test_cli_all_bad_is_an_error_without_output(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in BROKEN:
        shutil.copy(DATA / name, bad / name)
    assert run_cli("embed", bad, "-m", model_dir, "-o", tmp_path / "e.npy", "-j", "0", "-q") != 0
    assert "none of the 4 images could be read" in capsys.readouterr().err
    assert not (tmp_path / "e.npy").exists() and (tmp_path / "e.failures.csv").is_file()


def test_torchrun_two_ranks_match_one_process(photos: Path, model_dir: Path, tmp_path: Path) -> None:
    single = tmp_path / "single.npy"
    assert run_cli("embed", photos, "-m", model_dir, "-o", single, "-b", "1", "-j", "0", "-q") == 0
    sharded = tmp_path / "sharded.npy"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        "-m", "cl_zoo.cli", "embed", str(photos), "-m", str(model_dir), "-o", str(sharded),
        "-b", "1", "--save-every", "1", "-j", "0", "-q",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, pa, _ = load_embeddings(single)
    b, pb, _ = load_embeddings(sharded)
    assert pa == pb
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert json.loads((tmp_path / "sharded.meta.json").read_text())["count"] == 5


# ---------------------------------------------------------------------------------------------
# cl_zoo.embed on in-memory images, and normalize=
# ---------------------------------------------------------------------------------------------

EXAMPLE_PHOTOS = sorted(EXAMPLE_PHOTOS_DIR.glob("*.jpg"))
ON_CPU = {"device": "cpu", "precision": "fp32", "backend": "torch", "workers": 0, "batch_size": 4}


@pytest.fixture(scope="module")
def default_model() -> torch.nn.Module:
    return cl_zoo.create_model(cl_zoo.registry.DEFAULT_MODEL, pretrained=True).eval()


def test_embed_in_memory_images_match_files(default_model: torch.nn.Module) -> None:
    import torchvision.transforms.functional as TF

    files, paths = cl_zoo.embed(EXAMPLE_PHOTOS, default_model, **ON_CPU)
    assert paths == [str(p) for p in EXAMPLE_PHOTOS] and files.shape == (8, 512)
    pils = [Image.open(p) for p in paths]
    rgb = [img.convert("RGB") for img in pils]
    for given in (
        pils,  # lazily opened JPEGs
        [np.asarray(img) for img in rgb],  # HWC uint8
        [TF.pil_to_tensor(img) for img in rgb],  # CHW uint8
        [TF.to_tensor(img) for img in rgb],  # CHW float 0-1
        tuple(rgb),
    ):
        features, names = cl_zoo.embed(given, default_model, **ON_CPU)
        assert names == [f"<image {i}>" for i in range(8)]
        assert np.array_equal(features, files)  # same preprocessing, same engine: bit for bit
    one, names = cl_zoo.embed(pils[2], default_model, **ON_CPU)
    assert names == ["<image 0>"] and one.shape == (1, 512)
    np.testing.assert_allclose(one[0], files[2], rtol=0, atol=1e-5)  # a batch of one: other kernels, same numbers


def test_embed_batches_and_normalize(default_model: torch.nn.Module) -> None:
    crops = [Image.open(p).convert("RGB").resize((80, 72)) for p in EXAMPLE_PHOTOS[:4]]
    each, _ = cl_zoo.embed(crops, default_model, **ON_CPU)
    nhwc = np.stack([np.asarray(c) for c in crops])
    nchw = torch.from_numpy(nhwc).permute(0, 3, 1, 2)
    assert np.array_equal(cl_zoo.embed(nhwc, default_model, **ON_CPU)[0], each)
    assert np.array_equal(cl_zoo.embed(nchw, default_model, **ON_CPU)[0], each)
    assert np.array_equal(cl_zoo.embed(nchw.float() / 255, default_model, **ON_CPU)[0], each)
    unit, _ = cl_zoo.embed(crops, default_model, normalize=True, **ON_CPU)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(unit, each / np.linalg.norm(each, axis=1, keepdims=True), atol=1e-6)
    assert np.linalg.norm(each, axis=1).min() > 1.5  # the default stays unnormalised
    files, _ = cl_zoo.embed(EXAMPLE_PHOTOS[:2], default_model, normalize=True, **ON_CPU)
    np.testing.assert_allclose(np.linalg.norm(files, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize(
    ("given", "match"),
    [
        (42, "takes paths .* or in-memory images .*; got a int"),
        (b"photo.jpg", "got a bytes"),
        ([EXAMPLE_PHOTOS[0], Image.new("RGB", (8, 8))], "not both in one list"),
        ([Image.new("RGB", (8, 8)), 3], "image 1 is a int"),
        (torch.zeros(3, 8, 8) - 0.5, r"floats in \[-0.5, -0.5\]; float pixels must lie in \[0, 1\]"),
        (torch.full((3, 8, 8), float("nan")), r"must lie in \[0, 1\]"),
        (torch.zeros(3, 8, 8, dtype=torch.int64), "dtype int64; pixels are uint8"),
        (torch.zeros(8, 8, 3, dtype=torch.uint8), r"CHW or NCHW .* permute\(2, 0, 1\)"),
        (np.zeros((3, 8, 8), np.uint8), r"HW, HWC or NHWC .* transpose\(1, 2, 0\)"),
        (np.zeros((2, 2, 8, 8, 3), np.uint8), "HW, HWC or NHWC"),
        (np.zeros((0, 8, 8, 3), np.uint8), "no images given"),
    ],
)
def test_embed_refuses_what_it_cannot_read(given: object, match: str) -> None:
    with pytest.raises(cl_zoo.ClZooError, match=match) as info:
        cl_zoo.embed(given, tiny_model(), **ON_CPU)
    assert "\n" not in str(info.value)


def test_embed_in_memory_int8_needs_calibration_files() -> None:
    with pytest.raises(cl_zoo.ClZooError, match="calibration="):
        cl_zoo.embed(Image.new("RGB", (40, 40)), tiny_model(), precision="int8", device="cpu")
