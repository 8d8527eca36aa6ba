"""Figures for evaluation reports: confusion matrix, 2-D feature projection, training curve.

Rendered with matplotlib's Agg backend (no display needed on a server) and written atomically,
like every other output, so a crash never leaves a truncated PNG beside a report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from cl_zoo.fileio import atomic_path


def _figure():  # noqa: ANN202
    from cl_zoo.optional import require

    matplotlib = require("matplotlib", "--plot")

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | os.PathLike) -> Path:
    path = Path(path)
    try:
        with atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    finally:
        _figure().close(fig)
    return path


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """``cm[true, predicted]`` counts."""
    cm = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(cm, (np.asarray(labels, np.int64), np.asarray(predictions, np.int64)), 1)
    return cm


def plot_confusion(cm: np.ndarray, classes: Sequence[str], path: str | os.PathLike, title: str = "") -> Path:
    plt = _figure()
    n = len(classes)
    size = min(4 + 0.35 * n, 16)
    fig, ax = plt.subplots(figsize=(size, size))
    rates = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    im = ax.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, label="fraction of true class")
    if n <= 30:
        ax.set_xticks(range(n), labels=classes, rotation=90, fontsize=8)
        ax.set_yticks(range(n), labels=classes, fontsize=8)
    if n <= 15:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=7, color="white" if rates[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title or f"confusion matrix (top-1 {np.trace(cm) / max(cm.sum(), 1):.3f})")
    return _save(fig, path)


def pca_2d(features: np.ndarray) -> np.ndarray:
    """Projection on the two leading principal components (deterministic up to sign; sign fixed)."""
    x = np.asarray(features, dtype=np.float64)
    x = x - x.mean(0, keepdims=True)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    comps = vt[:2]
    comps *= np.sign(comps[np.arange(len(comps)), np.abs(comps).argmax(1)])[:, None]
    return x @ comps.T


def plot_projection(
    features: np.ndarray, labels: np.ndarray, classes: Sequence[str], path: str | os.PathLike,
    *, max_points: int = 5000, seed: int = 0, title: str = "",
) -> Path:
    """PCA of (L2-normalised) test features coloured by class, on a seeded subsample."""
    plt = _figure()
    labels = np.asarray(labels)
    idx = np.arange(len(labels))
    if len(idx) > max_points:
        idx = np.sort(np.random.default_rng(seed).choice(idx, max_points, replace=False))
    x = np.asarray(features[idx], dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    xy = pca_2d(x)
    fig, ax = plt.subplots(figsize=(7, 6))
    cmap = plt.get_cmap("tab20" if len(classes) > 10 else "tab10")
    for c in range(len(classes)):
        mask = labels[idx] == c
        if mask.any():
            ax.scatter(xy[mask, 0], xy[mask, 1], s=4, alpha=0.6, color=cmap(c % cmap.N), label=classes[c] if len(classes) <= 20 else None)
    if len(classes) <= 20:
        ax.legend(markerscale=3, fontsize=7, loc="best")
    ax.set_xlabel("PC 1")
    ax.set_ylabel("PC 2")
    ax.set_title(title or f"test features, PCA ({len(idx)} points)")
    return _save(fig, path)


def plot_curve(curve: Mapping[str, Any], path: str | os.PathLike, title: str = "") -> Path:
    """Training curve: per-epoch loss (and train top-1) for augmented protocols, L-BFGS loss for fast."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4))
    if "epoch" in curve:
        ax.plot(curve["epoch"], curve["train_loss"], label="train loss")
        ax.set_xlabel("epoch")
        if curve.get("train_top1"):
            ax2 = ax.twinx()
            ax2.plot(curve["epoch"], curve["train_top1"], color="tab:orange", label="train top-1")
            ax2.set_ylabel("train top-1")
    else:
        ax.plot(np.arange(1, len(curve["loss"]) + 1), curve["loss"])
        ax.set_xlabel(curve.get("x_label", "iteration"))
        ax.set_yscale("log")
    ax.set_ylabel("loss")
    ax.set_title(title or "linear probe training")
    return _save(fig, path)
