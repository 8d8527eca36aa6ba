"""What int8 does to the features users search with, on the trained CPU-tier checkpoints.

For each tier ResNet-18 (``model_cards/*_resnet18.imagenette64_cpu``, the bundled default first)
it runs ``cl-zoo knn`` on Imagenette (train as the memory, val as the queries, k=20,200, T=0.1 as
the cards) twice in one process, OpenVINO fp32 and ``--precision int8``, and prints:

* the int8 gate's own measurement (recall@10 and min cosine on the held-out calibration half);
* recall@10 of every val image's 10 nearest train images under int8 against fp32 (faiss exact);
* the minimum per-image cosine between int8 and fp32 features over train and val;
* kNN top-1 at k=20 and k=200 for fp32 and int8, and the change in points;
* images/s of each feature extraction (end to end from JPEGs, the 2-core machine's decode included).

The int8 calibration is 512 train images drawn with the evaluation seed (half calibrate, half are
held out for the gate), as ``cl-zoo knn --precision int8`` does. The features cache is bypassed
(``cache=False``) so both runs compute.

    python benchmarks/int8_fidelity.py                        # all tier ResNet-18s, ~10 min on 2 cores
    python benchmarks/int8_fidelity.py --models cacr_resnet18.imagenette64_cpu
    python benchmarks/int8_fidelity.py --candidate bf16   # the same columns for OpenVINO bf16 (no gate)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import cl_zoo  # noqa: E402
from cl_zoo.backends.int8 import int8_available, min_cosine  # noqa: E402
from cl_zoo.data.folder import open_image_folder  # noqa: E402
from cl_zoo.eval.features import split_features  # noqa: E402
from cl_zoo.eval.knn import knn_classify  # noqa: E402
from cl_zoo.registry import DEFAULT_MODEL  # noqa: E402


def recall_at_10(database_ref: np.ndarray, queries_ref: np.ndarray, database: np.ndarray, queries: np.ndarray) -> float:
    import faiss

    def neighbours(db: np.ndarray, q: np.ndarray) -> np.ndarray:
        db = np.ascontiguousarray(db / np.linalg.norm(db, axis=1, keepdims=True), dtype=np.float32)
        q = np.ascontiguousarray(q / np.linalg.norm(q, axis=1, keepdims=True), dtype=np.float32)
        index = faiss.IndexFlatIP(db.shape[1])
        index.add(db)
        return index.search(q, 10)[1]

    ref, cand = neighbours(database_ref, queries_ref), neighbours(database, queries)
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ref, cand)]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "datasets")
    parser.add_argument("--models", default=None, help="comma-separated names (default: every tier ResNet-18)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--candidate", choices=("int8", "bf16"), default="int8",
                        help="the precision compared with OpenVINO fp32 (the columns keep the name int8)")
    args = parser.parse_args()
    if not int8_available():
        print("needs the int8 extra: pip install 'cl-zoo[int8]'", file=sys.stderr)
        return 2
    if args.models:
        names = args.models.split(",")
    else:
        found = sorted(p.name for p in (REPO / "model_cards").glob("*_resnet18.imagenette64_cpu"))
        names = [DEFAULT_MODEL] + [n for n in found if n != DEFAULT_MODEL]
    train = open_image_folder("imagenette", root=args.data_root, split="train")
    test = open_image_folder("imagenette", root=args.data_root, split="val")
    print(f"Imagenette: {len(train.paths)} train (memory), {len(test.paths)} val (queries); kNN T=0.1; seed {args.seed}")
    header = ("model", "gate r@10", "gate cos", "val r@10", "min cos", "k20 fp32", "k20 int8", "k200 fp32", "k200 int8",
              "d k200", "fp32 img/s", "int8 img/s")
    print(" | ".join(header))
    worst = 1.0
    for name in names:
        model = cl_zoo.load_model(name)
        out = {}
        for precision in ("fp32", args.candidate):
            opts = dict(cache=False, workers=2, precision=precision, backend="openvino", calibration=train.paths,
                        calibration_seed=args.seed)
            start = time.perf_counter()
            tr = split_features(model, train, **opts)
            te = split_features(model, test, **opts)
            seconds = time.perf_counter() - start
            if tr.precision != precision:  # the gate refused int8: the row then compares what runs instead
                fidelity = (tr.quantization or {}).get("fidelity", {})
                print(f"{name}: int8 failed its gate (recall@10 {fidelity.get('recall_at_10', float('nan')):.3f}, "
                      f"min cosine {fidelity.get('min_cosine', float('nan')):.4f}); the int8 columns are {tr.precision}")
            knn = knn_classify(tr.features, tr.labels, te.features, te.labels, ks=[20, 200], temperature=0.1,
                               num_classes=len(train.classes), use_gpu=False)["metrics"]
            out[precision] = (tr, te, knn, (len(train.paths) + len(test.paths)) / seconds)
        (tr32, te32, k32, r32), (tr8, te8, k8, r8) = out["fp32"], out[args.candidate]
        gate = (tr8.quantization or {}).get("fidelity", {})
        recall = recall_at_10(tr32.features, te32.features, tr8.features, te8.features)
        worst = min(worst, recall)
        cos = min(min_cosine(tr32.features, tr8.features), min_cosine(te32.features, te8.features))
        key20, key200 = "knn_k20_top1", "knn_k200_top1"
        row = (name if tr8.precision == args.candidate else f"{name} [{tr8.precision}]", f"{gate.get('recall_at_10', float('nan')):.3f}", f"{gate.get('min_cosine', float('nan')):.4f}",
               f"{recall:.3f}", f"{cos:.4f}", f"{k32[key20]:.2%}", f"{k8[key20]:.2%}", f"{k32[key200]:.2%}",
               f"{k8[key200]:.2%}", f"{(k8[key200] - k32[key200]) * 100:+.2f} pt", f"{r32:.0f}", f"{r8:.0f}")
        print(" | ".join(row), flush=True)
    print(f"lowest val recall@10 against fp32: {worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
