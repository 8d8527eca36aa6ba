"""kNN core: faiss search + weighted vote against a brute-force NumPy implementation."""

from __future__ import annotations

import numpy as np
import pytest

from cl_zoo.errors import DataError
from cl_zoo.eval.knn import knn_classify, search_neighbours


def brute_force_knn(train, train_labels, test, k, temperature, num_classes, metric="cosine"):
    """The textbook rule written independently: full similarity matrix, full sort, weighted vote."""
    train = np.asarray(train, np.float64)
    test = np.asarray(test, np.float64)
    if metric == "cosine":
        train = train / np.linalg.norm(train, axis=1, keepdims=True)
        test = test / np.linalg.norm(test, axis=1, keepdims=True)
        sim = test @ train.T
    else:
        sim = -((test[:, None, :] - train[None, :, :]) ** 2).sum(-1)
    preds = []
    for row in sim:
        nn_idx = np.argsort(-row, kind="stable")[:k]
        s = row[nn_idx]
        scores = np.zeros(num_classes)
        for j, i in enumerate(nn_idx):
            scores[train_labels[i]] += np.exp((s[j] - s[0]) / temperature)
        preds.append(np.argsort(-scores, kind="stable")[:5])
    return np.array(preds)


def _random_problem(seed, n_train=600, n_test=150, dim=24, classes=10):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) * 1.5
    train_labels = rng.integers(0, classes, n_train)
    test_labels = rng.integers(0, classes, n_test)
    train = (centres[train_labels] + rng.normal(size=(n_train, dim))).astype(np.float32)
    test = (centres[test_labels] + rng.normal(size=(n_test, dim))).astype(np.float32)
    return train, train_labels, test, test_labels


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_faiss_predictions_equal_brute_force(seed, metric):
    train, train_labels, test, test_labels = _random_problem(seed)
    ks = (1, 20, 200)
    # memory_batch/batch_size smaller than the data so the sliced search + merge path is exercised.
    out = knn_classify(
        train, train_labels, test, test_labels, ks=ks, temperature=0.07 if metric == "cosine" else 5.0,
        num_classes=10, batch_size=64, metric=metric, memory_batch=128,
    )
    for k in ks:
        ref = brute_force_knn(train, train_labels, test, k, 0.07 if metric == "cosine" else 5.0, 10, metric)
        np.testing.assert_array_equal(out["predictions"][k], ref)
        assert out["metrics"][f"knn_k{k}_top1"] == pytest.approx((ref[:, 0] == test_labels).mean())
        assert out["metrics"][f"knn_k{k}_top5"] == pytest.approx((ref == test_labels[:, None]).any(1).mean())
    # Well-separated clusters: the classifier is far above chance (a sanity check on the labels).
    assert out["metrics"]["knn_k20_top1"] > 0.5


def test_sliced_search_equals_single_search():
    rng = np.random.default_rng(3)
    mem, q = rng.normal(size=(1000, 16)).astype(np.float32), rng.normal(size=(77, 16)).astype(np.float32)
    whole = search_neighbours(mem, q, 50, query_batch=10_000, memory_batch=10_000)
    sliced = search_neighbours(mem, q, 50, query_batch=13, memory_batch=97)
    np.testing.assert_array_equal(whole.index, sliced.index)
    np.testing.assert_allclose(whole.sims, sliced.sims, rtol=1e-6)


def test_top5_only_with_more_than_five_classes():
    train, train_labels, test, test_labels = _random_problem(0, classes=4)
    out = knn_classify(train, train_labels, test, test_labels, ks=(10,), num_classes=4)
    assert set(out["metrics"]) == {"knn_k10_top1"}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda tr, trl, te, tel: (tr[:0], trl[:0], te, tel), "train split is empty"),
        (lambda tr, trl, te, tel: (tr, trl, te[:0], tel[:0]), "test split is empty"),
        (lambda tr, trl, te, tel: (tr, np.zeros_like(trl), te, np.zeros_like(tel)), "single class"),
        (lambda tr, trl, te, tel: (tr[trl < 5], trl[trl < 5], te, tel), "never occur in train"),
        (lambda tr, trl, te, tel: (tr[:30], trl[:30], te, tel), "larger than the train set"),
    ],
)
def test_bad_input_is_one_line_error(mutate, message):
    train, train_labels, test, test_labels = _random_problem(0)
    args = mutate(train, train_labels, test, test_labels)
    with pytest.raises(DataError, match=message) as info:
        knn_classify(*args, ks=(200,) if "larger" in message else (5,), num_classes=10)
    assert "\n" not in str(info.value)
