"""The README's example grids, made by the CLI itself on examples/photos, so that they show what a user gets.

    python scripts/plot_examples.py             # writes docs/figures/search.png and docs/figures/dedup.png
    python scripts/plot_examples.py --out DIR   # elsewhere

``search.png``: three of the eight photos as queries against all eight (``cl-zoo search -k 4 --plot``);
each query's first hit is itself at cosine 1.000, the rest are the nearest other photos.
``dedup.png``: the eight photos have no near-duplicates, so edited copies of three of them are added
first (re-saved at JPEG quality 30, downscaled by a third, cropped by a twelfth on each side,
mirrored, brightened by 25%), as a collection gathered from several sources would hold them; then
``cl-zoo dedup --threshold 0.95 --plot``. The crop and the mirror score between 0.95 and 0.97, below
the default model's calibrated 0.99, which is why the example sets the threshold.
Everything runs offline with the bundled default model, in about a minute on a 2-core CPU. The PNGs
are then reduced to a colour palette (:func:`shrink_png`) to stay under the repository's 150 KB a figure.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHOTOS = REPO / "examples" / "photos"
OUT = REPO / "docs" / "figures"
QUERIES = ("great_white_shark.jpg", "horse_cart.jpg", "rock_beauty.jpg")
K = "4"
THRESHOLD = "0.95"
MAX_BYTES = 150_000  # the repository's budget for a committed figure
PALETTES = (256, 192, 128, 96, 64)  # tried in turn: the most colours (least banding) that fit MAX_BYTES


def add_edited_copies(folder: Path) -> list[str]:
    """The photos plus edited copies of three of them in ``folder``; returns the copies' names."""
    from PIL import Image, ImageEnhance, ImageOps

    for photo in sorted(PHOTOS.glob("*.jpg")):
        shutil.copy(photo, folder / photo.name)
    with Image.open(PHOTOS / "leonberg.jpg") as im:
        im.save(folder / "leonberg_q30.jpg", quality=30)
        im.resize((im.width * 2 // 3, im.height * 2 // 3), Image.Resampling.BICUBIC).save(folder / "leonberg_small.jpg", quality=60)
    with Image.open(PHOTOS / "rock_beauty.jpg") as im:
        w, h = im.size
        im.crop((w // 12, h // 12, w - w // 12, h - h // 12)).save(folder / "rock_beauty_crop.jpg", quality=85)
        ImageOps.mirror(im).save(folder / "rock_beauty_flipped.jpg", quality=90)
    with Image.open(PHOTOS / "thresher.jpg") as im:
        ImageEnhance.Brightness(im).enhance(1.25).save(folder / "thresher_brighter.jpg", quality=90)
    return ["leonberg_q30.jpg", "leonberg_small.jpg", "rock_beauty_crop.jpg", "rock_beauty_flipped.jpg", "thresher_brighter.jpg"]


def shrink_png(path: Path, budget: int = MAX_BYTES) -> int:
    """Re-save ``path`` with the largest adaptive palette of :data:`PALETTES` that fits ``budget`` bytes.

    Photos in a full-colour PNG cost about 1 MB a grid; a palette keeps the text crisp (JPEG would
    blur it) at the price of some banding in skies, least with the most colours. Returns the colours used.
    """
    import io

    from PIL import Image

    from cl_zoo.fileio import atomic_write_bytes

    with Image.open(path) as im:
        rgb = im.convert("RGB")
    for colours in PALETTES:
        buffer = io.BytesIO()
        # MAXCOVERAGE kept the photos' colours best by eye (MEDIANCUT greyed pink flowers at 96 colours)
        rgb.quantize(colors=colours, method=Image.Quantize.MAXCOVERAGE).save(buffer, format="PNG", optimize=True)
        if buffer.tell() <= budget:
            break
    atomic_write_bytes(path, buffer.getvalue())
    return colours


def run(argv: list[str]) -> None:
    from cl_zoo.cli import main

    print("$ cl-zoo " + " ".join(argv), flush=True)
    if main(argv) != 0:
        raise SystemExit(f"error: cl-zoo {argv[0]} failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder for search.png and dedup.png (default {OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cl-zoo-figures-") as tmp:
        work = Path(tmp)
        run(["embed", str(PHOTOS), "--out", str(work / "photos.npy"), "-q"])
        run(["search", str(work / "photos.npy"), *[a for q in QUERIES for a in ("--query", str(PHOTOS / q))], "-k", K,
             "--plot", str(args.out / "search.png"), "--json"])
        collection = work / "collection"
        collection.mkdir()
        add_edited_copies(collection)
        run(["embed", str(collection), "--out", str(work / "collection.npy"), "-q"])
        run(["dedup", str(work / "collection.npy"), "--threshold", THRESHOLD, "--plot", str(args.out / "dedup.png"), "--json"])
    for name in ("search.png", "dedup.png"):
        path = args.out / name
        colours = shrink_png(path)
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB, {colours}-colour palette)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
