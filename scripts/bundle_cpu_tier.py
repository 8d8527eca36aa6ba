"""Publish one evaluated CPU-tier run as ``model_cards/<method>_resnet18.imagenette64_cpu/``.

    python scripts/bundle_cpu_tier.py METHOD [--bundle DIR] [--random-init DIR] [--out model_cards]
                                             [--other-seed DIR ...] [--control DIR ...]

Input is what ``scripts/train_cpu_tier.sh METHOD`` leaves in ``$OUT/<name>/``: ``model/`` (the
float16 copy, already scored on itself), ``reports/`` (kNN and fast linear probe on Imagenette val,
float32 and float16 weights), ``run/metrics.csv`` and ``logs/machine.txt``. ``--random-init`` is a
folder with ``knn.json`` (and optionally ``linear.json``) from ``cl-zoo knn/linear-eval --random-init``
on the same architecture and test images: the baseline each row of the zoo table is read against.
``--other-seed`` names the bundle of the same recipe trained with another ``--seed``: its float16
scores go into the card and the table beside this seed's (its weights are not published), so a gap
between two methods can be read against the gap between two seeds of one. ``--control`` names the
bundle of a control run (any seed): a committed recipe in ``CONTROLS`` that changes one thing of this
method's recipe (``recipes/<control>_imagenette64_cpu_tier.yaml``), so a comparison between two methods
can be read without a confound. Its scores, training log and the change it made go into this card.

Why a script and not hand edits: the eight tier checkpoints are compared in one table, so every
card must say the same things measured the same way (wall time, views/s, machine, float32 vs float16
vs random init), and every number must come from a report whose checkpoint digests are the files
being published. It refuses when they are not, when a report was not computed with float32 torch
features, or when the float16 copy moved a top-1 metric by more than 0.1 point.

The folder is the exact Hugging Face Hub repo content, in the current checkpoint format (config.json
format_version 2, weights in one model.safetensors: what timm loads too). A bundle whose weights are
sharded is written as one file with the same tensors; the shards' digests stay in config.json as
``files_before_relayout``, and reports computed on those shards are accepted for it. ``--keep-shards``
keeps a published folder's weight files byte for byte (re-rendering its config and card without
re-publishing its weights). Its card names the registered model only once
``cl_zoo/models/pretrained.py`` pins these files: the script prints the entry to paste, then run it
again (the second run changes only the card).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cl_zoo.checkpoint import INDEX_NAME, consolidate_weights, upgrade_config
from cl_zoo.checkpoint.card import PAPERS, extra_sections, registered_name_of, render_card
from cl_zoo.checkpoint.hub import zoo_repo_id
from cl_zoo.checkpoint.timm_compat import ZOO_CFG_KEY
from cl_zoo.index.dedup_calibration import card_section as dedup_card_section
from cl_zoo.errors import ClZooError
from cl_zoo.eval.report import MAX_REPORT_BYTES, compare_reports, read_report
from cl_zoo.fileio import atomic_write_text
from cl_zoo.fileio import read_bounded_json

REPO = Path(__file__).resolve().parents[1]
TAG = "imagenette64_cpu"
METHODS = ("simclr", "mocov2", "dcl", "dclw", "simo", "jcl", "cmc", "cacr")
TOLERANCE = 0.001  # 0.1 point: the float16 copy must score like the float32 weights


@dataclass(frozen=True)
class Control:
    """A recipe that differs from a published tier recipe in one respect, to settle one comparison."""

    method: str  # the published method whose recipe it changes; its card holds the control's seeds
    compared_with: str  # the method whose gap to ``method`` the control explains
    label: str
    question: str

    def recipe_path(self, name: str) -> str:
        return f"recipes/{name}_{TAG}_tier.yaml"


# Issue 23's two confounds, and CMC's view construction. SimCLR's tier recipe uses its paper's temperature 0.5 and DCL's uses 0.1,
# so DCL vs SimCLR mixes the decoupling with the temperature; CACR sees 5 views of every image per
# epoch where DCL sees 2, so CACR vs DCL mixes the weighting with the augmented views learned from.
# CMC's tier recipe draws L and ab from two crops; the authors' code takes both from one.
CONTROLS: dict[str, Control] = {
    "simclr_tau0.1": Control(
        "simclr", "dcl", "SimCLR, τ=0.1",
        "SimCLR at DCL's temperature 0.1: DCL vs this differs only in the decoupling"),
    "dcl_150views": Control(
        "dcl", "cacr", "DCL, 75 epochs (150 views/image)",
        "DCL given CACR's 150 augmented views per image (2 views x 75 epochs = 5 views x 30): "
        "CACR vs this differs in the weighting, not in the views seen"),
    "cmc_sharedcrop": Control(
        "cmc", "cmc", "CMC, L and ab from one crop",
        "CMC with the authors' view construction, L and ab of the same crop: the published CMC (one crop each) "
        "vs this differs only in where its two colour views come from"),
}


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_json(path: Path) -> dict[str, Any]:
    """A run's config or report: bounded and checked like every JSON cl-zoo reads; a failure is ``fail``."""
    try:
        data = read_bounded_json(path, max_bytes=MAX_REPORT_BYTES, what="run's JSON file")
    except ClZooError as exc:
        fail(str(exc))
    if not isinstance(data, dict):
        fail(f"{path} does not hold a JSON object")
    return data


def training_summary(metrics_csv: Path) -> dict[str, Any]:
    """Per-epoch rows -> train time and throughput. Times are summed over epochs, so a run resumed
    after an interruption reports its optimisation time, not the pause."""
    if not metrics_csv.is_file():
        fail(f"{metrics_csv} not found (copied there by scripts/train_cpu_tier.sh)")
    rows = list(csv.DictReader(metrics_csv.open(encoding="utf-8")))
    if not rows:
        fail(f"{metrics_csv} has no epochs")
    seconds = sum(float(r["epoch_time_s"]) for r in rows)
    # Throughput is the median epoch's: one epoch slowed by another job on the machine (bf16 on two
    # cores collapses when a third process competes) should not move the method's figure.
    return {
        "epochs": int(rows[-1]["epoch"]),
        "train_time_s": round(seconds, 1),
        "epoch_time_median_s": round(statistics.median(float(r["epoch_time_s"]) for r in rows), 2),
        "images_per_s": round(statistics.median(float(r["images_per_s"]) for r in rows), 1),
        "views_per_s": round(statistics.median(float(r["views_per_s"]) for r in rows), 1),
        "loss_first_epoch": round(float(rows[0]["loss"]), 4),
        "loss_last_epoch": round(float(rows[-1]["loss"]), 4),
    }


def check_report(path: Path, files: list[dict[str, str]] | None, random_init: bool = False) -> dict[str, Any]:
    """The report at ``path``, refused unless it is fp32 torch features on one of ``files`` (digest maps)."""
    report = read_report(path)
    features = report.get("features") or {}
    if (features.get("precision"), features.get("backend")) != ("fp32", "torch"):
        fail(f"{path}: features were computed with {features.get('backend')} {features.get('precision')}; "
             "the tier's numbers are fp32 torch (rerun scripts/evaluate_and_bundle.sh)")
    model = report.get("model") or {}
    if random_init != (model.get("source") == "random-init"):
        fail(f"{path}: {'not ' if random_init else ''}a random-init report")
    if files is not None and model.get("checkpoint_files_sha256") not in files:
        fail(f"{path} was not computed on the files being published (checkpoint digests differ)")
    return report


def top1(report: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in report["metrics"].items() if k.endswith("top1")}


def training_device(machine: str) -> str:
    """``cuda`` or ``cpu``: where a run trained, from its machine line (scripts/train_cpu_tier.sh writes a
    GPU's as ``NAME (CUDA x, torch y); host CPU ...``, a CPU's as cl-zoo's CPU description)."""
    return "cuda" if "(CUDA " in machine else "cpu"


def device_label(entry: dict[str, Any]) -> str:
    """``, GPU`` for a seed trained on one (scripts/gpu_tier_runs.sh), else nothing: records made before
    seeds carried a machine line all trained on CPUs, through scripts/tier_queue.sh."""
    return ", GPU" if entry.get("device") == "cuda" else ""


def scored_reports(bundle: Path, config: dict[str, Any], test_files: str) -> dict[str, dict]:
    """A seed's or control's float16 kNN and linear reports, refused unless computed on its own weights
    (fp32 torch features) and on the published seed's test images."""
    reports = {t: check_report(bundle / "reports" / f"{t}_fp16.json", [dict(config.get("files") or {})]) for t in ("knn", "linear")}
    if reports["knn"]["data"]["test"]["file_list_hash"] != test_files:
        fail(f"{bundle}: scored on other test images")
    return reports


def how_it_trained(bundle: Path, epochs: Any, required: bool) -> tuple[str | None, dict[str, Any] | None]:
    """A bundle's machine line and training summary (``logs/machine.txt``, ``run/metrics.csv``), the
    run refused unless it trained all of its recipe's ``epochs``. ``required``: a missing file fails
    (a control's); otherwise it is ``None`` (seeds published before bundles kept them)."""
    machine_file, metrics = bundle / "logs" / "machine.txt", bundle / "run" / "metrics.csv"
    machine = None
    if machine_file.is_file():
        machine = machine_file.read_text(encoding="utf-8").strip()
    elif required:
        fail(f"{machine_file} not found")
    summary = None
    if required or metrics.is_file():
        summary = training_summary(metrics)
        if summary["epochs"] != epochs:
            fail(f"{bundle}: trained {summary['epochs']} of its recipe's {epochs} epochs (rerun train_cpu_tier.sh to finish it)")
    return machine, summary


def other_seed(bundle: Path, method: str, recipe: dict[str, Any], test_files: str) -> tuple[dict[str, Any], dict[str, dict]]:
    """The float16 scores of the same recipe trained with another seed (an evaluated bundle), and where and
    how long it trained when the bundle says (its machine line and training log)."""
    config = read_json(bundle / "model" / "config.json")
    other = dict(config.get("recipe") or {})
    seed = other.get("seed")
    if other.get("method") != method or {**other, "seed": recipe.get("seed")} != recipe:
        fail(f"{bundle}: not the published recipe with another seed (method {other.get('method')}, seed {seed})")
    if seed == recipe.get("seed"):
        fail(f"{bundle}: trained with seed {seed}, the published weights' own seed")
    reports = scored_reports(bundle, config, test_files)
    summary: dict[str, Any] = {"seed": int(seed), "fp16_top1": {**top1(reports["knn"]), **top1(reports["linear"])}}
    machine, trained = how_it_trained(bundle, other.get("epochs"), required=False)
    if machine is not None:
        summary.update(machine=machine, device=training_device(machine))
    if config.get("training_precision"):
        summary["training_precision"] = config["training_precision"]
    if trained is not None:
        summary.update({k: trained[k] for k in ("train_time_s", "epoch_time_median_s", "views_per_s")})
    return summary, reports


# Issue 23's transfer protocol (scripts/tier_transfer.py): the one BCCD detection fine-tune every tier
# ResNet-18 and its random init get, sized for a 2-core CPU (about 10 min a run). Faster R-CNN R18-FPN
# with every layer trainable and BatchNorm on batch statistics (the MoCo protocol's choices); the
# images are BCCD's 640x480 at a 256 px short side, 128 sampled RoIs per image instead of 512 (the
# RoI head dominated the step time); lr 0.005 is the protocol's 0.02 x batch/16.
BCCD_SCHEDULE: dict[str, Any] = {
    "train_split": "trainval", "val_split": "test", "head": "fpn", "norm": "bn", "freeze_at": 0,
    "max_iter": 300, "steps": [200, 260], "warmup_iters": 50, "batch_size": 4, "lr": 0.005,
    "min_sizes_train": [256], "min_size_test": 256, "max_size": 352, "rois_per_image": 128,
    "proposals_test": 1000, "precision": "auto",
}
BCCD_TEST = "72 images, 945 boxes, 3 classes"
TRANSFER_NAME = re.compile(
    r"transfer_(?P<kind>bccd_detection|cifar10_linear)(?P<engine>_detectron2)?(?P<random>_random_init)?(?:_seed(?P<seed>\d+))?\.json")
# The detectron2 row (issue 23: "the exported weights train there too"): the same schedule through
# ``cl-zoo detect --engine detectron2``, whose R18 default is the bundled coco_R_50_FPN_1x.yaml at depth 18.
# detectron2 trains in float32 on a CPU and keeps its config's precise BN; the report lists every override.
DETECTRON2_CONFIG = "coco_R_50_FPN_1x.yaml"


def detectron2_overrides(seed: int) -> dict[str, str]:
    """The overrides a BCCD_SCHEDULE run hands detectron2 (as ``cl-zoo detect`` writes them)."""
    s = BCCD_SCHEDULE
    return {
        "MODEL.RESNETS.DEPTH": "18", "MODEL.RESNETS.RES2_OUT_CHANNELS": "64", "MODEL.BACKBONE.FREEZE_AT": str(s["freeze_at"]),
        "SOLVER.MAX_ITER": str(s["max_iter"]), "SOLVER.STEPS": "(" + ",".join(map(str, s["steps"])) + ")",
        "SOLVER.WARMUP_ITERS": str(s["warmup_iters"]), "SOLVER.IMS_PER_BATCH": str(s["batch_size"]),
        "SOLVER.BASE_LR": repr(s["lr"]), "INPUT.MIN_SIZE_TRAIN": "(" + ",".join(map(str, s["min_sizes_train"])) + ",)",
        "INPUT.MIN_SIZE_TEST": str(s["min_size_test"]), "INPUT.MAX_SIZE_TRAIN": str(s["max_size"]),
        "INPUT.MAX_SIZE_TEST": str(s["max_size"]), "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE": str(s["rois_per_image"]),
        "MODEL.RPN.POST_NMS_TOPK_TEST": str(s["proposals_test"]), "MODEL.ROI_HEADS.NUM_CLASSES": "3",
        "MODEL.DEVICE": "cpu", "SEED": str(seed),
    }
DETECTION_METRICS = ("AP", "AP50", "AP75", "voc_AP50")


def transfer_file(task: str, random_init: bool, seed: int = 0, engine: str = "torchvision") -> str:
    """``transfer_bccd_detection[_detectron2][_random_init]_seedS.json`` or ``transfer_cifar10_linear[_random_init].json``."""
    base = "transfer_bccd_detection" if task == "detection" else "transfer_cifar10_linear"
    base += "_detectron2" if engine == "detectron2" else ""
    base += "_random_init" if random_init else ""
    return f"{base}_seed{seed}.json" if task == "detection" else f"{base}.json"


def detection_report(path: Path, engine: str, scored_files: list[dict[str, str]], random_init: bool,
                     architecture: str) -> dict[str, Any]:
    """A ``cl-zoo detect --engine ENGINE`` report fine-tuned from these weights (or the seeded random
    init of this architecture); either engine's schedule is checked by its caller."""
    report = read_json(path)
    backbone = report.get("backbone") if isinstance(report.get("backbone"), dict) else {}
    if report.get("task") != "detection" or report.get("engine") != engine:
        fail(f"{path}: not a cl-zoo detect --engine {engine} report")
    if random_init != (backbone.get("source") == "random-init"):
        fail(f"{path}: {'not ' if random_init else ''}a random-init backbone")
    if random_init and backbone.get("architecture") != architecture:
        fail(f"{path}: a random init of {backbone.get('architecture')}, this folder is {architecture}")
    if not random_init and backbone.get("checkpoint_files_sha256") not in scored_files:
        fail(f"{path} was not fine-tuned from the files being published (checkpoint digests differ)")
    return report


def check_detectron2_transfer(path: Path, scored_files: list[dict[str, str]], seed: int, random_init: bool,
                              architecture: str) -> dict[str, Any]:
    """A ``cl-zoo detect --engine detectron2`` BCCD report, refused unless it is these weights (or the
    seeded random init of this architecture) with the schedule's overrides (``detectron2_overrides``)
    and the test split evaluated."""
    report = detection_report(path, "detectron2", scored_files, random_init, architecture)
    overrides = report.get("overrides") if isinstance(report.get("overrides"), dict) else {}
    moved = sorted(k for k, v in detectron2_overrides(seed).items() if overrides.get(k) != v)
    if moved or report.get("config_file") != DETECTRON2_CONFIG:
        fail(f"{path}: not the documented BCCD schedule on {DETECTRON2_CONFIG} (differs in {moved or 'config_file'})")
    val = report.get("val_data")
    if not (isinstance(val, list) and len(val) == 1 and str(val[0]).startswith("voc: ") and str(val[0]).endswith(" test")):
        fail(f"{path}: not evaluated on BCCD's test split alone (val_data {val!r})")
    metrics = report.get("metrics") if isinstance(report.get("metrics"), dict) else {}
    if any(not isinstance(metrics.get(k), (int, float)) for k in ("voc_AP", "voc_AP50", "voc_AP75")):
        fail(f"{path}: no VOC07 metrics (voc_AP, voc_AP50, voc_AP75)")
    return report


def check_transfer(path: Path, scored_files: list[dict[str, str]], architecture: str) -> tuple[str, bool, int, dict[str, Any]]:
    """A transfer report of this folder: (task, random init?, seed, report), refused unless it was run
    on these weights (or a random init of this architecture) with the documented protocol. ``task`` is
    ``detection``, ``detection_detectron2`` or ``cifar10``."""
    match = TRANSFER_NAME.fullmatch(path.name)
    if not match or (match["kind"] == "bccd_detection") != (match["seed"] is not None) or (
            match["engine"] and match["kind"] != "bccd_detection"):
        fail(f"{path.name}: not a transfer report name this script knows "
             "(transfer_bccd_detection[_detectron2][_random_init]_seedS.json, transfer_cifar10_linear[_random_init].json)")
    if match["engine"]:
        seed, random_init = int(match["seed"]), bool(match["random"])
        report = check_detectron2_transfer(path, scored_files, seed, random_init, architecture)
        return "detection_detectron2", random_init, seed, report
    task = "detection" if match["kind"] == "bccd_detection" else "cifar10"
    random_init, seed = bool(match["random"]), int(match["seed"] or 0)
    if task == "cifar10":
        report = check_report(path, None if random_init else scored_files, random_init=random_init)
        if report["data"]["name"] != "cifar10" or report.get("protocol") != "fast":
            fail(f"{path}: not the fast linear probe on CIFAR-10")
        if report["model"].get("architecture") != architecture:
            fail(f"{path}: measured on {report['model'].get('architecture')}, this folder is {architecture}")
        return task, random_init, 0, report
    report = detection_report(path, "torchvision", scored_files, random_init, architecture)
    config = report.get("config") if isinstance(report.get("config"), dict) else {}
    expected = {k: v for k, v in BCCD_SCHEDULE.items() if k not in ("train_split", "val_split")}
    moved = {k: (config.get(k), v) for k, v in expected.items() if config.get(k) != v}
    if moved or config.get("seed") != seed or config.get("val_limit") is not None:
        fail(f"{path}: not the documented BCCD schedule (differs in {sorted(moved) or 'seed/val_limit'})")
    if not str(report.get("val_data") or "").startswith(BCCD_TEST) or report.get("iterations") != BCCD_SCHEDULE["max_iter"]:
        fail(f"{path}: not evaluated on BCCD's test split ({BCCD_TEST}) after the full schedule")
    return task, random_init, seed, report


def transfer_summary(reports: list[tuple[str, bool, int, dict[str, Any]]]) -> dict[str, Any]:
    """``cpu_tier.transfer``: per-seed detection metrics and the CIFAR-10 probe, ours and random init's."""
    summary: dict[str, Any] = {}
    for task, random_init, seed, report in sorted(reports, key=lambda r: (r[0], r[1], r[2])):
        key = {"detection": "bccd_detection", "detection_detectron2": "bccd_detection_detectron2",
               "cifar10": "cifar10_linear"}[task] + ("_random_init" if random_init else "")
        if task == "cifar10":
            summary[key] = top1(report)
            continue
        if task == "detection_detectron2":  # detectron2's VOC evaluator: VOC07 metrics only, no COCO AP
            entry = summary.setdefault(key, {"seeds": [], "voc_AP": [], "voc_AP50": [], "voc_AP75": [], "train_seconds": []})
            entry["seeds"].append(seed)
            for metric in ("voc_AP", "voc_AP50", "voc_AP75"):
                entry[metric].append(report["metrics"][metric])
            entry["train_seconds"].append(report["train_seconds"])
            continue
        entry = summary.setdefault(key, {"seeds": [], **{m: [] for m in DETECTION_METRICS}, "train_seconds": [], "precision": []})
        entry["seeds"].append(seed)
        for metric in DETECTION_METRICS:
            entry[metric].append(report["metrics"][metric])
        entry["train_seconds"].append(report["train_seconds"])
        entry["precision"].append(report["precision"])
    return summary


def transfer_section(transfer: dict[str, Any], architecture: str) -> str:
    """The card's transfer results: CIFAR-10 probe and BCCD detection, ours beside random init."""
    def spread(values: list[float] | None) -> str:
        if not values:
            return "-"
        mean = statistics.mean(values)
        if len(values) < 2:
            return f"{mean:.2f} (1 seed)"
        return f"{mean:.2f} ± {statistics.stdev(values):.2f} ({len(values)} seeds)"

    s = BCCD_SCHEDULE
    rows = []
    for label, suffix in (("these weights", ""), (f"{architecture}, random init", "_random_init")):
        probe = (transfer.get(f"cifar10_linear{suffix}") or {}).get("linear_fast_top1")
        det = transfer.get(f"bccd_detection{suffix}") or {}
        rows.append(f"| {label} | {'-' if probe is None else f'{100 * probe:.2f}%'} | {spread(det.get('AP'))} | "
                    f"{spread(det.get('voc_AP50'))} |")
    d2 = transfer.get("bccd_detection_detectron2") or {}
    if d2:
        rows.insert(1, f"| these weights, detectron2 engine | - | - (VOC evaluator) | {spread(d2.get('voc_AP50'))} |")
    d2_random = transfer.get("bccd_detection_detectron2_random_init") or {}
    if d2_random:
        rows.append(f"| {architecture}, random init, detectron2 engine | - | - (VOC evaluator) | {spread(d2_random.get('voc_AP50'))} |")
    detection = (
        f"BCCD detection (`python scripts/tier_transfer.py detection METHOD --seed S`): `cl-zoo detect --engine torchvision`, "
        f"Faster R-CNN {architecture}-FPN, every layer trainable, BatchNorm on batch statistics, trained on BCCD trainval "
        f"(292 images, 3 classes) for {s['max_iter']} iterations of {s['batch_size']} images (lr {s['lr']}, "
        f"{s['warmup_iters']} warm-up iterations, x0.1 at {' and '.join(map(str, s['steps']))}) at a {s['min_sizes_train'][0]} px "
        f"short side ({s['rois_per_image']} RoIs per image), evaluated on its test split (72 images) with COCO AP and "
        "VOC07 AP50; mean ± sample sd over fine-tune seeds. A schedule sized for a 2-core CPU: read it as a check that the "
        "weights transfer, not as the papers' VOC/COCO protocol." + (
            f" The detectron2 row: these weights through `cl-zoo export detectron2` and `cl-zoo detect --engine detectron2` "
            f"(`python scripts/tier_transfer.py detection METHOD --engine detectron2`): the bundled {DETECTRON2_CONFIG} at "
            "depth 18 with the same schedule, float32, its config's precise BN, scored by detectron2's PASCAL VOC07 evaluator."
            if d2 else "")
        if architecture == "resnet18" else
        "No BCCD detection: this backbone is CMC's L/ab pair, which is not a ResNet the Faster R-CNN engines can hold."
    )
    return (
        "CIFAR-10 linear probe (`python scripts/tier_transfer.py cifar10 METHOD`): `cl-zoo linear-eval --protocol fast` "
        "on CIFAR-10's 50,000 train / 10,000 test images (the JPEG copy; slightly below the original PNG data) with this "
        "model's own preprocessing and float32 PyTorch features.\n\n"
        f"{detection}\n\n"
        "| backbone | CIFAR-10 linear (fast) top-1 | BCCD AP | BCCD VOC07 AP50 |\n|---|---|---|---|\n" + "\n".join(rows)
        + "\n\nThe reports are in this folder (`transfer_*.json`)."
    )


def recipe_changes(published: dict[str, Any], other: dict[str, Any], prefix: str = "") -> dict[str, list[Any]]:
    """``{"method_args.temperature": [0.5, 0.1]}``: every leaf where ``other`` differs, seed aside."""
    changes: dict[str, list[Any]] = {}
    for key in sorted(set(published) | set(other)):
        a, b = published.get(key), other.get(key)
        if prefix == "" and key == "seed":
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            changes.update(recipe_changes(a, b, f"{prefix}{key}."))
        elif a != b:
            changes[f"{prefix}{key}"] = [a, b]
    return changes


def control_run(bundle: Path, method: str, recipe: dict[str, Any], test_files: str) -> tuple[dict[str, Any], dict[str, dict]]:
    """A control's evaluated bundle: which committed control recipe it is, what it changed, its scores."""
    from cl_zoo.train.recipe import Recipe

    config = read_json(bundle / "model" / "config.json")
    trained = dict(config.get("recipe") or {})
    name = None
    for candidate, control in CONTROLS.items():
        if control.method != method:
            continue
        committed = Recipe.load(REPO / control.recipe_path(candidate)).to_dict()
        if {**trained, "seed": committed.get("seed")} == committed:
            name = candidate
    if name is None:
        known = ", ".join(n for n, c in CONTROLS.items() if c.method == method) or "none"
        fail(f"{bundle}: its recipe is none of {method}'s control recipes ({known}) with another seed")
    changes = recipe_changes(recipe, trained)
    if not changes:
        fail(f"{bundle}: the control {name} trained the published recipe itself")
    reports = scored_reports(bundle, config, test_files)
    machine, summary = how_it_trained(bundle, trained.get("epochs"), required=True)
    return {
        "name": name,
        "recipe": CONTROLS[name].recipe_path(name),
        "seed": int(trained.get("seed", 0)),
        "changes": changes,
        "machine": machine,
        "device": training_device(machine),
        "training_precision": config.get("training_precision"),
        **{k: summary[k] for k in ("epochs", "train_time_s", "epoch_time_median_s", "views_per_s")},
        "fp16_top1": {**top1(reports["knn"]), **top1(reports["linear"])},
    }, reports


def control_files(entry: dict[str, Any]) -> dict[str, str]:
    """The files a control seed leaves in the card folder: its two reports and its training log."""
    stem = f"{entry['name']}_seed{entry['seed']}"
    return {"knn": f"eval_knn_{stem}.json", "linear": f"eval_linear_{stem}.json", "log": f"training_log_{stem}.csv"}


def controls_section(controls: list[dict[str, Any]]) -> str:
    """The card's account of its control runs: what each changed and what each seed scored."""
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.2f}%"

    lines = []
    for name in dict.fromkeys(c["name"] for c in controls):
        seeds = [c for c in controls if c["name"] == name]
        control = CONTROLS[name]
        change = "; ".join(f"`{k}` {a} → {b}" for k, (a, b) in seeds[0]["changes"].items())
        lines += [
            f"**{control.label}** (`{seeds[0]['recipe']}`): {control.question}. Its recipe differs from this card's in "
            f"{change}; everything else, data and evaluation included, is the same. Weights not published; each seed's "
            "reports and training log are in this folder (`eval_*_" + name + "_seed*.json`, `training_log_" + name + "_seed*.csv`).",
            "",
            "| training seed | kNN k=20 top-1 | kNN k=200 top-1 | linear (fast) top-1 | train time | views/s |",
            "|---|---|---|---|---|---|",
            *(f"| {c['seed']}{' (GPU)' if device_label(c) else ''} | {pct(c['fp16_top1'].get('knn_k20_top1'))} | {pct(c['fp16_top1'].get('knn_k200_top1'))} | "
              f"{pct(c['fp16_top1'].get('linear_fast_top1'))} | {c['train_time_s'] / 60:.1f} min ({c['epochs']} epochs) | "
              f"{c['views_per_s']:.0f} |" for c in sorted(seeds, key=lambda c: c["seed"])),
            "",
        ]
    return "\n".join(lines).strip()


def evaluation_details(
    name: str, fp16: dict[str, dict], fp32: dict[str, dict], rand: dict[str, dict], tier: dict,
    others: dict[int, dict[str, dict]] | None = None,
) -> str:
    def pct(report: dict | None, key: str) -> str:
        value = (report or {}).get("metrics", {}).get(key)
        return "-" if value is None else f"{100 * value:.2f}%"

    trained_on = {o["seed"]: o["machine"].split(";")[0] for o in tier.get("other_seeds") or [] if device_label(o)}
    rows = [
        (f"these float16 weights (training seed {tier.get('seed', 0)})", fp16),
        ("the float32 weights they were cast from", fp32),
        *((f"the same recipe with training seed {seed} (float16; weights not published"
           f"{'; trained on a GPU: ' + trained_on[seed] if seed in trained_on else ''})", r) for seed, r in sorted((others or {}).items())),
        (f"same architecture, random init (seed {rand['knn'].get('seed', 0)})", rand),
    ]
    table = "| features | kNN k=20 top-1 | kNN k=200 top-1 | linear (fast) top-1 |\n|---|---|---|---|\n" + "\n".join(
        f"| {label} | {pct(r.get('knn'), 'knn_k20_top1')} | {pct(r.get('knn'), 'knn_k200_top1')} | "
        f"{pct(r.get('linear'), 'linear_fast_top1')} |"
        for label, r in rows
    )
    return (
        "Measured with `cl-zoo knn` (cosine, weighted vote exp(sim/T), T=0.1) and `cl-zoo linear-eval --protocol fast` "
        "on Imagenette train (memory / probe training set, 9,469 images) and Imagenette val (3,925 images), 128 px copy, "
        "centre-cropped at this model's 64 px preprocessing, with float32 PyTorch features (`--precision fp32 --backend "
        "torch`, so another machine reproduces them; bf16 features move a near-tied kNN vote by about 0.1 point). "
        "The reports are in this folder (`eval_*.json`).\n\n"
        f"{table}\n\n"
        f"Reproduce: `bash scripts/train_cpu_tier.sh {tier['method']}` from a cl-zoo checkout with the Imagenette "
        "archives in `../shared/datasets` (or `DATA_DIR=...`): it runs `cl-zoo pretrain --recipe "
        f"recipes/{tier['method']}_imagenette64_cpu_tier.yaml` and then `scripts/evaluate_and_bundle.sh`; then "
        f"`python scripts/bundle_cpu_tier.py {tier['method']} --random-init R/`, where `R/` holds the `cl-zoo knn` and "
        "`cl-zoo linear-eval` reports of the same architecture with `--random-init`."
    )


# What a method's tier runs were trained with that cl-zoo has changed since (the card says so, because a
# rerun of the recipe with today's cl-zoo is then not the same computation).
TRAINING_NOTES = {
    "cmc": "Its seeds and the shared-crop control's trained with bf16 autocast running the RGB -> XYZ product of "
           "the Lab conversion in bf16 (a off by up to 1.2 of +-128); cl-zoo converts in float32 since, in "
           "training as in inference (cl_zoo.models.cmc_dual.float32_lab), so a rerun today is not bit-comparable.",
}


# A run whose config.json lacks training_head_precision trained before the projection head left
# autocast (cl_zoo.methods.heads, 2026-12-02): under bf16/fp16 its head's output was rounded.
HEAD_UNDER_AUTOCAST_NOTE = (
    "It trained with the projection head under {precision} autocast too, so its loss compared {precision}-rounded "
    "embeddings; cl-zoo runs the head in float32 since 2026-12-02 (cl_zoo.methods.heads: in issue 39's CIFAR-10 "
    "A/B the rounding cost DCL 0.9 kNN points at 16 epochs and 2.2 at 64), so a rerun today is not the same computation."
)


def head_under_autocast(config: dict[str, Any]) -> bool:
    """Whether this run's head ran in bf16/fp16: trained in reduced precision before the head left autocast."""
    return config.get("training_precision") in ("bf16", "fp16") and not config.get("training_head_precision")


def cpu_tier_note(method: str, tier: dict[str, Any], head_autocast: bool = False) -> str:
    minutes = tier["train_time_s"] / 60
    n_seeds = 1 + len(tier.get("other_seeds") or [])
    on_gpu = [str(o["seed"]) for o in tier.get("other_seeds") or [] if device_label(o)]
    gpu = f"; seed{'s' if len(on_gpu) > 1 else ''} {' and '.join(on_gpu)} trained with the same recipe on a GPU" if on_gpu else ""
    seeds = "One seed" if n_seeds == 1 else f"{n_seeds} seeds (the card's other seeds are scored, not published{gpu})"
    return (
        f"**Trained on a CPU**, not a GPU: one of the eight checkpoints of cl-zoo's CPU tier, where SimCLR, MoCo v2, DCL, "
        "DCLW, SiMo, JCL, CMC and CACR are trained with one protocol (Imagenette train, 64 px crops, the MoCo v2 "
        "augmentation family, batch 256, SGD lr 0.06 with cosine decay, the same epochs) and each method's own "
        "hyper-parameters from its paper's small-scale settings, so the methods can be compared at a budget anyone can "
        f"re-run on a laptop. Machine: {tier['machine']}; training precision {tier['training_precision']}. "
        f"{tier['epochs']} epochs took {minutes:.1f} min of wall time, summed over the epochs, including any epoch slowed or paused by other work on the machine (median epoch {tier['epoch_time_median_s']:.0f} s: "
        f"{tier['images_per_s']:.0f} images/s, {tier['views_per_s']:.0f} views/s). {seeds} at 64 px on 10 classes is not the paper's setting: read the "
        "numbers as this budget's, not the method's ceiling." + (f" {TRAINING_NOTES[method]}" if method in TRAINING_NOTES else "")
        + (" " + HEAD_UNDER_AUTOCAST_NOTE.format(precision=tier["training_precision"]) if head_autocast else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("method", choices=METHODS)
    parser.add_argument("--bundle", type=Path, help="train_cpu_tier.sh's output for the method (default runs/cpu_tier_bundles/NAME)")
    parser.add_argument("--random-init", type=Path, required=True, help="folder with knn.json [and linear.json] of the random-init baseline")
    parser.add_argument("--out", type=Path, default=REPO / "model_cards", help="where the NAME folder is written (default model_cards/)")
    parser.add_argument("--run", type=Path, help="the training run's folder, for bundles whose config lacks training_data/precision")
    parser.add_argument("--machine", help="machine line for the card (default: the bundle's logs/machine.txt)")
    parser.add_argument("--other-seed", type=Path, action="append", default=[], metavar="DIR",
                        help="bundle of the same recipe trained with another --seed (scores shown, weights not published)")
    parser.add_argument("--control", type=Path, action="append", default=[], metavar="DIR",
                        help="bundle of one of the method's control recipes (CONTROLS), any seed (scores shown, weights not published)")
    parser.add_argument("--keep-shards", action="store_true",
                        help="keep sharded weight files as they are instead of writing one model.safetensors")
    args = parser.parse_args(argv)

    name = f"{args.method}_resnet18.{TAG}"
    bundle = args.bundle or REPO / "runs" / "cpu_tier_bundles" / name
    src, reports = bundle / "model", bundle / "reports"
    config = upgrade_config(read_json(src / "config.json"))
    if args.run is not None:
        # Bundles made before evaluate_and_bundle.sh carried these over take them from the run itself.
        run_config = read_json(args.run / "model" / "config.json")
        for key in ("training_data", "training_precision"):
            config.setdefault(key, run_config.get(key))
    for key in ("training_data", "training_precision"):
        if not config.get(key):
            fail(f"{src}/config.json does not record {key}: pass --run RUN (the training run's folder)")
    # The card is published: name the archive, not where it sat on the training machine.
    local_dir = str(Path(config["training_data"]["source"]).parent) + "/"
    config["training_data"] = {**config["training_data"], "source": Path(config["training_data"]["source"]).name}
    files = dict(config.get("files") or {})
    if not files:
        fail(f"{src}/config.json lists no weight files")
    # The weights the reports may have been computed on: these files, or the shards they were re-laid out from.
    scored_files = [files] + ([config["files_before_relayout"]] if config.get("files_before_relayout") else [])

    fp32 = {t: check_report(reports / f"{t}.json", None) for t in ("knn", "linear")}
    fp16 = {t: check_report(reports / f"{t}_fp16.json", scored_files) for t in ("knn", "linear")}
    for task in ("knn", "linear"):
        for row in compare_reports(fp32[task], fp16[task], TOLERANCE):
            if not row["ok"]:
                fail(f"float16 weights moved {row['metric']} by {100 * row['diff']:+.2f} pt (> 0.1 pt)")
    rand = {"knn": check_report(args.random_init / "knn.json", None, random_init=True)}
    if (args.random_init / "linear.json").is_file():
        rand["linear"] = check_report(args.random_init / "linear.json", None, random_init=True)
    for report in rand.values():
        if report["model"].get("architecture") != config.get("architecture"):
            fail(f"random-init baseline is {report['model'].get('architecture')}, this model is {config.get('architecture')}")
        if report["data"]["test"]["file_list_hash"] != fp16["knn"]["data"]["test"]["file_list_hash"]:
            fail("random-init baseline was measured on other test images")

    machine_file = bundle / "logs" / "machine.txt"
    machine = args.machine or (machine_file.read_text(encoding="utf-8").strip() if machine_file.is_file() else None)
    if not machine:
        fail(f"no machine line: pass --machine or write {machine_file}")
    others = [other_seed(b, args.method, dict(config.get("recipe") or {}), fp16["knn"]["data"]["test"]["file_list_hash"])
              for b in args.other_seed]
    tier = {
        "method": args.method,
        "recipe": f"recipes/{args.method}_imagenette64_cpu_tier.yaml",
        "seed": int((config.get("recipe") or {}).get("seed", 0)),
        "machine": machine,
        "training_precision": config["training_precision"],
        **training_summary(bundle / "run" / "metrics.csv"),
        "fp32_top1": {**top1(fp32["knn"]), **top1(fp32["linear"])},
        "fp16_top1": {**top1(fp16["knn"]), **top1(fp16["linear"])},
        "random_init_top1": {k: v for r in rand.values() for k, v in top1(r).items()},
    }
    if others:
        tier["other_seeds"] = sorted((summary for summary, _ in others), key=lambda o: o["seed"])
    controls = [control_run(b, args.method, dict(config.get("recipe") or {}), fp16["knn"]["data"]["test"]["file_list_hash"])
                for b in args.control]
    seen = [(c["name"], c["seed"]) for c, _ in controls]
    if len(set(seen)) != len(seen):
        fail(f"a control seed is given twice: {sorted(seen)}")
    transfer_paths = sorted(src.glob("transfer_*.json"))
    transfers = [check_transfer(path, scored_files, config["architecture"]) for path in transfer_paths]
    if transfers:
        tier["transfer"] = transfer_summary(transfers)
    if controls:
        tier["controls"] = sorted((c for c, _ in controls), key=lambda c: (list(CONTROLS).index(c["name"]), c["seed"]))
    gap = tier["fp16_top1"]["knn_k200_top1"] - tier["random_init_top1"]["knn_k200_top1"]
    if gap < 0.15:
        fail(f"kNN k=200 is only {100 * gap:.1f} points above random init (the tier requires 15): a method that "
             "does not learn is a bug to find, not a row to publish")

    paper = PAPERS.get(args.method, ("", ""))[0]
    zoo_cfg = dict(config[ZOO_CFG_KEY])
    zoo_cfg.update(hf_hub_id=zoo_repo_id(name), bundled=name, paper=paper or None, dataset="imagenette",
                   notes=cpu_tier_note(args.method, tier, head_under_autocast(config)))
    config["pretrained_cfg"]["license"] = "apache-2.0"
    config.update({"model_name": name, ZOO_CFG_KEY: zoo_cfg, "cpu_tier": tier})
    dest = args.out / name
    if (dest / "config.json").is_file():
        # A near-duplicate calibration (scripts/calibrate_dedup.py --write) measured on these very
        # weights stays; on other weights it would be wrong, so it is dropped.
        previous = read_json(dest / "config.json")
        if previous.get("files") == files and "dedup" in previous:
            config["dedup"] = previous["dedup"]

    tmp = args.out / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for file in [*files, "model.safetensors.index.json", "curves.png"]:
        if (src / file).is_file():
            shutil.copy2(src / file, tmp / file)
    if (tmp / INDEX_NAME).is_file() and not args.keep_shards:
        config["files"] = consolidate_weights(tmp)
        config["files_before_relayout"] = files
    shutil.copy2(bundle / "run" / "metrics.csv", tmp / "training_log.csv")  # per-epoch loss, lr, throughput, monitor
    for task in ("knn", "linear"):
        shutil.copy2(reports / f"{task}_fp16.json", tmp / f"eval_{task}.json")
        shutil.copy2(reports / f"{task}.json", tmp / f"eval_{task}_fp32.json")
        if task in rand:
            shutil.copy2(args.random_init / f"{task}.json", tmp / f"eval_{task}_random_init.json")
        for b, (summary, _) in zip(args.other_seed, others):
            shutil.copy2(b / "reports" / f"{task}_fp16.json", tmp / f"eval_{task}_seed{summary['seed']}.json")
        for b, (entry, _) in zip(args.control, controls):
            shutil.copy2(b / "reports" / f"{task}_fp16.json", tmp / control_files(entry)[task])
    for b, (summary, _) in zip(args.other_seed, others):
        if (b / "run" / "metrics.csv").is_file():
            shutil.copy2(b / "run" / "metrics.csv", tmp / f"training_log_seed{summary['seed']}.csv")
    for b, (entry, _) in zip(args.control, controls):
        shutil.copy2(b / "run" / "metrics.csv", tmp / control_files(entry)["log"])
    for path in transfer_paths:
        shutil.copy2(path, tmp / path.name)
    atomic_write_text(tmp / "config.json", json.dumps(config, indent=2) + "\n")
    card = src / "README.md"
    sections = extra_sections(card.read_text(encoding="utf-8")) if card.is_file() else {}
    sections = {k: v.replace(local_dir, "") if local_dir != "/" else v for k, v in sections.items()}
    sections["Evaluation details"] = evaluation_details(name, fp16, fp32, rand, tier, {o["seed"]: r for o, r in others})
    sections.pop("Near-duplicate threshold", None)
    sections.pop("Controls", None)
    if controls:
        sections["Controls"] = controls_section(tier["controls"])
    sections.pop("Transfer", None)
    if transfers:
        sections["Transfer"] = transfer_section(tier["transfer"], config["architecture"])
    if "dedup" in config:
        sections["Near-duplicate threshold"] = dedup_card_section(config["dedup"], name)
    atomic_write_text(tmp / "README.md", render_card(config, sections, folder=dest))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)

    print(f"wrote {dest}: kNN k=20 {100 * tier['fp16_top1']['knn_k20_top1']:.2f}%, k=200 "
          f"{100 * tier['fp16_top1']['knn_k200_top1']:.2f}% ({100 * gap:+.1f} pt vs random init), linear "
          f"{100 * tier['fp16_top1']['linear_fast_top1']:.2f}%; {tier['train_time_s'] / 60:.1f} min, {tier['views_per_s']:.0f} views/s")
    if registered_name_of(config) != name:
        print("\nnot registered yet: add this to cl_zoo/models/pretrained.py, then run the script again for the card\n")
        print(f"_cpu_tier({args.method!r}, {config['architecture']!r}, {json.dumps(config['files'], indent=4)}, {{")
        for key in ("imagenette_knn_k20_top1", "imagenette_knn_k200_top1", "imagenette_linear_fast_top1"):
            print(f"    {key!r}: {round(config['metrics'][key], 4)},")
        print("})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
