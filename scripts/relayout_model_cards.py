"""Re-write published CPU-tier folders in the current checkpoint format, without retraining or re-scoring.

    python scripts/relayout_model_cards.py [NAME ...] [--keep-shards]

Each ``model_cards/NAME`` is turned back into the bundle ``scripts/train_cpu_tier.sh`` leaves
(``model/``, ``reports/``, ``run/metrics.csv``, ``logs/machine.txt``, the other seeds' reports, the control
runs' reports and logs) and
published again by ``scripts/bundle_cpu_tier.py``, so a re-laid-out folder is exactly what the
bundle script makes today: config.json in the current format, the card rendered by today's code,
and (unless ``--keep-shards``) the weights in one ``model.safetensors`` holding the same tensors.
``tests/project/test_cpu_tier.py`` uses :func:`bundle_from_folder` for its round trip, so the two cannot
drift.

Why not all at once by default: a folder's weights are ~22 MB of float16 that git stores again
when they are re-laid out; ``--keep-shards`` re-renders config and card alone (a few KB).

It prints the ``_cpu_tier`` pins of every folder whose weight files changed: paste them into
``cl_zoo/models/pretrained.py``, then run the script again so the cards name the registered model.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import bundle_cpu_tier  # noqa: E402
from bundle_cpu_tier import read_json  # noqa: E402


def bundle_from_folder(folder: Path, work: Path) -> list[str]:
    """Rebuild the bundle layout of a published tier folder under ``work``; returns bundle_cpu_tier's
    arguments (without ``--out``)."""
    config = read_json(folder / "config.json")
    bundle, rand = work / "bundle", work / "random"
    shutil.copytree(folder, bundle / "model")
    (bundle / "reports").mkdir()
    rand.mkdir()
    for task in ("knn", "linear"):
        shutil.copy2(folder / f"eval_{task}.json", bundle / "reports" / f"{task}_fp16.json")
        shutil.copy2(folder / f"eval_{task}_fp32.json", bundle / "reports" / f"{task}.json")
        if (folder / f"eval_{task}_random_init.json").is_file():
            shutil.copy2(folder / f"eval_{task}_random_init.json", rand / f"{task}.json")
    (bundle / "run").mkdir()
    shutil.copy2(folder / "training_log.csv", bundle / "run" / "metrics.csv")
    (bundle / "logs").mkdir()
    (bundle / "logs" / "machine.txt").write_text(config["cpu_tier"]["machine"] + "\n", encoding="utf-8")
    args = [config["cpu_tier"]["method"], "--bundle", str(bundle), "--random-init", str(rand)]
    for report in sorted(folder.glob("eval_knn_seed*.json")):  # the other seeds' bundles: reports + recipe
        seed = int(report.stem.removeprefix("eval_knn_seed"))
        other = work / f"seed{seed}"
        (other / "reports").mkdir(parents=True)
        (other / "model").mkdir()
        for task in ("knn", "linear"):
            shutil.copy2(folder / f"eval_{task}_seed{seed}.json", other / "reports" / f"{task}_fp16.json")
        files = read_json(report)["model"]["checkpoint_files_sha256"]
        record = next((o for o in config["cpu_tier"].get("other_seeds") or [] if o["seed"] == seed), {})
        other_config = {"files": files, "recipe": {**config["recipe"], "seed": seed}}
        if record.get("training_precision"):
            other_config["training_precision"] = record["training_precision"]
        (other / "model" / "config.json").write_text(json.dumps(other_config), encoding="utf-8")
        if record.get("machine"):  # seeds recorded with where they trained (older records: all on CPUs)
            (other / "logs").mkdir()
            (other / "logs" / "machine.txt").write_text(record["machine"] + "\n", encoding="utf-8")
        if (folder / f"training_log_seed{seed}.csv").is_file():
            (other / "run").mkdir()
            shutil.copy2(folder / f"training_log_seed{seed}.csv", other / "run" / "metrics.csv")
        args += ["--other-seed", str(other)]
    for entry in config["cpu_tier"].get("controls") or []:  # control runs: reports, training log, recipe
        files = bundle_cpu_tier.control_files(entry)
        control = work / f"control_{entry['name']}_seed{entry['seed']}"
        for sub in ("reports", "model", "run", "logs"):
            (control / sub).mkdir(parents=True)
        for task in ("knn", "linear"):
            shutil.copy2(folder / files[task], control / "reports" / f"{task}_fp16.json")
        shutil.copy2(folder / files["log"], control / "run" / "metrics.csv")
        (control / "logs" / "machine.txt").write_text(entry["machine"] + "\n", encoding="utf-8")
        recipe = copy.deepcopy(config["recipe"])
        for key, (_, value) in entry["changes"].items():
            *parents, leaf = key.split(".")
            node = recipe
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        recipe["seed"] = entry["seed"]
        files_sha = read_json(folder / files["knn"])["model"]["checkpoint_files_sha256"]
        control_config = {"files": files_sha, "recipe": recipe, "training_precision": entry["training_precision"]}
        (control / "model" / "config.json").write_text(json.dumps(control_config), encoding="utf-8")
        args += ["--control", str(control)]
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="folders under --cards (default: every CPU-tier folder)")
    parser.add_argument("--cards", type=Path, default=REPO / "model_cards")
    parser.add_argument("--keep-shards", action="store_true", help="re-render config.json and the card only")
    args = parser.parse_args(argv)
    names = args.names or sorted(p.name for p in args.cards.iterdir() if (p / "config.json").is_file()
                                 and "cpu_tier" in read_json(p / "config.json"))
    changed: list[str] = []
    for name in names:
        folder = args.cards / name
        before = read_json(folder / "config.json").get("files")
        with tempfile.TemporaryDirectory(prefix="relayout-") as work:
            bundle_args = bundle_from_folder(folder, Path(work))
            bundle_args += ["--out", str(args.cards)] + (["--keep-shards"] if args.keep_shards else [])
            bundle_cpu_tier.main(bundle_args)
        after = read_json(folder / "config.json")
        if after.get("files") != before:
            changed.append(f"{name}: {json.dumps(after['files'])}")
    if changed:
        print("\nweight files changed; new pins for cl_zoo/models/pretrained.py:\n" + "\n".join(changed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
