"""Evaluation of frozen features: weighted kNN and linear probes, with reports and figures.

``knn_classify`` / ``linear_fast`` work on NumPy features (the pretraining monitor calls them on
features it already holds); ``evaluate_knn`` / ``evaluate_linear`` take a model and two
ImageFolder splits, use the on-disk feature cache and return an ``EvalResult`` with its report.
"""

from __future__ import annotations

from cl_zoo.eval.knn import evaluate_knn, knn_classify
from cl_zoo.eval.linear import PROTOCOLS, evaluate_linear, linear_augmented, linear_fast
from cl_zoo.eval.report import EvalResult, update_card

__all__ = [
    "knn_classify",
    "evaluate_knn",
    "linear_fast",
    "linear_augmented",
    "evaluate_linear",
    "PROTOCOLS",
    "EvalResult",
    "update_card",
]
