"""Replay a recipe's first steps on the CPU and print, per step, what shows a collapse coming.

GPU time is scarce and a recipe that collapses wastes it (the first GPU run: DCL's and MoCo v2's CIFAR
recipes collapsed in their first epoch). This runs the trainer's own pieces (method, optimizer,
learning-rate schedule with its warm-up, in-memory device augmentations) on the first N images of a
folder, one step at a time, and prints the loss, the lr and the method's health logs: ``pos_sim``
(cosine between an image's views), and for queue methods ``neg_sim`` (query vs queued keys) and
``queue_sim`` (queued keys among themselves). Collapse looks like ``pos_sim`` -> 1 (DCL) or
``queue_sim`` -> 1 (MoCo v2's key encoder); healthy early training keeps them well apart.

    python scripts/recipe_replay.py recipes/mocov2_cifar10.yaml --data ../shared/datasets/cifar10-jpeg.tar.gz \\
        --images 4096 --steps 48 --set schedule.warmup_epochs=4

Steps are counted over the replay's own images, so ``schedule.warmup_epochs`` means epochs of
``--images`` (4 x 8 steps above), not of the full dataset. Not a timed benchmark and not part of the
test suite's budget: a full-width ResNet-18 step at batch 512 takes about 20 s on one core.
"""

from __future__ import annotations

import argparse

import torch

from cl_zoo.data.memory import decode_to_tensor
from cl_zoo.errors import ClZooError
from cl_zoo.methods import build_method_from_recipe
from cl_zoo.train.data import InMemoryBatches, augment_configs
from cl_zoo.train.loop import open_train_data
from cl_zoo.precision import resolve_precision
from cl_zoo.train.optim import build_optimizer, lr_factor, set_lr
from cl_zoo.train.recipe import Recipe, parse_overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help="recipe YAML or bundled recipe name")
    ap.add_argument("--data", required=True, help="image folder or archive (its train split)")
    ap.add_argument("--images", type=int, default=4096, help="use the first N images")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a recipe key (dotted), e.g. schedule.warmup_epochs=4")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    try:
        recipe = Recipe.load(args.recipe).with_overrides(parse_overrides(args.sets))
    except ClZooError as exc:
        raise SystemExit(f"error: {exc}") from None
    size = recipe.data.image_size
    method = build_method_from_recipe(recipe)
    images = decode_to_tensor(open_train_data(args.data).paths[: args.images], size)
    if len(images) < recipe.batch_size:
        raise SystemExit(f"error: {len(images)} images, fewer than one batch of {recipe.batch_size}")
    configs = augment_configs(method.view_config.presets(), size)
    optimizer = build_optimizer(recipe, method.parameter_groups(recipe.optim.weight_decay))
    batches = InMemoryBatches(images, configs, recipe.batch_size, 0, 1, recipe.seed)
    steps_per_epoch = len(images) // recipe.batch_size
    amp = resolve_precision(recipe.precision, "cpu", training=True) == "bf16"  # the trainer's own choice on this CPU
    print(f"{recipe.method} {recipe.arch}, {len(images)} images, batch {recipe.batch_size}, peak lr {recipe.effective_lr:g}, "
          f"warm-up {recipe.schedule.warmup_epochs:g} epochs of {steps_per_epoch} steps, bf16 autocast {amp}")
    method.train()
    step = epoch = 0
    while step < args.steps:
        for i, (index, views) in enumerate(batches.epoch(epoch)):
            progress = epoch + i / steps_per_epoch  # in epochs, as the trainer passes it
            lr = recipe.effective_lr * lr_factor(recipe, step, steps_per_epoch)
            set_lr(optimizer, lr)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss, logs = method(views, index, progress)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            method.after_optimizer_step(progress + 1 / steps_per_epoch)
            health = " ".join(f"{k} {v:.4f}" for k, v in logs.items() if k != "loss")
            print(f"step {step} lr {lr:.4f} loss {loss.item():.4f} {health}", flush=True)
            step += 1
            if step >= args.steps:
                break
        epoch += 1


if __name__ == "__main__":
    main()
