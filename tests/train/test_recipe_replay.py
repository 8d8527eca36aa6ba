"""scripts/recipe_replay.py: a recipe's first steps with the health logs that show a collapse."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import REPO_ROOT, make_folder

from cl_zoo.train.recipe import Recipe

ROOT = REPO_ROOT


def test_replay_prints_each_step_with_the_schedule_and_health_logs(tmp_path):
    folder = make_folder(tmp_path / "imgs")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "recipe_replay.py"), "mocov2_cifar10", "--data", str(folder),
         "--images", "48", "--steps", "3", "--set", "batch_size=16", "--set", "model_args.width=0.125",
         "--set", "data.image_size=16", "--set", "method_args.queue_size=32", "--set", "schedule.warmup_epochs=1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "CL_ZOO_CACHE": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [int(words[1]) for words in lines] == [0, 1, 2]
    # one warm-up epoch of 3 steps: the lr ramps 1/3, 2/3, 3/3 of the peak
    peak = Recipe.load("mocov2_cifar10").with_overrides({"batch_size": 16}).effective_lr  # the recipe's lr scaling
    lrs = [float(words[3]) for words in lines]
    assert all(abs(lr - peak * k / 3) < 1e-4 for lr, k in zip(lrs, (1, 2, 3))), lrs
    assert all({"pos_sim", "neg_sim", "queue_sim"} <= set(words) for words in lines)
