"""Cards say exactly what was measured and what was trained on, and link the method's paper:
a --per-class report is carded as the subset it scored, a run on a folder names the folder and its
image count (no Hub dataset id unless the data is that dataset), publish refuses a card whose
dataset claim config.json contradicts, and a repo id the Hub would refuse is one error line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

import cl_zoo
from cl_zoo.checkpoint import CARD_NAME
from cl_zoo.checkpoint.card import front_matter, parse_front_matter, render_card, training_dataset
from cl_zoo.cli import main
from cl_zoo.constants import PAPERS
from tests.helpers import TINY_PRETRAIN, run_cli_captured, tiny_checkpoint_model

pytestmark = pytest.mark.usefixtures("isolated_cache", "one_thread")


def _images(root: Path, names: list[str], seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(root / name)
    return root


def _labelled(root: Path, per_class: int) -> Path:
    return _images(root, [f"{split}/{cls}/{i}.png" for split in ("train", "test") for cls in "abc" for i in range(per_class)])


def test_a_per_class_report_is_carded_as_the_subset_it_scored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = cl_zoo.save_pretrained(tiny_checkpoint_model(), tmp_path / "ckpt")
    data = _labelled(tmp_path / "mydata", per_class=6)
    report = tmp_path / "knn.json"
    assert main(["knn", "-m", str(folder), "--train", str(data), "--test", str(data), "--k", "2", "--per-class", "2",
                 "--workers", "0", "--device", "cpu", "--out", str(report), "-q"]) == 0
    test = json.loads(report.read_text())["data"]["test"]
    assert test["num_images"] == 6 and test["subset"]["of_images"] == 18 and "first 2 of each class" in test["subset"]["drawn"]
    capsys.readouterr()
    assert main(["card-update", str(folder), str(report)]) == 0
    card = (folder / CARD_NAME).read_text()
    result = parse_front_matter(card)["model-index"][0]["results"][0]
    assert result["dataset"]["split"] == "test (6 of 18 images)"  # never filed by the Hub as the whole split
    assert result["dataset"]["name"].startswith("mydata test: 6 of its 18 images (the first 2 of each class")
    names = [m["name"] for m in result["metrics"]]
    assert names and all(": 6 of its 18 images (the first 2 of each class" in n and "from 6 of 18 train images" in n
                         for n in names)
    assert "on mydata test: 6 of its 18 images" in card.split("## Evaluation", 1)[1]


def test_a_report_without_subset_fields_still_says_per_class() -> None:
    """Reports written before they recorded the subset: per_class alone still marks it as one."""
    config = {"architecture": "resnet18", "metrics": {"imagenette_knn_k200_top1": 0.5},
              "evaluations": [{"task": "knn", "metrics": {"imagenette_knn_k200_top1": 0.5},
                               "hyperparameters": {"per_class": 50, "temperature": 0.1}}]}
    name = front_matter(config)["model-index"][0]["results"][0]["metrics"][0]["name"]
    assert name == "kNN top-1 (k=200, T=0.1) on imagenette val (the first 50 of each class)"


def test_a_subset_and_a_whole_split_stay_apart_on_the_hub() -> None:
    """huggingface_hub files results by dataset type and split: a subset must not be merged into
    (and named as) the whole split's results, nor the whole split's into the subset's."""
    from huggingface_hub import ModelCard

    knn = {"task": "knn", "split": "val", "test_images": 500, "train_images": 500,
           "test_subset": {"of_images": 3925, "drawn": "the first 50 of each class"},
           "train_subset": {"of_images": 9469, "drawn": "the first 50 of each class"},
           "hyperparameters": {"per_class": 50, "temperature": 0.1}, "metrics": {"imagenette_knn_k200_top1": 0.56}}
    linear = {"task": "linear", "split": "val", "test_images": 3925, "train_images": 9469,
              "metrics": {"imagenette_linear_fast_top1": 0.65}}
    config = {"architecture": "resnet18", "model_name": "m", "method": "cacr", "evaluations": [knn, linear],
              "metrics": {**knn["metrics"], **linear["metrics"]}}
    results = ModelCard(render_card(config, folder="/tmp/x")).data.eval_results
    by_split = {r.dataset_split: (r.dataset_name, r.metric_name) for r in results}
    assert set(by_split) == {"val (500 of 3,925 images)", "val"}
    assert by_split["val"] == ("imagenette", "Linear probe top-1 (fast protocol) on imagenette val: 3,925 images; "
                                             "probe trained on 9,469 train images")
    assert by_split["val (500 of 3,925 images)"][1] == (
        "kNN top-1 (k=200, T=0.1) on imagenette val: 500 of its 3,925 images (the first 50 of each class); "
        "neighbours from 500 of 9,469 train images")


def _pretrain(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "run"
    code = main(["pretrain", "--method", "dcl", *TINY_PRETRAIN, "--set", "data.dataset=imagenette", "--epochs", "1",
                 "--batch-size", "8", "--no-progress", "--workers", "0", "--data", str(data), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    return out / "model"


def test_a_run_on_a_folder_is_carded_as_that_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Eight photos trained with a recipe written for Imagenette: the card names the folder and its
    count, links no Hub dataset, and its title says which checkpoint it is."""
    model = _pretrain(tmp_path, _images(tmp_path / "photos", [f"{i}.png" for i in range(8)]), capsys)
    card = (model / CARD_NAME).read_text()
    meta = parse_front_matter(card)
    assert "datasets" not in meta and "frgfm/imagenette" not in card
    assert "# pixels pretrained with DCL on 8 images of photos\n" in card
    assert "on 8 images of `photos` (not imagenette, which its recipe was written for)" in card
    assert str(tmp_path) not in card.split("## How to load")[0]  # the folder's name, not the user's path
    config = json.loads((model / "config.json").read_text())
    assert config["cl_zoo_pretrained_cfg"]["dataset"] == "photos" and training_dataset(config) is None
    assert "arxiv:" + PAPERS["dcl"].arxiv in meta["tags"]

    # publish refuses a card that claims the dataset back, dry run or not, before any upload.
    (model / CARD_NAME).write_text(card.replace("library_name:", "datasets:\n- frgfm/imagenette\nlibrary_name:", 1))
    for dry in (["--dry-run"], []):
        code, out, err = run_cli_captured(["publish", str(model), "--repo-id", "me/photos", *dry], capsys)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
        assert "claims datasets frgfm/imagenette, but config.json says it was trained on 8 images of photos" in err


def test_named_data_is_identified_by_its_counts_not_its_recipe() -> None:
    record = {"source": "/data/imagenette128-train.tar.gz", "split": "train", "dataset": "imagenette",
              "images": 9469, "trained_images": 9469, "labeled": True}
    assert training_dataset({"training_data": record}) == "imagenette"
    assert front_matter({"architecture": "resnet18", "training_data": record})["datasets"] == ["frgfm/imagenette"]
    subset = {**record, "images": 2000, "trained_images": 2000}  # a 2,000-image subset is not the dataset
    assert training_dataset({"training_data": subset}) is None
    assert "datasets" not in front_matter({"architecture": "resnet18", "training_data": subset})
    wrong_classes = {**record, "classes": 3}
    assert training_dataset({"training_data": wrong_classes}) is None


@pytest.mark.parametrize("repo_id, why", [("bad id", "expected owner/name"), ("me/-x", "alphanumeric"),
                                          ("me/a--b", "Cannot have -- or ..")])
def test_publish_dry_run_refuses_a_repo_id_the_hub_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           repo_id: str, why: str) -> None:
    folder = cl_zoo.save_pretrained(tiny_checkpoint_model(), tmp_path / "ckpt")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())
    code, out, err = run_cli_captured(["publish", str(folder), "--repo-id", repo_id, "--dry-run"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: bad repo id {repo_id!r}") and why in err
    assert out == "" and sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir()) == before


def test_every_method_card_links_its_paper() -> None:
    for method, paper in PAPERS.items():
        config = {"architecture": "resnet18", "method": method}
        assert f"arxiv:{paper.arxiv}" in front_matter(config)["tags"]
        citation = render_card(config, folder="/tmp/x").split("## Citation", 1)[1]
        assert f"https://arxiv.org/abs/{paper.arxiv}" in citation and f"eprint={{{paper.arxiv}}}" in citation


def test_bundled_cards_link_their_papers_and_state_their_data() -> None:
    for card in sorted(Path(cl_zoo.__file__).parent.parent.glob("model_cards/*/README.md")):
        config = json.loads((card.parent / "config.json").read_text())
        meta = yaml.safe_load(card.read_text().split("---")[1])
        assert f"arxiv:{PAPERS[config['method']].arxiv}" in meta["tags"], card
        assert meta["datasets"] == ["frgfm/imagenette"], card  # 9,469 images of imagenette train: the dataset itself
