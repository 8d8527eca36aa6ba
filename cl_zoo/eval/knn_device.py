"""The weighted kNN vote of :mod:`cl_zoo.eval.knn` on torch tensors, on the device that holds them.

Why a second search beside faiss: the pretraining loop's kNN monitor (k=20/200, T=0.1 on CIFAR-10's
10,000 test images against its 50,000 training images, every ``knn_every`` epochs) must not stall
training. Copying every feature batch to the host and searching with faiss on the CPU leaves a GPU
idle for the whole search while training waits. On a GPU the similarity matrix is one matrix
product and ``topk`` a few kernels, and the features never leave the device.

On a CPU faiss stays the monitor's search: ``benchmarks/knn_monitor.py`` measures both in one run,
and on a CPU this search takes longer than faiss's at both CIFAR-10's and the CPU tier's sizes
(docs/benchmarks.md, "``knn_monitor.py``"). ``cl-zoo knn`` always uses faiss: this module serves the
monitor alone. Its speed on a GPU is for the same benchmark to measure there.

The rule is :func:`cl_zoo.eval.knn.vote`'s: cosine similarity, the k nearest training features vote
for their class with weight ``exp((sim - best_sim) / T)``, the class with the largest summed weight
wins, equal scores going to the lower class id. Neighbours at exactly equal similarity may be taken
in another order than faiss takes them (``topk`` does not promise an order for ties), which can move
a vote at the k-th place; the tests check agreement on features without such ties.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


@torch.no_grad()
def knn_top1_on_device(
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    queries: torch.Tensor,
    query_labels: torch.Tensor,
    ks: Sequence[int],
    temperature: float,
    num_classes: int,
    query_batch: int = 1024,
) -> dict[str, float]:
    """``{"knn_k{k}_top1": accuracy}`` for every k, computed where ``bank`` lives.

    Labels are validated by the caller (:func:`cl_zoo.eval.knn.validate_split_labels`); the one value
    read back on the host is the hit count per k, once, at the end.
    """
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1 or ks[-1] > len(bank):
        raise ValueError(f"k must lie in [1, {len(bank)}], got {ks}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    device = bank.device
    memory = F.normalize(bank.float(), dim=1)
    memory_labels = bank_labels.to(device=device, dtype=torch.int64)
    targets = query_labels.to(device=device, dtype=torch.int64)
    hits = torch.zeros(len(ks), dtype=torch.int64, device=device)
    for start in range(0, len(queries), query_batch):
        q = F.normalize(queries[start : start + query_batch].to(device).float(), dim=1)
        sims, index = (q @ memory.T).topk(ks[-1], dim=1)  # sorted, best first
        labels = memory_labels[index]
        weights = torch.exp((sims.double() - sims[:, :1].double()) / temperature)
        target = targets[start : start + query_batch]
        for i, k in enumerate(ks):
            scores = torch.zeros(len(q), num_classes, dtype=torch.float64, device=device)
            scores.scatter_add_(1, labels[:, :k], weights[:, :k])
            hits[i] += (scores.argmax(dim=1) == target).sum()
    counts = hits.tolist()
    return {f"knn_k{k}_top1": counts[i] / max(len(queries), 1) for i, k in enumerate(ks)}


__all__ = ["knn_top1_on_device"]
