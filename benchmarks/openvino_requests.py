"""How big OpenVINO's infer requests should be: the dynamic-batch graph against static batches.

``cl_zoo.backends.openvino.REQUEST_IMAGES`` fixes every infer request at a static batch; this
measures why, on this machine. For one converted graph (ResNet-50 at 224 px, seeded random weights,
converted by cl-zoo into its cache; int8 quantized on seeded noise, which says nothing about
fidelity but runs the same kernels) it compiles, per configuration, a fresh model from the cache the
way ``OpenVINORunner`` does (THROUGHPUT hint, all usable cores) and prints:

* compile: CPU-ms of ``compile_model`` from the plugin's blob cache;
* first call: CPU-ms the first round of requests costs beyond a steady round (what every new
  process pays before its first batch);
* steady: CPU-ms per image and images/s over 256 images, requests queued back to back.

The baseline is the dynamic-batch graph split into one request per stream (what cl-zoo ran until
2026-12) at ``--batch`` images per batch; each static size is printed as a ratio against it, all
configurations alternating within each round so that a drifting host weighs on all of them alike.

    python benchmarks/openvino_requests.py                    # bf16 and int8, sizes 4, 8, 16; ~2 minutes
    python benchmarks/openvino_requests.py --precisions bf16 --sizes 8,32 --rounds 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import cl_zoo  # noqa: E402
from cl_zoo.backends import openvino_available  # noqa: E402
from cl_zoo.backends.int8 import int8_available  # noqa: E402
from cl_zoo.data.workers import usable_cpus  # noqa: E402
from cl_zoo.embedding import Preprocess, model_fingerprint  # noqa: E402
from cl_zoo.precision import cpu_capability  # noqa: E402

HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}


def graph_xml(model, precision: str) -> Path:  # noqa: ANN001
    """The cached graph cl-zoo runs for ``precision`` (converted, or quantized, on first use)."""
    from cl_zoo.backends.openvino import OpenVINORunner

    pre = Preprocess.from_model(model)
    calibration = None
    if precision == "int8":
        calibration = np.random.default_rng(0).integers(0, 256, (64, *pre.crop_size, 3), dtype=np.uint8)
    runner = OpenVINORunner(model, fingerprint=model_fingerprint(model), input_hw=pre.crop_size, mean=pre.mean, std=pre.std,
                            precision=precision, threads=usable_cpus(), calibration=calibration, force_int8=True)
    folder = runner.int8_folder if precision == "int8" else runner.folder
    assert folder is not None
    return folder / "model.xml"


def measure(xml: Path, precision: str, size: int | None, batch: int, blobs: Path, images: int = 256) -> tuple[float, float, float, float]:
    """(compile CPU-ms, first-call extra CPU-ms, steady CPU-ms/image, images/s); ``size=None``: dynamic batch."""
    import openvino as ov

    core = ov.Core()
    graph = core.read_model(str(xml))
    shape = graph.input(0).get_partial_shape()
    rest = [shape[i].get_length() for i in range(1, shape.rank.get_length())]
    if size is not None:
        graph.reshape(ov.PartialShape([size, *rest]))
    config = {"INFERENCE_PRECISION_HINT": HINTS[precision], "PERFORMANCE_HINT": "THROUGHPUT",
              "INFERENCE_NUM_THREADS": usable_cpus(), "CACHE_DIR": str(blobs / f"{precision}-{size}")}
    start = time.process_time()
    compiled = core.compile_model(graph, "CPU", config)
    compile_ms = (time.process_time() - start) * 1000
    jobs = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
    queue = ov.AsyncInferQueue(compiled, jobs)
    per_request = size if size is not None else -(-batch // jobs)
    pixels = np.random.default_rng(0).integers(0, 256, (per_request, *rest), dtype=np.uint8)

    def round_of(requests: int) -> float:
        start = time.process_time()
        for _ in range(requests):
            queue.start_async({0: pixels}, share_inputs=True)
        queue.wait_all()
        return time.process_time() - start

    first = round_of(jobs)
    requests = max(jobs, images // per_request)
    wall = time.perf_counter()
    steady = round_of(requests)
    wall = time.perf_counter() - wall
    done = requests * per_request
    steady_ms = steady / done * 1000
    return compile_ms, first * 1000 - steady_ms * jobs * per_request, steady_ms, done / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", help="architecture (seeded random weights)")
    parser.add_argument("--precisions", default="bf16,int8")
    parser.add_argument("--sizes", default="4,8,16", help="static request sizes to compare")
    parser.add_argument("--batch", type=int, default=32, help="the dynamic baseline's batch, split across the streams")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not openvino_available():
        print("needs openvino (pip install 'cl-zoo[openvino]')", file=sys.stderr)
        return 2
    precisions = args.precisions.split(",")
    if "int8" in precisions and not int8_available():
        print("int8 needs nncf (pip install 'cl-zoo[int8]'); skipping it", file=sys.stderr)
        precisions.remove("int8")
    import openvino
    import torch

    torch.manual_seed(0)
    model = cl_zoo.create_model(args.model).eval()
    print(f"cpu: {cpu_capability().describe()}; openvino {openvino.__version__}; {args.model}, {usable_cpus()} threads")
    configs: list[int | None] = [None, *(int(s) for s in args.sizes.split(","))]
    with tempfile.TemporaryDirectory() as tmp:
        for precision in precisions:
            xml = graph_xml(model, precision)
            for size in configs:  # fill each blob cache once, outside the rounds
                measure(xml, precision, size, args.batch, Path(tmp), images=16)
            results: dict[int | None, list[tuple[float, float, float, float]]] = {size: [] for size in configs}
            for _ in range(args.rounds):
                for size in configs:
                    results[size].append(measure(xml, precision, size, args.batch, Path(tmp)))
            base = np.mean([r[2] for r in results[None]])
            print(f"{precision}: mean of {args.rounds} rounds, compiled from the blob cache")
            print(f"  {'requests':>22} | compile ms | first call +ms | steady CPU-ms/img | img/s | CPU vs dynamic")
            for size in configs:
                compile_ms, first_ms, steady_ms, rate = np.mean(results[size], axis=0)
                name = f"dynamic, {args.batch}/streams" if size is None else f"static {size}"
                print(f"  {name:>22} | {compile_ms:10.0f} | {first_ms:14.0f} | {steady_ms:17.3f} | {rate:5.0f} | {steady_ms / base:6.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
