"""Kill a run mid-epoch, resume it, and get the uninterrupted run's weights; NaN stops cleanly."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cl_zoo.errors import ClZooError
from tests.helpers import make_folder

# ResNet (BatchNorm buffers), SGD momentum state and a cosine schedule: everything resume must restore.
ARGS = [
    "--method", "dcl", "--arch", "resnet18_cifar", "--set", "model_args.width=0.125",
    "--set", "method_args.head_hidden_dim=32", "--set", "method_args.head_out_dim=16",
    "--set", "data.augment=cifar", "--image-size", "16", "--batch-size", "16", "--epochs", "3",
    "--lr", "0.3", "--knn-every", "0", "--workers", "1", "--no-progress",
]
STEPS_PER_EPOCH = 3  # 48 images / batch 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("resume") / "imgs")


def _run(args: list[str], env_extra: dict[str, str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CL_ZOO_CACHE": str(cache), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **env_extra}
    return subprocess.run([sys.executable, "-m", "cl_zoo.cli", "pretrain", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_kill_mid_epoch_then_resume_matches_uninterrupted(tmp_path, folder):
    cache = tmp_path / "cache"
    full = _run([*ARGS, "--data", str(folder), "--out", str(tmp_path / "full")], {}, cache)
    assert full.returncode == 0, full.stderr[-2000:]

    killed_dir = tmp_path / "killed"
    kill_step = STEPS_PER_EPOCH + 1  # the second step of epoch 2
    killed = _run([*ARGS, "--data", str(folder), "--out", str(killed_dir)], {"CL_ZOO_FAULT_KILL_STEP": str(kill_step)}, cache)
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = torch.load(killed_dir / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and state["global_step"] == STEPS_PER_EPOCH
    assert not list(killed_dir.glob(".checkpoint.pt.*"))  # no temp file left behind as the checkpoint
    assert not (killed_dir / "model").exists()
    from cl_zoo.factory import load_pretrained
    from cl_zoo.train.loop import export_run

    exported = export_run(killed_dir, tmp_path / "partial")  # what a run stopped at a deadline ships
    partial = load_pretrained(str(exported))
    assert partial.pretrained_cfg.epochs == 1 and partial.pretrained_cfg.method == "dcl"
    torch.testing.assert_close(partial.state_dict()["conv1.weight"], state["model"]["backbone.conv1.weight"])

    resumed = _run(["--out", str(killed_dir), "--resume", "--no-progress"], {}, cache)  # recipe and data from the run
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed" in resumed.stdout and "at epoch 1/3" in resumed.stdout

    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    b = torch.load(killed_dir / "checkpoint.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == 3 and a["global_step"] == b["global_step"] == 3 * STEPS_PER_EPOCH
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=0, atol=0, msg=key)
    rows_full = (tmp_path / "full" / "metrics.csv").read_text().splitlines()
    rows_resumed = (killed_dir / "metrics.csv").read_text().splitlines()
    assert len(rows_resumed) == len(rows_full) == 4  # header + 3 epochs, epoch 2 not counted twice
    loss = lambda rows: [float(r.split(",")[1]) for r in rows[1:]]  # noqa: E731
    assert loss(rows_resumed) == pytest.approx(loss(rows_full), rel=1e-6)

    # The finished run now resumes as another method: refused in one line, nothing trained.
    other = _run(["--out", str(killed_dir), "--resume", "--method", "simclr", "--set", "data.augment=cifar"], {}, cache)
    assert other.returncode == 2
    err = other.stderr.strip()
    assert err.startswith("error:") and "dcl run" in err and "simclr" in err and "\n" not in err


def test_nan_loss_stops_with_clear_error_and_keeps_checkpoint(tmp_path, folder, monkeypatch):
    from cl_zoo.train.loop import NonFiniteLossError, Trainer
    from cl_zoo.train.recipe import Recipe

    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    recipe = Recipe.from_dict({
        "method": "dcl", "arch": "pixels", "model_args": {"input_size": 16},
        "method_args": {"head_hidden_dim": 16, "head_out_dim": 8}, "data": {"image_size": 16, "augment": "cifar"},
        "epochs": 3, "batch_size": 16, "knn_every": 0, "workers": 1,
    })
    run = tmp_path / "run"
    monkeypatch.setenv("CL_ZOO_FAULT_NAN_STEP", str(STEPS_PER_EPOCH + 2))  # third step of epoch 2
    trainer = Trainer(recipe, folder, run, progress=False)
    digest_before: list[str] = []
    original_save = trainer._save

    def spy(epoch, step, history):  # noqa: ANN001
        original_save(epoch, step, history)
        digest_before.append(hashlib.sha256((run / "checkpoint.pt").read_bytes()).hexdigest())

    trainer._save = spy
    with pytest.raises(NonFiniteLossError) as err:
        trainer.fit()
    message = str(err.value)
    assert isinstance(err.value, ClZooError) and "\n" not in message
    assert "loss became nan at epoch 2 step 3" in message and "checkpoint" in message and "intact" in message
    assert len(digest_before) == 1  # epoch 1 was saved, epoch 2 never was
    assert hashlib.sha256((run / "checkpoint.pt").read_bytes()).hexdigest() == digest_before[0]
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    assert not (run / "model").exists()


@pytest.mark.slow
@pytest.mark.parametrize("path", ["--in-memory", "--stream"])
def test_kill_mid_epoch_with_step_checkpoints_resumes_mid_epoch_bit_for_bit(tmp_path, folder, path):
    """--checkpoint-every keeps progress inside an epoch; the resumed run equals an uninterrupted one."""
    cache = tmp_path / "cache"
    full = _run([*ARGS, path, "--data", str(folder), "--out", str(tmp_path / "full")], {}, cache)
    assert full.returncode == 0, full.stderr[-2000:]

    killed_dir = tmp_path / "killed"
    kill_step = STEPS_PER_EPOCH + 2  # before the third step of epoch 2: two of its steps are done
    killed = _run([*ARGS, path, "--checkpoint-every", "1", "--data", str(folder), "--out", str(killed_dir)],
                  {"CL_ZOO_FAULT_KILL_STEP": str(kill_step)}, cache)
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = torch.load(killed_dir / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and state["global_step"] == kill_step  # epoch-granular checkpoints would say 3
    assert state["partial_epoch"]["step"] == 2 and state["partial_epoch"]["seen"] == 2

    resumed = _run(["--out", str(killed_dir), "--resume", "--no-progress", path], {}, cache)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "at epoch 1/3 + 2/3 steps" in resumed.stdout

    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    b = torch.load(killed_dir / "checkpoint.pt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 3 * STEPS_PER_EPOCH and "partial_epoch" not in b
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=0, atol=0, msg=key)
    loss = lambda d: [float(r.split(",")[1]) for r in (d / "metrics.csv").read_text().splitlines()[1:]]  # noqa: E731
    assert loss(killed_dir) == loss(tmp_path / "full")  # epoch 2's mean loss includes the steps before the kill


def test_a_collapsed_run_says_so_after_each_epoch(tmp_path, folder, monkeypatch, capsys):
    """A head whose last layer outputs a constant maps every image to one point (a real collapse: DCL's
    gradient is zero there, so it stays); the run must say so in a warning line, a healthy one must not."""
    from cl_zoo.train.loop import COLLAPSE_POS_SIM, Trainer, collapse_warning
    from cl_zoo.train.recipe import Recipe

    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    recipe = Recipe.from_dict({
        "method": "dcl", "arch": "pixels", "model_args": {"input_size": 16},
        "method_args": {"head_hidden_dim": 16, "head_out_dim": 8}, "data": {"image_size": 16, "augment": "cifar"},
        "epochs": 2, "batch_size": 16, "knn_every": 0, "workers": 1,
    })
    healthy = Trainer(recipe, folder, tmp_path / "healthy", progress=False)
    healthy.fit()
    assert "collapsed" not in capsys.readouterr().out

    collapsed = Trainer(recipe, folder, tmp_path / "collapsed", progress=False)
    last = [m for m in collapsed.method.head.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.linspace(-1, 1, last.bias.numel()))
    collapsed.fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if "collapsed" in line]
    assert [line.split(":")[0] for line in lines] == ["warning", "warning"]
    assert "epoch 1:" in lines[0] and "epoch 2:" in lines[1] and "schedule.warmup_epochs" in lines[0]

    assert collapse_warning(3, COLLAPSE_POS_SIM - 1e-4) is None and collapse_warning(3, None) is None
    assert collapse_warning(3, float("nan")) is None
    assert collapse_warning(3, 0.9996).startswith("warning: epoch 3: the embeddings collapsed (mean cosine between an image's views 0.9996)")
