"""``cl-zoo pretrain``: self-supervised pretraining of one method on an image folder.

Examples::

    cl-zoo pretrain --recipe recipes/dcl_cifar10.yaml --data cifar10-jpeg.tar.gz --val cifar10-jpeg.tar.gz --out runs/dcl
    cl-zoo pretrain --method dcl --arch resnet18 --data imagenette128-train.tar.gz --image-size 64 --epochs 50 --out runs/x
    cl-zoo pretrain --out runs/dcl --resume                     # continue after a crash or Ctrl-C
    cl-zoo pretrain ... --checkpoint-every 500                  # long epochs: keep progress every 500 steps
    torchrun --nproc-per-node 8 -m cl_zoo.cli pretrain --recipe ... --out ...   # several GPUs

The recipe (YAML) holds every hyperparameter; options given here override it, ``--set key=value``
reaches any recipe key (``--set optim.weight_decay=1e-6 --set method_args.temperature=0.2``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cl_zoo.errors import ClZooError

if TYPE_CHECKING:
    from cl_zoo.train.loop import TrainingInterrupted


@click.command(context_settings={"show_default": True})
@click.option("--recipe", "recipe_path", help="Recipe YAML: a path, or a bundled recipe's name (dcl_cifar10).")
@click.option("--method", help="Method name (dcl, dclw, simclr, mocov2, ...); overrides the recipe.")
@click.option("--arch", help="Backbone architecture (see `cl-zoo models`); overrides the recipe.")
@click.option("--data", help="Training images: a folder of images (flat, nested or one sub-folder per class), an archive "
              "of one, or a named dataset (cifar10, imagenette, ...). With train/val splits inside, 'train' is used. "
              "Labels are not needed; class folders only feed the optional kNN monitor.")
@click.option("--val", help="Held-out labelled images for the kNN monitor (uses its val/test split if present). "
              "Without it, 5% of the training images are held out.")
@click.option("--data-root", default=None, help="Where named datasets live (default $CL_ZOO_DATA or ./data).")
@click.option("--out", "out", required=True, type=click.Path(), help="Run folder (checkpoints, logs, exported model).")
@click.option("--epochs", type=int, help="Training epochs.")
@click.option("--batch-size", type=int, help="Global batch size (all processes together).")
@click.option("--lr", type=float, help="Base learning rate (scaled by batch/base_batch when lr_scaling is linear).")
@click.option("--image-size", type=int, help="Training resolution (images are decoded at this size).")
@click.option("--precision", type=click.Choice(["auto", "bf16", "fp16", "fp32"]),
              help="Autocast precision; auto is bf16 on CUDA and on CPUs with AMX, else fp32 "
              "(fp16 is CUDA-only). Weights, optimizer state, BatchNorm statistics and losses stay float32.")
@click.option("--knn-every", type=int, help="Run the kNN monitor every N epochs (0: never).")
@click.option("--checkpoint-every", type=click.IntRange(min=0), metavar="STEPS",
              help="Also checkpoint every STEPS steps inside an epoch, so --resume loses at most that much (0: at epoch ends only).")
@click.option("--seed", type=int, help="Random seed.")
@click.option("-j", "--workers", type=click.IntRange(min=0), help="Decode threads / DataLoader workers.")
@click.option("--compile/--no-compile", "compile_", default=None, help="torch.compile the backbone.")
@click.option("--sync-bn/--no-sync-bn", default=None, help="SyncBatchNorm across processes (CUDA).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any recipe key (dotted).")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint (Ctrl-C writes one and prints this command).")
@click.option("--device", default="auto", help="auto, cpu, cuda or cuda:N.")
@click.option("--stream/--in-memory", default=None, help="Force the streaming DataLoader path or the decoded in-memory path "
              "(default: in memory when the decoded dataset fits in half the device memory).")
@click.option("--progress/--no-progress", default=True, help="Progress bars (logs still print one line per epoch).")
@click.option("-q", "--quiet", is_flag=True, help="Quiet: no progress bars (as --no-progress); the epoch lines, warnings and errors still print.")
@click.option("--json", "as_json", is_flag=True, help="Print the result (run folder, exported model, kNN metrics) as JSON on stdout; logs go to stderr.")
def pretrain_command(recipe_path, method, arch, data, val, data_root, out, epochs, batch_size, lr, image_size, precision,  # noqa: ANN001
                     knn_every, checkpoint_every, seed, workers, compile_, sync_bn, sets, resume, device, stream, progress=True,
                     quiet=False, as_json=False) -> int:
    """Pretrain a backbone with a contrastive method and export it in the zoo's format."""
    import contextlib
    import json
    import sys

    from cl_zoo.fileio import check_output_path, refuse_inputs_as_outputs

    run_dir = check_output_path(out, folder=True, create_parents=True)  # before the training code is imported, data opened or a model built
    from cl_zoo.train.loop import Trainer, TrainingInterrupted
    from cl_zoo.train.recipe import Recipe, parse_overrides, schedule_rescale_note

    overrides: dict[str, object] = {
        "method": method, "arch": arch, "epochs": epochs, "batch_size": batch_size, "optim.lr": lr,
        "data.image_size": image_size, "precision": precision, "knn_every": knn_every, "checkpoint_every": checkpoint_every, "seed": seed,
        "workers": workers, "compile": compile_, "sync_bn": sync_bn,
    }
    overrides.update(parse_overrides(sets))
    saved = run_dir / "recipe.yaml"
    if recipe_path:
        # The run writes its recipe.yaml: the user's own file there (epochs, comments) is never rewritten.
        refuse_inputs_as_outputs([saved], [recipe_path], error=ClZooError)
        base = Recipe.load(recipe_path)
    elif method:
        base = Recipe()
    elif resume and saved.is_file():
        base = Recipe.load(saved)
    else:
        raise ClZooError("give --recipe or --method (or --resume an existing run folder)")
    recipe = base.with_overrides(overrides)
    if resume and saved.is_file():
        # A resumed run keeps the schedule it started with (the trainer lets only epochs change):
        # --epochs there extends or shortens the run, it does not reshape its warm-up again.
        given = [key for key, value in overrides.items() if value is not None]
        if not any(key == "schedule" or key.startswith("schedule.") for key in given):
            recipe = dataclasses.replace(recipe, schedule=Recipe.load(saved).schedule)
    else:
        note = schedule_rescale_note(base, recipe)
        if note:
            click.echo(note, err=as_json)
    if data is None and not resume:
        raise ClZooError("give --data: a folder of images, an archive of one, or a named dataset")
    # --json: stdout carries only the JSON, so the trainer's log lines go to stderr.
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        trainer = Trainer(recipe, data, run_dir, val=val, data_root=data_root, resume=resume, device=device, stream=stream,
                          progress=progress and not quiet)
        try:
            result = trainer.fit()
        except TrainingInterrupted as stopped:
            echo_interrupted(stopped, run_dir)
            return stopped.exit_code
    if as_json:
        click.echo(json.dumps({"run": str(result.run_dir), "model": str(result.model_dir) if result.model_dir else None,
                               "epochs": result.epochs, "metrics": result.metrics}, indent=1))
    elif result.model_dir is not None:
        knn = ", ".join(f"{k}={100 * v:.2f}%" for k, v in sorted(result.metrics.items()))
        click.echo(f"exported {result.model_dir}" + (f" ({knn})" if knn else ""))
    return 0


def echo_interrupted(stopped: "TrainingInterrupted", run_dir: Path) -> None:
    """What Ctrl-C kept, and the command that continues the run (its recipe and data come from the
    run folder, so ``--out`` and ``--resume`` are all it needs)."""
    import shlex

    click.echo(f"\n{stopped}" + ("; to continue, run:" if stopped.checkpoint is not None else ""), err=True)
    if stopped.checkpoint is not None:
        click.echo(f"  {shlex.join(['cl-zoo', 'pretrain', '--out', str(run_dir.resolve()), '--resume'])}", err=True)
