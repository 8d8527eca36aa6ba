"""Ctrl-C in ``cl-zoo pretrain``: the last finished step is kept, whole, and the command that continues
it is printed; ``--resume`` with nothing to resume says so. Ctrl-C is a real SIGINT to this process,
sent at a chosen step (``CL_ZOO_FAULT_INTERRUPT_STEP``) or in the middle of a checkpoint write."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from cl_zoo.train.state import load_state
from tests.helpers import TINY_PRETRAIN, make_folder, run_cli_captured

pytestmark = pytest.mark.usefixtures("isolated_cache", "one_thread")

# 48 images, batch 8: 6 steps an epoch, 2 epochs
RUN = ["pretrain", "--method", "dcl", *TINY_PRETRAIN, "--batch-size", "8", "--epochs", "2", "--knn-every", "0",
       "--workers", "0", "--device", "cpu", "--precision", "fp32"]


@pytest.fixture(autouse=True)
def _ctrl_c_raises_keyboard_interrupt():
    """Python's own SIGINT handler, whatever the suite was started under (a background job inherits
    SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("data") / "train")


def test_ctrl_c_keeps_the_last_step_and_prints_the_resume_command(tmp_path, folder, capsys, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("CL_ZOO_FAULT_INTERRUPT_STEP", "8")  # as the 9th step starts: epoch 1 + 2 steps done
    monkeypatch.setenv("CL_ZOO_PROGRESS_EVERY_S", "0")
    code, _, err = run_cli_captured([*RUN, "--data", str(folder), "--out", str(out)], capsys)
    assert code == 130, err
    ckpt = out / "checkpoint.pt"
    assert f"interrupted: kept epoch 1 + 2/6 steps of 2 (step 8) in {ckpt.resolve()}; to continue, run:" in err
    assert err.rstrip().endswith(f"  cl-zoo pretrain --out {out.resolve()} --resume"), err
    assert "Traceback" not in err and "\r" not in err  # no bar frames: stderr is not a terminal
    state = load_state(ckpt)
    assert (state["epoch"], state["global_step"], state["partial_epoch"]["step"]) == (1, 8, 2)

    monkeypatch.delenv("CL_ZOO_FAULT_INTERRUPT_STEP")
    code, printed, err = run_cli_captured(["pretrain", "--out", str(out), "--resume", "--no-progress"], capsys)
    assert code == 0, err
    assert "resumed" in printed and "at epoch 1/2 + 2/6 steps" in printed
    # ... and ends where the uninterrupted run ends, bit for bit: the saved state was whole.
    whole = tmp_path / "whole"
    assert run_cli_captured([*RUN, "--no-progress", "--data", str(folder), "--out", str(whole)], capsys)[0] == 0
    resumed, straight = load_state(ckpt)["model"], load_state(whole / "checkpoint.pt")["model"]
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[k], straight[k]) for k in resumed)


def test_ctrl_c_during_a_checkpoint_write_waits_for_it(tmp_path, folder, capsys, monkeypatch):
    """The Ctrl-C lands inside torch.save: the write finishes (no torn file, no traceback from the zip
    writer), then the run stops and says what it kept."""
    import cl_zoo.train.state as state_module

    real_save = state_module.atomic_save_torch
    writes: list[int] = []

    def save_hit_by_ctrl_c(path, obj, **kwargs):
        writes.append(obj["global_step"])
        if writes == [4]:  # the first write, at step 4
            os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode: inside the write
        return real_save(path, obj, **kwargs)

    monkeypatch.setattr(state_module, "atomic_save_torch", save_hit_by_ctrl_c)
    out = tmp_path / "run"
    code, _, err = run_cli_captured([*RUN, "--no-progress", "--checkpoint-every", "4", "--data", str(folder),
                                     "--out", str(out)], capsys)
    assert code == 130 and "Traceback" not in err and "RuntimeError" not in err, err
    assert f"interrupted: kept epoch 0 + 4/6 steps of 2 (step 4) in {(out / 'checkpoint.pt').resolve()}" in err
    assert load_state(out / "checkpoint.pt")["global_step"] == 4
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".") or "tmp" in p.name) == []  # no temp left


def test_resume_with_nothing_to_resume_is_one_line(tmp_path, folder, capsys):
    out = tmp_path / "run"
    out.mkdir()
    code, _, err = run_cli_captured([*RUN, "--no-progress", "--data", str(folder), "--out", str(out), "--resume"], capsys)
    assert code == 2
    assert err.strip() == (f"error: --resume: nothing to resume, {out} holds no checkpoint.pt (no step was saved); "
                           "run without --resume to start the run")
    assert list(out.iterdir()) == []


def test_progress_lines_show_each_shown_step_s_own_loss(tmp_path, folder, capsys, monkeypatch):
    """Off a terminal the bar is a line per update here (interval 0); each line's loss is that step's,
    not the last logged step's (which repeated for up to ten steps)."""
    monkeypatch.setenv("CL_ZOO_PROGRESS_EVERY_S", "0")
    code, _, err = run_cli_captured([*RUN, "--epochs", "1", "--data", str(folder), "--out", str(tmp_path / "run")], capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("epoch 1/1: ")]
    assert [line.split()[2] for line in lines] == [f"{i}/6" for i in range(1, 7)]
    losses = [line.split("loss=")[1].split()[0] for line in lines]
    assert len(set(losses)) == len(losses), lines


def test_ctrl_c_at_an_epoch_end_keeps_every_step_and_resumes_without_a_duplicate_row(tmp_path, folder, capsys, monkeypatch):
    """Ctrl-C after an epoch's last step, before its end was recorded (the kNN monitor, the barrier):
    the steps are kept and the resumed run redoes only the epoch's end."""
    import cl_zoo.train.loop as loop

    barrier, calls = loop.launch.barrier, []

    def barrier_hit_by_ctrl_c(env):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return barrier(env)

    monkeypatch.setattr(loop.launch, "barrier", barrier_hit_by_ctrl_c)
    out = tmp_path / "run"
    code, _, err = run_cli_captured([*RUN, "--no-progress", "--data", str(folder), "--out", str(out)], capsys)
    assert code == 130 and f"interrupted: kept epoch 1 of 2 (step 6) in {(out / 'checkpoint.pt').resolve()}" in err, err
    monkeypatch.undo()
    code, _, err = run_cli_captured(["pretrain", "--out", str(out), "--resume", "--no-progress"], capsys)
    assert code == 0, err
    state = load_state(out / "checkpoint.pt")
    assert (state["epoch"], state["global_step"]) == (2, 12)
    assert [row["epoch"] for row in state["history"]] == [1, 2]
