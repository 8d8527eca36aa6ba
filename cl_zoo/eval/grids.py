"""Image grids for ``cl-zoo search --plot`` and ``cl-zoo dedup --plot``: what a search user wants to see.

A row per query (the query, then its neighbours) or per near-duplicate group, each tile captioned
with its cosine score and a shortened file name. Images go through the project's own decoder
(:func:`cl_zoo.data.images.load_image`), so the grid accepts and refuses exactly the files that
``embed`` does; a file that has moved or no longer decodes becomes a grey placeholder tile naming
the reason, because one stale path among thousands must not cost the user the whole picture.

The grid is bounded (rows and columns) so that ``--plot`` on 10,000 queries draws a readable
figure in seconds instead of a gigapixel PNG; the caller says what was left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from cl_zoo.data.images import ImageDecodeError, load_image
from cl_zoo.embedding import display_path
from cl_zoo.errors import DataError
from cl_zoo.eval.plots import _figure, check_plot_path, save_figure

MAX_ROWS = 8
MAX_COLUMNS = 11  # a query and search's default k=10 neighbours
TILE_INCHES = 1.55
TILE_ASPECT = 0.75  # tiles are 4:3 boxes: most photos are landscape, and square cells left wide gaps between rows
CAPTION_INCHES = 0.34  # two caption lines at 7.5 pt
TITLE_INCHES = 0.32
THUMB_PIXELS = 170  # about TILE_INCHES at the PNG's 110 dpi: no tile is upscaled from a smaller thumbnail
PLACEHOLDER_GREY = 0.85
QUERY_COLOUR = "tab:blue"


@dataclass(frozen=True)
class Tile:
    """One cell of a grid: an image path and the caption under it."""

    path: str
    caption: str
    role: str = "result"  # "query" or "first" tiles get a coloured frame


def short_name(path: str, limit: int = 26) -> str:
    """The file name of ``path`` on one short line: its middle elided, so the extension and the start stay."""
    name = display_path(os.path.basename(str(path).rstrip("/")) or str(path))
    if len(name) <= limit:
        return name
    head = (limit - 1) // 2
    return f"{name[:head]}…{name[-(limit - 1 - head):]}"


def thumbnail(path: str, width: int = THUMB_PIXELS, aspect: float = TILE_ASPECT) -> tuple[np.ndarray | None, str]:
    """(the image fitted into a white ``width`` x ``width * aspect`` box as uint8 RGB, "") or (None, why not).

    The whole image is shown, never cropped: a near-duplicate may differ from its original only
    at the border. JPEGs are decoded at the smallest DCT scale that still covers the box (draft
    mode), so a grid of large photos costs a fraction of full decodes.
    """
    from PIL import Image

    height = round(width * aspect)
    try:
        img = load_image(path, min_short_side=height)
    except ImageDecodeError as exc:
        return None, exc.reason
    # Scaled to fill the box both ways: a small copy drawn small read as a different picture.
    scale = min(width / img.width, height / img.height)
    img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.Resampling.BICUBIC)
    box = np.full((height, width, 3), 255, dtype=np.uint8)
    top, left = (height - img.height) // 2, (width - img.width) // 2
    box[top:top + img.height, left:left + img.width] = np.asarray(img, dtype=np.uint8)
    return box, ""


def _placeholder_text(reason: str, width: int = 16) -> str:
    words, lines, line = reason.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    shown = lines[:3] + (["…"] if len(lines) > 3 else [])
    return "unreadable\n" + "\n".join(shown)


def grid_figure(rows: Sequence[Sequence[Tile]], title: str = "", *, feature: str = "--plot") -> Any:
    """A matplotlib figure with one axes per tile, row by row; short rows leave their cells empty.

    Each axes is labelled ``tile:ROLE`` (``tile:missing`` for a placeholder) so that tests and
    callers can count what was drawn without reading pixels.
    """
    plt = _figure(feature)
    if not rows:
        raise DataError("nothing to plot: no rows")
    columns = max(len(r) for r in rows)
    tile_h = TILE_INCHES * TILE_ASPECT
    width = TILE_INCHES * columns
    title_h = TITLE_INCHES + 0.17 * title.count("\n") if title else 0.05
    height = len(rows) * (tile_h + CAPTION_INCHES) + title_h
    fig = plt.figure(figsize=(width, height))
    spec = fig.add_gridspec(len(rows), columns, left=0.005, right=0.995, bottom=0.005,
                            top=1 - (title_h + CAPTION_INCHES) / height,
                            wspace=0.05, hspace=CAPTION_INCHES / tile_h)
    for r, row in enumerate(rows):
        for c, tile in enumerate(row):
            ax = fig.add_subplot(spec[r, c])
            image, reason = thumbnail(tile.path)
            ax.set_xticks([])
            ax.set_yticks([])
            if image is None:
                ax.set_facecolor((PLACEHOLDER_GREY,) * 3)
                ax.text(0.5, 0.5, _placeholder_text(reason), ha="center", va="center", fontsize=7, color="0.25",
                        transform=ax.transAxes)
                ax.set_label("tile:missing")
            else:
                ax.imshow(image)
                ax.set_label(f"tile:{tile.role}")
            ax.set_title(tile.caption, fontsize=7.5, pad=3, linespacing=1.15)
            framed = tile.role in ("query", "first")
            for spine in ax.spines.values():
                spine.set_edgecolor(QUERY_COLOUR if framed else "0.8")
                spine.set_linewidth(2.5 if framed else 0.6)
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.08 / height, va="top")
    return fig


def neighbour_rows(report: Sequence[Mapping[str, Any]], *, max_rows: int = MAX_ROWS, max_columns: int = MAX_COLUMNS) -> list[list[Tile]]:
    """``cl-zoo search``'s report (``[{"query", "results": [{"path", "score"}]}]``) as grid rows."""
    rows = []
    for entry in list(report)[:max_rows]:
        row = [Tile(str(entry["query"]), f"query\n{short_name(entry['query'])}", "query")]
        for rank, hit in enumerate(entry["results"][: max_columns - 1], 1):
            row.append(Tile(str(hit["path"]), f"#{rank}  cos {float(hit['score']):.3f}\n{short_name(hit['path'])}"))
        rows.append(row)
    return rows


def group_rows(
    groups: Sequence[Sequence[str]], scores: Sequence[Sequence[float]], *, max_rows: int = MAX_ROWS, max_columns: int = MAX_COLUMNS,
) -> list[list[Tile]]:
    """Near-duplicate groups as grid rows: the group's first image, then the others with their cosine to it.

    A group wider than the grid shows how many images were left out in its first tile's caption.
    """
    rows = []
    for n, (group, sims) in enumerate(zip(list(groups)[:max_rows], scores), 1):
        hidden = len(group) - max_columns
        count = f"group {n}: {len(group)} images" + (f" ({hidden} not shown)" if hidden > 0 else "")
        row = [Tile(str(group[0]), f"{count}\n{short_name(group[0])}", "first")]
        for path, sim in zip(group[1:max_columns], sims[1:max_columns]):
            row.append(Tile(str(path), f"cos {float(sim):.4f}\n{short_name(path)}"))
        rows.append(row)
    return rows


def check_plot_option(path: str | os.PathLike[str] | None, feature: str) -> Path | None:
    """``--plot``'s destination and matplotlib, both checked before a command reads or embeds anything."""
    if path is None:
        return None

    _figure(feature)
    return check_plot_path(path)


def plot_neighbours(
    report: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *, title: str = "",
    max_rows: int = MAX_ROWS, max_columns: int = MAX_COLUMNS,
) -> Path:
    """``search --plot``: one row per query (at most ``max_rows``), the query then its neighbours."""
    fig = grid_figure(neighbour_rows(report, max_rows=max_rows, max_columns=max_columns), title, feature="cl-zoo search --plot")
    return save_figure(fig, path)


def plot_groups(
    groups: Sequence[Sequence[str]], scores: Sequence[Sequence[float]], path: str | os.PathLike[str], *, title: str = "",
    max_rows: int = MAX_ROWS, max_columns: int = MAX_COLUMNS,
) -> Path:
    """``dedup --plot``: one row per near-duplicate group (at most ``max_rows``) with cosine similarities."""
    if not groups:
        raise DataError("no near-duplicate groups to plot at this threshold; nothing was written (lower --threshold to see some)")
    fig = grid_figure(group_rows(groups, scores, max_rows=max_rows, max_columns=max_columns), title, feature="cl-zoo dedup --plot")
    return save_figure(fig, path)


def similarity_to_first(rows: Any, group: Sequence[int]) -> list[float]:
    """Cosine of each member of ``group`` to its first member; ``rows`` is an array or a block-read source."""
    ids = np.asarray(group, dtype=np.int64)
    vectors = rows.take(ids) if hasattr(rows, "take") and not isinstance(rows, np.ndarray) else np.asarray(rows)[ids]
    vectors = np.asarray(vectors, dtype=np.float64)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return [float(v) for v in vectors @ vectors[0]]


__all__ = [
    "MAX_COLUMNS", "MAX_ROWS", "Tile", "check_plot_option", "grid_figure", "group_rows", "neighbour_rows", "plot_groups", "plot_neighbours",
    "short_name", "similarity_to_first", "thumbnail",
]
