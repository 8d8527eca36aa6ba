"""Default report names carry what makes a run another run: seed, protocol, and where the data is."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from cl_zoo.cli.evaluate import _report_path


def report_of(tmp_path: Path, folder: str, seed: int = 0, protocol: str = "knn-k20") -> SimpleNamespace:
    for split in ("train", "test"):
        (tmp_path / folder / split).mkdir(parents=True, exist_ok=True)
    data = {"name": "train", **{split: {"source": str(tmp_path / folder / split)} for split in ("train", "test")}}
    return SimpleNamespace(report={"model": {"name": "resnet18", "weights_sha256": "ab" * 32}, "data": data,
                                   "protocol": protocol, "seed": seed})


def test_a_seed_sweep_and_a_second_dataset_of_the_same_folder_name_get_reports_of_their_own(tmp_path: Path) -> None:
    names = {_report_path(None, "knn", report_of(tmp_path, "pets", seed)) for seed in (0, 1, 2)}
    names.add(_report_path(None, "knn", report_of(tmp_path, "cars")))  # its folder is also called train/
    names.add(_report_path(None, "knn", report_of(tmp_path, "pets", protocol="knn-k200")))
    assert len(names) == 5
    assert all(p.parent == Path("eval-reports") for p in names)
    assert "seed1" in _report_path(None, "knn", report_of(tmp_path, "pets", 1)).name
    # the same run names the same report, so a rerun replaces its own earlier report
    assert _report_path(None, "knn", report_of(tmp_path, "pets")) == _report_path(None, "knn", report_of(tmp_path, "pets"))
