"""``detect --engine detectron2``: every option reaches the train_net.py command or is refused; user
folders are checked and registered under their own names. The tests at the end run detectron2 itself
and skip where it is not installed (it is not on PyPI)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch
import torchvision

from cl_zoo.bundled import bundled_folder
from cl_zoo.cli import main
from cl_zoo.detection.detectron2_run import Detectron2Options, _tuple, plan_detectron2_run
from tests.helpers import REPO_ROOT

HAS_DETECTRON2 = importlib.util.find_spec("detectron2") is not None
needs_detectron2 = pytest.mark.skipif(not HAS_DETECTRON2, reason="detectron2 is not installed (not on PyPI; "
                                      "build it from its repository to run these)")


MODELS: dict[str, str] = {}  # depth -> a torchvision state-dict file (random weights)


@pytest.fixture(scope="module", autouse=True)
def backbones(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The launcher reads the backbone's depth (also for --dry-run), so the model must be real."""
    folder = tmp_path_factory.mktemp("backbones")
    for depth in (18, 50):
        torch.save(getattr(torchvision.models, f"resnet{depth}")().state_dict(), folder / f"r{depth}.pth")
        MODELS[f"r{depth}"] = str(folder / f"r{depth}.pth")


def _dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["detect", "--engine", "detectron2", "--model", MODELS["r50"], "--dry-run", *args]) == 0, capsys.readouterr().err
    return shlex.split(capsys.readouterr().out)


def _value(command: list[str], key: str) -> str:
    return command[command.index(key) + 1]


def _small_voc(bccd: Path, target: Path, train: int = 4, test: int = 2) -> Path:
    """A VOC folder of a few BCCD images (its own split files, the real images and annotations)."""
    ids = (bccd / "ImageSets" / "Main" / "trainval.txt").read_text().split()
    (target / "ImageSets" / "Main").mkdir(parents=True)
    (target / "JPEGImages").symlink_to(bccd / "JPEGImages")
    (target / "Annotations").symlink_to(bccd / "Annotations")
    (target / "ImageSets" / "Main" / "trainval.txt").write_text("\n".join(ids[:train]) + "\n")
    (target / "ImageSets" / "Main" / "test.txt").write_text("\n".join(ids[train:train + test]) + "\n")
    return target


def test_every_option_reaches_the_command(bccd_voc_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    root = bccd_voc_dir / "bccd-voc"
    cmd = _dry_run(capsys, "--data", str(root), "--output", "runs/voc", "--device", "cpu", "--max-iter", "7",
                   "--batch-size", "4", "--lr", "0.005", "--steps", "3,5", "--warmup-iters", "2",
                   "--min-size-train", "480,512", "--min-size-test", "500", "--max-size", "900", "--seed", "4",
                   "--rois-per-image", "64", "--proposals-test", "300", "--checkpoint-period", "5", "--workers", "1",
                   "--freeze-at", "2", "--norm", "frozen", "--resume", "--", "TEST.PRECISE_BN.NUM_ITER", "3")
    folder = bundled_folder("detectron2")
    assert cmd[1] == str(folder / "train_net.py")
    assert _value(cmd, "--config-file") == str(folder / "configs" / "pascal_voc_R_50_C4_24k.yaml")  # VOC default
    expected = {
        "MODEL.DEVICE": "cpu", "SOLVER.MAX_ITER": "7", "SOLVER.IMS_PER_BATCH": "4", "SOLVER.BASE_LR": "0.005",
        "SOLVER.STEPS": "(3,5)", "SOLVER.WARMUP_ITERS": "2", "INPUT.MIN_SIZE_TRAIN": "(480,512)",
        "INPUT.MIN_SIZE_TEST": "500", "INPUT.MAX_SIZE_TRAIN": "900", "INPUT.MAX_SIZE_TEST": "900", "SEED": "4",
        "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE": "64", "MODEL.RPN.POST_NMS_TOPK_TEST": "300",
        "SOLVER.CHECKPOINT_PERIOD": "5", "DATALOADER.NUM_WORKERS": "1", "MODEL.BACKBONE.FREEZE_AT": "2",
        "MODEL.RESNETS.NORM": "FrozenBN", "MODEL.ROI_HEADS.NUM_CLASSES": "3", "TEST.PRECISE_BN.NUM_ITER": "3",
        "DATASETS.TRAIN": '("cl_zoo_train_0",)', "DATASETS.TEST": '("cl_zoo_val",)',
        # a relative --output lands where the user ran, whatever directory train_net.py runs in
        "OUTPUT_DIR": str(tmp_path / "runs" / "voc"), "MODEL.WEIGHTS": str(tmp_path / "runs" / "voc" / "model.pkl"),
        "--num-gpus": "1", "--voc-classes": "Platelets,RBC,WBC",
    }
    assert {key: _value(cmd, key) for key in expected} == expected
    assert "--resume" in cmd
    voc = [cmd[i + 1:i + 4] for i, word in enumerate(cmd) if word == "--voc"]
    assert voc == [["cl_zoo_train_0", str(root), "trainval"], ["cl_zoo_val", str(root), "test"]]


def test_lr_follows_the_linear_scaling_rule_and_builtin_datasets_stay(capsys, tmp_path):
    cmd = _dry_run(capsys, "--config", "coco-fpn-1x", "--output", str(tmp_path), "--device", "cpu",
                   "--batch-size", "8", "--val-split", "none")
    assert _value(cmd, "SOLVER.BASE_LR") == "0.01" and _value(cmd, "DATASETS.TEST") == "()"
    assert "DATASETS.TRAIN" not in cmd and "--voc" not in cmd and "MODEL.ROI_HEADS.NUM_CLASSES" not in cmd
    assert "SOLVER.MAX_ITER" not in cmd  # not given: the config's protocol schedule stands
    # --workers not given: the usable CPUs, as a number detectron2's config accepts (not "None")
    from cl_zoo.data.workers import default_workers

    assert _value(cmd, "DATALOADER.NUM_WORKERS") == str(default_workers())


def test_coco_folder_is_registered_with_its_category_count(tiny_coco_dir, tmp_path, capsys):
    root = tiny_coco_dir / "tiny-coco"
    cmd = _dry_run(capsys, "--data", str(root), "--output", str(tmp_path), "--device", "cpu")
    categories = json.loads((root / "annotations" / "instances_train2017.json").read_text())["categories"]
    assert _value(cmd, "MODEL.ROI_HEADS.NUM_CLASSES") == str(len(categories))
    assert _value(cmd, "--config-file").endswith("coco_R_50_C4_1x.yaml")
    coco = [cmd[i + 1:i + 4] for i, word in enumerate(cmd) if word == "--coco"]
    assert coco == [["cl_zoo_train_0", str(root / "annotations" / "instances_train2017.json"), str(root / "train2017")],
                    ["cl_zoo_val", str(root / "annotations" / "instances_val2017.json"), str(root / "val2017")]]


@pytest.mark.parametrize("args,message", [
    (["--val-limit", "5"], "--val-limit is not available with --engine detectron2"),
    (["--head", "fpn"], "--head fpn does not match --config's C4 model"),
    (["--max-iter", "3", "--", "SOLVER.MAX_ITER", "9"], "SOLVER.MAX_ITER is set by --max-iter"),
    (["--", "SOLVER.IMS_PER_BATCH", "8"], "SOLVER.IMS_PER_BATCH is set by --batch-size"),
    (["--", "SOLVER.MAX_ITER"], "KEY VALUE pairs"),
    (["--num-gpus", "2"], "--num-gpus 2 needs CUDA"),
    (["--batch-size", "0"], "--batch-size must be positive"),
    (["--val-data", ".", "--val-split", "none"], "nothing would be evaluated"),
])
def test_options_detectron2_cannot_honour_are_refused_in_one_line(bccd_voc_dir, tmp_path, capsys, args, message):
    out = tmp_path / "run"
    code = main(["detect", "--engine", "detectron2", "--model", MODELS["r50"], "--data", str(bccd_voc_dir / "bccd-voc"),
                 "--output", str(out), "--device", "cpu", "--dry-run", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.startswith("error:") and err.count("\n") == 1, err
    assert not out.exists()


def test_without_data_the_split_options_are_refused(capsys, tmp_path):
    code = main(["detect", "--engine", "detectron2", "--config", "voc-c4", "--model", MODELS["r50"], "--output", str(tmp_path),
                 "--device", "cpu", "--train-split", "train", "--dry-run"])
    assert code == 2 and "--train-split needs --data" in capsys.readouterr().err
    code = main(["detect", "--engine", "detectron2", "--model", MODELS["r50"], "--output", str(tmp_path), "--dry-run"])
    assert code == 2 and "needs --config" in capsys.readouterr().err


def test_torchvision_engine_refuses_detectron2_only_options(capsys, tmp_path):
    code = main(["detect", "--model", MODELS["r50"], "--data", ".", "--output", str(tmp_path), "--dry-run"])
    assert code == 2 and "--dry-run applies to --engine detectron2 only" in capsys.readouterr().err


def test_voc_folders_detectron2_cannot_read_are_refused_before_running(bccd_voc_dir, tmp_path, capsys):
    voc = _small_voc(bccd_voc_dir / "bccd-voc", tmp_path / "voc")
    (voc / "JPEGImages").unlink()
    (voc / "JPEGImages").mkdir()
    first = (voc / "ImageSets" / "Main" / "trainval.txt").read_text().split()[0]
    for image_id in (voc / "ImageSets" / "Main" / "trainval.txt").read_text().split():
        shutil.copy(bccd_voc_dir / "bccd-voc" / "JPEGImages" / f"{image_id}.jpg", voc / "JPEGImages" / f"{image_id}.jpg")
    (voc / "JPEGImages" / f"{first}.jpg").rename(voc / "JPEGImages" / f"{first}.png")
    code = main(["detect", "--engine", "detectron2", "--model", MODELS["r50"], "--data", str(voc), "--val-split", "none",
                 "--output", str(tmp_path / "run"), "--device", "cpu", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and f"(first: {first}.jpg)" in err and "JPEGImages/<id>.jpg" in err and err.count("\n") == 1


def test_mixed_voc_and_coco_are_refused(bccd_voc_dir, tiny_coco_dir, tmp_path):
    options = Detectron2Options(preset="voc-c4", data=(str(bccd_voc_dir / "bccd-voc"),), device="cpu",
                                val_data=str(tiny_coco_dir / "tiny-coco"), val_split="val2017")
    with pytest.raises(Exception, match="mix VOC and COCO"):
        plan_detectron2_run(options, tmp_path)


def test_tuple_literals_are_what_yacs_reads() -> None:
    assert _tuple((1,)) == "(1,)" and _tuple((3, 5)) == "(3,5)" and _tuple(()) == "()"
    assert _tuple(("a", "b")) == '("a","b")'


# ---------------------------------------------------------------------------------- detectron2 itself
def _train_net():
    spec = importlib.util.spec_from_file_location("cl_zoo_train_net", bundled_folder("detectron2") / "train_net.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_detectron2
def test_train_net_registers_the_folders_and_merges_every_override(bccd_voc_dir, tmp_path):
    from detectron2.config import get_cfg
    from detectron2.data import DatasetCatalog
    from detectron2.evaluation import PascalVOCDetectionEvaluator

    train_net = _train_net()
    voc = _small_voc(bccd_voc_dir / "bccd-voc", tmp_path / "voc")
    options = Detectron2Options(data=(str(voc),), device="cpu", max_iter=2, steps=(1,), min_sizes_train=(320, 352),
                                norm="frozen", extra=("TEST.PRECISE_BN.NUM_ITER", "2"))
    run = plan_detectron2_run(options, tmp_path / "run")
    args = train_net.argument_parser().parse_args(run.command()[2:])
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)  # yacs type-checks each value against the config
    assert cfg.MODEL.DEVICE == "cpu" and cfg.SOLVER.STEPS == (1,) and cfg.INPUT.MIN_SIZE_TRAIN == (320, 352)
    assert cfg.MODEL.ROI_HEADS.NUM_CLASSES == 3 and cfg.DATASETS.TRAIN == ("cl_zoo_train_0",)
    assert train_net.register_datasets(args) == ["Platelets", "RBC", "WBC"]
    dicts = DatasetCatalog.get("cl_zoo_train_0")
    assert len(dicts) == 4 and {a["category_id"] for d in dicts for a in d["annotations"]} <= {0, 1, 2}
    assert isinstance(train_net.Trainer.build_evaluator(cfg, "cl_zoo_val"), PascalVOCDetectionEvaluator)


@needs_detectron2
@pytest.mark.slow
def test_detectron2_trains_and_evaluates_a_voc_folder_of_its_own_classes(bccd_voc_dir, tmp_path, monkeypatch, capsys):
    import torch
    import torchvision

    monkeypatch.chdir(tmp_path)
    voc = _small_voc(bccd_voc_dir / "bccd-voc", tmp_path / "voc", train=2, test=2)
    torch.save(torchvision.models.resnet50().state_dict(), tmp_path / "r50.pth")
    code = main(["detect", "--engine", "detectron2", "--model", "r50.pth", "--data", str(voc), "--output", "run",
                 "--device", "cpu", "--max-iter", "1", "--batch-size", "1", "--min-size-train", "256",
                 "--min-size-test", "256", "--max-size", "320", "--rois-per-image", "16", "--proposals-test", "10",
                 "--workers", "0", "--", "TEST.PRECISE_BN.NUM_ITER", "1"])
    assert code == 0, capsys.readouterr().err
    log = (tmp_path / "run" / "log.txt").read_text()
    assert (tmp_path / "run" / "model_final.pth").is_file()
    assert "Evaluating cl_zoo_val using 2007 metric" in log and "copypaste: AP,AP50,AP75" in log
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["engine"] == "detectron2" and report["overrides"]["SOLVER.MAX_ITER"] == "1"
    assert set(report["metrics"]) == {"voc_AP", "voc_AP50", "voc_AP75"} and report["val_data"][0].endswith(" test")
    assert report["backbone"]["file_sha256"] and "report: " in capsys.readouterr().out


def test_resnet18_gets_its_depth_and_the_fpn_config_and_c4_is_refused(bccd_voc_dir, tmp_path, capsys):
    root = str(bccd_voc_dir / "bccd-voc")
    base = ["detect", "--engine", "detectron2", "--model", MODELS["r18"], "--data", root, "--output", str(tmp_path), "--dry-run"]
    assert main(base) == 0
    cmd = shlex.split(capsys.readouterr().out)
    assert _value(cmd, "--config-file").endswith("coco_R_50_FPN_1x.yaml")  # the C4 head needs bottleneck blocks
    assert _value(cmd, "MODEL.RESNETS.DEPTH") == "18" and _value(cmd, "MODEL.RESNETS.RES2_OUT_CHANNELS") == "64"
    assert main([*base, "--config", "voc-c4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ResNet-18 backbone cannot use --config voc-c4" in err
    assert main([*base[:4], MODELS["r50"], *base[5:]]) == 0
    assert "MODEL.RESNETS.DEPTH" not in capsys.readouterr().out  # the configs' own ResNet-50


def test_the_report_is_made_from_this_runs_results_under_the_torchvision_names(bccd_voc_dir, tmp_path, monkeypatch, capsys):
    """train_net.py's eval_results.json becomes report.json with the torchvision engine's metric names
    and the card's identity; a stale results file never does. detectron2 itself is faked here."""
    import importlib.util as util

    import cl_zoo.detection.detectron2_run as detectron2_run

    real_find_spec = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: object() if name == "detectron2" else real_find_spec(name, *a))
    out = tmp_path / "run"
    out.mkdir()
    (out / "eval_results.json").write_text(json.dumps({"cl_zoo_val": {"bbox": {"AP": 1.0, "AP50": 2.0, "AP75": 3.0}}}))
    launched = []

    def fake_train_net(command):
        launched.append(command)
        assert not (out / "eval_results.json").exists(), "an earlier run's results must be gone before a run starts"
        (out / "eval_results.json").write_text(json.dumps(
            {"cl_zoo_val": {"bbox": {"AP": 48.5, "AP50": 83.25, "AP75": 50.0, "AP-RBC": float("nan")}}}))
        return 0

    monkeypatch.setattr(detectron2_run.subprocess, "call", fake_train_net)
    card = REPO_ROOT / "model_cards" / "cacr_resnet18.imagenette64_cpu"
    voc = _small_voc(bccd_voc_dir / "bccd-voc", tmp_path / "voc")
    args = ["detect", "--engine", "detectron2", "--model", str(card), "--data", str(voc), "--output", str(out),
            "--device", "cpu", "--max-iter", "3", "--seed", "2"]
    assert main(args) == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["metrics"] == {"voc_AP": 48.5, "voc_AP50": 83.25, "voc_AP75": 50.0}
    assert report["engine"] == "detectron2" and report["config_file"] == "coco_R_50_FPN_1x.yaml"
    assert report["overrides"]["SEED"] == "2" and report["iterations"] == 3 and report["precision"] == "fp32"
    files = json.loads((card / "config.json").read_text())["files"]
    assert report["backbone"]["checkpoint_files_sha256"] == files and report["val_data"] == [f"voc: {voc} test"]

    # --random-init: the torchvision engine's seeded random weights, exported and reported as such.
    monkeypatch.setattr(detectron2_run.subprocess, "call", fake_train_net)
    assert main([*args, "--random-init"]) == 0, capsys.readouterr().err
    backbone = json.loads((out / "report.json").read_text())["backbone"]
    assert backbone["source"] == "random-init" and backbone["architecture"] == "resnet18" and "seed 2" in backbone["name"]
    from cl_zoo.eval.baseline import load_model_or_baseline
    from cl_zoo.eval.features import model_identity

    assert backbone["weights_sha256"] == model_identity(load_model_or_baseline(str(card), True, 2))["weights_sha256"]

    def no_bbox(command):
        (out / "eval_results.json").write_text(json.dumps({"cl_zoo_val": {"segm": {}}}))
        return 0

    monkeypatch.setattr(detectron2_run.subprocess, "call", no_bbox)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no bbox results" in err
    monkeypatch.setattr(detectron2_run.subprocess, "call", lambda command: 0)  # evaluated nothing, wrote nothing
    assert main(args) == 2
    assert "eval_results.json" in capsys.readouterr().err
