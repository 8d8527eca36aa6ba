"""The pictures: search/dedup image grids, pretraining's curves.png, and the README's methods figure.

Figures are checked through matplotlib's objects (axes labelled ``tile:ROLE``, legend texts, bar
widths), not pixels, so the tests say what was drawn and do not break on a font change.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cl_zoo.cli import main
from cl_zoo.eval import grids, plots
from tests.helpers import REPO_ROOT, TINY_PRETRAIN as TINY, embed_test_photos, expect_extra, hide, make_folder, one_error_line

REPO = REPO_ROOT
sys.path.insert(0, str(REPO / "scripts"))
import cpu_tier_table  # noqa: E402
import plot_methods  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def tiles(fig) -> list[str]:  # noqa: ANN001 - a matplotlib Figure
    return [ax.get_label() for ax in fig.axes if ax.get_label().startswith("tile:")]


def captions(fig) -> list[str]:  # noqa: ANN001
    return [ax.get_title() for ax in fig.axes]


@pytest.fixture
def tiny_images(tmp_path: Path) -> list[str]:
    """Three small synthetic images in three formats (a portrait one among them)."""
    paths = []
    specs = [("red.png", (24, 16), (200, 0, 0)), ("green.jpg", (30, 20), (0, 180, 0)), ("tall_blue.webp", (12, 30), (0, 0, 190))]
    for name, size, colour in specs:
        Image.new("RGB", size, colour).save(tmp_path / name)
        paths.append(str(tmp_path / name))
    return paths


def close(fig) -> None:  # noqa: ANN001
    import matplotlib.pyplot as plt

    plt.close(fig)


# ----------------------------------------------------------------------------- grids
def test_neighbour_grid_has_a_row_per_query_with_scores_and_names(tiny_images: list[str], tmp_path: Path) -> None:
    red, green, blue = tiny_images
    report = [
        {"query": red, "results": [{"path": red, "score": 1.0}, {"path": green, "score": 0.9123}, {"path": blue, "score": 0.5}]},
        {"query": blue, "results": [{"path": blue, "score": 0.99999}, {"path": str(tmp_path / "gone.jpg"), "score": 0.4}]},
    ]
    fig = grids.grid_figure(grids.neighbour_rows(report), "t")
    assert tiles(fig) == ["tile:query", "tile:result", "tile:result", "tile:result", "tile:query", "tile:result", "tile:missing"]
    text = captions(fig)
    assert text[0] == "query\nred.png" and text[2] == "#2  cos 0.912\ngreen.jpg" and text[6] == "#2  cos 0.400\ngone.jpg"
    drawn = fig.axes[1].get_images()[0].get_array()
    assert drawn.shape == (round(grids.THUMB_PIXELS * grids.TILE_ASPECT), grids.THUMB_PIXELS, 3)  # one box for every tile
    assert tuple(drawn[drawn.shape[0] // 2, drawn.shape[1] // 2]) == (200, 0, 0)  # the image itself, scaled up to fill
    portrait = fig.axes[3].get_images()[0].get_array()
    centre = portrait[portrait.shape[0] // 2, portrait.shape[1] // 2].astype(int)
    assert tuple(portrait[0, 0]) == (255, 255, 255) and np.abs(centre - (0, 0, 190)).max() <= 3  # padded sides; lossy WebP
    close(fig)

    out = grids.plot_neighbours(report, tmp_path / "grid.png", title="t")
    assert out.read_bytes()[:8] == PNG and not list(tmp_path.glob(".grid.png*"))  # written atomically, no temp left


def test_unreadable_images_become_placeholder_tiles_naming_the_reason(tiny_images: list[str], tmp_path: Path) -> None:
    (tmp_path / "notes.jpg").write_text("not an image")
    rows = [[grids.Tile(str(tmp_path / "missing.png"), "a"), grids.Tile(str(tmp_path / "notes.jpg"), "b"), grids.Tile(tiny_images[0], "c")]]
    fig = grids.grid_figure(rows)
    assert tiles(fig) == ["tile:missing", "tile:missing", "tile:result"]
    texts = [t.get_text() for ax in fig.axes[:2] for t in ax.texts]
    assert texts[0] == "unreadable\nfile not found" and texts[1].startswith("unreadable\nnot an image")
    assert not fig.axes[0].get_images()
    close(fig)


def test_grids_are_bounded(tiny_images: list[str]) -> None:
    report = [{"query": tiny_images[0], "results": [{"path": tiny_images[1], "score": 0.5}] * 40}] * 30
    rows = grids.neighbour_rows(report)
    assert len(rows) == grids.MAX_ROWS and {len(r) for r in rows} == {grids.MAX_COLUMNS}
    big = [tiny_images[1]] * (grids.MAX_COLUMNS + 2)
    rows = grids.group_rows([big] * 12, [[1.0] * len(big)] * 12)
    assert len(rows) == grids.MAX_ROWS and len(rows[0]) == grids.MAX_COLUMNS
    assert rows[0][0].caption.startswith(f"group 1: {len(big)} images (2 not shown)")


def test_group_grid_scores_are_cosines_to_the_first_image(tiny_images: list[str], tmp_path: Path) -> None:
    x = np.array([[1.0, 0.0], [3.0, 0.0], [1.0, 1.0], [0.0, 2.0]], np.float32)
    assert grids.similarity_to_first(x, [0, 2, 3]) == pytest.approx([1.0, 2 ** -0.5, 0.0])

    class BlockSource:  # what dedup --index-file holds: rows read on demand
        def take(self, rows: np.ndarray) -> np.ndarray:
            return x[rows]

    assert grids.similarity_to_first(BlockSource(), [1, 0]) == pytest.approx([1.0, 1.0])
    fig = grids.grid_figure(grids.group_rows([tiny_images[:2], tiny_images[1:]], [[1.0, 0.99512], [1.0, 0.97]]))
    assert tiles(fig) == ["tile:first", "tile:result", "tile:first", "tile:result"]
    assert captions(fig)[:2] == ["group 1: 2 images\nred.png", "cos 0.9951\ngreen.jpg"]
    close(fig)
    with pytest.raises(grids.DataError, match="no near-duplicate groups"):
        grids.plot_groups([], [], tmp_path / "g.png")


def test_short_names_keep_the_start_and_the_extension() -> None:
    assert grids.short_name("/a/b/chiton.jpg") == "chiton.jpg"
    long = grids.short_name("/x/a_very_long_file_name_from_a_camera_0001.jpeg")
    assert len(long) == 26 and long.startswith("a_very_long") and long.endswith("0001.jpeg") and "…" in long
    assert "\n" not in grids.short_name("/x/two\nlines.jpg")  # a caption line stays one line


# ----------------------------------------------------------------------------- the commands
def test_search_and_dedup_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    emb = embed_test_photos(tmp_path, {"copy_of_photo2.jpg": "photo2.JPEG"})
    photos = tmp_path / "photos"
    capsys.readouterr()
    assert main(["search", str(emb), "--query", str(photos / "photo2.JPEG"), "--query", str(photos / "photo0.jpg"), "-k", "3",
                 "--json", "--plot", str(tmp_path / "grid.png")]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == 2  # stdout is still only the JSON
    assert "wrote" in captured.err and "2 of 2 queries" in captured.err
    assert (tmp_path / "grid.png").read_bytes()[:8] == PNG

    assert main(["dedup", str(emb), "--threshold", "0.9999", "--plot", str(tmp_path / "groups.png")]) == 0
    assert "1 of 1 groups" in capsys.readouterr().err and (tmp_path / "groups.png").read_bytes()[:8] == PNG
    (tmp_path / "distinct").mkdir()
    distinct = embed_test_photos(tmp_path / "distinct")  # the four photos alone: no group at 0.9999
    capsys.readouterr()
    assert main(["dedup", str(distinct), "--threshold", "0.9999", "--plot", str(tmp_path / "none.png")]) == 0
    assert "not written" in capsys.readouterr().err and not (tmp_path / "none.png").exists()


@pytest.mark.parametrize("target, message", [
    ("grid.jpg", "--plot writes a PNG: name the file with .png"),
    ("no/such/folder/grid.png", "does not exist"),
    ("a_folder", "is a folder"),
])
def test_a_bad_plot_path_is_one_line_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, message: str) -> None:
    (tmp_path / "a_folder").mkdir()
    plot = str(tmp_path / target) if target != "a_folder" else str(tmp_path / "a_folder")
    missing = str(tmp_path / "never-read.npy")  # not read: the plot path is refused first
    for argv in (["search", missing, "--query", missing, "--plot", plot], ["dedup", missing, "--plot", plot]):
        assert main(argv) == 2
        line = one_error_line(capsys)
        assert message in line and "never-read" not in line, line


def test_missing_matplotlib_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    hide(monkeypatch, "matplotlib", "matplotlib.pyplot")
    missing = str(tmp_path / "e.npy")
    plot = str(tmp_path / "g.png")
    expect_extra(capsys, main(["search", missing, "--query", missing, "--plot", plot]), "cl-zoo search --plot", "matplotlib", "plots")
    expect_extra(capsys, main(["dedup", missing, "--plot", plot]), "cl-zoo dedup --plot", "matplotlib", "plots")


# ----------------------------------------------------------------------------- curves.png
def curve_rows(knn: bool) -> list[dict]:
    rows = [{"epoch": e, "loss": 5.0 - 0.1 * e} for e in range(1, 11)]
    if knn:
        for row in rows[4::5]:
            row.update(knn_k200_top1=0.3 + row["epoch"] / 100, knn_k20_top1=0.32 + row["epoch"] / 100)
    return rows


@pytest.mark.parametrize("knn", [False, True])
def test_curves_legend_names_the_loss_and_stays_off_the_curve(knn: bool) -> None:
    fig = plots.training_curves_figure(curve_rows(knn), "dcl resnet18 on imagenette, 10 epochs, seed 3")
    ax = fig.axes[0]
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == (["train loss", "kNN k=20 top-1", "kNN k=200 top-1"] if knn else ["train loss"])
    assert len(fig.axes) == (2 if knn else 1)  # the kNN axis only when there is kNN data
    fig.canvas.draw()
    assert legend.get_window_extent().y1 <= ax.get_window_extent().y0  # below the axes: never over the loss tail
    assert ax.get_title() == "dcl resnet18 on imagenette, 10 epochs, seed 3"
    assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == "train loss"
    if knn:
        assert fig.axes[1].get_ylabel() == "kNN top-1 (%)"
    close(fig)


def test_run_logger_writes_curves_png_with_its_title(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cl_zoo.train.logging import RunLogger

    seen = []
    real = plots.training_curves_figure
    monkeypatch.setattr(plots, "training_curves_figure", lambda rows, title="": seen.append(title) or real(rows, title))
    logger = RunLogger(tmp_path, tensorboard=False)
    for row in curve_rows(True):
        logger.log_epoch(row.pop("epoch"), row)
    assert logger.plot("simclr resnet18 on x, 10 epochs, seed 0") == tmp_path / "curves.png"
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG and seen == ["simclr resnet18 on x, 10 epochs, seed 0"]


# ----------------------------------------------------------------------------- the README's methods figure
def test_methods_figure_reads_the_committed_cards(tmp_path: Path) -> None:
    cards = REPO / "model_cards"
    rows = sorted(cpu_tier_table.tier_rows(cards), key=lambda r: -cpu_tier_table.mean_sd(cpu_tier_table.seed_values(r, "knn_k200_top1"))[0])
    assert len(rows) == 8
    fig = plot_methods.methods_figure(cards)
    knn, linear = fig.axes[:2]
    widths = [p.get_width() for p in knn.patches]
    expected = [100 * cpu_tier_table.mean_sd(cpu_tier_table.seed_values(r, "knn_k200_top1"))[0] for r in rows]
    assert widths == pytest.approx(expected) and len(linear.patches) == 8
    assert [t.get_text() for t in knn.get_yticklabels()] == [cpu_tier_table.LABELS[r["method"]] for r in rows]
    has_bccd = [r for r in rows if (r.get("transfer") or {}).get("bccd_detection")]
    if has_bccd:
        assert len(fig.axes) == 3 and len(fig.axes[2].patches) == len(has_bccd)
    title = fig._suptitle.get_text()
    assert "Imagenette at 64 px" in title and "30 epochs" in title and "3 seeds" in title and "ResNet-18" in title
    assert knn.get_xlabel() == "top-1 accuracy (%)"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "random init (ResNet-18)" in legend
    close(fig)

    assert plot_methods.main(["--out", str(tmp_path / "methods.png")]) == 0
    assert (tmp_path / "methods.png").read_bytes()[:8] == PNG and (tmp_path / "methods.png").stat().st_size < 150_000


@pytest.mark.parametrize("name", ["methods.png", "search.png", "dedup.png"])
def test_committed_figures_are_small(name: str) -> None:
    path = REPO / "docs" / "figures" / name
    assert path.read_bytes()[:8] == PNG and path.stat().st_size < 150_000, f"{path}: regenerate with scripts/plot_*.py"


def test_pretrain_titles_curves_png_with_data_epochs_and_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    seen = []
    real = plots.training_curves_figure
    monkeypatch.setattr(plots, "training_curves_figure", lambda rows, title="": seen.append(title) or real(rows, title))
    data = make_folder(tmp_path / "colours")
    assert main(["pretrain", "--method", "dcl", *TINY, "--data", str(data), "--val", str(data), "--epochs", "2", "--batch-size", "16",
                 "--knn-every", "1", "--seed", "3", "--out", str(tmp_path / "run")]) == 0
    assert seen == ["dcl pixels on 48 images of colours, 2 epochs, seed 3"]  # the real data, counted
    assert (tmp_path / "run" / "model" / "curves.png").read_bytes()[:8] == PNG
