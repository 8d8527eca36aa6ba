"""cl-zoo embed --out DIR/: numbered shards + manifest, resume by shard, torchrun by shard, hostile folders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers import DATA, GOOD, REPO_ROOT, free_port, run_cli, tiny_model

import cl_zoo
from cl_zoo.embedding import load_embeddings
from cl_zoo.embedding.sharded import ShardLayout
from cl_zoo.embedding.shards import MANIFEST_NAME, default_shard_images, open_shards
from cl_zoo.errors import DataError


@pytest.fixture()
def photos(tmp_path: Path) -> Path:
    """Eleven readable images and one broken file: shards of 3 give 4 shards, one with a failure."""
    root = tmp_path / "photos"
    root.mkdir()
    for n in range(11):
        shutil.copy(DATA / GOOD[n % len(GOOD)], root / f"img{n:02d}{Path(GOOD[n % len(GOOD)]).suffix}")
    shutil.copy(DATA / "truncated.jpg", root / "img05b.jpg")
    return root


def embed(photos: Path, model: Path, out: Path | str, *extra: object) -> int:
    return run_cli("embed", photos, "-m", model, "-o", out, "-b", "2", "--save-every", "1", "-j", "0", "-q", *extra)


def test_layout_chunks_never_straddle_shards() -> None:
    layout = ShardLayout(total=23, shard_images=7, chunk_size=4)
    assert layout.shards == 4 and layout.chunks_per_shard == 2
    covered = [i for s in range(layout.shards) for k in layout.chunks_of(s) for i in layout.chunk_range(k)]
    assert covered == list(range(23))
    for s in range(layout.shards):
        for k in layout.chunks_of(s):
            r = layout.chunk_range(k)
            assert r.start >= layout.shard_range(s).start and r.stop <= layout.shard_range(s).stop
            assert all(layout.chunk_of(i) == k for i in r)
    assert [len(b) for b in layout.batches(layout.chunks_of(0), 3)] == [3, 1, 3]
    # ~1 GiB of float32 512-d rows (524,288), in whole chunks; a million rows for small features.
    assert default_shard_images(512, 4, 1024) == 524_288
    assert default_shard_images(64, 4, 1000) == 1_000_000


def test_shards_match_the_single_file_output(photos: Path, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    single = tmp_path / "single.npy"
    assert embed(photos, model_dir, single) == 0
    out = tmp_path / "emb"
    assert embed(photos, model_dir, f"{out}/", "--shard-size", "3") == 0
    err = capsys.readouterr().err
    assert "into 4 shards" in err and "skipped 1" in err
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([MANIFEST_NAME, "emb_00000.npy", "emb_00001.npy", "emb_00002.npy", "emb_00003.npy", "failures_00002.csv",
                            "meta_00000.parquet", "meta_00001.parquet", "meta_00002.parquet", "meta_00003.parquet"])
    shards = open_shards(out)
    assert [r["rows"] for r in shards.records] == [3, 3, 2, 3] and shards.rows == 11
    a, pa, _ = load_embeddings(single)
    b, pb, meta = load_embeddings(out)
    assert pa == pb
    np.testing.assert_array_equal(a, b)  # the same batches, so the same bytes
    assert meta["model_name"] and meta["count"] == 11 and meta["dims"] == a.shape[1]
    import pyarrow.parquet as pq

    ids = [i for r in shards.records for i in pq.read_table(out / r["meta"]).column("id").to_pylist()]
    everything = sorted(str(p) for p in photos.iterdir())
    assert [everything[i] for i in ids] == pb  # id = position in the run's input list
    assert "img05b.jpg" in (out / "failures_00002.csv").read_text()


def test_resume_skips_finished_shards(photos: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    fresh = tmp_path / "fresh"
    assert embed(photos, model_dir, f"{fresh}/", "--shard-size", "4") == 0
    out = tmp_path / "emb"
    monkeypatch.setenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES", "5")  # shards 0 and 1 (2 batches each) are finished
    assert embed(photos, model_dir, f"{out}/", "--shard-size", "4") == 130
    err = capsys.readouterr().err
    assert "2 finished shards" in err and "--resume" in err
    assert sorted(p.name for p in out.glob("emb_*")) == ["emb_00000.npy", "emb_00001.npy"]
    assert json.loads((out / MANIFEST_NAME).read_text())["complete"] is False  # readers refuse it meanwhile
    with pytest.raises(DataError, match="unfinished"):
        open_shards(out)
    assert run_cli("index", out, "--out", tmp_path / "idx.faiss", "--max-memory", "1G") == 2
    assert "unfinished" in capsys.readouterr().err and not (tmp_path / "idx.faiss").exists()
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*_0000[01].*")}
    # without --resume the shards are not silently overwritten
    monkeypatch.delenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES")
    assert embed(photos, model_dir, f"{out}/", "--shard-size", "4") == 2
    assert "--resume" in capsys.readouterr().err
    # another shard size is another run: refused
    assert embed(photos, model_dir, f"{out}/", "--shard-size", "3", "--resume") == 2
    assert "cannot resume" in capsys.readouterr().err
    assert embed(photos, model_dir, f"{out}/", "--shard-size", "4", "--resume") == 0
    assert "2 finished shards" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*_0000[01].*")} == before  # never redone
    for name in ("emb_00000.npy", "emb_00001.npy", "emb_00002.npy", "meta_00002.parquet"):
        assert (out / name).read_bytes() == (fresh / name).read_bytes()
    assert not (out / ".parts").exists()
    # --force starts over (and deletes only our files)
    (out / "notes.txt").write_text("mine")
    assert embed(photos, model_dir, f"{out}/", "--shard-size", "4", "--force") == 0
    assert (out / "notes.txt").read_text() == "mine"


def test_resume_with_another_model_is_refused(photos: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "emb"
    monkeypatch.setenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES", "3")
    assert embed(photos, model_dir, f"{out}/", "--shard-size", "4") == 130
    monkeypatch.delenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES")
    other = tmp_path / "other"
    torch.manual_seed(1)
    cl_zoo.save_pretrained(tiny_model(), other)
    capsys.readouterr()
    assert embed(photos, other, f"{out}/", "--shard-size", "4", "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert "cannot resume" in err and len(err.splitlines()) == 1


@pytest.fixture()
def finished(photos: Path, model_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "emb"
    assert embed(photos, model_dir, f"{out}/", "--shard-size", "4") == 0
    return out


def test_hostile_shard_folders_are_one_line_errors(finished: Path, photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other_model = tmp_path / "other"
    torch.manual_seed(1)
    cl_zoo.save_pretrained(tiny_model(), other_model)
    foreign = tmp_path / "foreign"
    assert embed(photos, other_model, f"{foreign}/", "--shard-size", "4") == 0
    capsys.readouterr()

    def broken(name: str, edit) -> Path:  # noqa: ANN001
        copy = tmp_path / name
        shutil.copytree(finished, copy)
        edit(copy)
        return copy

    cases = {
        "missing": (lambda d: (d / "emb_00001.npy").unlink(), "missing"),
        "truncated": (lambda d: (d / "emb_00002.npy").write_bytes((d / "emb_00002.npy").read_bytes()[:-8]), "truncated"),
        "another model": (lambda d: [shutil.copy(foreign / n, d / n) for n in ("emb_00001.npy", "meta_00001.parquet")],
                          "another model"),
        "replaced": (lambda d: shutil.copy(foreign / "emb_00001.npy", d / "emb_00001.npy"), "digest differs"),
        "stray": (lambda d: shutil.copy(d / "emb_00000.npy", d / "emb_00009.npy"), "does not list"),
        "manifest": (lambda d: (d / MANIFEST_NAME).write_text("[1, 2"), "not valid JSON"),
    }
    for name, (edit, message) in cases.items():
        folder = broken(name.replace(" ", "_"), edit)
        with pytest.raises(DataError, match=message):
            open_shards(folder)
        assert run_cli("dedup", folder) != 0
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (name, err)


def test_torchrun_two_ranks_split_shards_and_match_one_process(photos: Path, model_dir: Path, tmp_path: Path) -> None:
    one = tmp_path / "one"
    assert embed(photos, model_dir, f"{one}/", "--shard-size", "3") == 0
    two = tmp_path / "two"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        "-m", "cl_zoo.cli", "embed", str(photos), "-m", str(model_dir), "-o", f"{two}/", "--shard-size", "3",
        "-b", "2", "--save-every", "1", "-j", "0", "-q",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("into 4 shards") == 1  # rank 0 reports, once
    for n in range(4):
        assert (two / f"emb_{n:05d}.npy").read_bytes() == (one / f"emb_{n:05d}.npy").read_bytes()
    a, pa, _ = load_embeddings(one)
    b, pb, _ = load_embeddings(two)
    assert pa == pb
    np.testing.assert_array_equal(a, b)
    m1, m2 = (json.loads((d / MANIFEST_NAME).read_text()) for d in (one, two))
    assert m1["shards"] == m2["shards"] and m1["model_sha256"] == m2["model_sha256"]


def write_tar(path: Path, files: list[Path], extra_bad: bool = False) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w") as tf:
        for n, file in enumerate(files):
            for name, data in ((f"{n:06d}{file.suffix.lower()}", file.read_bytes()), (f"{n:06d}.cls", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        if extra_bad:
            info = tarfile.TarInfo("zzz.txt")
            info.size = 2
            tf.addfile(info, io.BytesIO(b"no"))
    return path


def test_webdataset_shards_one_output_shard_per_tar(photos: Path, model_dir: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    images = sorted(p for p in photos.iterdir() if p.name != "img05b.jpg")
    tars = tmp_path / "tars"
    tars.mkdir()
    write_tar(tars / "data-000.tar", images[:6])
    write_tar(tars / "data-001.tar", images[6:], extra_bad=True)
    folder = tmp_path / "folder.npy"
    exact = ["--precision", "fp32", "--backend", "torch"]  # the same engine whatever each input's size suggests
    assert embed(photos, model_dir, folder, *exact) == 0
    out = tmp_path / "wds"
    pattern = str(tars / "data-{000..001}.tar")
    assert embed(pattern, model_dir, f"{out}/", *exact) == 0
    assert "into 2 shards" in capsys.readouterr().err
    shards = open_shards(out)
    assert [r["rows"] for r in shards.records] == [6, 5] and [r["source"] for r in shards.records] == [
        str(tars / "data-000.tar"), str(tars / "data-001.tar")]
    assert "no image" in (out / "failures_00001.csv").read_text()
    a, pa, _ = load_embeddings(folder)
    b, pb, _ = load_embeddings(out)
    assert pb[0] == f"{tars / 'data-000.tar'}#000000" and len(pb) == 11
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)  # the same images give the same features
    single = tmp_path / "wds.npy"
    assert embed(pattern, model_dir, single, *exact) == 0
    c, pc, _ = load_embeddings(single)
    assert pc == pb and np.array_equal(b, c)
    # resume: finished tars are skipped
    (out / "manifest.json").unlink()
    (out / "meta_00001.parquet").unlink()
    before = (out / "emb_00000.npy").stat().st_mtime_ns
    assert embed(pattern, model_dir, f"{out}/", "--resume", *exact) == 0
    assert "1 finished shard" in capsys.readouterr().err
    assert (out / "emb_00000.npy").stat().st_mtime_ns == before
    assert np.array_equal(load_embeddings(out)[0], b)
    # options that do not apply are one-line errors
    for extra, message in ((["--shard-size", "3"], "each input tar becomes one output shard"),
                           (["--precision", "int8"], "needs --calibration")):
        assert embed(pattern, model_dir, f"{tmp_path / 'x'}/", *extra) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert embed(photos, model_dir, tmp_path / "y.npy", "--image-key", "png") == 2
    assert "--image-key applies to WebDataset" in capsys.readouterr().err


def test_webdataset_and_lists_over_http(photos: Path, model_dir: Path, tmp_path: Path, served: str) -> None:  # noqa: F811
    """The CLI end to end on fsspec URLs: tar shards by brace pattern, and a Parquet path list, over loopback HTTP."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = sorted(p for p in photos.iterdir() if p.name != "img05b.jpg")
    write_tar(tmp_path / "web-000.tar", images[:5])
    write_tar(tmp_path / "web-001.tar", images[5:])
    exact = ["--precision", "fp32", "--backend", "torch"]
    local = tmp_path / "local"
    assert embed(str(tmp_path / "web-{000..001}.tar"), model_dir, f"{local}/", *exact) == 0
    remote = tmp_path / "remote"
    assert embed(f"{served}/web-{{000..001}}.tar", model_dir, f"{remote}/", *exact) == 0
    a, pa_, _ = load_embeddings(local)
    b, pb, meta = load_embeddings(remote)
    assert np.array_equal(a, b) and pb[0] == f"{served}/web-000.tar#000000" and len(pb) == 11
    # a Parquet list of image URLs, relative to the list's own URL
    pq.write_table(pa.table({"path": [f"photos/{p.name}" for p in images]}), tmp_path / "list.parquet")
    listed = tmp_path / "listed.npy"
    assert embed(f"{served}/list.parquet", model_dir, listed, *exact) == 0
    c, pc, _ = load_embeddings(listed)
    assert pc == [f"{served}/photos/{p.name}" for p in images]
    np.testing.assert_allclose(c, load_embeddings(local)[0], rtol=1e-5, atol=1e-6)
