"""``cl-zoo detect --engine detectron2``: every option of ``detect`` mapped onto a detectron2 run.

The run is the bundled ``train_net.py`` (see :mod:`cl_zoo.bundled`) on one of the protocol configs,
given detectron2 config overrides. Each ``detect`` option either becomes such an override
(``--max-iter`` -> ``SOLVER.MAX_ITER``, ``--device`` -> ``MODEL.DEVICE``, ...) or is refused for this
engine with one line; none is dropped silently. ``--data``/``--val-data`` folders are registered
inside ``train_net.py`` under names of their own (``--voc``/``--coco``), with
``MODEL.ROI_HEADS.NUM_CLASSES`` set to their class count, and evaluated by the matching evaluator.

Every path in the command is absolute and the process runs in the caller's directory, so a relative
``--out`` lands where the user ran, and detectron2's builtin datasets are looked up under
``$DETECTRON2_DATASETS`` (default ``./datasets`` there), not inside the installed package.

After a run, :func:`write_detectron2_report` turns ``train_net.py``'s ``eval_results.json`` into a
``report.json`` with the same keys as the torchvision engine's (``metrics`` uses its names: COCO's
``AP``..``APl``, and ``voc_AP``/``voc_AP50``/``voc_AP75`` for detectron2's VOC07 evaluator, which
is the metric ``cl_zoo.detection.evaluate`` reproduces), plus every override the run was given, so a
figure from either engine is read and checked the same way.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cl_zoo.bundled import bundled_folder
from cl_zoo.detection.detectron2_datasets import Detectron2Dataset, describe_dataset, shared_classes
from cl_zoo.detection.limits import check_detection_values
from cl_zoo.detection.presets import Preset, get_preset
from cl_zoo.errors import ClZooError
from cl_zoo.fileio import atomic_write_json, read_bounded_json

# Names the user's folders are registered under inside train_net.py (never a builtin voc_*/coco_*).
TRAIN_NAME = "cl_zoo_train_{}"
VAL_NAME = "cl_zoo_val"
WEIGHTS_FILE = "model.pkl"
RESULTS_FILE = "eval_results.json"  # written by train_net.py's Trainer.test
REPORT_FILE = "report.json"
MAX_RESULTS_BYTES = 4 << 20  # COCO's per-class APs for 1,203 LVIS classes are ~60 KB


@dataclass
class Detectron2Options:
    """The ``detect`` options, as given (``None``: not given, the config's value stands)."""

    preset: str | None = None
    data: tuple[str, ...] = ()
    val_data: str | None = None
    train_split: str | None = None
    val_split: str | None = None
    head: str | None = None
    norm: str = "bn"
    freeze_at: int = 0
    max_iter: int | None = None
    steps: tuple[int, ...] | None = None
    warmup_iters: int | None = None
    batch_size: int = 16
    lr: float | None = None
    min_sizes_train: tuple[int, ...] | None = None
    min_size_test: int | None = None
    max_size: int = 1333
    rois_per_image: int = 512
    proposals_test: int = 1000
    val_limit: int | None = None
    checkpoint_period: int = 2000
    workers: int = 4
    seed: int = 0
    device: str | None = None
    num_gpus: int | None = None
    resume: bool = False
    extra: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Detectron2Run:
    """A fully resolved run: what :meth:`command` launches."""

    train_net: Path
    config: Path
    output: Path
    num_gpus: int
    resume: bool
    datasets: tuple[Detectron2Dataset, ...]
    overrides: tuple[tuple[str, str], ...]  # (KEY, VALUE) in the order given to detectron2
    extra: tuple[str, ...] = ()

    @property
    def weights(self) -> Path:
        return self.output / WEIGHTS_FILE

    def command(self, python: str = sys.executable) -> list[str]:
        cmd = [python, str(self.train_net), "--config-file", str(self.config), "--num-gpus", str(self.num_gpus)]
        if self.resume:
            cmd.append("--resume")
        for dataset in self.datasets:
            cmd += dataset.arguments()
        voc = [d for d in self.datasets if d.layout == "voc"]
        if voc:
            cmd += ["--voc-classes", ",".join(voc[0].classes)]
        for key, value in self.overrides:
            cmd += [key, value]
        return cmd + list(self.extra)


def _tuple(values: tuple[int, ...] | tuple[str, ...]) -> str:
    """A tuple literal for yacs, which keeps the config's tuple type: ``(1,2)``, ``("a",)``, ``()``.

    Strings take double quotes (JSON's escaping is valid Python) so the printed command needs no
    nested shell quoting.
    """
    items = [json.dumps(v) if isinstance(v, str) else str(int(v)) for v in values]
    return "(" + ",".join(items) + ("," if len(items) == 1 else "") + ")"


def _device(requested: str | None) -> str:
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested != "cpu" and not requested.startswith("cuda"):
        raise ClZooError(f"--device {requested}: detectron2 runs on cpu or cuda[:N]")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ClZooError(f"--device {requested}: CUDA is not available here; use --device cpu")
    return requested


def _num_gpus(requested: int | None, device: str, batch_size: int) -> int:
    import torch

    if device == "cpu":
        if requested not in (None, 1):
            raise ClZooError(f"--num-gpus {requested} needs CUDA; with --device cpu detectron2 runs one process")
        return 1
    count = requested if requested is not None else (1 if ":" in device else max(1, torch.cuda.device_count()))
    if count < 1:
        raise ClZooError(f"--num-gpus must be at least 1, got {count}")
    if ":" in device and count > 1:
        raise ClZooError(f"--device {device} picks one GPU; use --device cuda with --num-gpus {count}")
    if batch_size % count:
        raise ClZooError(f"--batch-size {batch_size} must be divisible by --num-gpus {count} (images per GPU)")
    return count


def _refuse_unmappable(o: Detectron2Options, preset: Preset) -> None:
    if o.val_limit is not None:
        raise ClZooError("--val-limit is not available with --engine detectron2 (its evaluators score the "
                         "whole split); use a smaller --val-split or --engine torchvision")
    if o.head is not None and o.head != preset.head:
        other = "coco-fpn-1x" if o.head == "fpn" else "voc-c4, coco-c4-1x or coco-c4-2x"
        raise ClZooError(f"--head {o.head} does not match --config's {preset.head.upper()} model; "
                         f"with --engine detectron2 choose --config {other}")
    if o.val_data is not None and (o.val_split or "").lower() == "none":
        raise ClZooError("--val-data with --val-split none: nothing would be evaluated; drop one of them")
    if not o.data:
        if o.val_data is not None or o.train_split is not None:
            given = "--val-data" if o.val_data is not None else "--train-split"
            raise ClZooError(f"{given} needs --data with --engine detectron2 (without --data the config's "
                             "builtin datasets under $DETECTRON2_DATASETS are used)")
        if o.val_split is not None and o.val_split.lower() != "none":
            raise ClZooError("--val-split needs --data with --engine detectron2 (only 'none' applies to the "
                             "config's builtin datasets)")
    check_detection_values({f.name: getattr(o, f.name) for f in fields(o)}, as_flags=True)
    for flag, value in (("--max-iter", o.max_iter), ("--batch-size", o.batch_size),
                        ("--checkpoint-period", o.checkpoint_period), ("--rois-per-image", o.rois_per_image),
                        ("--proposals-test", o.proposals_test), ("--max-size", o.max_size),
                        ("--min-size-test", o.min_size_test)):
        if value is not None and value < 1:
            raise ClZooError(f"{flag} must be positive, got {value}")
    for flag, value in (("--workers", o.workers), ("--freeze-at", o.freeze_at), ("--warmup-iters", o.warmup_iters)):
        if value is not None and value < 0:
            raise ClZooError(f"{flag} must be >= 0, got {value}")
    if o.lr is not None and not o.lr > 0:
        raise ClZooError(f"--lr must be positive, got {o.lr}")


def _datasets(o: Detectron2Options, preset: Preset) -> tuple[list[Detectron2Dataset], list[Detectron2Dataset]]:
    if not o.data:
        return [], []
    # A VOC folder keeps VOC's splits whichever config trains on it (a ResNet-18 gets the FPN config).
    voc = (Path(o.data[0]).expanduser() / "Annotations").is_dir()
    train_split = o.train_split or ("trainval" if voc else preset.train_split)
    val_split = o.val_split or ("test" if voc else preset.val_split)
    train = [describe_dataset(root, train_split, TRAIN_NAME.format(i)) for i, root in enumerate(o.data)]
    val = [] if val_split.lower() == "none" else [
        describe_dataset(o.val_data or o.data[0], val_split, VAL_NAME, evaluated=True)
    ]
    return train, val


def default_preset(data: tuple[str, ...], depth: int = 50) -> str:
    """``--config`` when not given: the VOC protocol for a VOC folder, COCO R50-C4 1x for a COCO one;
    the FPN config for a ResNet-18/34, which detectron2's C4 head cannot take."""
    if not data:
        raise ClZooError("--engine detectron2 needs --config (voc-c4, coco-c4-1x, coco-c4-2x, coco-fpn-1x) or --data")
    if depth < 50:
        return "coco-fpn-1x"
    return "voc-c4" if (Path(data[0]).expanduser() / "Annotations").is_dir() else "coco-c4-1x"


def _depth_overrides(depth: int, preset_name: str, preset: Preset) -> list[tuple[str, str, str]]:
    """The configs are written for ResNet-50; another depth is set here, or refused where detectron2
    cannot build it (its C4 head makes res5 of bottleneck blocks, which a ResNet-18/34 does not have)."""
    if depth == 50:
        return []
    if depth < 50 and preset.head == "c4":
        raise ClZooError(f"a ResNet-{depth} backbone cannot use --config {preset_name}: detectron2's C4 head builds res5 "
                         "from bottleneck blocks (ResNet-50 and deeper); use --config coco-fpn-1x or --engine torchvision")
    overrides = [("--model", "MODEL.RESNETS.DEPTH", str(depth))]
    if depth < 50:  # detectron2 requires it for its basic-block ResNets
        overrides.append(("--model", "MODEL.RESNETS.RES2_OUT_CHANNELS", "64"))
    return overrides


def plan_detectron2_run(o: Detectron2Options, output: str | os.PathLike[str], depth: int = 50) -> Detectron2Run:
    """Resolve every option into a :class:`Detectron2Run`, or refuse with a one-line ClZooError.

    ``depth`` is the exported backbone's (``resnet_weights(model).depth``)."""
    preset_name = o.preset or default_preset(o.data, depth)
    preset = get_preset(preset_name)
    _refuse_unmappable(o, preset)
    folder = bundled_folder("detectron2")
    train_net, config = folder / "train_net.py", folder / "configs" / preset.yaml
    for needed in (train_net, config):
        if not needed.is_file():
            raise ClZooError(f"{needed} is missing: this cl-zoo install lacks its detectron2 launcher")
    device = _device(o.device)
    num_gpus = _num_gpus(o.num_gpus, device, o.batch_size)
    out = Path(os.path.abspath(os.path.expanduser(output)))
    train, val = _datasets(o, preset)

    # (option that sets it, KEY, VALUE); the option name is how a clashing EXTRA is explained.
    mapped: list[tuple[str, str, str]] = [
        ("--model", "MODEL.WEIGHTS", str(out / WEIGHTS_FILE)),
        ("--out", "OUTPUT_DIR", str(out)),
        ("--device", "MODEL.DEVICE", device),
        ("--seed", "SEED", str(o.seed)),
        ("--batch-size", "SOLVER.IMS_PER_BATCH", str(o.batch_size)),
        ("--lr", "SOLVER.BASE_LR", repr(o.lr if o.lr is not None else 0.02 * o.batch_size / 16)),
        ("--freeze-at", "MODEL.BACKBONE.FREEZE_AT", str(o.freeze_at)),
        ("--max-size", "INPUT.MAX_SIZE_TRAIN", str(o.max_size)),
        ("--max-size", "INPUT.MAX_SIZE_TEST", str(o.max_size)),
        ("--rois-per-image", "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", str(o.rois_per_image)),
        ("--proposals-test", "MODEL.RPN.POST_NMS_TOPK_TEST", str(o.proposals_test)),
        ("--checkpoint-period", "SOLVER.CHECKPOINT_PERIOD", str(o.checkpoint_period)),
        ("--workers", "DATALOADER.NUM_WORKERS", str(o.workers)),
        *_depth_overrides(depth, preset_name, preset),
    ]
    if o.norm == "frozen":
        mapped.append(("--norm", "MODEL.RESNETS.NORM", "FrozenBN"))
    if o.max_iter is not None:
        mapped.append(("--max-iter", "SOLVER.MAX_ITER", str(o.max_iter)))
    if o.steps is not None:
        mapped.append(("--steps", "SOLVER.STEPS", _tuple(o.steps)))
    if o.warmup_iters is not None:
        mapped.append(("--warmup-iters", "SOLVER.WARMUP_ITERS", str(o.warmup_iters)))
    if o.min_sizes_train is not None:
        mapped.append(("--min-size-train", "INPUT.MIN_SIZE_TRAIN", _tuple(o.min_sizes_train)))
    if o.min_size_test is not None:
        mapped.append(("--min-size-test", "INPUT.MIN_SIZE_TEST", str(o.min_size_test)))
    if train:
        classes = shared_classes(train + val)
        mapped += [
            ("--data", "DATASETS.TRAIN", _tuple(tuple(d.name for d in train))),
            ("--data", "MODEL.ROI_HEADS.NUM_CLASSES", str(len(classes))),
        ]
        # VOC folders are all registered with one class list, so a label means the same everywhere.
        train = [Detectron2Dataset(d.name, d.layout, d.paths, classes) for d in train]
        val = [Detectron2Dataset(d.name, d.layout, d.paths, classes) for d in val]
    if o.data or (o.val_split or "").lower() == "none":
        mapped.append(("--val-split", "DATASETS.TEST", _tuple(tuple(d.name for d in val))))

    extra = tuple(o.extra)
    if len(extra) % 2:
        raise ClZooError(f"detectron2 overrides after -- come as KEY VALUE pairs; got {len(extra)} words")
    set_by = {key: flag for flag, key, _ in mapped}
    for key in extra[::2]:
        if key in set_by:
            raise ClZooError(f"{key} is set by {set_by[key]}; give it there, not after --")
    return Detectron2Run(train_net, config, out, num_gpus, o.resume, tuple(train + val),
                         tuple((key, value) for _, key, value in mapped), extra)


def launch_detectron2(run: Detectron2Run) -> int:
    """Run ``train_net.py`` in the caller's directory; returns its exit status.

    An earlier run's results are removed first, so a report is only ever made from this run's."""
    (run.output / RESULTS_FILE).unlink(missing_ok=True)
    return subprocess.call(run.command())


def evaluates(run: Detectron2Run) -> bool:
    """Whether the run ends with an evaluation (``DATASETS.TEST`` not emptied by ``--val-split none``)."""
    return dict(run.overrides).get("DATASETS.TEST", "x") != "()"


def _metric_names(results: dict[str, Any], voc: bool) -> dict[str, float]:
    """detectron2's ``{"bbox": {...}}`` under the torchvision engine's metric names."""
    bbox = results.get("bbox")
    if not isinstance(bbox, dict):
        raise ClZooError(f"{RESULTS_FILE} has no bbox results (got keys {sorted(results)[:5]})")
    metrics: dict[str, float] = {}
    for key, value in bbox.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            continue  # COCO writes NaN for a class without ground truth
        metrics[f"voc_{key}" if voc else key] = round(float(value), 4)
    return metrics


def write_detectron2_report(run: Detectron2Run, *, model: str, backbone: dict[str, Any] | None,
                            train_seconds: float) -> Path:
    """``OUTPUT/report.json`` of a finished run (see the module doc); refuses a run that evaluated nothing."""
    import importlib.metadata

    overrides = dict(run.overrides) | dict(zip(run.extra[::2], run.extra[1::2]))
    evaluated = [d for d in run.datasets if d.name == VAL_NAME]
    test_names = [n.strip().strip('"') for n in overrides.get("DATASETS.TEST", "").strip("()").split(",") if n.strip()]
    results = read_bounded_json(run.output / RESULTS_FILE, max_bytes=MAX_RESULTS_BYTES, what="detectron2 evaluation results",
                        error=ClZooError)
    if not isinstance(results, dict) or not results:
        raise ClZooError(f"{run.output / RESULTS_FILE}: no evaluation results")
    metrics: dict[str, dict[str, float]] = {}
    for name, value in results.items():
        if not isinstance(value, dict):
            raise ClZooError(f"{run.output / RESULTS_FILE}: results of {name!r} are not a mapping")
        voc = any(d.layout == "voc" for d in evaluated) if name == VAL_NAME else name.startswith("voc_")
        metrics[str(name)] = _metric_names(value, voc)
    try:
        version = importlib.metadata.version("detectron2")
    except importlib.metadata.PackageNotFoundError:
        version = None
    report = {
        "task": "detection",
        "engine": "detectron2",
        "detectron2_version": version,
        "model": model,
        "backbone": backbone,
        "config_file": run.config.name,
        "overrides": overrides,
        "device": overrides.get("MODEL.DEVICE"),
        # The configs leave SOLVER.AMP off (detectron2's AMP is CUDA float16); only an EXTRA turns it on.
        "precision": "fp16" if overrides.get("SOLVER.AMP.ENABLED", "").lower() == "true" else "fp32",
        "iterations": int(overrides["SOLVER.MAX_ITER"]) if "SOLVER.MAX_ITER" in overrides else None,
        "train_seconds": round(train_seconds, 2),
        "train_data": [f"{d.layout}: {' '.join(d.paths)}" for d in run.datasets if d.name != VAL_NAME],
        "val_data": [f"{d.layout}: {' '.join(d.paths)}" for d in evaluated] or test_names,
        # One evaluated dataset (the usual case) reads like the torchvision report; several stay by name.
        "metrics": next(iter(metrics.values())) if len(metrics) == 1 else metrics,
    }
    path = run.output / REPORT_FILE
    atomic_write_json(path, report, allow_nan=False)
    return path
