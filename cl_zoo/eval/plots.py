"""Figures for evaluation reports: confusion matrix, 2-D feature projection, training curves.

Image grids for ``search``/``dedup --plot`` live in :mod:`cl_zoo.eval.grids`; pretraining's
``curves.png`` is drawn here (:func:`training_curves_figure`) and written by the run logger.

Rendered with matplotlib's Agg backend (no display needed on a server) and written atomically,
like every other output, so a crash never leaves a truncated PNG beside a report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from cl_zoo.errors import ClZooError
from cl_zoo.fileio import atomic_path, check_output_path, check_replaceable, read_head
from cl_zoo.optional import require


class PlotPathError(ClZooError):
    """A ``--plot`` destination that cannot be written; found before any model loads or image is read."""


def _figure(feature: str = "--plot"):  # noqa: ANN202 - matplotlib.pyplot
    """pyplot on the Agg backend, or one line naming the ``plots`` extra; ``feature`` is what the user asked for."""
    matplotlib = require("matplotlib", feature)

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def check_plot_path(path: str | os.PathLike) -> Path:
    """``path`` if a PNG can be written there, else one line saying why.

    Called before a command loads its model or reads its inputs, so a typo in ``--plot`` costs
    nothing; the same reasons would otherwise surface as an OSError traceback after the work.
    """
    path = check_output_path(path, option="--plot", error=PlotPathError)  # a folder is named as such first
    if path.suffix.lower() != ".png":
        raise PlotPathError(f"--plot writes a PNG: name the file with .png (got {path})")
    check_replaceable(path, is_plot_png, "a plot", error=PlotPathError)  # a photo named x.png is the user's
    return path


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def is_plot_png(path: Path) -> bool:
    """Whether ``path`` is a PNG matplotlib drew (its ``Software`` text chunk, written before the
    pixels): the only kind of file ``--plot`` replaces. A photo or screenshot is somebody's picture."""
    head = read_head(path, 4096)
    return head.startswith(_PNG_SIGNATURE) and b"tEXtSoftware\x00Matplotlib" in head


def _save(fig: Any, path: str | os.PathLike, *, dpi: int = 110) -> Path:
    path = Path(path)
    try:
        with atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    except OSError as exc:
        raise PlotPathError(f"cannot write {path}: {exc.strerror or exc}") from None
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


def _knn_label(key: str) -> str:
    """``knn_k20_top1`` -> ``kNN k=20 top-1``: the legend speaks the tables' words."""
    k = key.removeprefix("knn_k").removesuffix("_top1")
    return f"kNN k={k} top-1" if k.isdigit() else key


def training_curves_figure(rows: Sequence[Mapping[str, Any]], title: str = "", *, feature: str = "curves.png") -> Any:
    """Pretraining's ``curves.png``: train loss (left axis) and online kNN top-1 (right axis) per epoch.

    One legend holds every series, loss included, and sits below the axes: inside them it covered
    the loss tail, the part of the curve a reader looks at to judge convergence. ``rows`` are
    ``metrics.csv``'s rows (``epoch``, ``loss``, ``knn_k*_top1`` as fractions; blanks allowed).
    """
    from matplotlib.ticker import MaxNLocator

    plt = _figure(feature)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    epochs = [r["epoch"] for r in rows]
    losses = [_float(r.get("loss")) for r in rows]
    handles = ax.plot(epochs, losses, "-o", color="tab:blue", markersize=3, label="train loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss", color="tab:blue")
    ax.tick_params(axis="y", colors="tab:blue")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    knn_keys = sorted({k for r in rows for k in r if k.startswith("knn_") and k.endswith("_top1")},
                      key=lambda k: (len(k), k))  # k=20 before k=200
    if knn_keys:
        ax2 = ax.twinx()
        for key, colour in zip(knn_keys, ("tab:orange", "tab:green", "tab:red", "tab:purple")):
            pts = [(r["epoch"], 100 * float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
            if pts:
                handles += ax2.plot(*zip(*pts), "-s", color=colour, markersize=3, label=_knn_label(key))
        ax2.set_ylabel("kNN top-1 (%)")
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(handles), fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG atomically and close it (the writer every figure here uses)."""
    return _save(fig, path, dpi=dpi)


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")
