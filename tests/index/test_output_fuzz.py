"""Byte-level fuzz of the readers ``search`` and ``dedup`` trust: embeddings, row paths, metadata, faiss indexes.

Real small outputs (written by the same ``save_embeddings``/``save_index`` that ``cl-zoo embed`` and
``--save-index`` use) are damaged by a few random byte edits. Every read must either give a
consistent result (one finite float32 row per path; an index that answers a query) or raise
:class:`DataError` with a one-line message; any other exception, or a crash, is a bug. The
outcome counts are printed (``pytest -s``) and kept in ``COUNTS``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cl_zoo.embedding import load_embeddings, save_embeddings
from cl_zoo.errors import DataError
from cl_zoo.index.search import build_index, load_index, save_index, search
from tests.helpers import mutate

COUNTS: Counter[str] = Counter()
ROWS, DIMS = 6, 8
NAMES = ["/data/a.jpg", "/data/line\nbreak.png", "/data/cr\rname.webp", "/data/sep\u2028x.jpg", "/data/\u00e9t\u00e9.png", "/data/z.jpg"]
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# Edits that hit what parsers trust: single bytes, whole little-endian counts, truncation, insertion.
INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 40, 10**14, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
edit = st.one_of(
    st.tuples(st.just("byte"), st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
    st.tuples(st.just("int64"), st.floats(0, 1, exclude_max=True), st.sampled_from(INTERESTING)),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True), st.just(0)),
    st.tuples(st.just("insert"), st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.floats(0, 1, exclude_max=True), st.integers(1, 16)),
)
edits = st.lists(edit, min_size=1, max_size=3)


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("outputs")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(ROWS, DIMS)).astype(np.float32)
    meta = {"model": "resnet18", "model_name": "resnet18", "dedup_threshold": "0.95"}
    save_embeddings(root / "emb.npy", features, NAMES, meta)
    save_embeddings(root / "half.npy", features, NAMES, meta, half=True)
    save_embeddings(root / "emb.parquet", features, NAMES, meta)
    many = rng.normal(size=(200, DIMS)).astype(np.float32)
    for kind in ("flat", "ivf", "hnsw"):
        save_index(build_index(many, kind, nlist=4) if kind == "ivf" else build_index(many, kind), root / f"{kind}.faiss")
    return root


def check_embeddings(path: Path, outcome: str) -> None:
    try:
        features, paths, meta = load_embeddings(path)
    except DataError as exc:
        message = str(exc)
        assert len(message.splitlines()) == 1, repr(message)
        COUNTS[f"{outcome}: refused"] += 1
        return
    assert features.dtype == np.float32 and features.ndim == 2 and features.shape[0] == len(paths)
    assert np.isfinite(features).all() and all(isinstance(p, str) for p in paths) and isinstance(meta, dict)
    COUNTS[f"{outcome}: read"] += 1


NPY_PARTS = {"emb.npy": "emb", "emb.paths.jsonl": "emb", "emb.meta.json": "emb", "half.npy": "half"}


@FUZZ
@given(target=st.sampled_from(sorted(NPY_PARTS)), changes=edits)
def test_npy_output_and_sidecars(originals: Path, target: str, changes: list) -> None:
    stem = NPY_PARTS[target]
    with tempfile.TemporaryDirectory() as tmp:
        for f in originals.glob(f"{stem}.*"):
            if f.suffix != ".parquet":
                shutil.copy(f, Path(tmp) / f.name)
        victim = Path(tmp) / target
        victim.write_bytes(mutate(victim.read_bytes(), changes))
        check_embeddings(Path(tmp) / f"{stem}.npy", target)


@FUZZ
@given(changes=edits)
def test_parquet_output(originals: Path, changes: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        victim = Path(tmp) / "emb.parquet"
        victim.write_bytes(mutate((originals / "emb.parquet").read_bytes(), changes))
        check_embeddings(victim, "emb.parquet")


@FUZZ
@given(kind=st.sampled_from(["flat", "ivf", "hnsw"]), changes=edits)
def test_faiss_index(originals: Path, kind: str, changes: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        victim = Path(tmp) / "i.faiss"
        victim.write_bytes(mutate((originals / f"{kind}.faiss").read_bytes(), changes))
        try:
            index = load_index(victim, dims=DIMS)
        except DataError as exc:
            assert len(str(exc).splitlines()) == 1, repr(str(exc))
            COUNTS[f"{kind}.faiss: refused"] += 1
            return
        scores, ids = search(index, np.ones((2, DIMS), np.float32), k=5)
        assert ids.shape[0] == 2 and ((ids >= -1) & (ids < index.ntotal)).all()
        COUNTS[f"{kind}.faiss: read"] += 1


def test_report_counts() -> None:
    """Runs last in this file: prints what the fuzz saw (read consistently / refused in one line)."""
    if not COUNTS:
        pytest.skip("run with the fuzz tests above to see counts")
    print("\noutput fuzz outcomes:")
    for key in sorted(COUNTS):
        print(f"  {key}: {COUNTS[key]}")
