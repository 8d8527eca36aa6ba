"""The CPU tier's published checkpoints (issue 16): each folder is what scripts/bundle_cpu_tier.py
makes from its evaluation reports, its numbers are those reports', it learned (>= 15 points of kNN
k=200 above random init), docs/cpu-tier.md's tables are generated from the folders, and each exports to
torchvision, timm and detectron2 (CMC's L/ab pair is refused in one line)."""

from __future__ import annotations

import json
import pickle
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torchvision.models import resnet18

import cl_zoo
from cl_zoo.checkpoint import sha256_file
from cl_zoo.cli import main
from cl_zoo.eval.report import compare_reports
from cl_zoo.registry import DEFAULT_MODEL, get_pretrained, list_models
from tests.helpers import REPO_ROOT

REPO = REPO_ROOT
CARDS = REPO / "model_cards"
TIER = sorted(n for n in list_models("*_resnet18.imagenette64_cpu", pretrained=True))
sys.path.insert(0, str(REPO / "scripts"))
import bundle_cpu_tier  # noqa: E402
import cpu_tier_table  # noqa: E402
from relayout_model_cards import bundle_from_folder  # noqa: E402


def folder_of(name: str) -> Path:
    return CARDS / get_pretrained(name).cfg.bundled


def test_the_tier_is_registered_and_the_default_is_its_best() -> None:
    """The default is the best by kNN k=200 of the checkpoints that export (standard ResNet-18s; CMC's
    L/ab pair cannot be the default)."""
    assert TIER, "no CPU-tier checkpoint is registered"
    assert DEFAULT_MODEL in TIER
    exportable = [n for n in TIER if get_pretrained(n).arch == "resnet18"]
    best = max(exportable, key=lambda n: get_pretrained(n).cfg.metrics["imagenette_knn_k200_top1"])
    assert DEFAULT_MODEL == best, f"the default should be the tier's best exportable checkpoint ({best})"


@pytest.mark.parametrize("name", TIER)
def test_folder_pins_reports_and_learning(name: str) -> None:
    entry = get_pretrained(name)
    folder = folder_of(name)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_name"] == name and config["weights_dtype"] == "float16"
    assert entry.cfg.sha256 == config["files"] and entry.cfg.sha256
    # The registry's preprocessing is the one the weights were trained and scored with (CMC's pair
    # takes RGB in [0, 1], the ResNets ImageNet-normalised input).
    for key in ("mean", "std", "input_size", "crop_pct", "interpolation"):
        assert list(getattr(entry.cfg, key)) == list(config["pretrained_cfg"][key]) if key in ("mean", "std", "input_size") \
            else getattr(entry.cfg, key) == config["pretrained_cfg"][key], key
    for file, digest in entry.cfg.sha256.items():
        assert sha256_file(folder / file) == digest
    # Re-laid out as one file (format 2) from the shards the reports were computed on, or still those shards.
    scored_files = [entry.cfg.sha256] + ([config["files_before_relayout"]] if "files_before_relayout" in config else [])
    tier = config["cpu_tier"]
    assert tier["epochs"] == config["recipe"]["epochs"] == 30 and tier["method"] == entry.cfg.method
    assert tier["train_time_s"] > 0 and tier["views_per_s"] > 0 and tier["machine"]
    # Every number is the reports' own, and the reports were computed on these very files.
    for task in ("knn", "linear"):
        fp16 = json.loads((folder / f"eval_{task}.json").read_text())
        fp32 = json.loads((folder / f"eval_{task}_fp32.json").read_text())
        assert fp16["model"]["checkpoint_files_sha256"] in scored_files
        assert (fp16["features"]["precision"], fp16["features"]["backend"]) == ("fp32", "torch")
        assert all(row["ok"] for row in compare_reports(fp32, fp16, 0.001))  # float16 within 0.1 pt
        for key, value in fp16["metrics"].items():
            assert config["metrics"][f"imagenette_{key}"] == pytest.approx(value)
    for key, value in entry.cfg.metrics.items():
        assert config["metrics"][key] == pytest.approx(value, abs=5e-5)
    random_init = json.loads((folder / "eval_knn_random_init.json").read_text())
    assert random_init["model"]["source"] == "random-init"
    assert random_init["model"]["architecture"] == config["architecture"]
    gap = config["metrics"]["imagenette_knn_k200_top1"] - random_init["metrics"]["knn_k200_top1"]
    assert gap >= 0.15, f"{name} is only {100 * gap:.1f} points above random init"
    for other in tier.get("other_seeds") or []:  # scored, not published: their figures are their reports'
        assert other["seed"] != tier["seed"]
        for task in ("knn", "linear"):
            report = json.loads((folder / f"eval_{task}_seed{other['seed']}.json").read_text())
            assert report["model"]["checkpoint_files_sha256"] not in scored_files
            assert (report["features"]["precision"], report["features"]["backend"]) == ("fp32", "torch")
            for key, value in report["metrics"].items():
                if key.endswith("top1"):
                    assert other["fp16_top1"][key] == pytest.approx(value)


WITH_OTHER_SEEDS = [n for n in TIER if json.loads((folder_of(n) / "config.json").read_text())["cpu_tier"].get("other_seeds")]


@pytest.mark.parametrize("name", sorted(set(TIER[:1] + WITH_OTHER_SEEDS[:1])))
def test_bundle_script_reproduces_the_folder_and_refuses_bad_reports(name: str, tmp_path: Path) -> None:
    """Rebuild the bundle layout train_cpu_tier.sh leaves from the published folder and run the script."""
    folder = folder_of(name)
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    args = bundle_from_folder(folder, tmp_path) + ["--out", str(out)]
    if (folder / "model.safetensors.index.json").is_file():  # not re-laid out yet: its shards stay as published
        args.append("--keep-shards")
    assert bundle_cpu_tier.main(args) == 0
    for file in ("config.json", "README.md"):
        assert (out / name / file).read_text() == (folder / file).read_text(), f"{file} is not what the script makes"

    # Another seed's bundle must be the same recipe: one that differs in anything else is refused.
    shutil.rmtree(out)
    if "--other-seed" in args:
        other_config = Path(args[args.index("--other-seed") + 1]) / "model" / "config.json"
        changed = json.loads(other_config.read_text())
        other_config.write_text(json.dumps({**changed, "recipe": {**changed["recipe"], "epochs": 1}}))
        with pytest.raises(SystemExit, match="2"):
            bundle_cpu_tier.main(args)
        assert not out.exists() or not any(out.iterdir())
        other_config.write_text(json.dumps(changed))
    # A report computed with bf16 features is refused, and nothing is written.
    report = json.loads((bundle / "reports" / "knn_fp16.json").read_text())
    report["features"]["precision"] = "bf16"
    (bundle / "reports" / "knn_fp16.json").write_text(json.dumps(report))
    with pytest.raises(SystemExit, match="2"):
        bundle_cpu_tier.main(args)
    assert not out.exists() or not any(out.iterdir())


def test_readme_table_is_generated_from_the_folders() -> None:
    readme = cpu_tier_table.DOC.read_text()
    table = cpu_tier_table.render(CARDS)
    t = cpu_tier_table
    for begin, block, end in ((t.BEGIN, table, t.END), (t.CONTROLS_BEGIN, t.render_controls(CARDS), t.CONTROLS_END),
                              (t.TRANSFER_BEGIN, t.render_transfer(CARDS), t.TRANSFER_END),
                              (t.CLAIMS_BEGIN, t.render_claims(CARDS), t.CLAIMS_END)):
        assert f"{begin}\n{block}\n{end}" in readme, (
            f"docs/cpu-tier.md's {begin} table is stale: run python scripts/cpu_tier_table.py --write"
        )
    for name in TIER:
        assert f"`{name}`" in table


SHARDED = [n for n in TIER if (folder_of(n) / "model.safetensors.index.json").is_file()]


# an unsharded folder with other seeds and a sharded one, whichever folders those are as seeds land
@pytest.mark.parametrize("name", sorted({next((n for n in WITH_OTHER_SEEDS if n not in SHARDED), TIER[0]), *SHARDED[:1]}))
def test_add_tier_seed_rebuilds_a_folder_from_itself(name: str, tmp_path: Path) -> None:
    """With no new bundle, scripts/add_tier_seed.py reproduces the published folder file for file; a
    folder whose weights are still sharded keeps its shards (the registry pins them)."""
    import add_tier_seed

    method = json.loads((folder_of(name) / "config.json").read_text())["cpu_tier"]["method"]
    assert add_tier_seed.main([method, "--out", str(tmp_path)]) == 0
    for file in sorted(p.name for p in folder_of(name).iterdir()):
        assert (tmp_path / name / file).read_bytes() == (folder_of(name) / file).read_bytes(), file


def test_table_aggregates_seeds_on_fake_folders(tmp_path: Path) -> None:
    """Mean ± sample sd (n - 1) over every seed, rows ordered by mean kNN k=200, one seed shown as is."""
    import statistics

    def card(method: str, seeds: list[tuple[float, float, float]]) -> None:
        scores = [dict(zip(cpu_tier_table.METRICS, s)) for s in seeds]
        tier = {"method": method, "seed": 0, "epochs": 30, "epoch_time_median_s": 40.0, "views_per_s": 400.0,
                "fp16_top1": scores[0], "random_init_top1": {"knn_k20_top1": 0.3, "knn_k200_top1": 0.25, "linear_fast_top1": 0.4},
                "other_seeds": [{"seed": n, "fp16_top1": s} for n, s in enumerate(scores[1:], 1)]}
        folder = tmp_path / f"{method}_resnet18.imagenette64_cpu"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_name": folder.name, "architecture": "resnet18", "cpu_tier": tier}))

    card("simclr", [(0.47, 0.4675, 0.538), (0.48, 0.4702, 0.541), (0.46, 0.4651, 0.533)])
    card("dcl", [(0.57, 0.5669, 0.6145)])  # one seed: no spread is invented
    card("mocov2", [(0.50, 0.4600, 0.52), (0.50, 0.4900, 0.52)])
    table = cpu_tier_table.render(tmp_path)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert [r.split(" | ")[0] for r in rows[:3]] == ["| DCL", "| MoCo v2", "| SimCLR"]  # means 56.69 > 47.50 > 46.76
    simclr = rows[2].split(" | ")
    k200 = [0.4675, 0.4702, 0.4651]
    assert simclr[2] == "3"
    assert simclr[4] == f"{100 * statistics.mean(k200):.2f} ± {100 * statistics.stdev(k200):.2f}%" == "46.76 ± 0.26%"
    assert simclr[6] == "46.75% (seed 0), 47.02% (seed 1), 46.51% (seed 2)"
    dcl = rows[0].split(" | ")
    assert dcl[2] == "1" and dcl[4] == "56.69%" and "±" not in rows[0]
    assert "Not published yet" in table and "CACR" in table.split("Not published yet")[1]


def test_claims_read_gaps_against_twice_the_pooled_sd_on_fake_folders(tmp_path: Path) -> None:
    """A gap clears when it is larger than 2 x the pooled sample sd of the two rows' seeds; controls count as rows."""
    import statistics

    def card(method: str, knn: list[float], controls: list[dict] | None = None) -> None:
        scores = [{"knn_k20_top1": v, "knn_k200_top1": v, "linear_fast_top1": v} for v in knn]
        tier = {"method": method, "seed": 0, "epochs": 30, "epoch_time_median_s": 40.0, "views_per_s": 400.0,
                "fp16_top1": scores[0], "random_init_top1": {}, "controls": controls or [],
                "other_seeds": [{"seed": n, "fp16_top1": v} for n, v in enumerate(scores[1:], 1)]}
        folder = tmp_path / f"{method}_resnet18.imagenette64_cpu"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_name": folder.name, "architecture": "resnet18", "cpu_tier": tier}))

    control = [{"name": "simclr_tau0.1", "seed": n, "changes": {"method_args.temperature": [0.5, 0.1]}, "epochs": 30,
                "train_time_s": 1200.0, "fp16_top1": {"knn_k200_top1": v, "linear_fast_top1": v}}
               for n, v in enumerate([0.55, 0.56, 0.57])]
    card("simclr", [0.46, 0.47, 0.48], control)
    card("dcl", [0.565, 0.567, 0.569])
    card("mocov2", [0.47, 0.48, 0.49])
    card("jcl", [0.49])
    rows = {line.split(" | ")[0].removeprefix("| "): line.split(" | ") for line in cpu_tier_table.render_claims(tmp_path).splitlines()[2:]}
    dcl = rows["DCL vs SimCLR (decoupling + temperature)"]
    pooled = ((2 * statistics.variance([46, 47, 48]) + 2 * statistics.variance([56.5, 56.7, 56.9])) / 4) ** 0.5
    assert dcl[1:5] == ["3 / 3", "+9.70", f"{2 * pooled:.2f}", "**yes**"]
    control_row = rows["DCL vs SimCLR at τ=0.1 (decoupling alone)"]
    assert control_row[1:5] == ["3 / 3", "+0.70", f"{2 * pooled:.2f}", "no"]  # 0.70 < 2 x 0.72
    assert rows["JCL vs MoCo v2"][1:5] == ["1 / 3", "+1.00", "2.00", "no"]  # only MoCo v2's seeds give the spread
    assert rows["SiMo, K=16 vs MoCo v2's queue of 2048"][4] == "not run yet"
    assert rows["CACR vs SimCLR (weighting + views)"][1] == "0 / 3"


def test_each_control_recipe_changes_one_thing_of_a_published_recipe() -> None:
    """Issue 23's controls: SimCLR at DCL's temperature, DCL given CACR's views per image; nothing else moves."""
    from cl_zoo.train.recipe import Recipe

    def recipe(name: str) -> dict:
        return Recipe.load(REPO / "recipes" / f"{name}_imagenette64_cpu_tier.yaml").to_dict()

    expected = {"simclr_tau0.1": {"method_args.temperature": [0.5, 0.1]}, "dcl_150views": {"epochs": [30, 75]},
                "cmc_sharedcrop": {"method_args.view_crops": ["independent", "shared"]}}
    assert set(bundle_cpu_tier.CONTROLS) == set(expected)
    for name, control in bundle_cpu_tier.CONTROLS.items():
        assert bundle_cpu_tier.recipe_changes(recipe(control.method), recipe(name)) == expected[name], name
    assert recipe("simclr_tau0.1")["method_args"]["temperature"] == recipe("dcl")["method_args"]["temperature"]
    cacr = recipe("cacr")
    views_per_image = (1 + cacr["method_args"]["num_positives"]) * cacr["epochs"]
    assert 2 * recipe("dcl_150views")["epochs"] == views_per_image == 150


def _control_bundle(folder: Path, work: Path, control: str, seed: int) -> Path:
    """A control run's bundle as train_cpu_tier.sh leaves it, made from a published seed's reports (the
    scores are not a control's: the test checks the plumbing, not the numbers)."""
    from cl_zoo.train.recipe import Recipe

    bundle = work / f"{control}_seed{seed}"
    for sub in ("reports", "model", "run", "logs"):
        (bundle / sub).mkdir(parents=True)
    for task in ("knn", "linear"):
        shutil.copy2(folder / f"eval_{task}_seed1.json", bundle / "reports" / f"{task}_fp16.json")
    recipe = {**Recipe.load(REPO / "recipes" / f"{control}_imagenette64_cpu_tier.yaml").to_dict(), "seed": seed}
    files = json.loads((folder / "eval_knn_seed1.json").read_text())["model"]["checkpoint_files_sha256"]
    (bundle / "model" / "config.json").write_text(json.dumps({"files": files, "recipe": recipe, "training_precision": "bf16"}))
    header, *rows = (folder / "training_log.csv").read_text().splitlines()
    epochs = [row.split(",", 1)[1] for row in rows]
    log = [header] + [f"{e + 1},{epochs[e % len(epochs)]}" for e in range(recipe["epochs"])]
    (bundle / "run" / "metrics.csv").write_text("\n".join(log) + "\n")
    (bundle / "logs" / "machine.txt").write_text("a test machine\n")
    return bundle


@pytest.mark.skipif(not (CARDS / "dcl_resnet18.imagenette64_cpu" / "eval_knn_seed1.json").is_file(), reason="needs DCL's seed 1")
def test_control_runs_go_into_the_card_the_table_and_back(tmp_path: Path) -> None:
    """add_tier_seed.py --control: the card gains the control's reports, log, change and section; the
    folder rebuilds itself byte for byte; the controls table reads it; a wrong bundle is refused."""
    import add_tier_seed

    folder = CARDS / "dcl_resnet18.imagenette64_cpu"
    bundles = [_control_bundle(folder, tmp_path / "bundles", "dcl_150views", seed) for seed in (7, 8)]  # seeds the real card does not hold
    out = tmp_path / "cards"
    assert add_tier_seed.main(["dcl", "--control", str(bundles[1]), "--control", str(bundles[0]), "--out", str(out)]) == 0
    config = json.loads((out / folder.name / "config.json").read_text())
    controls = config["cpu_tier"]["controls"]
    assert [(c["name"], c["seed"], c["epochs"]) for c in controls if c["seed"] in (7, 8)] == [("dcl_150views", 7, 75), ("dcl_150views", 8, 75)]
    assert controls[0]["changes"] == {"epochs": [30, 75]} and controls[0]["recipe"] == "recipes/dcl_150views_imagenette64_cpu_tier.yaml"
    for name in ("eval_knn_dcl_150views_seed7.json", "eval_linear_dcl_150views_seed8.json", "training_log_dcl_150views_seed8.csv"):
        assert (out / folder.name / name).is_file(), name
    card = (out / folder.name / "README.md").read_text()
    assert "## Controls" in card and "`epochs` 30 → 75" in card
    assert (out / folder.name / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    # The folder is its own source: rebuilt with nothing new, it comes back byte for byte.
    again = tmp_path / "again"
    assert add_tier_seed.main(["dcl", "--cards", str(out), "--out", str(again)]) == 0
    for file in sorted(p.name for p in (out / folder.name).iterdir()):
        assert (again / folder.name / file).read_bytes() == (out / folder.name / file).read_bytes(), file
    table = cpu_tier_table.render_controls(out)
    row = next(line for line in table.splitlines() if line.startswith("| DCL, 75 epochs"))
    knn = [json.loads((folder / "eval_knn_seed1.json").read_text())["metrics"]["knn_k200_top1"]] * 2
    assert f"| {len(controls)} | " in row and f"{100 * knn[0]:.2f}% (seed 7)" in row and "`epochs` 30 → 75" in row
    assert row.endswith(f"| {75 * statistics.median(c['epoch_time_median_s'] for c in controls) / 60:.0f} min |")  # epochs x median, as the tier table
    assert "Not run yet: SimCLR, τ=0.1; CMC, L and ab from one crop." in table
    # Refused: the published recipe with another seed, a control stopped early, a control seed twice.
    plain = _control_bundle(folder, tmp_path / "plain", "dcl", 2)
    short = _control_bundle(folder, tmp_path / "short", "dcl_150views", 9)
    (short / "run" / "metrics.csv").write_text("\n".join((short / "run" / "metrics.csv").read_text().splitlines()[:31]) + "\n")
    for bad in (["--control", str(plain)], ["--control", str(short)], ["--control", str(bundles[0])] * 2):
        with pytest.raises(SystemExit, match="2"):
            add_tier_seed.main(["dcl", *bad, "--out", str(tmp_path / "refused")])
        assert not (tmp_path / "refused" / folder.name).exists()


GPU_MACHINE = "NVIDIA H200 (CUDA 13.0, torch 2.11.0+cu130); host CPU a test CPU (16 usable cores)"


@pytest.mark.skipif(not (CARDS / "dcl_resnet18.imagenette64_cpu" / "eval_knn_seed1.json").is_file(), reason="needs DCL's seed 1")
def test_a_seed_trained_on_a_gpu_says_so_in_the_card_and_the_tables(tmp_path: Path) -> None:
    """scripts/gpu_tier_runs.sh: a seed's machine line names its GPU; the card records where and how long
    it trained (and its training log), labels it, rebuilds itself from itself, and the tables mark it;
    the controls' train-time column stays the CPU seeds' time."""
    import add_tier_seed

    folder = CARDS / "dcl_resnet18.imagenette64_cpu"
    seed = _control_bundle(folder, tmp_path / "bundles", "dcl", 7)  # the published recipe, seed 7: another seed
    (seed / "logs" / "machine.txt").write_text(GPU_MACHINE + "\n")
    header, *rows = (seed / "run" / "metrics.csv").read_text().splitlines()
    (seed / "run" / "metrics.csv").write_text("\n".join([header, *(",".join(r.split(",")[:5] + ["2.5"] + r.split(",")[6:]) for r in rows)]) + "\n")
    control = _control_bundle(folder, tmp_path / "bundles", "dcl_150views", 8)
    (control / "logs" / "machine.txt").write_text(GPU_MACHINE + "\n")
    assert bundle_cpu_tier.training_device(GPU_MACHINE) == "cuda"
    assert bundle_cpu_tier.training_device("AMD EPYC (2 usable cores, AVX512, bf16 units: AVX512_BF16)") == "cpu"
    out = tmp_path / "cards"
    assert add_tier_seed.main(["dcl", str(seed), "--control", str(control), "--out", str(out)]) == 0
    config = json.loads((out / folder.name / "config.json").read_text())
    record = next(o for o in config["cpu_tier"]["other_seeds"] if o["seed"] == 7)
    assert record["machine"] == GPU_MACHINE and record["device"] == "cuda" and record["training_precision"] == "bf16"
    assert record["epoch_time_median_s"] == 2.5 and record["train_time_s"] == 2.5 * 30
    assert (out / folder.name / "training_log_seed7.csv").read_text() == (seed / "run" / "metrics.csv").read_text()
    assert next(c for c in config["cpu_tier"]["controls"] if c["seed"] == 8)["device"] == "cuda"
    card = (out / folder.name / "README.md").read_text()
    assert "training seed 7 (float16; weights not published; trained on a GPU: NVIDIA H200 (CUDA 13.0, torch 2.11.0+cu130))" in card
    assert "| 8 (GPU) |" in card
    # rebuilt from itself: the seed's machine line and log come back, byte for byte
    again = tmp_path / "again"
    assert add_tier_seed.main(["dcl", "--cards", str(out), "--out", str(again)]) == 0
    for file in sorted(p.name for p in (out / folder.name).iterdir()):
        assert (again / folder.name / file).read_bytes() == (out / folder.name / file).read_bytes(), file
    assert "(seed 7, GPU)" in cpu_tier_table.render(out)
    row = next(line for line in cpu_tier_table.render_controls(out).splitlines() if line.startswith("| DCL, 75 epochs"))
    assert "(seed 8, GPU)" in row
    on_cpu = [c for c in config["cpu_tier"]["controls"] if c.get("device") != "cuda"]
    assert row.endswith(f"| {75 * statistics.median(c['epoch_time_median_s'] for c in on_cpu) / 60:.0f} min |")
    # a seed stopped short of its recipe's epochs is refused
    (seed / "run" / "metrics.csv").write_text("\n".join([header, *rows[:3]]) + "\n")
    with pytest.raises(SystemExit, match="2"):
        add_tier_seed.main(["dcl", str(seed), "--out", str(tmp_path / "refused")])


@pytest.mark.parametrize("name", [n for n in TIER if get_pretrained(n).arch == "resnet18"])
def test_exports_to_torchvision_timm_and_detectron2(name: str, tmp_path: Path) -> None:
    model = cl_zoo.create_model(name, pretrained=True).eval()
    for target, file in (("torchvision", "tv.pth"), ("timm", "timm.safetensors"), ("detectron2", "d2.pkl")):
        assert main(["export", target, name, str(tmp_path / file)]) == 0
    reference = resnet18()
    reference.fc = torch.nn.Identity()
    missing, unexpected = reference.load_state_dict(torch.load(tmp_path / "tv.pth", weights_only=True), strict=False)
    assert not unexpected and set(missing) <= {"fc.weight", "fc.bias"}
    reference.eval()
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(reference(images), model(images).float(), atol=1e-4)
    timm_state = load_file(tmp_path / "timm.safetensors")
    tv_state = torch.load(tmp_path / "tv.pth", weights_only=True)
    assert timm_state.keys() == tv_state.keys() and all(torch.equal(timm_state[k], tv_state[k]) for k in tv_state)
    with open(tmp_path / "d2.pkl", "rb") as fh:
        d2 = pickle.load(fh)  # our own file, written a line above
    weights = d2["model"]
    assert "stem.conv1.weight" in weights and "res5.1.conv2.norm.running_var" in weights
    assert weights["stem.conv1.weight"].shape == (64, 3, 7, 7)


@pytest.mark.parametrize("name", [n for n in TIER if get_pretrained(n).arch != "resnet18"])
def test_cmc_pair_is_refused_in_one_line(name: str, tmp_path: Path) -> None:
    for target, suffix in (("torchvision", ".pth"), ("timm", ".safetensors"), ("detectron2", ".pkl")):
        out = tmp_path / f"{target}{suffix}"
        proc = subprocess.run([sys.executable, "-m", "cl_zoo.cli", "export", target, name, str(out)],
                              capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "L/ab pair" in proc.stderr
        assert not out.exists()


def test_cards_say_when_the_head_trained_under_autocast() -> None:
    """Runs exported before the projection head left autocast lack training_head_precision; their
    bf16/fp16 cards say the head's output was rounded, and a rerun today's cannot be."""
    assert bundle_cpu_tier.head_under_autocast({"training_precision": "bf16"})
    assert bundle_cpu_tier.head_under_autocast({"training_precision": "fp16"})
    assert not bundle_cpu_tier.head_under_autocast({"training_precision": "fp32"})
    assert not bundle_cpu_tier.head_under_autocast({"training_precision": "bf16", "training_head_precision": "fp32"})
    for name in TIER:
        config = json.loads((folder_of(name) / "config.json").read_text())
        said = "projection head under" in config[bundle_cpu_tier.ZOO_CFG_KEY]["notes"]
        assert said == bundle_cpu_tier.head_under_autocast(config), name
