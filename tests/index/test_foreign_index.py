"""A faiss index built elsewhere over raw (not unit-length) rows, or by another metric, is refused in one line.

Its inner products looked like cosines of 21.5 and ranked the neighbours differently, with no warning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cl_zoo.cli import main
from cl_zoo.embedding import write_path_list
from cl_zoo.errors import DataError
from cl_zoo.index.search import build_index, load_index, save_index
from tests.helpers import embed_test_photos, EXAMPLE_PHOTOS_DIR

faiss = pytest.importorskip("faiss")


def raw_rows(tmp_path: Path, n: int = 300, dim: int = 16) -> tuple[Path, np.ndarray]:
    """Embeddings with norms around 20, as a sharded ``embed --out DIR/`` writes them, with their paths."""
    x = (20 * np.random.default_rng(0).standard_normal((n, dim)) / np.sqrt(dim)).astype(np.float32)
    emb = tmp_path / "emb.npy"
    np.save(emb, x)
    write_path_list(tmp_path / "emb.paths.jsonl", [f"/images/{i:06d}.jpg" for i in range(n)])
    return emb, x


def foreign(kind: str, x: np.ndarray, path: Path) -> Path:
    """What autofaiss or a script writes: an inner-product (or L2) index over the rows as they are."""
    d = x.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, 16, faiss.METRIC_INNER_PRODUCT)
    elif kind == "ivf":
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, 4, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
    else:
        index = faiss.IndexFlatL2(d)
    index.add(x)
    faiss.write_index(index, str(path))
    return path


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_an_inner_product_index_over_raw_rows_is_refused(kind: str, tmp_path: Path) -> None:
    _, x = raw_rows(tmp_path)
    with pytest.raises(DataError, match=r"not unit-length \((\d+) of \1 sampled have norms .* so its inner products are not cosines"):
        load_index(foreign(kind, x, tmp_path / f"{kind}.faiss"), count=len(x), dims=x.shape[1])
    save_index(build_index(x, kind), tmp_path / f"own-{kind}.faiss")  # cl-zoo's own, over normalised rows, loads
    assert load_index(tmp_path / f"own-{kind}.faiss", count=len(x), dims=x.shape[1]).ntotal == len(x)


@pytest.mark.parametrize("kind", ["flat", "l2"])
def test_dedup_through_a_foreign_index_is_one_line(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    emb, x = raw_rows(tmp_path)
    index = foreign(kind, x, tmp_path / "foreign.faiss")
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(["dedup", str(emb), "--index-file", str(index), "--threshold", "0.9", "-q"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith(f"error: index {index} refused: " if kind == "flat" else "error: "), err
    expected = "so its inner products are not cosines" if kind == "flat" else "it ranks by L2 distance, not by inner product (cosine)"
    assert expected in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_search_through_an_index_over_raw_embed_rows_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: rows of the embeddings file, indexed as they are; search printed 'cosines' above 1."""
    emb = embed_test_photos(tmp_path)
    x = np.load(emb)
    index = foreign("flat", x * 20.0, tmp_path / "raw.faiss")
    capsys.readouterr()
    code = main(["search", str(emb), "--query", str(EXAMPLE_PHOTOS_DIR / "pot.jpg"), "--index-file", str(index)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"error: index {index} refused: its vectors are not unit-length"), err
