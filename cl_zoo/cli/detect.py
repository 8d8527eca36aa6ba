"""``cl-zoo detect``: detection transfer of a backbone (torchvision engine, or detectron2)."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cl_zoo.cli.rerun import rerun_command
from cl_zoo.errors import ClZooError

if TYPE_CHECKING:
    from cl_zoo.detection.detectron2_run import Detectron2Options


def _ints(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError as exc:
        raise ClZooError(f"expected comma-separated integers, got {text!r}") from exc


def _finite(value: float) -> float | None:
    """A metric for JSON: NaN (no box of a size class) is null, as in report.json."""
    return None if value != value else float(value)


class _Voice:
    """Where detect's lines go: ``--json`` keeps stdout for the one JSON summary (information moves
    to stderr), ``-q`` drops information but never results, warnings or errors."""

    def __init__(self, quiet: bool, as_json: bool) -> None:
        self.quiet = quiet
        self.as_json = as_json

    def info(self, text: str) -> None:
        if not self.quiet:
            click.echo(text, err=self.as_json)

    def note(self, text: str) -> None:
        click.echo(text, err=True)

    def result(self, text: str, summary: dict[str, Any]) -> None:
        if self.as_json:
            click.echo(json.dumps(summary, sort_keys=True))
        else:
            click.echo(text)


def _detectron2(options: "Detectron2Options", model: str, output: str, dry_run: bool, prefix: str | None,
                random_init: bool = False, note: str | None = None, voice: _Voice | None = None) -> None:
    import time

    from cl_zoo.export import export_detectron2, resnet_weights
    from cl_zoo.detection.detectron2_run import evaluates, launch_detectron2, plan_detectron2_run, write_detectron2_report

    # The backbone's depth picks the config keys (and refuses a C4 head for a ResNet-18), so it is
    # read before anything is planned, also for --dry-run.
    identity, source = _backbone_identity(model, prefix, random_init, options.seed)
    weights = resnet_weights(source, prefix)
    run = plan_detectron2_run(options, output, depth=weights.depth)
    voice = voice or _Voice(quiet=False, as_json=False)
    if note:
        voice.note(note)
    if dry_run:
        voice.result(shlex.join(run.command()), {"engine": "detectron2", "dry_run": True, "command": run.command()})
        return
    summary = export_detectron2(weights, run.weights)
    voice.info(summary.text())
    if importlib.util.find_spec("detectron2") is None:
        raise ClZooError(
            f"detectron2 is not installed (weights are ready in {run.weights}); install it with "
            "pip install 'git+https://github.com/facebookresearch/detectron2.git' and rerun, or use --engine torchvision"
        )
    voice.info("running: " + shlex.join(run.command()))
    start = time.perf_counter()
    code = launch_detectron2(run)
    if code != 0:
        raise ClZooError(f"detectron2 training exited with status {code}")
    report = None
    if evaluates(run):
        report = write_detectron2_report(run, model=model, backbone=identity, train_seconds=time.perf_counter() - start)
    voice.result(f"report: {report}" if report else f"trained: {output}",
                 {"engine": "detectron2", "out": str(output), "report": str(report) if report else None})


def _backbone_identity(model: str, prefix: str | None, random_init: bool = False, seed: int = 0
                       ) -> tuple[dict[str, Any] | None, Any]:
    """What goes into the report as the backbone (the torchvision engine's fields), and what to export.

    A zoo name or checkpoint folder is loaded once, as a model whose identity (name, source, weight
    and file digests) is known; a raw checkpoint file is identified by its path and sha256. With
    ``random_init`` it is the architecture with weights drawn from ``seed``, exactly the torchvision
    engine's baseline, so both engines start from the same random weights."""
    path = Path(model)
    if path.is_file() or prefix is not None:
        import hashlib

        if not path.is_file():
            return None, model
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return {"name": path.name, "source": str(path.resolve()), "file_sha256": digest.hexdigest()}, model
    from cl_zoo.eval.baseline import load_model_or_baseline
    from cl_zoo.eval.features import model_identity

    backbone = load_model_or_baseline(model, random_init, seed)
    return model_identity(backbone), backbone


@click.command("detect")
@click.option("--engine", type=click.Choice(["torchvision", "detectron2"]), default="torchvision", show_default=True,
              help="torchvision runs here; its COCO AP needs pycocotools (pip install 'cl-zoo[detection]'; "
                   "--val-split none trains without it). detectron2 launches its train_net.py.")
@click.option("--config", "preset", default=None,
              help="Protocol preset: voc-c4, coco-c4-1x, coco-c4-2x, coco-fpn-1x (detectron2 default: voc-c4 "
                   "for a VOC --data folder, coco-c4-1x for a COCO one).")
@click.option("--model", "model_spec", required=True, help="Zoo name, checkpoint folder/file or hf-hub: id.")
@click.option("--prefix", default=None, help="Key prefix of the encoder inside a raw checkpoint.")
@click.option("--random-init", is_flag=True,
              help="--model's architecture with weights drawn from --seed, the baseline a pretrained backbone is read against "
                   "(with --engine detectron2 those weights are exported and fine-tuned there).")
@click.option("--data", "data", multiple=True, help="Training data root (VOC or COCO layout); repeat to concatenate.")
@click.option("--val-data", default=None, help="Validation root (default: the first --data).")
@click.option("--train-split", default=None, help="VOC ImageSets name or COCO split (default from --config).")
@click.option("--val-split", default=None, help="Validation split; 'none' skips evaluation.")
@click.option("--preset", "run_preset", type=click.Choice(["cpu-quick"]), default=None,
              help="Run size: cpu-quick is R18-FPN-sized for a 2-core CPU (150 iterations of 4 images at 256 px, a few "
                   "minutes on BCCD); it prints the options it sets, and each option given wins. On a CPU without "
                   "--preset, --config or --max-iter, cpu-quick is used (said in one line).")
@click.option("--head", type=click.Choice(["c4", "fpn"]), default=None,
              help="Default: FPN for a ResNet-18/34 (as the detectron2 launcher), C4 for deeper ones or --config's.")
@click.option("--norm", type=click.Choice(["bn", "frozen"]), default="bn", show_default=True,
              help="Backbone BatchNorm trainable (protocol) or frozen.")
@click.option("--freeze-at", type=int, default=0, show_default=True,
              help="Freeze the stem (1) and stages up to res N (2-5), as detectron2's BACKBONE.FREEZE_AT.")
@click.option("--max-iter", type=int, default=None, help="Training iterations (default: --config's, 24000 for VOC).")
@click.option("--steps", default=None, help="LR decay iterations, e.g. 18000,22000.")
@click.option("--warmup-iters", type=int, default=None, help="Linear LR warm-up iterations (default 100).")
@click.option("--batch-size", type=int, default=None, help="Images per iteration (default 16, cpu-quick 4).")
@click.option("--lr", type=float, default=None, help="Default 0.02 x batch/16.")
@click.option("--min-size-train", default=None, help="Comma-separated shorter sides for multi-scale training.")
@click.option("--min-size-test", type=int, default=None, help="Shorter image side for evaluation (default 800).")
@click.option("--max-size", type=int, default=None, help="Longest image side (default 1333, cpu-quick 352).")
@click.option("--rois-per-image", type=int, default=None, help="Sampled RoIs per training image (default 512, cpu-quick 128).")
@click.option("--proposals-test", type=int, default=None, help="RoIs per test image (default 1000).")
@click.option("--val-limit", type=int, default=None,
              help="Evaluate only the first N validation images (torchvision engine).")
@click.option("--checkpoint-period", type=int, default=None,
              help="Iterations between last.pt checkpoints (default 2000, cpu-quick 50; Ctrl-C also writes one).")
@click.option("-j", "--workers", type=click.IntRange(min=0), default=None, help="DataLoader workers (default: the usable CPUs, at most 8).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the data order, augmentation and head initialisation.")
@click.option("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available).")
@click.option("--out", "output", default=None, type=click.Path(file_okay=False),
              help="Run folder (required): last.pt, config.json, report.json.")
@click.option("--output", "output_alias", default=None, type=click.Path(file_okay=False), hidden=True)  # deprecated: --out
@click.option("--resume", is_flag=True, help="Continue from OUT/last.pt (detectron2: OUT/last_checkpoint).")
@click.option("--num-gpus", type=int, default=None,
              help="detectron2 engine only: processes, one per GPU (default: every visible GPU; 1 on cpu).")
@click.option("--dry-run", is_flag=True, help="detectron2 engine: print the full train_net.py command only.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: on unless --quiet; detectron2 prints log lines either way).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or information lines; results, warnings and errors still print.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result (metrics, report and run folder; the command with --dry-run) as JSON on stdout.")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True,
              help="torchvision engine: auto is bf16 autocast on CUDA and on CPUs with AMX, else fp32.")
@click.argument("extra", nargs=-1)
def detect_command(engine: str, preset: str | None, model_spec: str, prefix: str | None, random_init: bool, data: tuple[str, ...],
                   val_data: str | None, train_split: str | None, val_split: str | None, run_preset: str | None,
                   head: str | None, norm: str, freeze_at: int, max_iter: int | None, steps: str | None,
                   warmup_iters: int | None, batch_size: int | None, lr: float | None, min_size_train: str | None,
                   min_size_test: int | None, max_size: int | None, rois_per_image: int | None,
                   proposals_test: int | None, val_limit: int | None, checkpoint_period: int | None, workers: int,
                   seed: int, device: str | None, output: str | None, output_alias: str | None, resume: bool,
                   num_gpus: int | None, dry_run: bool, progress: bool | None, quiet: bool, as_json: bool, precision: str,
                   extra: tuple[str, ...]) -> int:
    """Fine-tune Faster R-CNN on a backbone and report COCO AP and VOC07 AP50.

    With --engine detectron2 every option becomes a detectron2 config override (or is refused), and
    --data/--val-data folders (VOC or COCO layout) are registered inside train_net.py. EXTRA (after
    --) are further detectron2 overrides for keys no option sets, e.g. -- TEST.PRECISE_BN.NUM_ITER 50.
    """
    from cl_zoo.detection.limits import check_detection_values
    from cl_zoo.detection.presets import PROTOCOL_DEFAULTS, get_run_preset

    output = _out_folder(output, output_alias)
    voice = _Voice(quiet, as_json)
    no_progress = not (progress if progress is not None else not quiet)
    if random_init and (prefix is not None or Path(model_spec).is_file()):
        raise ClZooError("--random-init takes a zoo name or a checkpoint folder, not a raw checkpoint file")
    # Options that set the run's size: given, else the --preset's, else the protocol's (PROTOCOL_DEFAULTS;
    # the config's own values for those a config sets: iterations, steps, warm-up, image sizes).
    given: dict[str, Any] = {
        "head": head, "batch_size": batch_size, "lr": lr, "max_iter": max_iter, "steps": _ints(steps),
        "warmup_iters": warmup_iters, "min_sizes_train": _ints(min_size_train), "min_size_test": min_size_test,
        "max_size": max_size, "rois_per_image": rois_per_image, "proposals_test": proposals_test,
        "checkpoint_period": checkpoint_period,
    }
    note = None
    if run_preset is None and preset is None and max_iter is None and _resolved_device(device) == "cpu":
        run_preset = "cpu-quick"
        note = ("note: on a CPU without --preset, --config or --max-iter: using --preset cpu-quick, not the "
                "24,000-iteration GPU protocol (--config voc-c4 runs that)")
    chosen = get_run_preset(run_preset) if run_preset is not None else None
    if chosen is not None and max_iter is not None:  # its LR steps and warm-up at the same fractions of the run
        chosen = chosen.scaled_to(max_iter)
    if chosen is not None:
        for key, value in chosen.values().items():
            if key == "head":  # below --head and --config's head; detectron2 takes its head from --config
                given["preset_head"] = value
            elif given[key] is None:
                given[key] = value
        note = (note + "; " if note else "") + f"preset {chosen.name}: {chosen.as_options()} (each option given wins)"
    for key, value in PROTOCOL_DEFAULTS.items():
        if given[key] is None:
            given[key] = value
    check_detection_values({**given, "freeze_at": freeze_at, "val_limit": val_limit, "workers": workers, "seed": seed,
                            "num_gpus": num_gpus}, as_flags=True)
    if resume and engine == "torchvision":
        from cl_zoo.detection.train import check_resumable

        check_resumable(Path(output), resume)
    return _run(engine, preset, model_spec, prefix, random_init, data, val_data, train_split, val_split, given,
                norm, freeze_at, val_limit, workers, seed, device, output, resume, num_gpus, dry_run, no_progress,
                precision, extra, note, voice)


def _protocol_steps(preset: Any, max_iter: int | None, defaults: Any) -> tuple[int, ...]:
    """The protocol's LR steps, moved to the same fractions of a --max-iter that shortens or stretches it."""
    from cl_zoo.detection.presets import scale_steps

    of_iters, steps = (preset.max_iter, preset.steps) if preset else (defaults.max_iter, defaults.steps)
    return scale_steps(steps, of_iters, max_iter) if max_iter is not None else tuple(steps)


def _out_folder(out: str | None, deprecated: str | None) -> str:
    """``--out``, or the deprecated ``--output`` it replaced (every command names its output ``--out``)."""
    if out is not None and deprecated is not None and out != deprecated:
        raise ClZooError(f"--out {out} and --output {deprecated} name two folders; --output is the old name of --out")
    folder = out if out is not None else deprecated
    if folder is None:
        raise click.UsageError("Missing option '--out' (the run folder).")
    return folder


def _resolved_device(device: str | None) -> str:
    """Where the run will train, as both engines decide it when --device is not given."""
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _run(engine: str, preset: str | None, model_spec: str, prefix: str | None, random_init: bool,
         data: tuple[str, ...], val_data: str | None, train_split: str | None, val_split: str | None,
         given: dict[str, Any], norm: str, freeze_at: int, val_limit: int | None, workers: int | None, seed: int,
         device: str | None, output: str, resume: bool, num_gpus: int | None, dry_run: bool, no_progress: bool,
         precision: str, extra: tuple[str, ...], note: str | None, voice: _Voice) -> int:
    from cl_zoo.detection.presets import get_preset

    if engine == "detectron2":
        from cl_zoo.data.workers import default_workers
        from cl_zoo.detection.detectron2_run import Detectron2Options

        if workers is None:
            workers = default_workers()
        options = Detectron2Options(
            preset=preset, data=data, val_data=val_data, train_split=train_split, val_split=val_split,
            head=given["head"], norm=norm, freeze_at=freeze_at, max_iter=given["max_iter"], steps=given["steps"],
            warmup_iters=given["warmup_iters"], batch_size=given["batch_size"], lr=given["lr"],
            min_sizes_train=given["min_sizes_train"], min_size_test=given["min_size_test"],
            max_size=given["max_size"], rois_per_image=given["rois_per_image"],
            proposals_test=given["proposals_test"], val_limit=val_limit,
            checkpoint_period=given["checkpoint_period"], workers=workers, seed=seed, device=device,
            num_gpus=num_gpus, resume=resume, extra=extra,
        )
        _detectron2(options, model_spec, output, dry_run, prefix, random_init, note, voice)
        return 0
    for flag_given, flag in ((num_gpus is not None, "--num-gpus"), (dry_run, "--dry-run"), (bool(extra), "EXTRA after --")):
        if flag_given:
            raise ClZooError(f"{flag} applies to --engine detectron2 only")
    p = get_preset(preset) if preset is not None else None
    from cl_zoo.export import check_standard_layout, resnet_weights
    from cl_zoo.detection.train import DetectionConfig, DetectionInterrupted, open_datasets, train_detector

    if not data:
        raise ClZooError("--engine torchvision needs --data (a VOC or COCO folder)")
    defaults = DetectionConfig()
    cfg = DetectionConfig(
        # None: by the backbone's depth (FPN for ResNet-18/34, as the detectron2 launcher picks)
        head=given["head"] or (p.head if p else None) or given.get("preset_head"),
        norm=norm,
        freeze_at=freeze_at,
        batch_size=given["batch_size"],
        lr=given["lr"],
        max_iter=given["max_iter"] if given["max_iter"] is not None else (p.max_iter if p else defaults.max_iter),
        steps=given["steps"] if given["steps"] is not None else _protocol_steps(p, given["max_iter"], defaults),
        warmup_iters=given["warmup_iters"] if given["warmup_iters"] is not None else (p.warmup_iters if p else defaults.warmup_iters),
        min_sizes_train=given["min_sizes_train"] or (p.min_sizes_train if p else defaults.min_sizes_train),
        min_size_test=given["min_size_test"] or (p.min_size_test if p else defaults.min_size_test),
        max_size=given["max_size"],
        rois_per_image=given["rois_per_image"],
        proposals_test=given["proposals_test"],
        checkpoint_period=given["checkpoint_period"],
        workers=workers if workers is not None else defaults.workers,
        seed=seed,
        val_limit=val_limit,
        precision=precision,
    )
    tsplit = train_split or (p.train_split if p else "trainval")
    vsplit = val_split or (p.val_split if p else "test")
    train, val = open_datasets(list(data), tsplit, val_data, None if vsplit.lower() == "none" else vsplit)
    if val is not None:  # scored with COCO AP after training: checked before it starts
        from cl_zoo.optional import require

        require("pycocotools", "COCO AP (detect --engine torchvision)")
    voice.info(f"train: {train.summary()}")
    if val is not None:
        voice.info(f"val: {val.summary()}")
    from cl_zoo.detection.models import check_detection_backbone
    from cl_zoo.eval.baseline import load_model_or_baseline
    from cl_zoo.eval.features import model_identity

    path = Path(model_spec)
    if path.is_file() or prefix is not None:
        # A raw training checkpoint: take its (query) encoder into a stock zoo ResNet.
        from cl_zoo.factory import create_model

        weights = resnet_weights(model_spec, prefix)
        # Shapes the stock ResNet cannot hold (CIFAR stem, other widths) or missing tensors are a
        # one-line CheckpointError here, not a PyTorch traceback or a silently half-loaded backbone.
        check_standard_layout(weights, "the torchvision detector")
        backbone = create_model(f"resnet{weights.depth}")
        backbone.load_state_dict({k: v for k, v in weights.state.items()}, strict=False)
        voice.info(f"backbone: ResNet-{weights.depth} from {weights.source} (prefix {weights.prefix!r})")
    else:
        backbone = load_model_or_baseline(model_spec, random_init, seed)
    check_detection_backbone(backbone)
    identity = model_identity(backbone)
    if note:
        voice.note(note)
    try:
        run = train_detector(backbone, train, val, cfg, output, device=device, resume=resume,
                             progress=not no_progress, model_name=model_spec, backbone_identity=identity)
    except DetectionInterrupted as exc:
        message = " ".join(str(exc).split())
        click.echo(f"\ninterrupted: {message}" + ("; to continue, run:" if exc.checkpoint is not None else ""), err=True)
        if exc.checkpoint is not None:
            click.echo(f"  {rerun_command(click.get_current_context(), add=['--resume'])}", err=True)
        if exc.abandoned:
            # The training thread is inside an op that cannot be interrupted; waiting for it (as the
            # interpreter's exit would, for its locks and DataLoader) is what Ctrl-C must not do.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.exit_code)
        return exc.exit_code
    keys = ["AP", "AP50", "AP75", "APs", "APm", "APl", "voc_AP50", "voc_AP", "voc_AP75"]
    line = "  ".join(f"{k} {run.metrics[k]:.2f}" for k in keys if k in run.metrics)
    text = (line + "\n" if line else "") + f"report: {run.report_path}"
    voice.result(text, {"engine": "torchvision", "out": str(output), "metrics": {k: _finite(run.metrics[k]) for k in keys if k in run.metrics},
                        "report": str(run.report_path) if run.report_path else None})
    return 0
