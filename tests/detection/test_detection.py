"""Detection transfer: configs, loaders and evaluators on real data, a few CPU training steps."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from cl_zoo.cli import main
from cl_zoo.detection import (
    DetectionConfig,
    evaluate_detections,
    load_coco,
    load_voc,
    open_datasets,
    train_detector,
    voc_evaluate,
)
from cl_zoo.errors import DataError
from cl_zoo.factory import create_model
from tests.helpers import REPO_ROOT

CONFIGS = REPO_ROOT / "transfer" / "detectron2" / "configs"
MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def _yaml(name: str) -> dict:
    cfg = yaml.safe_load((CONFIGS / name).read_text())
    base = cfg.pop("_BASE_", None)
    if base is None:
        return cfg

    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
        return out

    return merge(_yaml(base), cfg)


def _tuple(text: str | list) -> list[int]:
    return [int(v) for v in re.findall(r"\d+", text)] if isinstance(text, str) else list(text)


@pytest.mark.parametrize(
    "name,iters,steps,sizes",
    [
        ("pascal_voc_R_50_C4_24k.yaml", 24000, [18000, 22000], list(range(480, 801, 32))),
        ("coco_R_50_C4_1x.yaml", 90000, [60000, 80000], list(range(640, 801, 32))),
        ("coco_R_50_C4_2x.yaml", 180000, [120000, 160000], list(range(640, 801, 32))),
        ("coco_R_50_FPN_1x.yaml", 90000, [60000, 80000], list(range(640, 801, 32))),
    ],
)
def test_detectron2_configs_carry_the_protocol(name, iters, steps, sizes):
    cfg = _yaml(name)
    m = cfg["MODEL"]
    assert m["PIXEL_MEAN"] == MEAN and m["PIXEL_STD"] == STD and cfg["INPUT"]["FORMAT"] == "RGB"
    assert m["RESNETS"]["STRIDE_IN_1X1"] is False and m["BACKBONE"]["FREEZE_AT"] == 0
    assert m["RESNETS"]["NORM"] in ("naiveSyncBN", "SyncBN") and cfg["TEST"]["PRECISE_BN"]["ENABLED"] is True
    assert cfg["SOLVER"]["IMS_PER_BATCH"] == 16 and cfg["SOLVER"]["BASE_LR"] == 0.02
    assert cfg["SOLVER"]["MAX_ITER"] == iters and _tuple(cfg["SOLVER"]["STEPS"]) == steps
    assert _tuple(cfg["INPUT"]["MIN_SIZE_TRAIN"]) == sizes and cfg["INPUT"]["MIN_SIZE_TEST"] == 800
    if "FPN" in name:
        assert m["FPN"]["NORM"] == "SyncBN" and m["BACKBONE"]["NAME"] == "build_resnet_fpn_backbone"
    else:
        assert m["ROI_HEADS"]["NAME"] == "Res5ROIHeadsExtraNorm"
    if "voc" in name:
        assert m["ROI_HEADS"]["NUM_CLASSES"] == 20 and cfg["SOLVER"]["WARMUP_ITERS"] == 100
        assert "voc_2012_trainval" in cfg["DATASETS"]["TRAIN"] and "voc_2007_test" in cfg["DATASETS"]["TEST"]
    train_net = (CONFIGS.parent / "train_net.py").read_text()
    assert "class Res5ROIHeadsExtraNorm" in train_net and "PascalVOCDetectionEvaluator" in train_net


def test_bccd_voc_loader_and_voc07_evaluator(bccd_voc_dir):
    root = bccd_voc_dir / "bccd-voc"
    train = load_voc(root, "trainval")
    test = load_voc(root, "test", train.classes)
    assert train.classes == ["Platelets", "RBC", "WBC"] and len(test.samples) == 72
    perfect = [{"boxes": s.boxes, "scores": np.ones(len(s.boxes)), "labels": s.labels} for s in test.samples]
    empty = [{"boxes": np.zeros((0, 4)), "scores": np.zeros(0), "labels": np.zeros(0, int)} for _ in test.samples]
    assert voc_evaluate(test, perfect)["voc_AP50"] == pytest.approx(100.0)
    assert voc_evaluate(test, empty)["voc_AP50"] == 0.0
    # Shifting every box by most of its width drops AP50 well below perfect.
    shifted = [dict(p, boxes=p["boxes"] + np.array([1, 0, 1, 0]) * (p["boxes"][:, 2:3] - p["boxes"][:, 0:1]) * 0.6)
               for p in perfect]
    assert voc_evaluate(test, shifted)["voc_AP50"] < 50.0


def test_voc_folder_without_imagesets_is_a_one_line_error(bccd_voc_dir, tmp_path, capsys):
    root = tmp_path / "voc"
    shutil.copytree(bccd_voc_dir / "bccd-voc" / "Annotations", root / "Annotations")
    (root / "JPEGImages").mkdir()
    with pytest.raises(DataError, match="ImageSets"):
        load_voc(root, "trainval")
    code = main(["detect", "--model", "x", "--data", str(root), "--output", str(tmp_path / "run")])
    assert code == 2 and "ImageSets" in capsys.readouterr().err


def test_raw_checkpoint_with_non_standard_resnet_is_a_one_line_error(bccd_voc_dir, tmp_path, capsys):
    narrow = create_model("resnet18", width=0.5)  # stage widths a stock ResNet-18 cannot hold
    path = tmp_path / "narrow.pth"
    torch.save({"state_dict": {f"module.encoder_q.{k}": v for k, v in narrow.state_dict().items()}}, path)
    out = tmp_path / "run"
    code = main(["detect", "--model", str(path), "--data", str(bccd_voc_dir / "bccd-voc"), "--output", str(out),
                 "--max-iter", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error:") and "\n" not in err, err
    assert "has shape" in err and "non-standard width" in err
    assert not out.exists() or not any(out.iterdir())


def test_coco_bad_boxes_are_skipped_and_counted(tiny_coco_dir, tmp_path):
    src = tiny_coco_dir / "tiny-coco"
    data = json.loads((src / "annotations" / "instances_val2017.json").read_text())
    image = data["images"][0]
    good = sum(1 for a in data["annotations"])
    data["annotations"] += [
        {"id": 10**9, "image_id": image["id"], "category_id": 1, "bbox": [10, 10, 0, 5], "iscrowd": 0, "area": 0},
        {"id": 10**9 + 1, "image_id": image["id"], "category_id": 1, "bbox": [image["width"] - 5, 0, 50, 50],
         "iscrowd": 0, "area": 2500},
        {"id": 10**9 + 2, "image_id": image["id"], "category_id": 1, "bbox": [-30, 5, 20, 20], "iscrowd": 0, "area": 400},
    ]
    ann = tmp_path / "bad.json"
    ann.write_text(json.dumps(data))
    loaded = load_coco(src / "val2017", ann)
    assert loaded.skipped["zero-area boxes"] == 1 and loaded.skipped["out-of-bounds boxes"] == 2
    assert sum(len(s.boxes) for s in loaded.samples) == good
    assert "skipped" in loaded.summary()
    perfect = [{"boxes": s.boxes, "scores": np.ones(len(s.boxes)), "labels": s.labels} for s in loaded.samples]
    metrics = evaluate_detections(loaded, perfect)
    assert metrics["AP"] == pytest.approx(100.0) and metrics["voc_AP50"] == pytest.approx(100.0)


def test_unknown_config_name_is_a_one_line_error(capsys, tmp_path):
    assert main(["detect", "--config", "voc-c5", "--model", "m", "--data", ".", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown detection config 'voc-c5'" in err and err.count("\n") == 1


def test_detectron2_engine_dry_run_names_the_config(capsys, tmp_path):
    from cl_zoo.registry import DEFAULT_MODEL  # a ResNet-18: its depth reaches the command

    assert main(["detect", "--engine", "detectron2", "--config", "coco-fpn-1x", "--model", DEFAULT_MODEL,
                 "--output", str(tmp_path / "run"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "coco_R_50_FPN_1x.yaml" in out and "MODEL.WEIGHTS" in out and "train_net.py" in out
    assert "MODEL.RESNETS.DEPTH 18" in out


def test_torchvision_engine_trains_and_evaluates_on_tiny_coco(tiny_coco_dir, tmp_path):
    root = tiny_coco_dir / "tiny-coco"
    train, val = open_datasets([str(root)], "train2017", None, "val2017")
    cfg = DetectionConfig(head="fpn", batch_size=2, max_iter=2, steps=(1,), warmup_iters=1, min_sizes_train=(96, 128),
                          min_size_test=96, max_size=160, rois_per_image=32, proposals_test=50, workers=0,
                          checkpoint_period=1, val_limit=8)
    torch.manual_seed(0)
    run = train_detector(create_model("resnet18"), train, val, cfg, tmp_path / "run", device="cpu", progress=False)
    assert len(run.losses) == 2 and all(np.isfinite(run.losses))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert set(["AP", "AP50", "AP75", "APs", "APm", "APl", "voc_AP50"]) <= set(report["metrics"])
    assert report["val_images_evaluated"] == 8 and report["iterations"] == 2
    # Resume: one more iteration continues from the saved iteration 2.
    cfg3 = DetectionConfig(**{**cfg.__dict__, "max_iter": 3, "val_limit": 2})
    again = train_detector(create_model("resnet18"), train, val, cfg3, tmp_path / "run", device="cpu",
                           resume=True, progress=False)
    assert len(again.losses) == 1
    assert json.loads((tmp_path / "run" / "report.json").read_text())["resumed_from"] == 2


def test_c4_head_has_extra_norm_and_trains_a_step(bccd_voc_dir, tmp_path):
    root = bccd_voc_dir / "bccd-voc"
    train, val = open_datasets([str(root)], "train", None, None)
    cfg = DetectionConfig(head="c4", norm="frozen", batch_size=1, max_iter=1, steps=(), warmup_iters=1,
                          min_sizes_train=(96,), min_size_test=96, max_size=128, rois_per_image=8, workers=0)
    run = train_detector(create_model("resnet18"), train, None, cfg, None, device="cpu", progress=False)
    head = run.model.roi_heads.box_head
    assert hasattr(head, "res5") and hasattr(head, "norm") and np.isfinite(run.losses[0])
    assert not hasattr(run.model.backbone, "layer4")  # C4: res5 lives in the RoI head only


@pytest.mark.parametrize("head", ["fpn", "c4"])
def test_box_deltas_stay_float32_under_bf16_autocast(head):
    """torchvision's BoxCoder casts anchors to the deltas' dtype: bf16 deltas quantised box corners to
    2-4 px, collapsed small proposals and made the box loss NaN tens of iterations into BCCD runs."""
    from cl_zoo.detection.models import build_faster_rcnn

    # 16 test proposals, not 1000: the C4 head runs res5 on each, and on a CPU without bf16 units
    # (AVX2 only) emulated bf16 made 1000 of them take 111 s; the dtypes do not depend on the count.
    model = build_faster_rcnn(create_model("resnet18"), 3, head=head, min_size=128, max_size=160, rois_per_image=16,
                              proposals_test=16).eval()
    seen = {}
    for name, module in (("rpn", model.rpn.head), ("predictor", model.roi_heads.box_predictor)):
        module.register_forward_hook(lambda _m, _i, out, name=name: seen.setdefault(name, out))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        detections = model([torch.rand(3, 128, 160)])
    objectness, deltas = seen["rpn"]
    scores, boxes = seen["predictor"]
    assert all(t.dtype == torch.float32 for t in [*objectness, *deltas, scores, boxes])
    assert detections[0]["boxes"].dtype == torch.float32
    assert model.rpn.head.conv[0][0].weight.dtype == torch.float32 and "rpn.head.conv.0.0.weight" in model.state_dict()


# ------------------------------------------------------------------------------------------------
# Run sizes, default head, --out (issue 42)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def planned(monkeypatch):
    """``cl-zoo detect`` up to the call that trains: the resolved DetectionConfig and output folder."""
    import cl_zoo.detection.train as train_module
    from cl_zoo.detection.train import DetectionRun

    seen: dict = {}

    def fake_train(backbone, train, val, cfg, output_dir, **kwargs):
        seen.update(cfg=cfg, out=output_dir, backbone=backbone)
        return DetectionRun(backbone, {}, None)

    monkeypatch.setattr(train_module, "train_detector", fake_train)
    return seen


def _detect(bccd_voc_dir, tmp_path, *args: str) -> list[str]:
    return ["detect", "--model", "resnet18", "--random-init", "--data", str(bccd_voc_dir / "bccd-voc"),
            "--out", str(tmp_path / "run"), *args]


def test_cpu_without_a_schedule_runs_cpu_quick_and_says_so(bccd_voc_dir, tmp_path, capsys, planned):
    from cl_zoo.detection.presets import RUN_PRESETS

    quick = RUN_PRESETS["cpu-quick"]
    assert main(_detect(bccd_voc_dir, tmp_path, "--device", "cpu", "--batch-size", "2")) == 0
    cfg = planned["cfg"]
    # the preset's values, except the option given on the command line
    assert (cfg.max_iter, cfg.steps, cfg.min_sizes_train, cfg.max_size, cfg.rois_per_image, cfg.checkpoint_period) == (
        quick.max_iter, quick.steps, quick.min_sizes_train, quick.max_size, quick.rois_per_image, quick.checkpoint_period)
    assert cfg.batch_size == 2 and cfg.lr == quick.lr and cfg.head == "fpn"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: on a CPU without --preset") and "--max-iter 150" in err[0]


def test_an_explicit_schedule_on_a_cpu_is_kept(bccd_voc_dir, tmp_path, capsys, planned):
    assert main(_detect(bccd_voc_dir, tmp_path, "--device", "cpu", "--config", "voc-c4")) == 0
    cfg = planned["cfg"]
    assert (cfg.max_iter, cfg.batch_size, cfg.rois_per_image, cfg.head) == (24000, 16, 512, "c4")
    assert "cpu-quick" not in capsys.readouterr().err
    assert main(_detect(bccd_voc_dir, tmp_path, "--device", "cpu", "--max-iter", "7")) == 0
    cfg = planned["cfg"]
    assert (cfg.max_iter, cfg.batch_size, cfg.max_size) == (7, 16, 1333) and cfg.head is None  # by depth, below
    assert "cpu-quick" not in capsys.readouterr().err


def test_out_is_the_option_and_output_its_hidden_alias(bccd_voc_dir, tmp_path, capsys, planned):
    args = ["detect", "--model", "resnet18", "--random-init", "--data", str(bccd_voc_dir / "bccd-voc"), "--max-iter", "1"]
    assert main([*args, "--output", str(tmp_path / "old")]) == 0 and planned["out"] == str(tmp_path / "old")
    assert main([*args, "--out", str(tmp_path / "a"), "--output", str(tmp_path / "b")]) == 2
    assert "--output is the old name of --out" in capsys.readouterr().err
    assert main(args) == 2 and "Missing option '--out'" in capsys.readouterr().err
    from click.testing import CliRunner

    from cl_zoo.cli import cli

    help_text = CliRunner().invoke(cli, ["detect", "--help"]).output
    assert "--out " in help_text and "--output" not in help_text and "--preset" in help_text


def test_default_head_is_fpn_for_basic_block_resnets_as_in_detectron2(bccd_voc_dir):
    from cl_zoo.detection.detectron2_run import default_preset
    from cl_zoo.detection.models import default_head
    from cl_zoo.detection.presets import get_preset

    for arch, depth in (("resnet18", 18), ("resnet50", 50)):
        voc = (str(bccd_voc_dir / "bccd-voc"),)
        assert default_head(create_model(arch)) == get_preset(default_preset(voc, depth)).head
    train, _ = open_datasets([str(bccd_voc_dir / "bccd-voc")], "train", None, None)
    run = train_detector(create_model("resnet18"), train, None, DetectionConfig(max_iter=0, workers=0), None,
                         device="cpu", progress=False)
    assert run.model.head_kind == "fpn" and not hasattr(run.model.roi_heads.box_head, "res5")


def test_detectron2_engine_takes_the_cpu_preset_but_keeps_its_config(capsys, tmp_path):
    from cl_zoo.registry import DEFAULT_MODEL  # a ResNet-18: the launcher picks its FPN config

    assert main(["detect", "--engine", "detectron2", "--model", DEFAULT_MODEL, "--config", "coco-fpn-1x",
                 "--preset", "cpu-quick", "--rois-per-image", "64", "--out", str(tmp_path / "run"), "--dry-run"]) == 0
    captured = capsys.readouterr()
    words = shlex.split(captured.out)
    value = {key: words[words.index(key) + 1] for key in ("SOLVER.MAX_ITER", "SOLVER.IMS_PER_BATCH",
                                                          "SOLVER.STEPS", "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE")}
    assert value == {"SOLVER.MAX_ITER": "150", "SOLVER.IMS_PER_BATCH": "4", "SOLVER.STEPS": "(100,130)",
                     "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE": "64"}
    assert "coco_R_50_FPN_1x.yaml" in captured.out and captured.err.startswith("preset cpu-quick:")


def test_detect_speaks_the_cli_vocabulary_json_quiet_and_progress(bccd_voc_dir, tmp_path, capsys, monkeypatch):
    """--json puts one JSON summary on stdout (information moves to stderr), -q drops information
    lines and the bar but not results, --progress/--no-progress as everywhere (issue 42)."""
    import cl_zoo.detection.train as train_module
    from cl_zoo.detection.train import DetectionRun

    seen: dict = {}

    def fake_train(backbone, train, val, cfg, output_dir, **kwargs):
        seen.update(kwargs)
        report = Path(output_dir) / "report.json"
        return DetectionRun(backbone, {"AP": 36.74, "AP50": 69.1, "APs": float("nan")}, report)

    monkeypatch.setattr(train_module, "train_detector", fake_train)
    base = _detect(bccd_voc_dir, tmp_path, "--device", "cpu", "--max-iter", "1")
    assert main([*base, "--json"]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)  # stdout is exactly one JSON document
    assert summary == {"engine": "torchvision", "out": str(tmp_path / "run"), "report": str(tmp_path / "run" / "report.json"),
                       "metrics": {"AP": 36.74, "AP50": 69.1, "APs": None}}
    assert "train: " in err and seen["progress"] is True
    assert main([*base, "-q"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["AP 36.74  AP50 69.10  APs nan", f"report: {tmp_path / 'run' / 'report.json'}"]
    assert err == "" and seen["progress"] is False
    assert main([*base, "-q", "--progress"]) == 0 and seen["progress"] is True
    assert main([*base, "--no-progress"]) == 0 and seen["progress"] is False
    capsys.readouterr()
    dry = ["detect", "--engine", "detectron2", "--model", "resnet18", "--random-init", "--data", str(bccd_voc_dir / "bccd-voc"),
           "--out", str(tmp_path / "d2"), "--device", "cpu", "--max-iter", "1", "--dry-run", "--json"]
    assert main(dry) == 0
    command = json.loads(capsys.readouterr().out)
    assert command["dry_run"] is True and command["command"][1].endswith("train_net.py")
