"""Transfer of the CPU tier's checkpoints (issue 23): detection on BCCD and a linear probe on CIFAR-10.

    python scripts/tier_transfer.py detection METHOD [--seed S] [--random-init]   # one fine-tune
    python scripts/tier_transfer.py detection METHOD --engine detectron2 [--seed S] [--random-init]  # in detectron2
    python scripts/tier_transfer.py cifar10 METHOD [--random-init]                 # one linear probe

METHOD is a published tier folder's method (``dcl`` for ``model_cards/dcl_resnet18.imagenette64_cpu``).

* ``detection``: ``cl-zoo detect --engine torchvision`` fine-tunes Faster R-CNN (ResNet-18 FPN, every
  layer trainable, BatchNorm with batch statistics) on BCCD's trainval split (292 images, 3 classes)
  and reports COCO AP and VOC07 AP50 on its test split (72 images), with ``BCCD_SCHEDULE``: one fixed
  schedule and image size that fit a 2-core CPU (about 10 min a run). ``--seed`` is the fine-tune's
  seed (data order, detector heads; the backbone is the card's published weights). CMC's L/ab pair is
  not a ResNet the detector can hold, so it has no detection row.
* ``--engine detectron2``: the same schedule through ``cl-zoo detect --engine detectron2`` (the card's
  weights exported to detectron2, its R18-FPN config; float32, VOC07 evaluator): the row that shows the
  exported weights train there too; with ``--random-init`` the torchvision engine's seeded random
  weights go the same way (its baseline). Needs detectron2 installed.
* ``cifar10``: ``cl-zoo linear-eval --protocol fast`` on CIFAR-10 (50,000 train / 10,000 test, the
  JPEG copy in ``../shared/datasets``) with the checkpoint's own preprocessing (its 64 px centre
  crop of the 32 px images) and float32 PyTorch features, like the tier's Imagenette probe.
* ``--random-init``: the same run on the card's architecture with seeded random weights; its report
  goes into every tier card of that architecture (the baseline each row is read against).

Each run has its own folder under ``$RUN_ROOT`` (default ``runs/tier_transfer``); a detection run
that was interrupted continues from its ``last.pt`` when the command is run again. The report is
checked (the card's weight digests or a random init of its architecture, the documented schedule),
copied into the card folder as ``transfer_*.json`` and the folder re-rendered by
``scripts/add_tier_seed.py`` (weights untouched), whose ``bundle_cpu_tier.py`` summarises the
transfer reports into ``cpu_tier.transfer`` and the card. Then ``python scripts/cpu_tier_table.py
--write``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import bundle_cpu_tier  # noqa: E402
from bundle_cpu_tier import BCCD_SCHEDULE, fail, read_json, transfer_file  # noqa: E402


def card_folder(cards: Path, method: str) -> Path:
    folder = cards / f"{method}_resnet18.{bundle_cpu_tier.TAG}"
    if not (folder / "config.json").is_file():
        fail(f"{folder} is not a published tier folder")
    return folder


def data_dir(given: Path | None) -> Path:
    folder = given or Path(os.environ.get("DATA_DIR", REPO.parent / "shared" / "datasets"))
    if not folder.is_dir():
        fail(f"data folder {folder} not found (set --data-dir or DATA_DIR to ../shared/datasets)")
    return folder


def detection_command(folder: Path, bccd: Path, run: Path, seed: int, random_init: bool, engine: str = "torchvision") -> list[str]:
    """The one documented BCCD fine-tune, as a ``cl-zoo detect`` command line."""
    s = BCCD_SCHEDULE
    command = [
        sys.executable, "-m", "cl_zoo.cli", "detect", "--engine", engine, "--model", str(folder),
        "--data", str(bccd), "--train-split", s["train_split"], "--val-split", s["val_split"],
        "--head", s["head"], "--norm", s["norm"], "--freeze-at", str(s["freeze_at"]),
        "--max-iter", str(s["max_iter"]), "--steps", ",".join(map(str, s["steps"])),
        "--warmup-iters", str(s["warmup_iters"]), "--batch-size", str(s["batch_size"]), "--lr", str(s["lr"]),
        "--min-size-train", ",".join(map(str, s["min_sizes_train"])), "--min-size-test", str(s["min_size_test"]),
        "--max-size", str(s["max_size"]), "--rois-per-image", str(s["rois_per_image"]),
        "--proposals-test", str(s["proposals_test"]), "--seed", str(seed),
        "--device", "cpu", "--no-progress", "--out", str(run),
    ]
    if engine == "torchvision":
        command += ["--precision", s["precision"]]
    if random_init:
        command.append("--random-init")
    if (run / ("last_checkpoint" if engine == "detectron2" else "last.pt")).is_file():
        command.append("--resume")
    return command


def cifar10_command(folder: Path, data: Path, report: Path, random_init: bool) -> list[str]:
    command = [
        sys.executable, "-m", "cl_zoo.cli", "linear-eval", "--model", str(folder), "--train", "cifar10",
        "--test", "cifar10", "--root", str(data), "--test-split", "test", "--protocol", "fast",
        "--precision", "fp32", "--backend", "torch", "--out", str(report),
    ]
    return command + (["--random-init", "--seed", "0"] if random_init else [])


def file_report(report: Path, cards: Path, folder: Path, name: str, random_init: bool) -> list[Path]:
    """Copy a finished run's report into its card (a random init's into every card of its architecture)."""
    config = read_json(folder / "config.json")
    targets = [folder]
    if random_init:
        targets = sorted(
            f for f in cards.glob(f"*_resnet18.{bundle_cpu_tier.TAG}")
            if (f / "config.json").is_file()
            and read_json(f / "config.json")["architecture"] == config["architecture"]
        )
    for target in targets:
        shutil.copy2(report, target / name)
    return targets


def rerender(cards: Path, targets: list[Path]) -> None:
    """Re-publish each folder from itself: bundle_cpu_tier.py checks and summarises the transfer reports."""
    import add_tier_seed

    for target in targets:
        method = read_json(target / "config.json")["cpu_tier"]["method"]
        code = add_tier_seed.main([method, "--cards", str(cards), "--out", str(cards)])
        if code:
            fail(f"re-rendering {target} failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=("detection", "cifar10"))
    parser.add_argument("method", choices=bundle_cpu_tier.METHODS)
    parser.add_argument("--seed", type=int, default=0, help="detection: the fine-tune's seed (0, 1, 2)")
    parser.add_argument("--random-init", action="store_true", help="the card architecture's random-init baseline")
    parser.add_argument("--engine", choices=("torchvision", "detectron2"), default="torchvision",
                        help="detection: the engine that fine-tunes (detectron2 must be installed)")
    parser.add_argument("--cards", type=Path, default=REPO / "model_cards")
    parser.add_argument("--data-dir", type=Path, help="folder with bccd-voc.tar.gz and cifar10-jpeg.tar.gz (default DATA_DIR or ../shared/datasets)")
    parser.add_argument("--run-root", type=Path, default=Path(os.environ.get("RUN_ROOT", REPO / "runs" / "tier_transfer")))
    args = parser.parse_args(argv)
    folder = card_folder(args.cards, args.method)
    config = read_json(folder / "config.json")
    data = data_dir(args.data_dir)
    who = f"random_init_{config['architecture']}" if args.random_init else args.method
    if args.engine == "detectron2" and args.task != "detection":
        fail("--engine detectron2 is for detection runs")
    if args.task == "detection":
        if config["architecture"] != "resnet18":
            fail(f"{folder.name} is {config['architecture']}: the detector needs a ResNet (CMC's L/ab pair is not one)")
        archive = data / "bccd-voc.tar.gz"
        if not archive.is_file():
            fail(f"{archive} not found")
        from cl_zoo.data.archive import extract_archive

        bccd = extract_archive(archive) / "bccd-voc"
        engine = "_detectron2" if args.engine == "detectron2" else ""
        run = args.run_root / who / f"bccd_detection{engine}_seed{args.seed}"
        run.mkdir(parents=True, exist_ok=True)
        command = detection_command(folder, bccd, run, args.seed, args.random_init, args.engine)
        report = run / "report.json"
    else:
        run = args.run_root / who / "cifar10_linear"
        run.mkdir(parents=True, exist_ok=True)
        report = run / "linear.json"
        command = cifar10_command(folder, data, report, args.random_init)
    print("$ " + " ".join(command[1:]), flush=True)
    with open(run / "log.txt", "a", encoding="utf-8") as log:
        code = subprocess.call(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if code:
        fail(f"{args.task} run failed (exit {code}); log: {run / 'log.txt'}")
    name = transfer_file(args.task, args.random_init, args.seed, args.engine)
    targets = file_report(report, args.cards, folder, name, args.random_init)
    rerender(args.cards, targets)
    summary: dict[str, Any] = read_json(report)["metrics"]
    print(f"{name} -> {', '.join(t.name for t in targets)}: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
