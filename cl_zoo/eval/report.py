"""Evaluation reports: one JSON file per run that says exactly what produced a number.

A kNN or linear accuracy is only meaningful with its model (name, source, revision and the sha256
of the weights actually used), its data (where it was and a hash of the file list), the protocol
and every hyperparameter, the seed and the library versions. Reports hold no host names or user
paths beyond the data location the user passed, so they can be committed next to a checkpoint.
"""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from cl_zoo import __version__
from cl_zoo.checkpoint import CARD_NAME, CONFIG_NAME, load_folder, read_config, upgrade_config
from cl_zoo.checkpoint import card as cards
from cl_zoo.data.named import NAMED_DATASETS
from cl_zoo.errors import CheckpointError, DataError
from cl_zoo.eval.features import weights_sha256
from cl_zoo.fileio import atomic_write_json, atomic_write_text, read_bounded_json
from cl_zoo.optional import is_installed

REPORT_FORMAT_VERSION = 1
# A report is metrics plus provenance (a few KB; a detection report with per-class AP about 10 KB);
# one claiming megabytes is not ours.
MAX_REPORT_BYTES = 4 << 20


def library_versions() -> dict[str, str]:
    import torch
    import torchvision

    # faiss is optional (cl-zoo[index]): linear-eval runs without it, and its report says so.
    faiss_version = "not installed"
    if is_installed("faiss"):
        import faiss

        faiss_version = getattr(faiss, "__version__", "unknown")
    return {
        "cl_zoo": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "numpy": np.__version__,
        "faiss": faiss_version,
    }


def data_entry(data: Any) -> dict[str, Any]:
    """How a split is described in a report (an :class:`~cl_zoo.data.folder.ImageFolderData`)."""
    counts = np.bincount(np.asarray(data.labels, dtype=np.int64), minlength=len(data.classes))
    return {
        "source": str(getattr(data, "source", "")),
        "split": getattr(data, "split", None),
        "file_list_hash": data.file_list_hash,
        "num_images": len(data.paths),
        "num_classes": len(data.classes),
        "classes": list(data.classes),
        "images_per_class": {"min": int(counts.min()) if counts.size else 0, "max": int(counts.max()) if counts.size else 0},
        **({"subset": dict(data.subset)} if getattr(data, "subset", None) else {}),
    }


def data_name(data: Any) -> str:
    """A short name for the data: the named dataset, else the folder/archive name."""
    source = str(getattr(data, "source", "")).rstrip("/\\")
    named = source.split(":", 1)[0].lower()  # named datasets report their source as "cifar10:train"
    if named in NAMED_DATASETS:
        return named
    base = os.path.basename(source) or "data"
    for suffix in (".tar.gz", ".tgz", ".tar", ".zip"):
        if base.lower().endswith(suffix):
            return base[: -len(suffix)]
    return base


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def build_report(
    *,
    task: str,
    model: Mapping[str, Any],
    train: Any,
    test: Any,
    protocol: str,
    hyperparameters: Mapping[str, Any],
    seed: int,
    metrics: Mapping[str, float],
    timings: Mapping[str, float],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the report dictionary (JSON-ready)."""
    report = {
        "format": "cl-zoo-eval",
        "format_version": REPORT_FORMAT_VERSION,
        "task": task,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": dict(model),
        "data": {"name": data_name(train), "train": data_entry(train), "test": data_entry(test)},
        "protocol": protocol,
        "hyperparameters": dict(hyperparameters),
        "seed": seed,
        "metrics": dict(metrics),
        "timings": {k: round(float(v), 3) for k, v in timings.items()},
        "versions": library_versions(),
    }
    if extra:
        report.update(extra)
    return _jsonable(report)


def write_json_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """Write JSON via a temporary file in the same folder: the file is complete or absent."""
    return atomic_write_json(path, _jsonable(obj))


def read_report(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise DataError(f"report not found: {path}")
    report = read_bounded_json(path, max_bytes=MAX_REPORT_BYTES, what="cl-zoo evaluation report")
    if not isinstance(report, dict) or report.get("format") != "cl-zoo-eval":
        raise DataError(f"{path} is not a cl-zoo evaluation report (no \"format\": \"cl-zoo-eval\")")
    if not isinstance(report.get("metrics"), dict) or not report["metrics"]:
        raise DataError(f"{path} holds no metrics")
    return report


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """A short human summary of a report."""
    data = report["data"]
    lines = [
        f"{report['task']} ({report['protocol']}): model {report['model']['name']} "
        f"[{report['model']['weights_sha256'][:12]}], data {data['name']} "
        f"({data['train']['num_images']} train / {data['test']['num_images']} test, {data['train']['num_classes']} classes)"
    ]
    for key, value in report["metrics"].items():
        lines.append(f"  {key:<28} {100 * value:6.2f}%")
    lines.append("  time: " + ", ".join(f"{k} {v:.1f}s" for k, v in report["timings"].items()))
    engine = report.get("features") or {}
    if engine.get("precision"):
        lines.append(f"  features: {engine.get('backend', 'torch')} {engine['precision']}")
    return lines


def compare_reports(
    a: Mapping[str, Any] | str | os.PathLike,
    b: Mapping[str, Any] | str | os.PathLike,
    tolerance: float,
    *,
    metrics: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Per-metric ``{"metric", "a", "b", "diff", "ok"}`` rows: does ``b`` reproduce ``a``?

    Made for checking that a converted copy of a checkpoint (float16 bundled weights) scores like
    the original. Metrics are fractions, so ``tolerance=0.001`` is 0.1 point; ``diff`` is ``b - a``
    and a row is ok when ``|diff| <= tolerance`` (up to float rounding, so a one-image change of
    exactly the tolerance passes). ``metrics`` defaults to the top-1 metrics of ``a``. The two
    reports must come from the same task, protocol and test images, or the numbers say nothing.
    """
    ra = a if isinstance(a, Mapping) else read_report(a)
    rb = b if isinstance(b, Mapping) else read_report(b)
    for key in ("task", "protocol"):
        if ra.get(key) != rb.get(key):
            raise DataError(f"reports differ in {key} ({ra.get(key)!r} vs {rb.get(key)!r}); compare like with like")
    hashes = [((r.get("data") or {}).get("test") or {}).get("file_list_hash") for r in (ra, rb)]
    if hashes[0] != hashes[1]:
        raise DataError("reports were computed on different test images (file-list hashes differ)")
    names = list(metrics) if metrics is not None else [k for k in ra["metrics"] if k.endswith("top1")]
    if not names:
        raise DataError("the first report has no top-1 metric to compare")
    rows = []
    for name in names:
        if name not in ra["metrics"] or name not in rb["metrics"]:
            raise DataError(f"metric {name!r} is missing from {'the first' if name not in ra['metrics'] else 'the second'} report")
        va, vb = float(ra["metrics"][name]), float(rb["metrics"][name])
        diff = vb - va
        rows.append({"metric": name, "a": va, "b": vb, "diff": diff, "ok": abs(diff) <= tolerance + 1e-9})
    return rows


class EvalResult:
    """A finished evaluation: the report plus what the figures need (kept out of the JSON)."""

    def __init__(
        self,
        report: dict[str, Any],
        *,
        test_labels: np.ndarray,
        predictions: np.ndarray,
        classes: Sequence[str],
        test_features: np.ndarray | None = None,
        curve: Mapping[str, Any] | None = None,
    ) -> None:
        self.report = report
        self.test_labels = test_labels
        self.predictions = predictions  # [N, top] ranked class ids of the headline metric
        self.classes = list(classes)
        self.test_features = test_features
        self.curve = curve

    @property
    def metrics(self) -> dict[str, float]:
        return self.report["metrics"]


def card_metric_name(report: Mapping[str, Any], metric: str) -> str:
    """Metric key on a model card: the evaluation data's name in front (``cifar10_knn_k200_top1``),
    since a checkpoint is often evaluated on data other than what it was pretrained on."""
    return f"{_slug(report['data']['name'])}_{metric}"


def _slug(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower() or "data"


def update_card(folder: str | os.PathLike, report_path: str | os.PathLike) -> dict[str, float]:
    """Merge a report's metrics into a checkpoint folder's config.json and re-render its README.md.

    The report must have been produced by the weights in ``folder`` (same state-dict sha256):
    otherwise a card could advertise another model's accuracy. Returns the metrics written.
    """
    folder = Path(folder)
    report = read_report(report_path)
    config = read_config(folder)
    model = load_folder(folder)
    actual = weights_sha256(model)
    claimed = (report.get("model") or {}).get("weights_sha256")
    if claimed != actual:
        raise CheckpointError(
            f"{report_path} was produced by other weights (sha256 {str(claimed)[:12]}...) than {folder} "
            f"({actual[:12]}...); evaluate this checkpoint first"
        )
    metrics = {card_metric_name(report, k): float(v) for k, v in report["metrics"].items()}
    config = upgrade_config(config)  # metrics are a top-level key since format 2 (timm reads pretrained_cfg)
    config["metrics"] = {**(config.get("metrics") or {}), **metrics}
    evaluation = {
        "task": report["task"],
        "protocol": report["protocol"],
        "data": report["data"]["name"],
        # what was measured, for the card: the split and how many of its images (a subset says so)
        "split": report["data"]["test"].get("split"),
        "test_images": report["data"]["test"].get("num_images"),
        "train_images": report["data"]["train"].get("num_images"),
        **{f"{role}_subset": report["data"][role]["subset"] for role in ("train", "test") if report["data"][role].get("subset")},
        "train_file_list_hash": report["data"]["train"]["file_list_hash"],
        "test_file_list_hash": report["data"]["test"]["file_list_hash"],
        "hyperparameters": report.get("hyperparameters", {}),
        "metrics": metrics,
        "created": report.get("created"),
        "cl_zoo_version": (report.get("versions") or {}).get("cl_zoo"),
    }
    previous = [e for e in config.get("evaluations") or [] if isinstance(e, dict)]
    # Re-applying the same report replaces its entry instead of duplicating it.
    previous = [e for e in previous if not (e.get("metrics") == metrics and e.get("created") == evaluation["created"])]
    config["evaluations"] = previous + [evaluation]
    card_path = folder / CARD_NAME
    kept = cards.extra_sections(card_path.read_text(encoding="utf-8")) if card_path.is_file() else {}
    card = cards.render_card(config, sections=kept, folder=folder)
    write_text_atomic(json.dumps(config, indent=2) + "\n", folder / CONFIG_NAME)
    write_text_atomic(card, folder / CARD_NAME)
    return metrics


def write_text_atomic(text: str, path: str | os.PathLike) -> Path:
    """Replace a checkpoint folder's file whole; the folder must already exist."""
    return atomic_write_text(path, text, mkdir=False)
