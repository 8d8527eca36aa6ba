"""Add other seeds' evaluated bundles to a published CPU-tier folder, from that folder alone.

    python scripts/add_tier_seed.py METHOD [BUNDLE ...] [--control BUNDLE ...] [--out model_cards]

``BUNDLE`` is what ``RUN_ROOT=... OUT=... scripts/train_cpu_tier.sh METHOD --seed N`` leaves in
``$OUT/<method>_resnet18.imagenette64_cpu/`` (the same recipe with another seed, evaluated). The
published seed's own bundle is long gone by then (runs are not kept), so it is rebuilt from the
published folder (``relayout_model_cards.bundle_from_folder``: its weights, reports, training log
and machine line, plus the seeds already in its card) and ``scripts/bundle_cpu_tier.py`` runs with
every ``--other-seed``: the card and ``config.json`` gain the new seeds' reports, the weights stay
the published seed's, byte for byte. ``--control BUNDLE`` adds a control run the same way
(``train_cpu_tier.sh simclr_tau0.1 --seed N``: one of ``bundle_cpu_tier.CONTROLS``, any seed); the
seeds and controls already in the card are kept. Then ``python scripts/cpu_tier_table.py --write``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import bundle_cpu_tier  # noqa: E402
from cl_zoo.checkpoint import INDEX_NAME  # noqa: E402
from relayout_model_cards import bundle_from_folder  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("method", choices=bundle_cpu_tier.METHODS)
    parser.add_argument("bundles", nargs="*", type=Path, help="evaluated bundles of the same recipe with other seeds")
    parser.add_argument("--control", type=Path, action="append", default=[], metavar="BUNDLE",
                        help="evaluated bundle of one of the method's control recipes")
    parser.add_argument("--out", type=Path, default=REPO / "model_cards")
    parser.add_argument("--cards", type=Path, default=REPO / "model_cards", help="where the published folder is")
    args = parser.parse_args(argv)
    folder = args.cards / f"{args.method}_resnet18.{bundle_cpu_tier.TAG}"
    if not (folder / "config.json").is_file():
        print(f"error: {folder} is not a published tier folder", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix=f"tier-{args.method}-") as work:
        call = bundle_from_folder(folder, Path(work))
        if (folder / INDEX_NAME).is_file():
            # Not re-laid out yet: its weight shards are what the registry pins, so they stay byte for byte.
            call.append("--keep-shards")
        for bundle in args.bundles:
            call += ["--other-seed", str(bundle)]
        for bundle in args.control:
            call += ["--control", str(bundle)]
        return bundle_cpu_tier.main([*call, "--out", str(args.out)])


if __name__ == "__main__":
    sys.exit(main())
