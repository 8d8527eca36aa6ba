"""The kNN monitor's search on torch tensors gives cl-zoo knn's (faiss) answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cl_zoo.eval.knn import knn_classify
from cl_zoo.eval.knn_device import knn_top1_on_device


def _clustered(n: int, classes: int, dim: int, seed: int, spread: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping clusters around fixed class centres (the same for every ``seed``): accuracies well
    away from chance and from 1, no two similarities equal."""
    centres = np.random.default_rng(1234).standard_normal((classes, dim)).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    return (centres[labels] + spread * rng.standard_normal((n, dim))).astype(np.float32), labels


@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_device_search_gives_faiss_accuracies(temperature: float) -> None:
    bank, bank_labels = _clustered(3000, 10, 64, seed=0)
    queries, query_labels = _clustered(700, 10, 64, seed=1)
    ks = (1, 20, 200)
    want = knn_classify(bank, bank_labels, queries, query_labels, ks=ks, temperature=temperature, num_classes=10,
                        use_gpu=False)["metrics"]
    got = knn_top1_on_device(torch.from_numpy(bank), torch.from_numpy(bank_labels), torch.from_numpy(queries),
                             torch.from_numpy(query_labels), ks, temperature, num_classes=10, query_batch=128)
    assert set(got) == {"knn_k1_top1", "knn_k20_top1", "knn_k200_top1"}
    for key, value in got.items():
        assert value == want[key], key
    assert 0.3 < got["knn_k200_top1"] < 0.95 and got["knn_k1_top1"] < got["knn_k200_top1"]  # a test that can tell right from wrong votes


def test_equal_votes_go_to_the_lower_class_as_in_cl_zoo_knn() -> None:
    # the query sits exactly between one class-1 and one class-0 neighbour: equal weights
    bank = np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 0.0]], np.float32)
    bank_labels = np.array([1, 0, 2])
    queries, query_labels = np.array([[1.0, 0.0]], np.float32), np.array([0])
    want = knn_classify(bank, bank_labels, queries, query_labels, ks=(2,), temperature=0.1, num_classes=3,
                        use_gpu=False)["metrics"]["knn_k2_top1"]
    got = knn_top1_on_device(torch.from_numpy(bank), torch.from_numpy(bank_labels), torch.from_numpy(queries),
                             torch.from_numpy(query_labels), (2,), 0.1, num_classes=3)["knn_k2_top1"]
    assert got == want == 1.0


def test_unnormalised_low_precision_features_are_scored_by_cosine() -> None:
    bank, bank_labels = _clustered(500, 5, 32, seed=2)
    queries, query_labels = _clustered(200, 5, 32, seed=3)
    scale = torch.from_numpy(np.random.default_rng(4).uniform(0.1, 10.0, (500, 1)).astype(np.float32))
    plain = knn_top1_on_device(torch.from_numpy(bank), torch.from_numpy(bank_labels), torch.from_numpy(queries),
                               torch.from_numpy(query_labels), (20,), 0.1, num_classes=5)
    scaled = knn_top1_on_device(torch.from_numpy(bank) * scale, torch.from_numpy(bank_labels), torch.from_numpy(queries) * 3,
                                torch.from_numpy(query_labels), (20,), 0.1, num_classes=5)
    assert plain == scaled


@pytest.mark.parametrize("ks, temperature, words", [((0,), 0.1, "k must lie"), ((11,), 0.1, "k must lie"),
                                                    ((5,), 0.0, "temperature")])
def test_bad_arguments_are_one_line_errors(ks, temperature, words) -> None:
    feats, labels = torch.randn(10, 4), torch.arange(10) % 2
    with pytest.raises(ValueError, match=words):
        knn_top1_on_device(feats, labels, feats, labels, ks, temperature, num_classes=2)


def test_the_monitor_benchmark_runs_and_finds_both_searches_agree() -> None:
    """``benchmarks/knn_monitor.py`` at toy sizes: what the next GPU session will run must not have rotted."""
    import subprocess
    import sys

    from tests.helpers import REPO_ROOT

    script = REPO_ROOT / "benchmarks" / "knn_monitor.py"
    if not script.is_file():
        pytest.skip("benchmarks/ is not shipped in the wheel; run from the repository")
    done = subprocess.run([sys.executable, str(script), "--device", "cpu", "--bank", "600", "--queries", "100",
                           "--dim", "16", "--rounds", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ratio device / faiss:" in done.stdout and "same accuracies: True" in done.stdout
