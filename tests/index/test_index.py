"""``cl-zoo index``: the plan by size and budget, block-wise builds from files and shard folders,
saved indexes reused by search and dedup, and every refusal as one line that leaves outputs alone.

The million-vector run lives in ``benchmarks/index_build.py``, not here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cl_zoo.cli import main
from cl_zoo.embedding import write_path_list
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.index import (
    build_index,
    choose_index,
    index_nearest_neighbour_scores,
    index_similar_pairs,
    load_saved_index,
    open_source,
    parse_memory,
    read_info,
    sidecar_path,
)
from cl_zoo.index.search import similar_pairs
from tests.helpers import embed_test_photos, run_cli_captured

MiB = 1 << 20


def random_embeddings(path: Path, n: int, dim: int, seed: int = 0, paths: bool = True) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)
    np.save(path, x)
    if paths:
        write_path_list(path.with_name(path.stem + ".paths.jsonl"), [f"/images/{i:06d}.jpg" for i in range(n)])
    return x


@pytest.fixture(scope="module")
def data_20k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("emb") / "emb.npy"
    random_embeddings(path, 20_000, 64)
    return path


# ------------------------------------------------------------------ the plan (pure function)


@pytest.mark.parametrize(
    ("n", "dim", "budget", "kind", "factory"),
    [
        (500, 64, 1 << 30, "flat", "Flat"),
        (5_000, 64, 1 << 30, "hnsw", "HNSW32"),
        (5_000, 64, 2 * MiB, "flat", "Flat"),  # too few to quantize; the graph does not fit, vectors do
        (20_000, 64, 1 << 30, "hnsw", "HNSW32"),
        (20_000, 64, 7 * MiB, "ivf-flat", "IVF512,Flat"),  # nlist = min(4*sqrt(n), n/39)
        (20_000, 64, 2 * MiB, "opq-ivf-pq", "OPQ48_96,IVF512,PQ48x8np"),
        (1_000_000, 512, 4 << 30, "ivf-flat", "IVF4000,Flat"),  # too many for a graph on CPU
        (1_000_000, 512, 512 * MiB, "opq-ivf-pq", "OPQ256_512,IVF4000_HNSW32,PQ256x8np"),
        (1_000_000, 512, 64 * MiB, "opq-ivf-pq", "OPQ32_512,IVF4000_HNSW32,PQ32x8np"),
        (5_000_000, 512, 64 << 30, "opq-ivf-pq", "OPQ256_512,IVF8944_HNSW32,PQ256x8np"),  # past IVF-Flat's range
    ],
)
def test_plan_by_size_and_budget(n: int, dim: int, budget: int, kind: str, factory: str) -> None:
    plan = choose_index(n, dim, budget)
    assert (plan.kind, plan.factory) == (kind, factory)
    assert plan.estimated_bytes <= budget and plan.reason


def test_plan_refuses_a_budget_below_the_most_compressed_index() -> None:
    with pytest.raises(DataError, match="too small.*PQ4x8np"):
        choose_index(1_000_000, 512, 8 * MiB)
    with pytest.raises(DataError, match="too small"):
        choose_index(5_000, 64, 100_000)  # too few vectors to train PQ, too many for raw vectors
    assert choose_index(20_000, 64, 7 * MiB, train_rows=3_900).nlist == 100  # 39 training rows per list


def test_parse_memory() -> None:
    assert parse_memory("4G") == 4 << 30 and parse_memory("512M") == 512 << 20
    assert parse_memory("1.5GiB") == 3 << 29 and parse_memory("2kb") == 2048 and parse_memory("1000") == 1000
    for bad in ("", "4X", "-1G", "G", "0"):
        with pytest.raises(ClZooError):
            parse_memory(bad)


# ------------------------------------------------------------------ build, save, reload


def test_build_save_reload_round_trip(data_20k: Path, tmp_path: Path) -> None:
    out = tmp_path / "emb.faiss"
    result = build_index(data_20k, out, 1 << 30, seed=0)
    info = read_info(out)
    assert info == result.info and info.factory == "HNSW32" and info.n == 20_000 and info.dim == 64
    assert info.recall_at_10 >= 0.9 and info.recall_target_met and info.search_params.startswith("efSearch=")
    assert 0 < info.index_bytes == out.stat().st_size <= info.max_memory_bytes
    assert info.latency_ms > 0 and info.build_seconds > 0 and info.eval_queries == 1_000
    index, loaded = load_saved_index(out, data_20k, count=20_000, dims=64)
    assert loaded == info and index.ntotal == 20_000
    assert index.hnsw.efSearch == int(info.search_params.split("=")[1])  # the tuned setting is applied


def test_ivf_build_reaches_target_recall_and_dedups_like_exact(data_20k: Path, tmp_path: Path) -> None:
    out = tmp_path / "ivf.faiss"
    info = build_index(data_20k, out, 7 * MiB).info
    assert info.kind == "ivf-flat" and info.recall_at_10 >= 0.9 and info.search_params.startswith("nprobe=")
    index, _ = load_saved_index(out, data_20k, count=20_000, dims=64)
    x = np.load(data_20k)
    rows, cols, sims = index_similar_pairs(index, x, 0.55)
    exact = similar_pairs(x, 0.55)
    assert set(zip(rows.tolist(), cols.tolist())) <= set(zip(exact[0].tolist(), exact[1].tolist()))
    assert len(rows) >= 0.9 * len(exact[0]) and (sims >= 0.55).all()


def test_index_dedup_streams_rows_and_survives_hnsw_query_blocks(tmp_path: Path) -> None:
    """Rows read block by block from disk give the pairs and scores of the matrix in memory; and
    faiss's HNSW range search, which aborts the process past its interrupt-check period (~1e8 /
    (levels * dims * efSearch) queries per call: 4,068 on CIFAR-10's 512-d embeddings), is not used."""
    import faiss

    emb = tmp_path / "emb.npy"
    x = random_embeddings(emb, 2_000, 32, paths=False)
    index = faiss.IndexHNSWFlat(32, 32, faiss.METRIC_INNER_PRODUCT)
    index.add(x / np.linalg.norm(x, axis=1, keepdims=True))
    assert index.hnsw.max_level >= 2  # faiss seeds its levels: 2 here
    index.hnsw.efSearch = 1_024  # period 1e8 / (levels * 32 * 1024) <= 1,525 queries, under the block of 2,000
    rows, cols, sims = index_similar_pairs(index, x, 0.5, block=2_000)
    exact = similar_pairs(x, 0.5)
    assert set(zip(rows.tolist(), cols.tolist())) == set(zip(exact[0].tolist(), exact[1].tolist())) and (sims >= 0.5).all()
    index.hnsw.efSearch = 64
    rows, cols, sims = index_similar_pairs(index, x, 0.5)
    streamed = index_similar_pairs(index, open_source(emb), 0.5, block=700)
    for a, b in zip(streamed, (rows, cols, sims)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(index_nearest_neighbour_scores(index, open_source(emb), block=700),
                                  index_nearest_neighbour_scores(index, x))


def test_pq_build_under_a_tight_budget(tmp_path: Path) -> None:
    emb = tmp_path / "small.npy"
    random_embeddings(emb, 12_000, 16)
    out = tmp_path / "pq.faiss"
    info = build_index(emb, out, 400 << 10).info
    assert info.kind == "opq-ivf-pq" and info.index_bytes <= 400 << 10
    assert 0.5 < info.recall_at_10 <= 1.0  # random data is the worst case for quantization
    index, _ = load_saved_index(out, emb, count=12_000, dims=16)
    assert index.ntotal == 12_000


def test_shard_folder_gives_the_same_index_as_one_file(tmp_path: Path) -> None:
    x = random_embeddings(tmp_path / "all.npy", 12_000, 32, seed=3, paths=False)
    shards = tmp_path / "shards"
    shards.mkdir()
    np.save(shards / "emb_00000.npy", x[:7_000])
    np.save(shards / "emb_00001.npy", x[7_000:])  # no manifest: shards written by another tool, read by name
    one = build_index(tmp_path / "all.npy", tmp_path / "one.faiss", 3 * MiB, block_rows=4_096)
    two = build_index(shards, tmp_path / "two.faiss", 3 * MiB, block_rows=4_096)
    assert one.info.factory == two.info.factory == "IVF256,Flat"
    assert (tmp_path / "one.faiss").read_bytes() == (tmp_path / "two.faiss").read_bytes()
    assert one.info.recall_at_10 == two.info.recall_at_10 and one.info.fingerprint != two.info.fingerprint
    assert two.info.sources == [str((shards / f"emb_0000{i}.npy").resolve()) for i in (0, 1)]
    (shards / "manifest.json").write_text("{}")  # a manifest makes it a cl-zoo embed output, checked as one
    with pytest.raises(DataError, match="not a cl-zoo shard manifest"):
        build_index(shards, tmp_path / "three.faiss", 3 * MiB)


# ------------------------------------------------------------------ refusals: one line, outputs untouched


def assert_one_error_line(err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture()
def existing_index(tmp_path: Path) -> Path:
    """An index file and sidecar already in place, which no failed build may touch."""
    out = tmp_path / "keep.faiss"
    out.write_bytes(b"previous index")
    sidecar_path(out).write_text('{"format": "cl-zoo-index/1", "previous": true}')
    return out


def untouched(out: Path) -> bool:
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    return out.read_bytes() == b"previous index" and sidecar_path(out).read_text() == '{"format": "cl-zoo-index/1", "previous": true}' and not leftovers


def test_truncated_npy_and_shard_are_refused(tmp_path: Path, existing_index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    emb = tmp_path / "emb.npy"
    random_embeddings(emb, 2_000, 16)
    data = emb.read_bytes()
    emb.write_bytes(data[:-100])
    code, out, err = run_cli_captured(["index", str(emb), "--out", str(existing_index), "--max-memory", "1G"], capsys)
    assert code == 2 and out == ""
    assert_one_error_line(err, "truncated")
    shards = tmp_path / "shards"
    shards.mkdir()
    np.save(shards / "emb_00000.npy", np.ones((10, 16), np.float32))
    (shards / "emb_00001.npy").write_bytes(data[: len(data) // 2])
    code, _, err = run_cli_captured(["index", str(shards), "--out", str(existing_index), "--max-memory", "1G"], capsys)
    assert code == 2
    assert_one_error_line(err, "emb_00001.npy is truncated")
    assert untouched(existing_index)


def test_shards_of_different_dims_or_with_gaps_are_refused(tmp_path: Path, existing_index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    np.save(shards / "emb_00000.npy", np.ones((10, 16), np.float32))
    np.save(shards / "emb_00001.npy", np.ones((10, 8), np.float32))
    code, _, err = run_cli_captured(["index", str(shards), "--out", str(existing_index), "--max-memory", "1G"], capsys)
    assert code == 2
    assert_one_error_line(err, "disagree on dims", "16", "8")
    (shards / "emb_00001.npy").rename(shards / "emb_00002.npy")
    code, _, err = run_cli_captured(["index", str(shards), "--out", str(existing_index), "--max-memory", "1G"], capsys)
    assert_one_error_line(err, "missing shard number 1")
    assert untouched(existing_index)


def test_tiny_budget_bad_budget_and_missing_file_are_refused(data_20k: Path, tmp_path: Path, existing_index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli_captured(["index", str(data_20k), "--out", str(existing_index), "--max-memory", "100K"], capsys)
    assert code == 2 and out == ""
    assert_one_error_line(err, "too small", "raise --max-memory")
    code, _, err = run_cli_captured(["index", str(data_20k), "--out", str(existing_index), "--max-memory", "four gigs"], capsys)
    assert code == 2
    assert_one_error_line(err, "cannot read memory size")
    code, _, err = run_cli_captured(["index", str(tmp_path / "missing.npy"), "--out", str(existing_index), "--max-memory", "1G"], capsys)
    assert code == 2
    assert_one_error_line(err, "does not exist")
    assert untouched(existing_index)


def test_index_from_other_embeddings_is_refused_by_search_and_dedup(data_20k: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "emb.faiss"
    assert main(["index", str(data_20k), "--out", str(out), "--max-memory", "7M", "-q"]) == 0
    capsys.readouterr()
    other = tmp_path / "other.npy"
    random_embeddings(other, 20_000, 64, seed=1)  # same shape, other vectors
    with pytest.raises(DataError, match="built from other embeddings"):
        load_saved_index(out, other, count=20_000, dims=64)
    code, _, err = run_cli_captured(["dedup", str(other), "--index-file", str(out), "-t", "0.9"], capsys)
    assert code == 2
    assert_one_error_line(err, "built from other embeddings", "fingerprint")
    meta = data_20k.with_name("emb.meta.json")
    try:  # same vectors, but recorded as another model's: also another set of embeddings
        meta.write_text(json.dumps({"model": "other-model", "model_name": "x"}))
        with pytest.raises(DataError, match="built from other embeddings"):
            load_saved_index(out, data_20k, count=20_000, dims=64)
    finally:
        meta.unlink()
    # An index file swapped under its sidecar is refused too.
    original = out.read_bytes()
    out.write_bytes(original[:-8] + bytes(8))
    with pytest.raises(DataError, match="not the index"):
        load_saved_index(out, data_20k, count=20_000, dims=64)


# ------------------------------------------------------------------ the commands


def test_index_command_text_and_json(data_20k: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.faiss"
    code, text, err = run_cli_captured(["index", str(data_20k), "--out", str(out), "--max-memory", "7M"], capsys)
    assert code == 0, err
    assert "plan: IVF256,Flat" in err and "added 20000/20000" in err
    lines = text.splitlines()
    assert lines[0] == "index: IVF256,Flat (ivf-flat, 256 lists) over 20000 vectors of 64 dims"
    assert lines[1].startswith("why: the HNSW graph") and lines[2].startswith("recall@10: ")
    assert "ms/query" in lines[3] and "of the 7.00 MiB budget" in lines[4] and lines[-1].startswith("wrote ")
    code, text, _ = run_cli_captured(["index", str(data_20k), "--out", str(out), "--max-memory", "7M", "--json", "-q", "--seed", "1"], capsys)
    report = json.loads(text)
    assert code == 0 and report["factory"] == "IVF256,Flat" and report["seed"] == 1 and report["tried"]
    assert report == {**json.loads(sidecar_path(out).read_text()), "estimated_bytes": report["estimated_bytes"], "tried": report["tried"]}


def test_dedup_with_index_file_matches_exact_dedup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    emb = tmp_path / "emb.npy"
    x = random_embeddings(emb, 3_000, 32, paths=False)
    x[100] = x[7] * 1.01  # two near-copies (cosine 1), a chain of three
    x[2000] = x[1500] + 0.01
    x[2001] = x[2000] + 0.01
    np.save(emb, x)
    write_path_list(tmp_path / "emb.paths.jsonl", [f"/images/{i:06d}.jpg" for i in range(len(x))])
    out = tmp_path / "emb.faiss"
    assert main(["index", str(emb), "--out", str(out), "--max-memory", "1G", "-q"]) == 0
    capsys.readouterr()
    code, exact, _ = run_cli_captured(["dedup", str(emb), "-t", "0.99", "--json"], capsys)
    assert code == 0
    code, approx, err = run_cli_captured(["dedup", str(emb), "-t", "0.99", "--json", "--index-file", str(out), "--show-scores"], capsys)
    assert code == 0 and json.loads(approx) == json.loads(exact) == [
        ["/images/000007.jpg", "/images/000100.jpg"], ["/images/001500.jpg", "/images/002000.jpg", "/images/002001.jpg"]
    ]
    assert "approximate" in err and "nearest-neighbour similarity" in err


def test_search_uses_a_saved_index_and_refuses_another_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil


    emb = embed_test_photos(tmp_path)
    photos = tmp_path / "photos"
    index = tmp_path / "emb.faiss"
    assert main(["index", str(emb), "--out", str(index), "--max-memory", "64M", "-q"]) == 0
    capsys.readouterr()
    query = str(photos / "photo2.JPEG")
    assert main(["search", str(emb), "--query", query, "-k", "2", "--json"]) == 0
    rebuilt = json.loads(capsys.readouterr().out)
    assert main(["search", str(emb), "--query", query, "-k", "2", "--json", "--index-file", str(index)]) == 0
    assert json.loads(capsys.readouterr().out) == rebuilt and rebuilt[0]["results"][0]["path"] == query

    other = tmp_path / "other.npy"  # the same rows embedded again, by another model
    shutil.copy(emb, other)
    shutil.copy(tmp_path / "emb.paths.jsonl", tmp_path / "other.paths.jsonl")
    meta = json.loads((tmp_path / "emb.meta.json").read_text())
    (tmp_path / "other.meta.json").write_text(json.dumps({**meta, "model_name": "another"}))
    code, out, err = run_cli_captured(["search", str(other), "--query", query, "--index-file", str(index)], capsys)
    assert code == 2 and out == ""
    assert_one_error_line(err, "built from other embeddings")


# ------------------------------------------------------------------ shard folders written by cl-zoo embed --out DIR/


@pytest.fixture()
def photo_shards(tmp_path: Path) -> Path:
    """The test photos and a copy of photo2 embedded into a folder of shards of two images."""

    return embed_test_photos(tmp_path, {"copy_of_photo2.jpg": "photo2.JPEG"}, out="shards/", extra=("--shard-size", "2"))


def features_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way of reading embedding values fail: what is left may read paths and headers only."""
    from cl_zoo.embedding.shards import ShardSet
    from cl_zoo.index.source import EmbeddingSource

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("embedding values were read")

    for owner, name in ((ShardSet, "load"), (ShardSet, "blocks"), (EmbeddingSource, "blocks"), (EmbeddingSource, "take")):
        monkeypatch.setattr(owner, name, refuse)


def test_shard_folder_index_search_and_dedup(photo_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from cl_zoo.embedding.shards import open_shards

    assert [r["rows"] for r in open_shards(photo_shards).records] == [2, 2, 1]
    index = tmp_path / "shards.faiss"
    assert main(["index", str(photo_shards), "--out", str(index), "--max-memory", "64M", "-q"]) == 0
    info = read_info(index)
    assert info is not None and info.n == 5 and len(info.sources) == 3
    capsys.readouterr()
    query = str(tmp_path / "photos" / "photo2.JPEG")
    copy = str(tmp_path / "photos" / "copy_of_photo2.jpg")

    assert main(["search", str(photo_shards), "--query", query, "-k", "2", "--json"]) == 0  # exact: the folder loaded whole
    exact = json.loads(capsys.readouterr().out)
    assert {hit["path"] for hit in exact[0]["results"]} == {query, copy}
    assert main(["dedup", str(photo_shards), "-t", "0.9999", "--json"]) == 0
    exact_groups = json.loads(capsys.readouterr().out)
    assert exact_groups == [[copy, query]]

    with monkeypatch.context() as patch:  # through the index, search reads row paths, never a feature
        features_never_read(patch)
        assert main(["search", str(photo_shards), "--query", query, "-k", "2", "--json", "--index-file", str(index)]) == 0
        assert json.loads(capsys.readouterr().out) == exact
    with monkeypatch.context() as patch:  # and dedup streams blocks: the folder is never loaded whole
        import cl_zoo.embedding
        from cl_zoo.embedding.shards import ShardSet

        def whole(*args: object) -> None:
            raise AssertionError("the whole matrix was loaded")

        patch.setattr(ShardSet, "load", whole)
        patch.setattr(cl_zoo.embedding, "load_embeddings", whole)
        code, text, err = run_cli_captured(["dedup", str(photo_shards), "-t", "0.9999", "--json", "--index-file", str(index), "--show-scores"], capsys)
        assert code == 0 and json.loads(text) == exact_groups and "approximate" in err and "nearest-neighbour similarity of 5" in err


def test_damaged_shard_folders_are_refused_and_leave_indexes_alone(photo_shards: Path, tmp_path: Path, existing_index: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import shutil


    index = tmp_path / "shards.faiss"
    assert main(["index", str(photo_shards), "--out", str(index), "--max-memory", "64M", "-q"]) == 0
    saved = index.read_bytes(), sidecar_path(index).read_bytes()
    (tmp_path / "foreign").mkdir()
    foreign = embed_test_photos(tmp_path / "foreign", {"copy_of_photo2.jpg": "photo2.JPEG"}, out="shards/", extra=("--shard-size", "2"), seed=1)
    capsys.readouterr()
    query = str(tmp_path / "photos" / "photo2.JPEG")

    def another_model(folder: Path) -> None:
        for name in ("emb_00001.npy", "meta_00001.parquet"):
            shutil.copy(foreign / name, folder / name)

    def truncated(folder: Path) -> None:
        (folder / "emb_00002.npy").write_bytes((folder / "emb_00002.npy").read_bytes()[:-8])

    cases = {
        "another_model": (another_model, "made by another model"),
        "another_models_emb": (lambda folder: shutil.copy(foreign / "emb_00001.npy", folder), "emb_00001.npy is not the file manifest.json recorded"),
        "truncated": (truncated, "emb_00002.npy is truncated"),
        "missing": (lambda folder: (folder / "emb_00001.npy").unlink(), "emb_00001.npy listed in manifest.json is missing"),
    }
    for name, (damage, fragment) in cases.items():
        folder = tmp_path / name
        shutil.copytree(photo_shards, folder)
        damage(folder)
        for args in (["index", str(folder), "--out", str(existing_index), "--max-memory", "64M"],
                     ["search", str(folder), "--query", query, "--index-file", str(index)],
                     ["dedup", str(folder), "-t", "0.9", "--index-file", str(index)]):
            code, out, err = run_cli_captured(args, capsys)
            assert code != 0 and out == "", (name, args[0], err)
            assert_one_error_line(err, fragment)
        assert untouched(existing_index)
        assert (index.read_bytes(), sidecar_path(index).read_bytes()) == saved


@pytest.mark.parametrize("damage, message", [
    ("no listing", r"has no emb\.paths\.jsonl beside it naming its rows"),
    ("short listing", r"has shape \(6, 4\) but emb\.paths\.jsonl lists 5 paths"),
    ("other count", r"emb\.meta\.json records count 7 but .*emb\.npy has 6; the files do not belong together"),
    ("bad metadata", r"emb\.meta\.json: dims must be a non-negative integer, got '4'"),
    ("truncated", r"emb\.npy is truncated"),
])
def test_a_saved_index_and_a_loaded_matrix_read_one_npy_output_the_same_way(tmp_path: Path, damage: str, message: str) -> None:
    """``search``/``dedup`` through a saved index (:func:`cl_zoo.index.open_rows`, values left on disk)
    and without one (:func:`cl_zoo.embedding.load_embeddings`) read a ``.npy`` and its sidecars with
    one reader (:func:`cl_zoo.arrays.read_npy_rows`), so a damaged output is refused in the same words."""
    from cl_zoo.embedding import load_embeddings
    from cl_zoo.index import open_rows

    emb = tmp_path / "emb.npy"
    x = random_embeddings(emb, 6, 4)
    listing, info = tmp_path / "emb.paths.jsonl", tmp_path / "emb.meta.json"
    info.write_text(json.dumps({"dims": 4, "count": 6, "dtype": "float32"}))
    rows = open_rows(emb)
    assert (rows.rows, rows.dims, rows.paths) == (6, 4, load_embeddings(emb)[1]) and np.array_equal(load_embeddings(emb)[0], x)
    if damage == "no listing":
        listing.unlink()
    elif damage == "short listing":
        write_path_list(listing, [f"/images/{i:06d}.jpg" for i in range(5)])
    elif damage == "other count":
        info.write_text(json.dumps({"dims": 4, "count": 7, "dtype": "float32"}))
    elif damage == "bad metadata":
        info.write_text(json.dumps({"dims": "4", "count": 6, "dtype": "float32"}))
    else:
        emb.write_bytes(emb.read_bytes()[:-4])
    for read in (open_rows, load_embeddings):
        with pytest.raises(DataError, match=message) as error:
            read(emb)
        assert "\n" not in str(error.value)
