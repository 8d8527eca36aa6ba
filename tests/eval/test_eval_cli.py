"""Evaluation end to end: real CIFAR-10 baselines, the CLI's reports/figures/cache, card-update,
and one-line errors for bad input."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from cl_zoo.cli import main


def cifar_subset(cifar10_dir, train_per_class, test_per_class):
    """A fixed subset: the first N images of each class in sorted file order."""
    from cl_zoo.eval.features import first_per_class, open_eval_split

    train = first_per_class(open_eval_split(cifar10_dir, None, None, "train"), train_per_class)
    test = first_per_class(open_eval_split(cifar10_dir, None, None, "test"), test_per_class)
    return train, test


def tiny_folder(root, classes=("a", "b", "c"), per_class=6, size=20, splits=("train", "test")):
    """Colour-coded classes (a distinct mean colour each, plus noise): learnable from pixels."""
    rng = np.random.default_rng(0)
    palette = [(220, 30, 30), (30, 220, 30), (30, 30, 220), (220, 220, 30)]
    for split in splits:
        for ci, cls in enumerate(classes):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                arr = np.clip(np.array(palette[ci % 4]) + rng.normal(0, 25, (size, size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(arr).save(root / split / cls / f"{i:03d}.png")
    return root


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --------------------------------------------------------------------------------------------
# real data
# --------------------------------------------------------------------------------------------


def test_pixel_knn_baseline_in_literature_range(cifar10_dir, cache):
    """Raw pixels, cosine kNN, k=200, T=0.07 on 5000 train (500/class) / 1000 test (100/class).

    Published CIFAR-10 raw-pixel kNN accuracies are about 30-40% (e.g. 35-39% for L1/L2 kNN with the
    full 50k memory in CS231n's notes); a smaller memory and the JPEG re-encoding cost a little, so
    the accepted band is 0.28-0.42. Outside it, preprocessing (normalisation, crop) or the vote is
    broken: a wrong label order gives ~0.10, features from a different image ~0.10.
    """
    from cl_zoo import create_model
    from cl_zoo.eval.knn import evaluate_knn

    train, test = cifar_subset(cifar10_dir, 500, 100)
    result = evaluate_knn(create_model("pixels"), train, test, ks=(20, 200), temperature=0.07, workers=0)
    m = result.metrics
    print(f"pixels kNN CIFAR-10 5000/1000 (T=0.07, cosine): {m}")
    assert 0.28 <= m["knn_k200_top1"] <= 0.42
    assert m["knn_k200_top5"] > m["knn_k200_top1"]
    assert result.report["data"]["train"]["num_images"] == 5000


def test_random_resnet18_knn_beats_chance(cifar10_dir, cache):
    """A randomly initialised ResNet-18 (CIFAR stem) is a known-weak but above-chance baseline."""
    from cl_zoo import create_model
    from cl_zoo.eval.knn import evaluate_knn

    train, test = cifar_subset(cifar10_dir, 50, 20)  # 500 / 200 images: ResNet-18 on CPU is slow
    torch.manual_seed(0)
    model = create_model("resnet18_cifar")
    result = evaluate_knn(model, train, test, ks=(20, 200), temperature=0.07, workers=0, device="cpu")
    print(f"random resnet18_cifar kNN CIFAR-10 500/200 (T=0.07): {result.metrics}")
    assert result.metrics["knn_k20_top1"] > 0.1


def test_fast_linear_on_cifar10_subset_is_quick(cifar10_dir, cache):
    """Fast protocol, random ResNet-18 x0.25 on 1000 train / 500 test: extraction plus the
    weight-decay search and refit stay within a few CPU minutes and beat chance."""
    import time

    from cl_zoo import create_model
    from cl_zoo.eval.linear import evaluate_linear

    train, test = cifar_subset(cifar10_dir, 100, 50)
    torch.manual_seed(0)
    model = create_model("resnet18_cifar", width=0.25)
    start = time.perf_counter()
    result = evaluate_linear(model, train, test, protocol_name="fast", workers=0, device="cpu")
    seconds = time.perf_counter() - start
    print(f"fast linear, random resnet18_cifar x0.25, CIFAR-10 1000/500: {result.metrics} "
          f"wd={result.report['hyperparameters']['chosen_weight_decay']} in {seconds:.1f}s")
    assert seconds < 180
    assert result.metrics["linear_fast_top1"] > 0.15


# --------------------------------------------------------------------------------------------
# CLI: reports, figures, cache
# --------------------------------------------------------------------------------------------


def test_knn_cli_report_plots_and_cache(tmp_path, cache, capsys):
    data = tiny_folder(tmp_path / "data")
    out = tmp_path / "reports" / "knn.json"
    args = ["knn", "-m", "pixels", "--train", str(data), "--test", str(data), "--k", "3,5", "--workers", "0",
            "--out", str(out), "--plot", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads(out.read_text())
    for key in ("model", "data", "protocol", "hyperparameters", "seed", "metrics", "timings", "versions"):
        assert key in report
    assert report["model"]["name"] == "pixels" and len(report["model"]["weights_sha256"]) == 64
    assert report["data"]["train"]["split"] == "train" and report["data"]["test"]["split"] == "test"
    assert len(report["data"]["train"]["file_list_hash"]) == 64
    assert report["hyperparameters"]["k"] == [3, 5] and report["hyperparameters"]["temperature"] == 0.1
    assert set(report["versions"]) >= {"cl_zoo", "torch", "numpy", "faiss"}
    assert report["metrics"]["knn_k5_top1"] > 0.9  # colour-coded classes are trivially separable
    assert "knn_k5_top5" not in report["metrics"]  # only 3 classes
    for name in report["figures"].values():
        assert (out.parent / name).stat().st_size > 1000
    assert not [p for p in os.listdir(out.parent) if p.startswith(".")]  # no temporaries left
    assert report["features"]["train_cached"] is False
    assert "hostname" not in out.read_text().lower()

    # Second run: features come from the cache and the numbers are identical.
    assert main(args[:-2]) == 0
    again = json.loads(out.read_text())
    assert again["features"]["train_cached"] and again["features"]["test_cached"]
    assert again["metrics"] == report["metrics"]
    assert "knn_k5_top1" in capsys.readouterr().out  # the human summary


def test_linear_eval_cli_fast_and_paper(tmp_path, cache, capsys):
    data = tiny_folder(tmp_path / "data")
    out = tmp_path / "lin.json"
    assert main(["linear-eval", "-m", "pixels", "--train", str(data), "--test", str(data), "--workers", "0",
                 "--out", str(out), "--plot", "--json", "--wd-grid", "1e-4,1e-2", "--val-fraction", "0.2"]) == 0
    report = json.loads(out.read_text())
    assert report["protocol"] == "fast" and report["hyperparameters"]["wd_grid"] == [1e-4, 1e-2]
    assert report["hyperparameters"]["chosen_weight_decay"] in (1e-4, 1e-2)
    assert report["metrics"]["linear_fast_top1"] > 0.9
    assert set(report["figures"]) == {"confusion", "projection", "curve"}

    out2 = tmp_path / "paper.json"
    assert main(["linear-eval", "-m", "pixels", "--train", str(data), "--test", str(data), "--workers", "0",
                 "--protocol", "paper", "--epochs", "1", "--lr", "0.1", "--train-batch-size", "6", "--out", str(out2)]) == 0
    report = json.loads(out2.read_text())
    hp = report["hyperparameters"]
    assert (hp["protocol"], hp["epochs"], hp["lr"], hp["batch_size"], hp["momentum"], hp["milestones"]) == ("paper", 1, 0.1, 6, 0.9, [60, 80])
    assert len(report["curve"]["train_loss"]) == 1
    # Protocol settings that do not apply to the fast protocol are refused, not ignored.
    assert main(["linear-eval", "-m", "pixels", "--train", str(data), "--test", str(data), "--epochs", "3"]) == 2


def test_card_update_writes_metrics_and_model_index(tmp_path, cache, capsys):
    import yaml

    from cl_zoo import create_model, save_pretrained
    from cl_zoo.checkpoint.card import parse_front_matter

    torch.manual_seed(0)
    model = create_model("resnet18_cifar", width=0.125)
    folder = save_pretrained(model, tmp_path / "ckpt")
    data = tiny_folder(tmp_path / "mydata")
    report = tmp_path / "r.json"
    assert main(["knn", "-m", str(folder), "--train", str(data), "--test", str(data), "--k", "5",
                 "--workers", "0", "--device", "cpu", "--out", str(report)]) == 0
    assert main(["card-update", str(folder), str(report)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert "mydata_knn_k5_top1" in config["metrics"]
    assert "metrics" not in config["pretrained_cfg"]  # timm's part; cl-zoo's metrics are top-level
    assert config["evaluations"][-1]["protocol"] == "knn"
    meta = parse_front_matter((folder / "README.md").read_text())
    entries = meta["model-index"][0]["results"][0]["metrics"]
    # The Hub's standard metric type; the protocol (and the recorded temperature), the split and the
    # images scored in the name.
    assert any(e["type"] == "accuracy" and e["name"].startswith("kNN top-1 (k=5, T=") and e["name"].endswith(" on mydata test: 18 images; neighbours from 18 train images")
               for e in entries)
    assert yaml.safe_dump(meta)
    # The updated folder still loads, and applying the report twice does not duplicate it.
    assert main(["card-update", str(folder), str(report)]) == 0
    assert len(json.loads((folder / "config.json").read_text())["evaluations"]) == 1
    from cl_zoo import load_model

    load_model(str(folder))

    # A report from other weights is refused.
    other = tmp_path / "other.json"
    assert main(["knn", "-m", "pixels", "--train", str(data), "--test", str(data), "--k", "5", "--workers", "0", "--out", str(other)]) == 0
    capsys.readouterr()
    assert main(["card-update", str(folder), str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert "other weights" in err and "\n" not in err


# --------------------------------------------------------------------------------------------
# bad input: one line, exit 2, no report
# --------------------------------------------------------------------------------------------


def _bad(tmp_path, capsys, args, message):
    out = tmp_path / "bad.json"
    code = main([*args, "--workers", "0", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error:") and "\n" not in err, err
    assert message in err, err
    assert not out.exists()


def test_bad_inputs_are_one_line_errors(tmp_path, cache, capsys):
    good = tiny_folder(tmp_path / "good")
    other = tiny_folder(tmp_path / "other", classes=("a", "b", "d"))
    single = tiny_folder(tmp_path / "single", classes=("a",))
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "empty" / "test").mkdir(parents=True)
    knn = ["knn", "-m", "pixels"]
    _bad(tmp_path, capsys, [*knn, "--train", str(good), "--test", str(other)], "different class sets")
    _bad(tmp_path, capsys, [*knn, "--train", str(single), "--test", str(single)], "single class")
    _bad(tmp_path, capsys, [*knn, "--train", str(good), "--test", str(tmp_path / "empty")], "empty")
    _bad(tmp_path, capsys, [*knn, "--train", str(good), "--test", str(good), "--k", "200"], "larger than the train set")
    _bad(tmp_path, capsys, [*knn, "--train", str(good), "--test", str(good), "--k", "x"], "--k")

    from cl_zoo import create_model, save_pretrained

    gray = save_pretrained(create_model("resnet18_cifar", width=0.125, in_chans=1), tmp_path / "gray")
    _bad(tmp_path, capsys, ["knn", "-m", str(gray), "--train", str(good), "--test", str(good), "--k", "3"], "input channels")
    _bad(tmp_path, capsys, ["linear-eval", "-m", str(gray), "--train", str(good), "--test", str(good)], "input channels")
    _bad(tmp_path, capsys, ["linear-eval", "-m", "pixels", "--train", str(good), "--test", str(other)], "different class sets")


def test_data_forms_named_dataset_and_archive(tmp_path, cache, cifar10_dir, capsys):
    """DATA may be a named dataset under --root, or an archive of an ImageFolder."""
    import tarfile

    out = tmp_path / "named.json"
    assert main(["knn", "-m", "pixels", "--train", "cifar10", "--test", "cifar10", "--root", str(cifar10_dir.parent),
                 "--per-class", "10", "--k", "20", "--workers", "0", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["data"]["name"] == "cifar10"
    assert (report["data"]["train"]["num_images"], report["data"]["test"]["num_images"]) == (100, 100)
    assert report["data"]["train"]["file_list_hash"] != ""

    data = tiny_folder(tmp_path / "folder")
    archive = tmp_path / "tiny.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(data, arcname="tiny")
    out = tmp_path / "archive.json"
    assert main(["knn", "-m", "pixels", "--train", str(archive), "--test", str(archive), "--k", "5", "--workers", "0", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["data"]["name"] == "tiny" and report["metrics"]["knn_k5_top1"] > 0.9


def test_feature_cache_tells_apart_copies_with_equal_file_names(tmp_path, cache):
    """CIFAR's train and test subsets share relative names (<class>/0000.jpg), so the file-list hash
    alone is equal; the cache must still serve each split its own features."""
    from cl_zoo import create_model
    from cl_zoo.data.folder import open_image_folder
    from cl_zoo.eval.features import split_features

    a = open_image_folder(tiny_folder(tmp_path / "a", per_class=3), split="train")
    b = open_image_folder(tiny_folder(tmp_path / "b", per_class=3, size=24), split="train")
    assert a.file_list_hash == b.file_list_hash
    model = create_model("pixels")
    fa, fb = split_features(model, a, workers=0), split_features(model, b, workers=0)
    assert fa.key != fb.key and not fa.cached and not fb.cached
    again = split_features(model, b, workers=0)
    assert again.cached and np.array_equal(np.asarray(again.features), fb.features)
    assert not np.array_equal(fa.features, fb.features)
    # A cache entry damaged after it was written (NaN, another dtype) is recomputed, not served.
    damaged = np.array(fb.features, dtype=np.float32)
    damaged[1, 2] = np.nan
    np.save(fb.path, damaged)
    again = split_features(model, b, workers=0)
    assert not again.cached and np.isfinite(again.features).all()
    np.save(fb.path, np.asarray(fb.features, dtype=np.float64))
    assert not split_features(model, b, workers=0).cached


# --------------------------------------------------------------------------------------------
# float16 copies: report comparison, card sections kept by card-update
# --------------------------------------------------------------------------------------------


def _report(metrics, *, task="knn", protocol="knn", test_hash="h1"):
    return {"format": "cl-zoo-eval", "task": task, "protocol": protocol,
            "data": {"name": "d", "train": {"file_list_hash": "t"}, "test": {"file_list_hash": test_hash}},
            "metrics": metrics}


def test_compare_reports_top1_within_tolerance(tmp_path):
    from cl_zoo.errors import DataError
    from cl_zoo.eval.report import compare_reports

    fp32 = _report({"knn_k20_top1": 0.500, "knn_k20_top5": 0.9, "knn_k200_top1": 0.600})
    # One image in 1000 (exactly 0.1 point) passes despite float rounding; 0.15 point does not.
    fp16 = _report({"knn_k20_top1": 0.501, "knn_k20_top5": 0.5, "knn_k200_top1": 0.5985})
    rows = compare_reports(fp32, fp16, 0.001)
    assert [r["metric"] for r in rows] == ["knn_k20_top1", "knn_k200_top1"]  # top-5 is not compared
    assert rows[0]["ok"] and rows[0]["diff"] == pytest.approx(0.001)
    assert not rows[1]["ok"] and rows[1]["diff"] == pytest.approx(-0.0015)
    assert [r["ok"] for r in compare_reports(fp32, fp16, 0.002)] == [True, True]

    # Paths are read as reports; an explicit metric list is honoured.
    (tmp_path / "a.json").write_text(json.dumps(fp32))
    (tmp_path / "b.json").write_text(json.dumps(fp16))
    rows = compare_reports(tmp_path / "a.json", tmp_path / "b.json", 0.001, metrics=["knn_k20_top5"])
    assert len(rows) == 1 and not rows[0]["ok"] and rows[0]["b"] == 0.5

    with pytest.raises(DataError, match="different test images"):
        compare_reports(fp32, _report(fp32["metrics"], test_hash="h2"), 0.001)
    with pytest.raises(DataError, match="protocol"):
        compare_reports(fp32, _report(fp32["metrics"], protocol="fast"), 0.001)
    with pytest.raises(DataError, match="missing from the second"):
        compare_reports(fp32, _report({"knn_k20_top1": 0.5}), 0.001)


def test_card_update_keeps_sections_not_built_from_config(tmp_path):
    from cl_zoo import create_model, save_pretrained
    from cl_zoo.checkpoint.card import extra_sections
    from cl_zoo.eval.features import weights_sha256
    from cl_zoo.eval.report import update_card

    torch.manual_seed(0)
    model = create_model("resnet18_cifar", width=0.125)
    training = "Online kNN monitor:\n\n- knn_k20_top1: 50.00%\n\n![loss and kNN accuracy per epoch](curves.png)"
    folder = save_pretrained(model, tmp_path / "ckpt", card_sections={"Training": training})
    assert extra_sections((folder / "README.md").read_text()) == {"Training": training}
    report = _report({"knn_k5_top1": 0.75})
    report["model"] = {"weights_sha256": weights_sha256(model)}
    (tmp_path / "r.json").write_text(json.dumps(report))
    update_card(folder, tmp_path / "r.json")
    card = (folder / "README.md").read_text()
    assert "| d_knn_k5_top1 | 0.75 |" in card
    assert extra_sections(card) == {"Training": training}
    assert card.index("## Training") < card.index("## Citation")


def test_random_init_baseline_of_a_checkpoint_folder(tmp_path, cache, capsys):
    """`--random-init` on a folder evaluates its architecture and preprocessing untrained: the
    baseline a model card compares against."""
    from cl_zoo import create_model, save_pretrained
    from cl_zoo.eval.features import weights_sha256

    torch.manual_seed(0)
    trained = create_model("resnet18_cifar", width=0.125)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)  # weights no random initialisation would produce
    folder = save_pretrained(trained, tmp_path / "ckpt")
    data = tiny_folder(tmp_path / "mydata")
    report = tmp_path / "random.json"
    assert main(["knn", "-m", str(folder), "--random-init", "--train", str(data), "--test", str(data),
                 "--k", "5", "--workers", "0", "--device", "cpu", "--out", str(report)]) == 0
    result = json.loads(report.read_text())
    assert "random init" in result["model"]["name"]
    assert result["model"]["weights_sha256"] != weights_sha256(trained)
    assert result["hyperparameters"]["random_init"] is True
