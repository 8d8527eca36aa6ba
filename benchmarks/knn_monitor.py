"""The pretraining loop's kNN monitor: faiss on the host against torch on the training device.

``cl-zoo pretrain`` scores its backbone every ``knn_every`` epochs with a weighted kNN (k=20/200,
T=0.1). This measures the search half of that monitor at CIFAR-10's sizes (50,000 training features
as the memory, 10,000 test features as queries, 512-d, ResNet-18's width), from features that are
already on the device, both ways the trainer can run it:

* baseline, ``faiss``: the features copied to the host, then ``cl_zoo.eval.knn.knn_classify``
  (faiss exact flat index, on the CPU): what the monitor did on every device until 2026-12;
* ``device``: ``cl_zoo.eval.knn_device.knn_top1_on_device``, one matrix product and ``topk`` per
  query slice where the features live. This is what the monitor now does on CUDA.

Each round runs both, in alternating order. The script prints seconds per monitor search for each,
the ratio device / faiss (below 1 means the device search is faster), and whether the two agree on
every accuracy. The features are class clusters with noise, so the accuracies are not trivial; the
numbers on real features can only differ by equal-similarity ties.

    python benchmarks/knn_monitor.py                 # the training device: cuda if there is one
    python benchmarks/knn_monitor.py --device cpu --rounds 2
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from cl_zoo.eval.knn import knn_classify
from cl_zoo.eval.knn_device import knn_top1_on_device

KS = (20, 200)
TEMPERATURE = 0.1


def clustered(n: int, classes: int, dim: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=gen)
    feats = centres[labels] + 3.0 * (dim / 64) ** 0.5 * torch.randn(n, dim, generator=gen)  # overlapping classes
    return feats.to(device), labels


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    ap.add_argument("--bank", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"device: {name}; torch {torch.__version__}; memory {args.bank} x {args.dim}, {args.queries} queries, "
          f"k={','.join(map(str, KS))}, T={TEMPERATURE}")
    bank, bank_labels = clustered(args.bank, 10, args.dim, 0, device)
    queries, query_labels = clustered(args.queries, 10, args.dim, 1, device)

    def with_faiss() -> dict[str, float]:
        result = knn_classify(bank.cpu().numpy(), bank_labels.numpy(), queries.cpu().numpy(), query_labels.numpy(),
                              ks=KS, temperature=TEMPERATURE, num_classes=10, use_gpu=False)
        return {k: v for k, v in result["metrics"].items() if k.endswith("_top1")}

    def on_device() -> dict[str, float]:
        return knn_top1_on_device(bank, bank_labels, queries, query_labels, KS, TEMPERATURE, num_classes=10)

    on_device()  # first call: kernels loaded, allocator warmed
    times: dict[str, list[float]] = {"faiss": [], "device": []}
    answers: dict[str, dict[str, float]] = {}
    for rnd in range(args.rounds):
        order = [("faiss", with_faiss), ("device", on_device)]
        for label, fn in order if rnd % 2 == 0 else order[::-1]:
            sync(device)
            start = time.perf_counter()
            answers[label] = fn()
            sync(device)
            times[label].append(time.perf_counter() - start)
    for label, runs in times.items():
        print(f"{label:>7}: {np.median(runs):.3f} s per monitor search (median of {len(runs)}; "
              f"{', '.join(f'{t:.3f}' for t in runs)}); {answers[label]}")
    ratio = np.median(times["device"]) / np.median(times["faiss"])
    print(f"ratio device / faiss: {ratio:.3f}x ({'device faster' if ratio < 1 else 'faiss faster'}); "
          f"same accuracies: {answers['device'] == answers['faiss']}")


if __name__ == "__main__":
    main()
