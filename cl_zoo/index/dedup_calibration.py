"""Which cosine similarity means "the same photo" for a given model.

A near-duplicate threshold is a property of the model, not of the tool: a small 64 px model maps
many unrelated photos close together (the bundled one scores a bald eagle against a punching bag at
0.959), so a fixed 0.95 groups strangers, while a large model may spread even true copies further
apart. The threshold is therefore measured per model and stored in its ``config.json`` under
``"dedup"``; ``cl-zoo dedup`` reads it back (via the embeddings' metadata, or the model folder). The threshold's reader,
:func:`~cl_zoo.arrays.recorded_threshold`, is below embedding/ (which copies it into the metadata).

The measurement: every distinct photo gets a few *copies* of the kind a collection really holds
(re-encoded at low JPEG quality, downscaled, slightly cropped, and all three at once). Positives are
each copy's similarity to its original; negatives are each original's similarity to its nearest
*other* original. The threshold is set just below the weakest copy that keeps the whole picture
(re-encoded or resized), not midway to the closest distinct pair: that pair, found among a few
hundred photos, underestimates how close strangers come in a collection of thousands (for the
bundled model, 255 photos put it at 0.959, but on CIFAR-10's 10,000 test images a cut at 0.976 still
groups 123 images, most of them different pictures, while 0.99 groups 17 near-identical ones).
Cropped copies lose pixels, and a small model may score them no higher than two different photos,
so they are reported (how many the threshold still catches) but do not pull the threshold down.
"""

from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

# The threshold a model records and the fallback live below embedding/, which records the threshold
# in the metadata it writes; re-exported here, beside the calibration that measures it.
from cl_zoo.arrays import CONFIG_KEY, FALLBACK_DEDUP_THRESHOLD, normalize, recorded_threshold
from cl_zoo.embedding import extract_features, load_embedding_model
from cl_zoo.errors import DataError


def _jpeg_bytes(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.convert("RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _reencode(img: Image.Image) -> Image.Image:
    return Image.open(io.BytesIO(_jpeg_bytes(img, 40)))


def _downscale(img: Image.Image) -> Image.Image:
    w, h = img.size
    return img.resize((max(1, w // 2), max(1, h // 2)), Image.Resampling.BILINEAR)


def _crop(img: Image.Image) -> Image.Image:
    # 5% off the left/top and 3% off the right/bottom: an off-centre trim, as from a screenshot.
    w, h = img.size
    return img.crop((int(0.05 * w), int(0.05 * h), w - int(0.03 * w), h - int(0.03 * h)))


def _all_three(img: Image.Image) -> Image.Image:
    return _reencode(_downscale(_crop(img)))


# name -> transformation; the copies a calibration compares against their originals.
COPY_KINDS: dict[str, Callable[[Image.Image], Image.Image]] = {
    "jpeg_q40": _reencode,
    "half_size": _downscale,
    "crop_5pct": _crop,
    "crop_half_jpeg_q40": _all_three,
}
COPY_KIND_LABELS: dict[str, str] = {
    "jpeg_q40": "re-encoded as JPEG quality 40",
    "half_size": "half size",
    "crop_5pct": "5% cropped off the left/top, 3% off the right/bottom",
    "crop_half_jpeg_q40": "that crop, then half size, then JPEG quality 40",
}
# The kinds that keep the whole picture: the threshold must group every one of these.
WHOLE_PICTURE_KINDS: frozenset[str] = frozenset({"jpeg_q40", "half_size"})


def write_copies(photos: Sequence[str], folder: str | os.PathLike[str]) -> list[tuple[int, str, str]]:
    """Write every kind of copy of every photo into ``folder``; returns ``(photo index, kind, path)``.

    Copies are stored as JPEG quality 95 (the low-quality kind already went through quality 40),
    so they are read back through the same decoder as real files.
    """
    folder = Path(folder)
    out: list[tuple[int, str, str]] = []
    for i, photo in enumerate(photos):
        with Image.open(photo) as img:
            rgb = img.convert("RGB")
        for kind, make in COPY_KINDS.items():
            path = folder / f"{i:05d}-{kind}.jpg"
            path.write_bytes(_jpeg_bytes(make(rgb), 95))
            out.append((i, kind, str(path)))
    return out


THRESHOLD_STEP = 0.005


def choose_threshold(copy_scores: np.ndarray, distinct_scores: np.ndarray) -> float:
    """The weakest copy's score rounded down to a multiple of 0.005, if that stays above every
    distinct pair (else midway between the two).

    ``copy_scores`` are the copies the threshold must catch (whole-picture kinds). When they
    overlap the distinct pairs, the threshold minimises missed copies plus falsely grouped photos
    (each as a fraction of its own count), so neither side dominates by sheer number; ties go to
    the higher cut.
    """
    pos = np.sort(np.asarray(copy_scores, dtype=np.float64))
    neg = np.sort(np.asarray(distinct_scores, dtype=np.float64))
    if not len(pos) or not len(neg):
        raise DataError("calibration needs copies and at least two distinct photos")
    if pos[0] > neg[-1]:
        below_copies = np.floor(pos[0] / THRESHOLD_STEP + 1e-9) * THRESHOLD_STEP
        if below_copies > neg[-1]:
            return float(np.round(below_copies, 3))
        return float(np.round((pos[0] + neg[-1]) / 2, 4))
    candidates = np.unique(np.round(np.concatenate([pos, neg]), 3))
    missed = np.searchsorted(pos, candidates, side="left") / len(pos)
    grouped = (len(neg) - np.searchsorted(neg, candidates, side="left")) / len(neg)
    cost = missed + grouped
    # Among equally good cuts take the highest: a missed copy costs less than grouped strangers.
    return float(candidates[len(cost) - 1 - int(np.argmin(cost[::-1]))])


@dataclass
class DedupCalibration:
    """Scores of a calibration run and the threshold chosen from them."""

    threshold: float
    copy_scores: np.ndarray  # [n_copies] similarity of each copy to its original
    copy_kinds: list[str]  # kind of each copy (a key of COPY_KINDS)
    distinct_scores: np.ndarray  # [n_photos] similarity of each photo to its nearest other photo
    distinct_pair: tuple[str, str]  # the closest distinct pair (photo names)

    def summary(self) -> dict[str, Any]:
        """What a model card records: the threshold and the evidence for it."""
        pos, neg, t = self.copy_scores, self.distinct_scores, self.threshold
        kinds = np.array(self.copy_kinds)
        per_kind = {
            kind: {
                "min": round(float(pos[kinds == kind].min()), 4),
                "median": round(float(np.median(pos[kinds == kind])), 4),
                "caught": f"{int((pos[kinds == kind] >= t).sum())}/{int((kinds == kind).sum())}",
            }
            for kind in dict.fromkeys(self.copy_kinds)
        }
        return {
            "threshold": t,
            "method": "cl_zoo.index.dedup_calibration.calibrate_dedup_threshold",
            "photos": int(len(neg)),
            "copies": int(len(pos)),
            "whole_picture_kinds": sorted(WHOLE_PICTURE_KINDS),
            "copy_scores_by_kind": per_kind,
            "distinct_nn_max": round(float(neg.max()), 4),
            "distinct_nn_p99": round(float(np.quantile(neg, 0.99)), 4),
            "distinct_nn_median": round(float(np.median(neg)), 4),
            "closest_distinct_pair": list(self.distinct_pair),
            "distinct_grouped": int((neg >= t).sum()),
        }


def calibrate_dedup_threshold(
    model: Any,
    photos: Sequence[str | os.PathLike[str]],
    *,
    workdir: str | os.PathLike[str] | None = None,
    batch_size: int = 64,
    device: str = "auto",
    workers: int | None = None,
    progress: bool = False,
) -> DedupCalibration:
    """Measure ``model``'s duplicate threshold on distinct ``photos`` and copies made of them.

    ``model`` is anything :func:`cl_zoo.embedding.load_embedding_model` accepts. ``photos`` must be
    different pictures (no duplicates among them): each one's nearest neighbour is a negative.
    """
    originals = [os.fspath(p) for p in photos]
    if len(originals) < 2:
        raise DataError(f"calibration needs at least 2 distinct photos, got {len(originals)}")
    net = load_embedding_model(model)
    with tempfile.TemporaryDirectory(prefix="cl-zoo-calibrate-", dir=workdir) as tmp:
        copies = write_copies(originals, tmp)
        result = extract_features(
            net, originals + [p for _, _, p in copies], batch_size=batch_size, device=device,
            workers=workers, progress=progress,
        )
    if result.failures:
        path, reason = result.failures[0]
        raise DataError(f"{len(result.failures)} calibration image(s) could not be read (first: {path}: {reason})")
    x = normalize(result.features)
    orig, copy = x[: len(originals)], x[len(originals):]
    owner = np.array([i for i, _, _ in copies])
    copy_scores = np.einsum("ij,ij->i", copy, orig[owner])
    sims = orig @ orig.T
    np.fill_diagonal(sims, -np.inf)
    nearest = sims.argmax(axis=1)
    distinct_scores = sims[np.arange(len(orig)), nearest]
    a = int(distinct_scores.argmax())
    whole = np.array([k in WHOLE_PICTURE_KINDS for _, k, _ in copies])
    return DedupCalibration(
        threshold=choose_threshold(copy_scores[whole], distinct_scores),
        copy_scores=copy_scores.astype(np.float32),
        copy_kinds=[k for _, k, _ in copies],
        distinct_scores=distinct_scores.astype(np.float32),
        distinct_pair=(Path(originals[a]).name, Path(originals[int(nearest[a])]).name),
    )


def card_section(summary: dict[str, Any], folder: str) -> str:
    """The "Near-duplicate threshold" section of a model card, from :meth:`DedupCalibration.summary`.

    Generated rather than written by hand so that a recalibrated model cannot keep an old story.
    """
    t = summary["threshold"]
    rows = "\n".join(
        f"| {COPY_KIND_LABELS.get(kind, kind)} | {s['min']:.4f} | {s['median']:.4f} | {s['caught']} |"
        for kind, s in summary["copy_scores_by_kind"].items()
    )
    pair = " / ".join(Path(p).stem for p in summary.get("closest_distinct_pair") or [])
    return (
        f"`cl-zoo dedup` groups images of this model at cosine similarity **>= {t:g}** unless told otherwise "
        f"(recorded under `\"dedup\"` in `config.json`). Measured with `python scripts/calibrate_dedup.py "
        f"model_cards/{folder} <photos> --write` on the {summary['photos']} distinct photos of "
        f"{summary.get('photos_source', 'a photo folder')} and {summary['copies'] // max(summary['photos'], 1)} copies of each:\n\n"
        f"| copies of each photo | lowest similarity to its original | median | grouped at {t:g} |\n|---|---|---|---|\n{rows}\n\n"
        f"Distinct photos score up to {summary['distinct_nn_max']:.4f} against their nearest other photo ({pair}; median "
        f"{summary['distinct_nn_median']:.3f}); {summary['distinct_grouped']} of them are grouped at the threshold. The "
        "threshold sits just below the weakest whole-picture copy (re-encoded or resized), rounded down to 0.005, "
        "rather than midway to the closest distinct pair, because strangers come closer in larger collections. "
        "Cropped copies score lower; `cl-zoo dedup --show-scores` shows the distribution in your collection."
    )


__all__ = [
    "CONFIG_KEY",
    "COPY_KINDS",
    "WHOLE_PICTURE_KINDS",
    "DedupCalibration",
    "FALLBACK_DEDUP_THRESHOLD",
    "calibrate_dedup_threshold",
    "card_section",
    "choose_threshold",
    "recorded_threshold",
    "write_copies",
]
