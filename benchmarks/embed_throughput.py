"""Images/s of ``cl-zoo embed``'s loop against a plain torchvision fp32 pipeline, end to end from JPEGs.

Everything runs in one process on the same photos (the 255 real ImageNet photos of
``../shared/datasets/imagenet-samples.tar.gz``, repeated to ``--count``), with the same model
(ResNet-50 at 224 px, seeded random weights), batch size, DataLoader workers and device:

* baseline: what one writes by hand: full PIL decode, ``Resize`` + ``CenterCrop`` + ``ToTensor`` +
  ``Normalize`` per image, ``model.eval()`` under ``torch.no_grad()``, fp32;
* cl-zoo defaults: ``extract_features(precision="auto", backend="auto")``, what ``cl-zoo embed``
  runs (bf16 on AMX / AVX512_BF16 CPUs, OpenVINO when installed);
* every engine separately: torch fp32, torch bf16, OpenVINO fp32, OpenVINO bf16 and, with the
  ``int8`` extra, OpenVINO int8 (NNCF, calibrated on the distinct photos and forced past its gate,
  because seeded random weights say nothing about fidelity: ``benchmarks/int8_fidelity.py``
  measures that on the trained tier checkpoints), each with the minimum per-image cosine of its
  features to cl-zoo's torch fp32 features;
* where the time goes: decoding alone (cl-zoo's draft-mode decode through the very loader the
  pipeline uses, all cores, rate D; and the baseline's full decode) and, per engine, the model
  alone on an already-decoded batch (all cores, same batch size, fed as the pipeline feeds it,
  rate M);
* the bound those imply when decode and inference share the same cores: per image the CPU spends
  ``cores/D`` seconds decoding and ``cores/M`` in the model, and CPU time adds up, so no schedule
  beats ``B = 1 / (1/D + 1/M)`` images/s; each engine's end-to-end rate is printed as a share of
  its own B (on a GPU the model does not use the CPU's cores, so there the bound is ``min(D, M)``).

The OpenVINO conversion is a one-time cost (cached per weights and input size); it is done and
timed before the timed runs and printed on its own line. Prints the CPU model and its bf16 units
first, ratios last.

    python benchmarks/embed_throughput.py                       # CPU, ~3-5 minutes on 2 cores
    python benchmarks/embed_throughput.py --count 256 --engines openvino-bf16,openvino-int8
    python benchmarks/embed_throughput.py --count 512 --device cuda
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as T

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import cl_zoo  # noqa: E402
from cl_zoo.backends import openvino_available  # noqa: E402
from cl_zoo.backends.int8 import int8_available  # noqa: E402
from cl_zoo.data.images import discover_images  # noqa: E402
from cl_zoo.data.workers import default_workers, usable_cpus  # noqa: E402
from cl_zoo.embedding import Preprocess, extract_features, resolve_device  # noqa: E402
from cl_zoo.embedding.preprocess import decode_images  # noqa: E402
from cl_zoo.embedding.extract import BatchForward, image_batches, overlapped, prepare_engine  # noqa: E402
from cl_zoo.embedding.options import EngineOptions  # noqa: E402
from cl_zoo.precision import cpu_capability  # noqa: E402


class BaselineDataset(torch.utils.data.Dataset):
    def __init__(self, paths: list[str], transform: T.Compose) -> None:
        self.paths, self.transform = paths, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.paths[i], "rb") as fh:
            img = Image.open(fh).convert("RGB")
        return self.transform(img)


def baseline_transform(model: torch.nn.Module) -> T.Compose:
    cfg = model.pretrained_cfg
    return T.Compose([T.Resize(cfg.resize_size), T.CenterCrop(cfg.input_size[1:]), T.ToTensor(), T.Normalize(cfg.mean, cfg.std)])


def baseline(model: torch.nn.Module, paths: list[str], batch: int, workers: int, device: torch.device) -> float:
    loader = torch.utils.data.DataLoader(
        BaselineDataset(paths, baseline_transform(model)), batch_size=batch, num_workers=workers,
        pin_memory=device.type == "cuda",
    )
    net = model.to(device).eval()
    start = time.perf_counter()
    n = 0
    with torch.no_grad():
        for x in loader:
            net(x.to(device)).cpu()
            n += len(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def ours(model, paths, batch, workers, device, precision, backend, **int8):  # noqa: ANN001, ANN003, ANN201
    start = time.perf_counter()
    result = extract_features(model, paths, batch_size=batch, workers=workers, device=device, precision=precision, backend=backend,
                              **(int8 if precision == "int8" else {}))
    assert len(result.paths) == len(paths), result.failures[:3]
    return len(paths) / (time.perf_counter() - start), result


def decode_only(dataset: torch.utils.data.Dataset, batch: int, workers: int) -> float:
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers)
    start = time.perf_counter()
    n = 0
    for item in loader:
        n += len(item)
    return n / (time.perf_counter() - start)


def decode_rate(paths: list[str], pre: Preprocess, batch: int, workers: int) -> float:
    """D: images/s of cl-zoo's own decode loader (what ``run_batches`` consumes), nothing else running.

    Timed over the run's images twice in one pass, so that starting the worker processes (about
    0.1 s) weighs half as much as in a run of ``--count`` images: D is a bound, and a bound that
    includes start-up costs flatters every share measured against it.
    """
    paths = list(paths) * 2
    batches = [list(range(s, min(s + batch, len(paths)))) for s in range(0, len(paths), batch)]
    start = time.perf_counter()
    n = sum(len(indices) for indices, _, _ in image_batches(paths, pre, batches, workers, torch.device("cpu")))
    return n / (time.perf_counter() - start)


def model_rate(model, paths, batch, workers, device, precision, backend, images, **int8):  # noqa: ANN001, ANN003, ANN201
    """(M, setup seconds): images/s of the engine alone on one decoded batch, fed back to back as
    ``run_batches`` feeds it, and how long preparing the engine took (compiling from the cache)."""
    start = time.perf_counter()
    options = EngineOptions(batch_size=batch, device=device, workers=workers, precision=precision, backend=backend,
                            **(int8 if precision == "int8" else {}))
    engine = prepare_engine(model, paths, options, need_fingerprint=False)
    setup = time.perf_counter() - start
    forward = BatchForward(model, engine)
    pixels = torch.from_numpy(decode_images(paths[:batch], engine.preprocess))
    rounds = max(2, images // batch)
    with forward.context():
        forward(pixels)  # warm-up: first-inference allocations and kernel selection
        start = time.perf_counter()
        overlapped(range(rounds), forward, lambda _: pixels, lambda _, feats: None)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return rounds * len(pixels) / (time.perf_counter() - start), setup


def bound(d: float, m: float, device: torch.device) -> float:
    """Images/s no schedule can beat: CPU time per image adds up on the CPU; a GPU model runs beside it."""
    return min(d, m) if device.type == "cuda" else 1.0 / (1.0 / d + 1.0 / m)


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def photo_paths(archive: Path, count: int, cache: Path) -> list[str]:
    folder = cache / "imagenet-samples"
    if not (folder / ".complete").exists():
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")
        (folder / ".complete").touch()
    photos = discover_images([folder])
    return [photos[i % len(photos)] for i in range(count)]


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", type=Path, default=REPO.parent / "shared" / "datasets" / "imagenet-samples.tar.gz")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/cl-zoo-test-data"))
    parser.add_argument("--model", default="resnet50", help="architecture (seeded random weights)")
    parser.add_argument("--count", type=int, default=256, help="images per run (photos repeated)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=None, help="decode workers for every pipeline (default: cl-zoo's choice)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engines", default="all",
                        help="'all', 'none' (defaults only) or a comma list of backend-precision, e.g. openvino-bf16,openvino-int8")
    parser.add_argument("--model-images", type=int, default=None, help="images per model-only run (default: --count / 2)")
    args = parser.parse_args()
    if not args.archive.is_file():
        print(f"needs {args.archive}", file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    workers = args.workers  # None: cl-zoo chooses, as `cl-zoo embed` does
    paths = photo_paths(args.archive, args.count, args.cache)
    torch.manual_seed(0)
    model = cl_zoo.create_model(args.model).eval()
    cap = cpu_capability()
    try:
        load = "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = "load average unknown"
    ov = "not installed"
    if openvino_available():
        import openvino

        ov = openvino.__version__
    print(f"cpu: {cap.describe()}; AMX {'yes' if cap.amx else 'no'}, AVX512_BF16 {'yes' if cap.avx512_bf16 else 'no'}; {load}")
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), openvino {ov}")
    print(f"{args.model} {model.pretrained_cfg.input_size[1]}px, {len(paths)} JPEGs end to end, batch {args.batch}, "
          f"{'auto' if workers is None else workers} decode workers, device {device}")

    engines = [("fp32", "torch"), ("bf16", "torch")]
    int8_options = {"calibration": sorted(set(paths)), "force_int8": True}
    if device.type == "cpu" and openvino_available():
        engines += [("fp32", "openvino"), ("bf16", "openvino")]
        for prec in ("fp32", "bf16"):  # one-time conversion/compilation, outside the timed runs
            start = time.perf_counter()
            warm = extract_features(model, paths[:2], batch_size=2, workers=0, device=device, precision=prec, backend="openvino")
            print(f"openvino {prec}: {warm.backend_reason} in {time.perf_counter() - start:.1f} s (one time, cached)")
        if int8_available():
            engines.append(("int8", "openvino"))
            start = time.perf_counter()
            warm = extract_features(model, paths[:2], batch_size=2, workers=0, device=device, precision="int8", backend="openvino",
                                    **int8_options)
            print(f"openvino int8: {warm.backend_reason} in {time.perf_counter() - start:.1f} s (one time, cached)")
    if device.type == "cuda":
        baseline(model, paths[: args.batch * 2], args.batch, 0, device)
        extract_features(model, paths[: args.batch * 2], batch_size=args.batch, workers=0, device=device)

    # Where the time goes: decoding alone (both pipelines, all cores) and, per engine, the model alone.
    pre = Preprocess.from_model(model)
    cores = usable_cpus()
    dec_ours = decode_rate(paths, pre, args.batch, cores)
    dec_base = decode_only(BaselineDataset(paths, baseline_transform(model)), args.batch, cores)
    print(f"decode only ({cores} workers): cl-zoo draft decode D = {dec_ours:.1f} images/s, baseline full decode {dec_base:.1f} images/s")

    before = cpu_seconds()
    base = baseline(model, paths, args.batch, default_workers() if workers is None else workers, device)
    print(f"baseline torchvision fp32: {base:.2f} images/s, {(cpu_seconds() - before) / len(paths) * 1000:.0f} CPU-ms/image", flush=True)
    before = cpu_seconds()
    default_rate, default_result = ours(model, paths, args.batch, workers, device, "auto", "auto")
    chosen = (default_result.precision, default_result.backend)
    print(f"cl-zoo defaults ({chosen[1]} {chosen[0]}: {default_result.backend_reason}): {default_rate:.2f} images/s, "
          f"{(cpu_seconds() - before) / len(paths) * 1000:.0f} CPU-ms/image", flush=True)
    features = {chosen: default_result.features}
    rates = {chosen: default_rate}
    cpu_ms = {chosen: (cpu_seconds() - before) / len(paths) * 1000}
    if args.engines == "all":
        wanted = engines
    elif args.engines == "none":
        wanted = []
    else:
        names = {f"{backend}-{prec}": (prec, backend) for prec, backend in engines}
        unknown = [e for e in args.engines.split(",") if e not in names]
        if unknown:
            print(f"unknown engine(s) {', '.join(unknown)}; available here: {', '.join(names)}", file=sys.stderr)
            return 2
        wanted = [names[e] for e in args.engines.split(",")]
    for prec, backend in wanted:
        if (prec, backend) == chosen:
            continue
        before = cpu_seconds()
        rate, result = ours(model, paths, args.batch, workers, device, prec, backend, **int8_options)
        features[(prec, backend)], rates[(prec, backend)] = result.features, rate
        cpu_ms[(prec, backend)] = (cpu_seconds() - before) / len(paths) * 1000
        print(f"cl-zoo {backend} {prec}: {rate:.2f} images/s, {cpu_ms[(prec, backend)]:.0f} CPU-ms/image", flush=True)
    model_images = args.model_images or max(4 * args.batch, args.count // 2)  # 4 batches measured too little of the steady rate
    model_only, setup = {}, {}
    for prec, backend in rates:
        model_only[(prec, backend)], setup[(prec, backend)] = model_rate(model, paths, args.batch, workers, device, prec, backend,
                                                                         model_images, **int8_options)
        print(f"model only {backend} {prec} (batch {args.batch}, {model_images} images): M = {model_only[(prec, backend)]:.2f} "
              f"images/s; engine setup {setup[(prec, backend)]:.2f} s", flush=True)
    ref = features.get(("fp32", "torch"))
    kind = "min(D, M)" if device.type == "cuda" else f"1/(1/D + 1/M), {cores} cores shared"
    print(f"summary: end to end, bound B = {kind}, share = e2e / B, ratio against the torchvision fp32 baseline above "
          f"(D = {dec_ours:.1f} images/s):")
    print("  (steady: e2e with the engine's one-time setup, measured in the model-only run, taken out of its wall time)")
    print(f"  {'engine':>14} | {'e2e img/s':>9} | {'M img/s':>8} | {'B img/s':>8} | {'share':>6} | {'steady':>6} | {'vs base':>7} | "
          "min cosine to torch fp32")
    for (prec, backend), rate in rates.items():
        cos = f"{min_cosine(ref, features[(prec, backend)]):.6f}" if ref is not None else "-"
        tag = " [cl-zoo defaults]" if (prec, backend) == chosen else ""
        m = model_only[(prec, backend)]
        b = bound(dec_ours, m, device)
        steady = len(paths) / max(len(paths) / rate - setup[(prec, backend)], 1e-9)
        print(f"  {backend + ' ' + prec:>14} | {rate:9.2f} | {m:8.2f} | {b:8.2f} | {rate / b:6.1%} | {steady / b:6.1%} | "
              f"{rate / base:6.2f}x | {cos}{tag}")
    try:
        load = "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        pass
    print(f"ratio cl-zoo defaults / baseline: {default_rate / base:.2f}x ({load} at the end)")
    if ("int8", "openvino") in rates:
        rate = rates[("int8", "openvino")]
        decode_ms = cores / dec_ours * 1000  # CPU-ms per image the decoders spend
        print(f"ratio cl-zoo int8 / baseline: {rate / base:.2f}x, int8 / bf16 (same run): "
              f"{rate / rates.get(('bf16', 'openvino'), float('nan')):.2f}x; decoding takes about {decode_ms:.1f} of int8's "
              f"{cpu_ms[('int8', 'openvino')]:.1f} CPU-ms per image ({decode_ms / cpu_ms[('int8', 'openvino')]:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
