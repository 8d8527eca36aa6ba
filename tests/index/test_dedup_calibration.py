"""Dedup thresholds are measured per model, recorded in its card and used by default (issue 14,
point 10), and the score distribution can be shown."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import cl_zoo
from cl_zoo.cli import main
from cl_zoo.index.dedup_calibration import (
    COPY_KINDS,
    FALLBACK_DEDUP_THRESHOLD,
    calibrate_dedup_threshold,
    choose_threshold,
    recorded_threshold,
)
from cl_zoo.embedding import model_metadata, save_embeddings
from cl_zoo.index.search import dedup_threshold_for, nearest_neighbour_scores
from tests.helpers import DATA

BUNDLED = cl_zoo.registry.DEFAULT_MODEL  # the bundled default carries a calibration


def pair(cos: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A unit vector at cosine ``cos`` from unit ``a``, rotated towards unit ``b`` (orthogonal to a)."""
    return cos * a + np.sqrt(1 - cos * cos) * b


def strangers_and_copies() -> np.ndarray:
    """Rows 0/1 at cosine 0.959 (the eagle and the punching bag); rows 2/3 at 0.995 (a copy)."""
    e = np.eye(8, dtype=np.float32)
    return np.stack([e[0], pair(0.959, e[0], e[1]), e[2], pair(0.995, e[2], e[3]), e[4], e[5]]).astype(np.float32)


def test_choose_threshold_midway_or_balanced() -> None:
    # Separable: just below the weakest copy (rounded down to 0.005), well above the strangers.
    assert choose_threshold(np.array([0.993, 0.999, 1.0]), np.array([0.80, 0.9591])) == 0.99
    # ... unless rounding down would reach a stranger: then midway.
    assert choose_threshold(np.array([0.9612, 1.0]), np.array([0.80, 0.9604])) == pytest.approx(0.9608)
    # Overlap: 1 of 4 copies below 0.95 and 1 of 4 strangers above it; the cut balances the two.
    t = choose_threshold(np.array([0.94, 0.97, 0.98, 0.99]), np.array([0.80, 0.85, 0.90, 0.96]))
    assert 0.96 < t <= 0.97


def test_dedup_defaults_to_the_recorded_threshold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At the old fixed default (0.95) the strangers at 0.959 were grouped."""
    x = strangers_and_copies()
    paths = [str(tmp_path / f"{i}.jpg") for i in range(len(x))]
    save_embeddings(tmp_path / "cal.npy", x, paths, {"model": "x", "dedup_threshold": "0.976"})
    assert main(["dedup", str(tmp_path / "cal.npy"), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == [[paths[2], paths[3]]] and "threshold 0.976 (calibrated" in out.err
    save_embeddings(tmp_path / "none.npy", x, paths, {"model": "hf-hub:nobody/nothing"})
    assert main(["dedup", str(tmp_path / "none.npy"), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == [[paths[2], paths[3]]] and f"threshold {FALLBACK_DEDUP_THRESHOLD}" in out.err
    assert main(["dedup", str(tmp_path / "none.npy"), "--json", "-t", "0.95"]) == 0
    assert json.loads(capsys.readouterr().out) == [[paths[0], paths[1]], [paths[2], paths[3]]]


def test_old_embeddings_find_the_threshold_in_the_model_folder(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"dedup": {"threshold": 0.97}}))
    assert dedup_threshold_for({"model": str(folder)})[0] == 0.97
    assert dedup_threshold_for({"model": BUNDLED})[0] == recorded_threshold(
        json.loads((Path(cl_zoo.__file__).parents[1] / "model_cards" / BUNDLED / "config.json").read_text())
    )


def test_show_scores_prints_the_nearest_neighbour_histogram(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = strangers_and_copies()
    save_embeddings(tmp_path / "e.npy", x, [f"{i}.jpg" for i in range(len(x))], {"model": "x"})
    assert main(["dedup", str(tmp_path / "e.npy"), "-t", "0.976", "--show-scores"]) == 0
    err = capsys.readouterr().err
    assert "nearest-neighbour similarity of 6 images" in err and "<- threshold" in err
    rows = [line for line in err.splitlines() if line.startswith("  0.") or line.startswith("  1.")]
    assert sum(int(line.split()[1]) for line in rows) == 6


def test_nearest_neighbour_scores_exclude_self_even_for_exact_copies() -> None:
    x = strangers_and_copies()
    x = np.vstack([x, x[4:5]])  # row 6 is an exact copy of row 4
    scores = nearest_neighbour_scores(x)
    np.testing.assert_allclose(scores[[0, 1, 2, 3, 4, 6]], [0.959, 0.959, 0.995, 0.995, 1.0, 1.0], atol=1e-5)
    assert scores[5] == pytest.approx(0.0, abs=1e-6)


def test_bundled_model_records_its_calibrated_threshold_and_embed_passes_it_on() -> None:
    from cl_zoo.embedding import load_embedding_model

    model = load_embedding_model(BUNDLED)
    threshold = recorded_threshold(model.checkpoint_config)
    summary = model.checkpoint_config["dedup"]
    whole = min(summary["copy_scores_by_kind"][kind]["min"] for kind in summary["whole_picture_kinds"])
    assert threshold is not None and summary["distinct_nn_max"] < threshold <= whole  # above strangers, below copies
    assert summary["distinct_grouped"] == 0 and summary["copy_scores_by_kind"]["jpeg_q40"]["caught"] == "255/255"
    card = (Path(cl_zoo.__file__).parents[1] / "model_cards" / BUNDLED / "README.md").read_text()
    assert f"similarity **>= {threshold:g}**" in card  # the card states the recorded threshold
    assert model_metadata(model, BUNDLED)["dedup_threshold"] == str(threshold)


def test_calibration_runs_on_real_photos(tmp_path: Path) -> None:
    photos = [str(DATA / n) for n in ("photo0.jpg", "photo1.png", "photo2.JPEG", "photo3.webp")]
    cal = calibrate_dedup_threshold(BUNDLED, photos, workdir=tmp_path, workers=0, device="cpu")
    summary = cal.summary()
    assert summary["photos"] == 4 and summary["copies"] == 4 * len(COPY_KINDS)
    assert summary["copy_scores_by_kind"]["jpeg_q40"]["min"] > summary["distinct_nn_max"]
    assert list(tmp_path.iterdir()) == []  # copies are written to a temporary folder and removed


@pytest.mark.slow
def test_bundled_threshold_is_reproducible(imagenet_samples_dir: Path) -> None:
    """The card's figure comes from scripts/calibrate_dedup.py on the 255 shared photos."""
    from cl_zoo.data.images import discover_images
    from cl_zoo.embedding import load_embedding_model

    recorded = load_embedding_model(BUNDLED).checkpoint_config["dedup"]
    cal = calibrate_dedup_threshold(BUNDLED, discover_images([imagenet_samples_dir / "photos"]))
    summary = cal.summary()
    assert summary["threshold"] == recorded["threshold"]
    assert summary["distinct_nn_max"] == pytest.approx(recorded["distinct_nn_max"], abs=2e-3)
