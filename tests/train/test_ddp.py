"""Two gloo processes (torchrun on CPU) train exactly like one process with the same global batch.

Why this can be exact: the trainer draws the image order and every augmentation parameter for the
*global* batch from seeded generators and each rank applies its own rows, so both set-ups see the
same views; the methods gather embeddings with the sum-over-ranks gradient rule and DDP averages
gradients, which is the gradient of the single-process loss. BatchNorm is the one thing that would
differ (per-rank statistics over half the batch), and SyncBatchNorm has no CPU kernel, so the test
uses a model without batch statistics: raw pixels into the methods' MLP head (no BN). For MoCo v2
this also checks that the queue, fed with keys gathered from both ranks, ends up identical.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers import free_port, make_folder

COMMON = [
    "--arch", "pixels", "--set", "model_args.input_size=16", "--set", "method_args.head_hidden_dim=32",
    "--set", "method_args.head_out_dim=16", "--set", "data.augment=cifar", "--image-size", "16",
    "--batch-size", "16", "--epochs", "2", "--lr", "0.5", "--precision", "fp32", "--knn-every", "0",
    "--workers", "1", "--no-progress", "--device", "cpu",
]
METHODS = {
    "dcl": [],
    "mocov2": ["--set", "method_args.queue_size=32", "--set", "method_args.momentum=0.9"],
}


def _run(cmd: list[str], cache: Path) -> None:
    env = {**os.environ, "CL_ZOO_CACHE": str(cache), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-3000:]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_gloo_processes_match_one_process(tmp_path, method):
    data = make_folder(tmp_path / "imgs", classes=2, seed=2)
    args = ["--method", method, *COMMON, *METHODS[method], "--data", str(data)]
    cli = [sys.executable, "-m", "cl_zoo.cli", "pretrain"]
    _run([*cli, *args, "--out", str(tmp_path / "one")], tmp_path / "cache")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "cl_zoo.cli", "pretrain"]
    _run([*torchrun, *args, "--out", str(tmp_path / "two")], tmp_path / "cache")

    one = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)
    two = torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=True)
    assert two["world_size"] == 2 and one["global_step"] == two["global_step"] == 4
    assert one["model"].keys() == two["model"].keys()
    changed = 0
    for key, value in one["model"].items():
        torch.testing.assert_close(two["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
        changed += int(value.is_floating_point() and value.numel() > 1)
    assert changed
    if method == "mocov2":
        queue = [k for k in one["model"] if "queue" in k and one["model"][k].is_floating_point()]
        assert queue and all(one["model"][k].abs().sum() > 0 for k in queue)
    loss = lambda run: [float(r.split(",")[1]) for r in (tmp_path / run / "metrics.csv").read_text().splitlines()[1:]]  # noqa: E731
    assert loss("two") == pytest.approx(loss("one"), rel=1e-5)
    # One writer: exactly one exported model and one log in the run folder.
    assert (tmp_path / "two" / "model" / "config.json").is_file()
