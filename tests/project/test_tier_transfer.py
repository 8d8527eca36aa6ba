"""Issue 23's transfer table: scripts/tier_transfer.py runs the documented BCCD fine-tune and CIFAR-10
probe, scripts/bundle_cpu_tier.py checks and summarises the reports into the card, and
scripts/cpu_tier_table.py renders the README's transfer table (on fake reports: the runs take hours)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from cl_zoo.cli import main
from tests.helpers import REPO_ROOT

REPO = REPO_ROOT
CARDS = REPO / "model_cards"
sys.path.insert(0, str(REPO / "scripts"))
import bundle_cpu_tier  # noqa: E402
import cpu_tier_table  # noqa: E402
import tier_transfer  # noqa: E402
from bundle_cpu_tier import BCCD_SCHEDULE, transfer_file  # noqa: E402


@pytest.mark.parametrize("random_init", [False, True])
def test_detection_command_runs_the_documented_schedule(bccd_voc_dir: Path, tmp_path: Path, monkeypatch, random_init: bool) -> None:
    """The command tier_transfer.py builds reaches train_detector as exactly BCCD_SCHEDULE, with the
    backbone's identity (the card's digests, or a seeded random init of its architecture)."""
    import cl_zoo.detection.train as detection_train

    seen = {}

    def fake_train(backbone, train, val, cfg, output, **kwargs):
        seen.update(cfg=cfg, train=train.summary(), val=val.summary(), identity=kwargs["backbone_identity"])
        return detection_train.DetectionRun(backbone, {}, None)

    monkeypatch.setattr(detection_train, "train_detector", fake_train)
    folder = CARDS / "dcl_resnet18.imagenette64_cpu"
    command = tier_transfer.detection_command(folder, bccd_voc_dir / "bccd-voc", tmp_path / "run", 2, random_init)
    assert command[1:4] == ["-m", "cl_zoo.cli", "detect"]
    assert main(command[3:]) == 0
    config = seen["cfg"].to_dict()
    for key, value in BCCD_SCHEDULE.items():
        if key not in ("train_split", "val_split"):
            assert config[key] == value, key
    assert config["seed"] == 2 and config["val_limit"] is None
    assert seen["val"].startswith(bundle_cpu_tier.BCCD_TEST) and seen["train"].startswith("292 images")
    files = json.loads((folder / "config.json").read_text())["files"]
    if random_init:
        assert seen["identity"]["source"] == "random-init" and seen["identity"]["architecture"] == "resnet18"
        assert "seed 2" in seen["identity"]["name"]
    else:
        assert seen["identity"]["checkpoint_files_sha256"] == files


def test_detect_random_init_is_refused_where_it_cannot_apply(tmp_path: Path, capsys) -> None:
    for extra in (["--prefix", "encoder."], ["--engine", "detectron2", "--prefix", "encoder."]):
        code = main(["detect", "--model", str(CARDS / "dcl_resnet18.imagenette64_cpu"), "--random-init", "--data", str(tmp_path),
                     "--output", str(tmp_path / "out"), *extra])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "--random-init" in err


def _detection_report(folder: Path, seed: int, ap: float, random_init: bool = False, **change) -> dict:
    config = json.loads((folder / "config.json").read_text())
    schedule = {k: v for k, v in BCCD_SCHEDULE.items() if k not in ("train_split", "val_split")}
    backbone = ({"source": "random-init", "architecture": config["architecture"], "checkpoint_files_sha256": {}}
                if random_init else {"source": str(folder), "architecture": config["architecture"],
                                     "checkpoint_files_sha256": config["files"]})
    return {
        "task": "detection", "engine": "torchvision", "backbone": backbone, "precision": "bf16", "train_seconds": 600.0,
        "config": {**schedule, "seed": seed, "val_limit": None, **change}, "iterations": BCCD_SCHEDULE["max_iter"],
        "val_data": "72 images, 945 boxes, 3 classes (voc: /data/bccd-voc)",
        "metrics": {"AP": ap, "AP50": ap + 20, "AP75": ap - 5, "voc_AP50": ap + 21},
    }


def _linear_report(folder: Path, top1: float, random_init: bool = False) -> dict:
    """The folder's own Imagenette probe report, re-labelled as a CIFAR-10 probe."""
    report = json.loads((folder / ("eval_linear_random_init.json" if random_init else "eval_linear.json")).read_text())
    report["data"]["name"] = "cifar10"
    report["metrics"]["linear_fast_top1"] = top1
    return report


def test_transfer_reports_go_into_the_card_and_the_table(tmp_path: Path) -> None:
    import add_tier_seed

    cards = tmp_path / "cards"
    for method in ("dcl", "cmc"):
        shutil.copytree(CARDS / f"{method}_resnet18.imagenette64_cpu", cards / f"{method}_resnet18.imagenette64_cpu")
    dcl, cmc = cards / "dcl_resnet18.imagenette64_cpu", cards / "cmc_resnet18.imagenette64_cpu"
    for seed, ap in enumerate((40.0, 42.0, 41.0)):
        (dcl / transfer_file("detection", False, seed)).write_text(json.dumps(_detection_report(dcl, seed, ap)))
        (dcl / transfer_file("detection", True, seed)).write_text(json.dumps(_detection_report(dcl, seed, 20.0 + seed, True)))
    (dcl / transfer_file("cifar10", False)).write_text(json.dumps(_linear_report(dcl, 0.61)))
    (dcl / transfer_file("cifar10", True)).write_text(json.dumps(_linear_report(dcl, 0.35, True)))
    (cmc / transfer_file("cifar10", False)).write_text(json.dumps(_linear_report(cmc, 0.66)))
    for method in ("dcl", "cmc"):
        assert add_tier_seed.main([method, "--cards", str(cards), "--out", str(cards)]) == 0
    transfer = json.loads((dcl / "config.json").read_text())["cpu_tier"]["transfer"]
    assert transfer["bccd_detection"]["seeds"] == [0, 1, 2] and transfer["bccd_detection"]["AP"] == [40.0, 42.0, 41.0]
    assert transfer["bccd_detection_random_init"]["voc_AP50"] == [41.0, 42.0, 43.0]
    assert transfer["cifar10_linear"]["linear_fast_top1"] == 0.61
    card = (dcl / "README.md").read_text()
    assert "## Transfer" in card and "41.00 ± 1.00 (3 seeds)" in card and "61.00%" in card
    assert "not a ResNet" in (cmc / "README.md").read_text()

    table = cpu_tier_table.render_transfer(cards)
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    assert "41.00 ± 1.00 (3)" in rows["| DCL"] and "61.00%" in rows["| DCL"] and "62.00 ± 1.00 (3)" in rows["| DCL"]
    assert "66.00%" in rows["| CMC (L/ab)"] and "not a ResNet" in table
    assert "21.00 ± 1.00 (3)" in rows["| random init"]

    # Refused, and the folder left as it was: another schedule, other weights, a random init of another
    # architecture, a probe on other data.
    before = {p.name: p.read_bytes() for p in dcl.iterdir()}
    bad = [
        (transfer_file("detection", False, 0), _detection_report(dcl, 0, 40.0, max_iter=100)),
        (transfer_file("detection", False, 1), {**_detection_report(dcl, 1, 40.0), "backbone": {"source": "x", "checkpoint_files_sha256": {"a": "b"}}}),
        (transfer_file("detection", True, 0), {**_detection_report(dcl, 0, 20.0, True), "backbone": {"source": "random-init", "architecture": "resnet50"}}),
        (transfer_file("cifar10", False), {**_linear_report(dcl, 0.6), "data": {**_linear_report(dcl, 0.6)["data"], "name": "stl10"}}),
        ("transfer_bccd_detection.json", _detection_report(dcl, 0, 40.0)),
    ]
    for name, report in bad:
        original = (dcl / name).read_bytes() if (dcl / name).is_file() else None
        (dcl / name).write_text(json.dumps(report))
        with pytest.raises(SystemExit, match="2"):
            add_tier_seed.main(["dcl", "--cards", str(cards), "--out", str(cards)])
        if original is None:
            (dcl / name).unlink()
        else:
            (dcl / name).write_bytes(original)
        assert {p.name: p.read_bytes() for p in dcl.iterdir()} == before


def test_random_init_reports_go_into_every_card_of_the_architecture(tmp_path: Path) -> None:
    cards = tmp_path / "cards"
    for method in ("dcl", "simclr", "cmc"):
        shutil.copytree(CARDS / f"{method}_resnet18.imagenette64_cpu", cards / f"{method}_resnet18.imagenette64_cpu")
    report = tmp_path / "report.json"
    report.write_text("{}")
    targets = tier_transfer.file_report(report, cards, cards / "dcl_resnet18.imagenette64_cpu", "transfer_x.json", True)
    assert [t.name for t in targets] == ["dcl_resnet18.imagenette64_cpu", "simclr_resnet18.imagenette64_cpu"]
    assert not (cards / "cmc_resnet18.imagenette64_cpu" / "transfer_x.json").exists()


def test_queue_skips_done_and_malformed_lines(tmp_path: Path) -> None:
    """scripts/tier_queue.sh: a line whose output exists is done, a malformed one is flagged, never run."""
    import subprocess

    work = tmp_path / "work"
    done = work / "bundles_seed7" / "dcl_150views_resnet18.imagenette64_cpu" / "reports" / "linear_fp16.json"
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    queue = tmp_path / "queue.txt"
    # Done: a bundle evaluated but not published yet, the published seed 0, a seed already in the card,
    # transfer reports in the card (the detectron2 one under its own name).
    queue.write_text("# issue 23\npretrain dcl_150views 7   # finished\npretrain dcl 0\npretrain dcl 1\n\n"
                     "transfer cifar10 dcl 0\ntransfer detection cacr 0 detectron2\n"
                     "pretrain dcl\nfrobnicate x y\npretrain byol 1\n")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "tier_queue.sh"), str(queue)], capture_output=True, text=True,
                          env={"TIER_WORK": str(work), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0 and "queue done" in proc.stdout and "start:" not in proc.stdout, proc.stdout + proc.stderr
    assert sorted(p.name for p in work.glob("failed.*")) == ["failed.frobnicate_x_y", "failed.pretrain_byol_1", "failed.pretrain_dcl"]


def _detectron2_report(folder: Path, seed: int, ap50: float, random_init: bool = False, **change) -> dict:
    config = json.loads((folder / "config.json").read_text())
    backbone = ({"source": "random-init", "architecture": config["architecture"], "checkpoint_files_sha256": {}}
                if random_init else {"source": str(folder), "architecture": config["architecture"],
                                     "checkpoint_files_sha256": config["files"]})
    return {
        "task": "detection", "engine": "detectron2", "config_file": bundle_cpu_tier.DETECTRON2_CONFIG,
        "backbone": backbone,
        "overrides": {**bundle_cpu_tier.detectron2_overrides(seed), "OUTPUT_DIR": "/runs/x", **change},
        "precision": "fp32", "train_seconds": 900.0, "iterations": BCCD_SCHEDULE["max_iter"],
        "train_data": ["voc: /data/bccd-voc trainval"], "val_data": ["voc: /data/bccd-voc test"],
        "metrics": {"voc_AP": ap50 - 30, "voc_AP50": ap50, "voc_AP75": ap50 - 25},
    }


def test_detectron2_command_hands_detectron2_the_documented_overrides(bccd_voc_dir: Path, tmp_path: Path, capsys) -> None:
    """What tier_transfer.py --engine detectron2 runs is exactly what bundle_cpu_tier.py later accepts:
    the schedule's overrides on the R18-FPN config (checked on the dry run; detectron2 need not be installed)."""
    import shlex

    folder = CARDS / "cacr_resnet18.imagenette64_cpu"
    command = tier_transfer.detection_command(folder, bccd_voc_dir / "bccd-voc", tmp_path / "run", 1, False, "detectron2")
    assert "--precision" not in command and command[command.index("--engine") + 1] == "detectron2"
    assert main([*command[3:], "--dry-run"]) == 0
    printed = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed[printed.index("--config-file") + 1].endswith(bundle_cpu_tier.DETECTRON2_CONFIG)
    for key, value in bundle_cpu_tier.detectron2_overrides(1).items():
        assert printed[printed.index(key) + 1] == value, key
    voc = printed.index("--voc")
    assert printed[voc + 1:voc + 4][2] == "trainval" and printed[printed.index("--voc", voc + 1) + 3] == "test"


def test_a_detectron2_report_goes_into_the_card_and_its_own_table_row(tmp_path: Path) -> None:
    import add_tier_seed

    cards = tmp_path / "cards"
    shutil.copytree(CARDS / "dcl_resnet18.imagenette64_cpu", cards / "dcl_resnet18.imagenette64_cpu")
    dcl = cards / "dcl_resnet18.imagenette64_cpu"
    (dcl / transfer_file("detection", False, 0, "detectron2")).write_text(json.dumps(_detectron2_report(dcl, 0, 80.0)))
    random_name = transfer_file("detection", True, 0, "detectron2")
    assert random_name == "transfer_bccd_detection_detectron2_random_init_seed0.json"
    (dcl / random_name).write_text(json.dumps(_detectron2_report(dcl, 0, 70.0, True)))
    assert add_tier_seed.main(["dcl", "--cards", str(cards), "--out", str(cards)]) == 0
    transfer = json.loads((dcl / "config.json").read_text())["cpu_tier"]["transfer"]
    assert transfer["bccd_detection_detectron2"] == {"seeds": [0], "voc_AP": [50.0], "voc_AP50": [80.0], "voc_AP75": [55.0],
                                                     "train_seconds": [900.0]}
    assert "| these weights, detectron2 engine | - | - (VOC evaluator) | 80.00 (1 seed) |" in (dcl / "README.md").read_text()
    table = cpu_tier_table.render_transfer(cards)
    assert "| DCL, detectron2 engine | `dcl_resnet18.imagenette64_cpu` | - | - | - | 80.00 (1) |" in table
    assert "| random init, detectron2 engine | `resnet18` | - | - | - | 70.00 (1) |" in table
    assert "the exported weights train there" in table
    assert "| resnet18, random init, detectron2 engine | - | - (VOC evaluator) | 70.00 (1 seed) |" in (dcl / "README.md").read_text()

    before = {p.name: p.read_bytes() for p in dcl.iterdir()}
    name = transfer_file("detection", False, 0, "detectron2")
    original = (dcl / name).read_bytes()
    bad = [
        _detectron2_report(dcl, 0, 80.0, **{"SOLVER.MAX_ITER": "100"}),       # another schedule
        {**_detectron2_report(dcl, 0, 80.0), "config_file": "coco_R_50_C4_1x.yaml"},
        {**_detectron2_report(dcl, 0, 80.0), "engine": "torchvision"},
        {**_detectron2_report(dcl, 0, 80.0), "backbone": {"checkpoint_files_sha256": {"a": "b"}}},
        {**_detectron2_report(dcl, 0, 80.0), "val_data": ["voc: /data/bccd-voc trainval"]},
        {**_detectron2_report(dcl, 0, 80.0), "metrics": {"voc_AP50": 80.0}},
        _detectron2_report(dcl, 1, 80.0),                                         # seed 1's run filed as seed 0
        _detectron2_report(dcl, 0, 80.0, True),                                   # a random init filed as the weights
    ]
    for report in bad:
        (dcl / name).write_text(json.dumps(report))
        with pytest.raises(SystemExit, match="2"):
            add_tier_seed.main(["dcl", "--cards", str(cards), "--out", str(cards)])
        (dcl / name).write_bytes(original)
        assert {p.name: p.read_bytes() for p in dcl.iterdir()} == before
    random_original = (dcl / random_name).read_bytes()
    for odd, report in (("transfer_cifar10_linear_detectron2.json", _detectron2_report(dcl, 0, 80.0)),
                        (random_name, _detectron2_report(dcl, 0, 80.0)),  # the weights filed as a random init
                        (random_name, {**_detectron2_report(dcl, 0, 70.0, True),
                                       "backbone": {"source": "random-init", "architecture": "resnet50"}})):
        (dcl / odd).write_text(json.dumps(report))
        with pytest.raises(SystemExit, match="2"):
            add_tier_seed.main(["dcl", "--cards", str(cards), "--out", str(cards)])
        (dcl / odd).unlink()
    (dcl / random_name).write_bytes(random_original)
