"""CPU cost of one training step of each CPU-tier recipe, relative to DCL's, in float32 and bfloat16.

The eight recipes share batch, epochs and crop size, so a run's wall time scales with its step cost;
this prints each method's CPU-seconds per step (forward and backward of the method on random 64 px
views, the recipe's own architecture and heads), the ratio to DCL float32 measured in the same run,
and the bfloat16-autocast speed-up. CPU time on one thread, not wall time: on a machine shared with
other jobs it still measures the work, and a dedicated 2-core machine runs it about twice as fast.

    python benchmarks/cpu_tier_step_cost.py --batch 64 --repeats 2
    python benchmarks/cpu_tier_step_cost.py --methods dcl cacr
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from cl_zoo.methods import build_method
from cl_zoo.train.recipe import Recipe

TIER = ("dcl", "simclr", "dclw", "mocov2", "simo", "jcl", "cmc", "cacr")
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def step_cpu_seconds(method: torch.nn.Module, batch: int, size: int, bf16: bool, repeats: int) -> float:
    """Fastest of ``repeats`` steps (after one warm-up step) in CPU-seconds of this process."""
    views = [torch.rand(batch, 3, size, size).contiguous(memory_format=torch.channels_last) for _ in range(method.num_views)]
    index = torch.arange(batch)
    best = float("inf")
    for i in range(repeats + 1):
        start = time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = method(views, index, 0.0)
        loss.backward()
        method.zero_grad(set_to_none=True)
        if i:
            best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(TIER), choices=TIER)
    parser.add_argument("--batch", type=int, default=64, help="images per step (the recipes use 256; cost is linear)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    methods = ["dcl"] + [m for m in args.methods if m != "dcl"]  # the baseline is always measured
    print(f"torch {torch.__version__}, 1 thread, batch {args.batch}, CPU-seconds per step (best of {args.repeats})")
    baseline = None
    for name in methods:
        recipe = Recipe.load(RECIPES / f"{name}_imagenette64_cpu_tier.yaml")
        torch.manual_seed(0)
        method = build_method(recipe.method, recipe.arch, model_args=recipe.model_args, epochs=recipe.epochs,
                              augment=recipe.data.augment, sync_bn=False, **recipe.method_args)
        method = method.to(memory_format=torch.channels_last)
        fp32 = step_cpu_seconds(method, args.batch, recipe.data.image_size, False, args.repeats)
        bf16 = step_cpu_seconds(method, args.batch, recipe.data.image_size, True, args.repeats)
        baseline = baseline or fp32
        print(f"{name:<7} views {method.num_views}  fp32 {fp32:5.2f} s  bf16 {bf16:5.2f} s  "
              f"x DCL fp32 {fp32 / baseline:4.2f}  bf16 speed-up {fp32 / bf16:4.2f}x")


if __name__ == "__main__":
    main()
