"""Cosine search (flat/IVF/HNSW), saved indexes, dedup groups, and the search/dedup commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cl_zoo.cli import main
from cl_zoo.errors import DataError
from cl_zoo.index.search import build_index, dedup_groups, load_index, save_index, search, similar_pairs
from tests.helpers import embed_test_photos, EXAMPLE_PHOTOS_DIR



def clustered(n_clusters: int = 8, per: int = 40, dim: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_clusters, dim))
    return (np.repeat(centres, per, axis=0) + 0.05 * rng.normal(size=(n_clusters * per, dim))).astype(np.float32)


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_index_kinds_rank_by_cosine(kind: str) -> None:
    x = clustered()
    x[5] *= 100.0  # scale must not matter: cosine, not inner product
    index = build_index(x, kind)
    scores, ids = search(index, x[[5, 100]], k=5)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    exact = unit[[5, 100]] @ unit.T
    assert ids[0, 0] == 5 and ids[1, 0] == 100
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    # Every approximate hit is a true neighbour from the same cluster, with its true cosine.
    assert set(ids[0]) <= set(range(0, 40)) and set(ids[1]) <= set(range(80, 120))
    np.testing.assert_allclose(scores, np.take_along_axis(exact, ids, axis=1), atol=1e-5)
    if kind == "flat":
        np.testing.assert_array_equal(ids[0], np.argsort(-exact[0], kind="stable")[:5])


def test_k_larger_than_database_and_dim_mismatch() -> None:
    x = clustered(2, 3)
    scores, ids = search(build_index(x), x[:1], k=50)
    assert ids.shape == (1, 6) and (ids >= 0).all()
    with pytest.raises(DataError, match="dims"):
        search(build_index(x), np.ones((1, 5), np.float32))


def test_save_and_reload_index(tmp_path: Path) -> None:
    x = clustered()
    index = build_index(x, "ivf", nlist=4)
    save_index(index, tmp_path / "x.faiss")
    again = load_index(tmp_path / "x.faiss", count=len(x), dims=x.shape[1])
    assert search(again, x[:3], 4)[1].tolist() == search(index, x[:3], 4)[1].tolist()
    with pytest.raises(DataError, match="rebuild"):
        load_index(tmp_path / "x.faiss", count=len(x) + 1, dims=x.shape[1])
    (tmp_path / "junk.faiss").write_bytes(b"not an index")
    with pytest.raises(DataError, match="not a faiss index"):
        load_index(tmp_path / "junk.faiss")


def test_dedup_groups_transitive_and_inclusive_threshold() -> None:
    e = np.eye(6, dtype=np.float32)
    x = np.stack([e[0], e[1], e[0], e[2], e[3], e[4]])
    c = 0.96
    x[4] = c * e[2] + np.sqrt(1 - c * c) * e[3]  # cos(3, 4) = 0.96
    x[5] = c * x[4] + np.sqrt(1 - c * c) * e[5]  # cos(4, 5) = 0.96, cos(3, 5) < 0.95: joined via 4
    assert dedup_groups(x, 0.95) == [[0, 2], [3, 4, 5]]
    assert dedup_groups(x, 0.99) == [[0, 2]]
    rows, cols, sims = similar_pairs(x, 0.96 - 1e-6)
    assert {(int(i), int(j)) for i, j in zip(rows, cols)} == {(0, 2), (3, 4), (4, 5)}
    assert dedup_groups(np.array([[1.0, 0.0], [1.0, 0.0]], np.float32), 1.0) == [[0, 1]]  # ">=" holds at 1.0


def test_search_and_dedup_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    emb = embed_test_photos(tmp_path, {"copy_of_photo2.jpg": "photo2.JPEG"})
    photos = tmp_path / "photos"
    capsys.readouterr()

    query = str(photos / "photo2.JPEG")
    assert main(["search", str(emb), "--query", query, "-k", "3", "--json", "--save-index", str(tmp_path / "i.faiss")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report[0]["query"] == query and len(report[0]["results"]) == 3
    top2 = {r["path"] for r in report[0]["results"][:2]}
    assert top2 == {query, str(photos / "copy_of_photo2.jpg")}
    assert report[0]["results"][0]["score"] == pytest.approx(1.0, abs=1e-4)
    assert main(["search", str(emb), "--query", query, "-k", "3", "--json", "--load-index", str(tmp_path / "i.faiss")]) == 0
    assert json.loads(capsys.readouterr().out) == report
    assert main(["search", str(emb), "--query", str(photos), "-k", "2", "--index", "hnsw"]) == 0
    assert capsys.readouterr().out.count("\n  ") == 10  # 5 queries x 2 hits

    assert main(["dedup", str(emb), "--threshold", "0.9999", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [[str(photos / "copy_of_photo2.jpg"), query]]
    assert main(["search", str(tmp_path / "missing.npy"), "--query", query]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["dedup"], ["search", "--query", str(EXAMPLE_PHOTOS_DIR / "pot.jpg")]], ids=["dedup", "search"])
def test_embeddings_with_no_rows_are_one_line(command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 0-row embeddings file ended dedup in a numpy traceback (concatenate of nothing)."""
    emb = tmp_path / "emb.npy"
    np.save(emb, np.zeros((0, 8), np.float32))
    (tmp_path / "emb.paths.txt").write_text("")
    code = main([command[0], str(emb), *command[1:]])
    out, err = capsys.readouterr()
    task = "deduplicate" if command[0] == "dedup" else "search"
    assert (code, out, err) == (2, "", f"error: {emb} holds no embeddings (0 rows); nothing to {task}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npy", "emb.paths.txt"]
    assert dedup_groups(np.zeros((0, 8), np.float32)) == []  # the Python API: no rows, no groups


@pytest.mark.parametrize(("value", "line"), [
    ("nan", "error: --threshold (a cosine similarity) must be a finite number, got nan"),
    ("1.5", "error: --threshold (a cosine similarity) must be >= -1 and <= 1, got 1.5"),
])
def test_dedup_threshold_is_checked_before_the_embeddings_are_read(value: str, line: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["dedup", str(tmp_path / "not-read.npy"), "-t", value])
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", line + "\n")


def test_index_seed_out_of_range_is_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`index --seed -1` was numpy's "expected non-negative integer" traceback after the embeddings were opened."""
    from cl_zoo.index import build_index as build_saved_index
    from cl_zoo.validation import InvalidValueError

    emb = tmp_path / "emb.npy"
    np.save(emb, clustered(2, 10))
    code = main(["index", str(emb), "-o", str(tmp_path / "i.faiss"), "--max-memory", "1G", "--seed", "-1"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and err == "error: Invalid value for '--seed': -1 is not in the range 0<=x<=4294967295 (see cl-zoo index --help)\n"
    with pytest.raises(InvalidValueError, match="--seed must be >= 0 and <= 4294967295, got -1"):
        build_saved_index(emb, tmp_path / "i.faiss", max_memory_bytes=1 << 30, seed=-1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npy"]
