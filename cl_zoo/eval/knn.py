"""Weighted k-nearest-neighbour classification of frozen features.

The vote is Wu et al.'s (InstDisc), as lightly, solo-learn and MoCo's CIFAR demo compute it: every
one of the k nearest train features votes for its class with weight ``exp(sim / T)``, and classes
are ranked by their summed weight. Numbers are only comparable across papers when this exact rule,
k and T are used, so all three are explicit arguments and land in the report.

The neighbour search is exact (faiss flat index). It runs once with the largest k and the votes for
smaller k reuse the same sorted neighbours, so ``ks=(20, 200)`` costs one search. To keep memory
bounded for ImageNet-sized memories (1.28M x 2048 float32 is 10 GB) both the queries and the
memory are processed in slices: each memory slice is searched and merged into a running top-k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from cl_zoo.errors import DataError
from cl_zoo.eval.features import check_same_classes, model_identity, split_features
from cl_zoo.eval.report import build_report, EvalResult
from cl_zoo.index.search import require_faiss
from cl_zoo.validation import check_choice, check_number, check_numbers, check_seed, InvalidValueError

METRICS: tuple[str, ...] = ("cosine", "l2")


@dataclass
class Neighbours:
    """Top-k neighbours of every query, best first: similarities (higher is closer) and indices."""

    sims: np.ndarray  # [Q, k] float32; cosine similarity, or minus the squared L2 distance
    index: np.ndarray  # [Q, k] int64 into the memory


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm in float32 (all-zero rows stay zero rather than becoming NaN)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def _faiss_index(dim: int, metric: str, use_gpu: bool):  # noqa: ANN202 - faiss has no type stubs

    faiss = require_faiss("kNN classification (cl-zoo knn)")

    index = faiss.IndexFlatIP(dim) if metric == "cosine" else faiss.IndexFlatL2(dim)
    if use_gpu and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        resources = faiss.StandardGpuResources()
        index = faiss.index_cpu_to_gpu(resources, 0, index)
        index._cl_zoo_resources = resources  # keep the GPU memory pool alive with the index
    return index


def _merge(best: Neighbours | None, sims: np.ndarray, index: np.ndarray, k: int) -> Neighbours:
    """Keep the k best of the running result and a new slice's result.

    The new slice's indices are all larger than the running ones, so a stable sort on similarity
    keeps the lower memory index first among equal similarities (deterministic ties).
    """
    if best is not None:
        sims = np.concatenate([best.sims, sims], axis=1)
        index = np.concatenate([best.index, index], axis=1)
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return Neighbours(np.take_along_axis(sims, order, axis=1), np.take_along_axis(index, order, axis=1))


def search_neighbours(
    memory: np.ndarray,
    queries: np.ndarray,
    k: int,
    *,
    metric: str = "cosine",
    query_batch: int = 4096,
    memory_batch: int = 262_144,
    use_gpu: bool = True,
    progress: bool = False,
) -> Neighbours:
    """Exact top-k neighbours of ``queries`` in ``memory``.

    ``memory`` may be a read-only memmap (the feature cache): only ``memory_batch`` rows are held as
    float32 at a time. For ``cosine`` both sides are L2-normalised here. ``progress`` shows a bar
    on stderr (queries x memory slices searched; off when stderr is not a terminal).
    """
    import sys

    from tqdm import tqdm

    if metric not in METRICS:
        raise DataError(f"unknown kNN metric {metric!r}; choose from {', '.join(METRICS)}")
    n, dim = memory.shape
    if k > n:
        raise DataError(f"k={k} is larger than the train set ({n} samples); use --k at most {n}")
    prep = l2_normalize if metric == "cosine" else (lambda a: np.ascontiguousarray(a, dtype=np.float32))
    q_all = prep(queries)
    results: list[Neighbours | None] = [None] * ((len(q_all) + query_batch - 1) // query_batch)
    slices = (n + memory_batch - 1) // memory_batch
    bar = tqdm(
        total=len(q_all) * slices, desc="knn search", unit="query", file=sys.stderr,
        disable=None if progress else True, leave=False, dynamic_ncols=True,
    )
    for start in range(0, n, memory_batch):
        block = prep(memory[start : start + memory_batch])
        index = _faiss_index(dim, metric, use_gpu)
        index.add(block)
        kk = min(k, len(block))
        for qi, qs in enumerate(range(0, len(q_all), query_batch)):
            dist, idx = index.search(q_all[qs : qs + query_batch], kk)
            sims = dist if metric == "cosine" else -dist
            results[qi] = _merge(results[qi], sims.astype(np.float32), idx.astype(np.int64) + start, k)
            bar.update(min(query_batch, len(q_all) - qs))
        del index, block
    bar.close()
    if not results:
        return Neighbours(np.zeros((0, k), np.float32), np.zeros((0, k), np.int64))
    return Neighbours(
        np.concatenate([r.sims for r in results if r is not None]),
        np.concatenate([r.index for r in results if r is not None]),
    )


def vote(
    neighbours: Neighbours, train_labels: np.ndarray, k: int, num_classes: int, temperature: float
) -> np.ndarray:
    """Class scores ``[Q, C]`` from the first k neighbours: ``sum exp(sim / T)`` per class.

    Similarities are shifted by each query's best one before the exponential. That scales a query's
    scores by a constant, so the ranking is the rule's, but ``exp`` can no longer overflow (small T)
    or underflow to all-zero votes (L2 distances of raw pixels are in the thousands).
    """
    sims = neighbours.sims[:, :k].astype(np.float64)
    labels = np.asarray(train_labels)[neighbours.index[:, :k]]
    weights = np.exp((sims - sims[:, :1]) / temperature)
    scores = np.zeros((sims.shape[0], num_classes), dtype=np.float64)
    np.add.at(scores, (np.arange(sims.shape[0])[:, None], labels), weights)
    return scores


def rank_classes(scores: np.ndarray, top: int) -> np.ndarray:
    """Best ``top`` classes per row; equal scores go to the lower class id (stable sort)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :top]


def validate_split_labels(train_labels: np.ndarray, test_labels: np.ndarray | None, num_classes: int) -> None:
    """The one-line errors for label sets no classifier can be evaluated on."""
    if len(train_labels) == 0:
        raise DataError("the train split is empty")
    if test_labels is not None and len(test_labels) == 0:
        raise DataError("the test split is empty")
    present = np.unique(train_labels)
    if len(present) < 2:
        raise DataError(f"the train split has a single class ({int(present[0])}); classification needs at least 2")
    if present.min() < 0 or present.max() >= num_classes:
        raise DataError(f"train labels must lie in [0, {num_classes}); got {int(present.min())}..{int(present.max())}")
    if test_labels is not None:
        unseen = np.setdiff1d(np.unique(test_labels), present)
        if len(unseen):
            raise DataError(f"test labels {unseen[:5].tolist()} never occur in train; train and test must share classes")


def check_knn_settings(ks: Sequence[int], temperature: float, metric: str = "cosine") -> list[int]:
    """The distinct neighbour counts, ascending, once every setting of the vote is in range.

    A NaN temperature makes every vote weight NaN, so every query is "wrong" and the report says
    0.00% top-1; it is refused here, before any feature is extracted, with the other settings.
    """
    counts = check_numbers("--k", list(ks), low=1, integer=True)
    if not counts:
        raise InvalidValueError("--k (the neighbour counts) is empty")
    check_number("--temperature", temperature, low=0, low_open=True)
    check_choice("--metric", metric, METRICS)
    return sorted({int(k) for k in counts})


def knn_classify(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    ks: Sequence[int] = (20, 200),
    temperature: float = 0.07,
    num_classes: int | None = None,
    batch_size: int = 4096,
    *,
    metric: str = "cosine",
    memory_batch: int = 262_144,
    use_gpu: bool = True,
    progress: bool = False,
) -> dict:
    """Weighted kNN top-1 (and top-5 with more than 5 classes) for several k in one search.

    Returns ``{"metrics": {"knn_k20_top1": ..., ...}, "predictions": {k: [Q, top] class ids},
    "k": [...], "temperature": T, "metric": ...}``; accuracies are fractions in [0, 1].
    """
    train_labels = np.asarray(train_labels, dtype=np.int64)
    test_labels = np.asarray(test_labels, dtype=np.int64)
    ks = check_knn_settings(ks, temperature, metric)
    if train_feats.ndim != 2 or test_feats.ndim != 2 or train_feats.shape[1] != test_feats.shape[1]:
        raise DataError(f"feature shapes do not match: train {train_feats.shape}, test {test_feats.shape}")
    if len(train_feats) != len(train_labels) or len(test_feats) != len(test_labels):
        raise DataError("features and labels differ in length")
    if num_classes is None:
        num_classes = int(max(train_labels.max(initial=-1), test_labels.max(initial=-1))) + 1
    if len(train_labels) and ks[-1] > len(train_labels):
        raise DataError(f"k={ks[-1]} is larger than the train set ({len(train_labels)} samples); use --k at most {len(train_labels)}")
    validate_split_labels(train_labels, test_labels, num_classes)
    neighbours = search_neighbours(
        train_feats, test_feats, ks[-1], metric=metric, query_batch=batch_size, memory_batch=memory_batch, use_gpu=use_gpu,
        progress=progress,
    )
    top = 5 if num_classes > 5 else 1
    metrics: dict[str, float] = {}
    predictions: dict[int, np.ndarray] = {}
    for k in ks:
        ranked = rank_classes(vote(neighbours, train_labels, k, num_classes, temperature), top)
        predictions[k] = ranked
        hits = ranked == test_labels[:, None]
        metrics[f"knn_k{k}_top1"] = float(hits[:, 0].mean())
        if top == 5:
            metrics[f"knn_k{k}_top5"] = float(hits.any(axis=1).mean())
    return {"metrics": metrics, "predictions": predictions, "k": ks, "temperature": temperature, "metric": metric}


def evaluate_knn(
    model: Any,
    train: Any,
    test: Any,
    *,
    ks: Sequence[int] = (20, 200),
    temperature: float = 0.1,  # what every table and model card used (cl-zoo knn's default too)
    metric: str = "cosine",
    seed: int = 0,
    batch_size: int = 256,
    device: Any = None,
    workers: int = 0,
    cache: bool = True,
    cache_dir: Any = None,
    progress: bool = False,
    precision: str = "auto",
    backend: str = "auto",
    force_int8: bool = False,
    identity: dict[str, Any] | None = None,
    extra_hyperparameters: dict[str, Any] | None = None,
) -> Any:
    """kNN of a model on two :class:`~cl_zoo.data.folder.ImageFolderData` splits -> ``EvalResult``.

    Features come from (and go to) the on-disk cache, so a second run with another k or T costs
    only the search. The settings are checked (:func:`check_knn_settings`) before any feature is.
    """
    ks = check_knn_settings(ks, temperature, metric)
    check_number("--batch-size", batch_size, low=1, integer=True)
    check_seed("--seed", seed)
    check_same_classes(train.classes, test.classes)
    if len(test.paths) == 0:
        raise DataError(f"the test split is empty: {getattr(test, 'source', '?')}")
    if ks[-1] > len(train.paths):
        raise DataError(f"k={ks[-1]} is larger than the train set ({len(train.paths)} images); use --k at most {len(train.paths)}")
    identity = identity or model_identity(model)
    opts = dict(identity=identity, cache=cache, cache_dir=cache_dir, batch_size=batch_size, device=device, workers=workers, progress=progress,
                precision=precision, backend=backend, calibration=train.paths, calibration_seed=seed, force_int8=force_int8)
    train_fs = split_features(model, train, **opts)
    test_fs = split_features(model, test, **opts)
    start = time.perf_counter()
    use_gpu = device is None or "cuda" in str(device)
    out = knn_classify(
        train_fs.features, train_fs.labels, test_fs.features, test_fs.labels, ks=ks, temperature=temperature,
        num_classes=len(train.classes), metric=metric, use_gpu=use_gpu, progress=progress,
    )
    timings = {
        "train_features_s": train_fs.seconds,
        "test_features_s": test_fs.seconds,
        "knn_s": time.perf_counter() - start,
    }
    hyper = {
        "k": ks, "temperature": temperature, "metric": metric, "vote": "sum of exp(sim / T) over the k neighbours",
        "search": "faiss exact flat index", "feature_batch_size": batch_size,
        **(extra_hyperparameters or {}),
    }
    report = build_report(
        task="knn", model=identity, train=train, test=test, protocol="knn", hyperparameters=hyper, seed=seed,
        metrics=out["metrics"], timings=timings,
        extra={"features": {"train_cached": train_fs.cached, "test_cached": test_fs.cached, "train_key": train_fs.key, "test_key": test_fs.key, "dim": int(train_fs.features.shape[1]),
                             "precision": train_fs.precision, "backend": train_fs.backend,
                             **({"quantization": train_fs.quantization} if train_fs.quantization else {})}},
    )
    return EvalResult(
        report, test_labels=np.asarray(test_fs.labels), predictions=out["predictions"][ks[-1]],
        classes=train.classes, test_features=test_fs.features,
    )
