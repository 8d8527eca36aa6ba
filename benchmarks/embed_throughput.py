"""Images/s of cl-zoo's embedding loop against a straightforward torchvision pipeline.

Both run in the same process on the same photos (the 255 real ImageNet photos of
``../shared/datasets/imagenet-samples.tar.gz``, repeated to ``--count``), with the same model,
batch size, DataLoader workers and device. The baseline is what one would write by hand:
an ImageFolder-style dataset with a full PIL decode, ``Resize`` + ``CenterCrop`` + ``ToTensor`` +
``Normalize`` per image, ``model.eval()`` under ``torch.no_grad()``. Runs alternate
(baseline, cl-zoo, baseline, ...) so that load from other processes hits both alike.

    python benchmarks/embed_throughput.py --count 512 --batch 32 --workers 2 --device cpu
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tarfile
import time
from pathlib import Path

import torch
from PIL import Image
from torchvision import transforms as T

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import cl_zoo  # noqa: E402
from cl_zoo.data.images import discover_images  # noqa: E402
from cl_zoo.embedding import extract_features, resolve_device  # noqa: E402


class BaselineDataset(torch.utils.data.Dataset):
    def __init__(self, paths: list[str], transform: T.Compose) -> None:
        self.paths, self.transform = paths, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.paths[i], "rb") as fh:
            img = Image.open(fh).convert("RGB")
        return self.transform(img)


def baseline(model: torch.nn.Module, paths: list[str], batch: int, workers: int, device: torch.device) -> float:
    cfg = model.pretrained_cfg
    tf = T.Compose(
        [T.Resize(cfg.resize_size), T.CenterCrop(cfg.input_size[1:]), T.ToTensor(), T.Normalize(cfg.mean, cfg.std)]
    )
    loader = torch.utils.data.DataLoader(
        BaselineDataset(paths, tf), batch_size=batch, num_workers=workers, pin_memory=device.type == "cuda"
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


def ours(model: torch.nn.Module, paths: list[str], batch: int, workers: int, device: torch.device, precision: str) -> float:
    start = time.perf_counter()
    result = extract_features(model, paths, batch_size=batch, workers=workers, device=device, precision=precision)
    assert len(result.paths) == len(paths), result.failures[:3]
    return len(paths) / (time.perf_counter() - start)


def cpu_seconds() -> float:
    """User+system time of this process and its reaped children (the DataLoader workers)."""
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", type=Path, default=REPO.parent / "shared" / "datasets" / "imagenet-samples.tar.gz")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/cl-zoo-test-data"))
    parser.add_argument("--model", default="resnet50", help="architecture (random weights)")
    parser.add_argument("--count", type=int, default=512, help="images per run (photos repeated)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", help="cl-zoo side only (bf16/fp16 autocast on CUDA)")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each pipeline")
    args = parser.parse_args()
    if not args.archive.is_file():
        print(f"needs {args.archive}", file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    paths = photo_paths(args.archive, args.count, args.cache)
    model = cl_zoo.create_model(args.model).eval()
    print(
        f"{args.model} {model.pretrained_cfg.input_size[1]}px, {len(paths)} images, batch {args.batch}, "
        f"workers {args.workers}, device {device}, torch threads {torch.get_num_threads()}"
    )
    if device.type == "cuda":  # warm up kernels/cudnn autotuning outside the timed runs
        baseline(model, paths[: args.batch * 2], args.batch, 0, device)
        ours(model, paths[: args.batch * 2], args.batch, 0, device, args.precision)
    base_rates, our_rates, base_cpu, our_cpu = [], [], [], []
    for r in range(args.repeats):
        for name, rates, cpus, run in (
            ("baseline", base_rates, base_cpu, lambda: baseline(model, paths, args.batch, args.workers, device)),
            ("cl-zoo  ", our_rates, our_cpu, lambda: ours(model, paths, args.batch, args.workers, device, args.precision)),
        ):
            before = cpu_seconds()
            rates.append(run())
            cpus.append((cpu_seconds() - before) / len(paths))
            print(f"run {r + 1}: {name} {rates[-1]:.2f} images/s, {cpus[-1] * 1000:.0f} CPU-ms/image", flush=True)
    b, o = statistics.median(base_rates), statistics.median(our_rates)
    bc, oc = statistics.median(base_cpu), statistics.median(our_cpu)
    # CPU time per image (this process and its DataLoader workers) is the figure that other load on
    # a shared machine disturbs least; images/s is the one that matters on a dedicated one.
    print(f"baseline {b:.2f} images/s, cl-zoo {o:.2f} images/s, ratio {o / b:.2f}x "
          f"(CPU per image: baseline {bc * 1000:.0f} ms, cl-zoo {oc * 1000:.0f} ms, ratio {bc / oc:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
