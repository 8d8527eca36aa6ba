"""``cl-zoo detect``'s numbers are checked before any work (both engines), presets follow --max-iter,
a COCO folder's refusal names the split option that works, and --help says what the engine needs."""

from __future__ import annotations

import pytest

from cl_zoo.detection.presets import get_run_preset
from tests.helpers import run_cli_captured


@pytest.mark.parametrize("args,words", [
    (["--engine", "detectron2", "--dry-run", "--freeze-at", "9"], "--freeze-at must be >= 0 and <= 5, got 9"),
    (["--freeze-at", "-1"], "--freeze-at must be >= 0 and <= 5, got -1"),
    (["--lr", "nan"], "--lr must be a finite number, got nan"),
    (["--lr", "-0.1"], "--lr must be > 0 and <= 100, got -0.1"),
    (["--max-size", "1000000"], "--max-size must be >= 32 and <= 8192, got 1000000"),
    (["--min-size-train", "96,0"], "--min-size-train[1] must be >= 32"),
    (["--steps", "30,10"], "--steps must increase, got [30, 10]"),
    (["--seed", "-3"], "--seed must be >= 0"),
    (["--val-limit", "0"], "--val-limit must be positive, got 0"),
])
def test_detect_numbers_are_one_line_before_any_work(tmp_path, capsys, args, words):
    out = tmp_path / "run"
    code, _, err = run_cli_captured(["detect", "--model", "resnet18", "--data", str(tmp_path), "--device", "cpu",
                                     "--out", str(out), *args], capsys)
    assert code == 2 and err.startswith("error: ") and words in err, err
    assert "\n" not in err.strip() and not out.exists()


def test_cpu_quick_lr_steps_follow_max_iter():
    preset = get_run_preset("cpu-quick")
    assert (preset.max_iter, preset.steps, preset.warmup_iters) == (150, (100, 130), 50)
    short = preset.scaled_to(60)  # the steps stayed at 100/130: a 60-iteration run never decayed
    assert (short.max_iter, short.steps, short.warmup_iters) == (60, (40, 52), 20)
    assert "--max-iter 60 --steps 40,52 --warmup-iters 20" in short.as_options()
    assert preset.scaled_to(150) is preset


def test_protocol_steps_follow_max_iter():
    from cl_zoo.cli.detect import _protocol_steps
    from cl_zoo.detection.presets import get_preset
    from cl_zoo.detection.train import DetectionConfig

    assert _protocol_steps(get_preset("voc-c4"), 2400, DetectionConfig()) == (1800, 2200)
    assert _protocol_steps(None, None, DetectionConfig()) == (18000, 22000)


def test_a_coco_folder_refusal_names_the_split_option(tiny_coco_dir, tmp_path, capsys):
    root = tiny_coco_dir / "tiny-coco"
    base = ["detect", "--model", "resnet18", "--data", str(root), "--device", "cpu", "--out", str(tmp_path / "run")]
    code, _, err = run_cli_captured(base, capsys)
    assert code == 2 and err.strip() == (f"error: {root} is a COCO folder without annotations/instances_trainval.json; "
                                         "its splits are train2017, val2017: pass --train-split train2017")
    code, _, err = run_cli_captured([*base, "--train-split", "train2017"], capsys)
    assert code == 2 and err.strip().endswith("its splits are train2017, val2017: pass --val-split val2017")


def test_help_says_what_the_torchvision_engine_needs(capsys):
    code, out, _ = run_cli_captured(["detect", "--help"], capsys)
    text = " ".join(out.split())
    assert code == 0 and "without extra installs" not in text
    assert "its COCO AP needs pycocotools" in text and "--val-split none trains without it" in text
