#!/usr/bin/env python
"""Measure a model's near-duplicate threshold and record it in its folder's config.json.

    python scripts/calibrate_dedup.py MODEL_DIR PHOTOS_DIR [--write]

PHOTOS_DIR holds distinct photos (the bundled model's figure comes from the 255 photos of
/work/shared/datasets/imagenet-samples.tar.gz, unpacked). Prints the measurement as JSON; with
--write it is stored under "dedup" in MODEL_DIR/config.json, where `cl-zoo embed` picks it up for
the embeddings' metadata and `cl-zoo dedup` uses it as its default threshold. The model's weights
(model.safetensors) are never touched.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from cl_zoo.data.images import discover_images
    from cl_zoo.index.dedup_calibration import CONFIG_KEY, calibrate_dedup_threshold
    from cl_zoo.fileio import atomic_write_json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("photos", type=Path)
    parser.add_argument("--write", action="store_true", help="store the result in MODEL_DIR/config.json")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--source", default=None, help="how the card names the photos (default: the folder's name)")
    args = parser.parse_args(argv)
    config_path = args.model_dir / "config.json"
    if not config_path.is_file():
        print(f"error: {args.model_dir} is not a checkpoint folder (no config.json)", file=sys.stderr)
        return 2
    photos = discover_images([args.photos])
    calibration = calibrate_dedup_threshold(args.model_dir, photos, workers=args.workers, progress=True)
    summary = calibration.summary()
    summary["photos_source"] = args.source or args.photos.name
    print(json.dumps(summary, indent=1))
    if args.write:
        config = json.loads(config_path.read_text())
        config[CONFIG_KEY] = summary
        atomic_write_json(config_path, config)
        print(f"wrote threshold {summary['threshold']} into {config_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
