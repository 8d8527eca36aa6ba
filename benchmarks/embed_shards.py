"""Sharded ``cl-zoo embed --out DIR/`` against the single-file path: speed, flat memory, an index.

Prints, in one run:

1. images/s of ``--out DIR/`` (shards) against ``--out file.npy`` (today's single-file path) on the
   same ``--speed-images`` images, alternating the two ``--rounds`` times, each a fresh process
   (the CLI's own images/s line: extraction only, model loading excluded);
2. peak resident memory of a sharded run at two sizes: the folder's images, and the same images
   ``--repeat`` times (hard links in a temporary folder, so the files are real and distinct paths
   but take no disk). Peak RSS of the main process (``ru_maxrss`` from ``os.wait4``) and of the whole
   process tree (DataLoader workers included, sampled every 0.2 s with psutil);
3. ``cl-zoo index`` on the larger shard folder under ``--max-memory``: the chosen index, build
   time, recall@10 against exact search and query latency (its ``--json`` report).

    python benchmarks/embed_shards.py --images /tmp/cifar            # CIFAR-10's 60k JPEGs: 60k and 600k
    python benchmarks/embed_shards.py --images DIR --repeat 3 --speed-images 5000

CIFAR-10 as JPEGs is ``../shared/datasets/cifar10-jpeg.tar.gz`` (unpack it anywhere). Keep the
machine otherwise idle for the images/s figures; the memory figures do not depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cl_zoo.data.images import discover_images  # noqa: E402
from cl_zoo.index.memory import format_bytes  # noqa: E402

CLI = [sys.executable, "-m", "cl_zoo.cli"]
RATE = re.compile(r"([0-9.]+) images/s")


def run_measured(cmd: list[str]) -> tuple[str, int, int, float]:
    """(stderr, main-process peak RSS, process-tree peak RSS, seconds) of one command."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    tree_peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal tree_peak
        try:
            root = psutil.Process(proc.pid)
        except psutil.Error:
            return
        while not stop.is_set():
            try:
                total = root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
                tree_peak = max(tree_peak, total)
            except psutil.Error:
                pass
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return err, usage.ru_maxrss * 1024, tree_peak, time.perf_counter() - start


def rate_of(stderr: str) -> float:
    found = RATE.findall(stderr)
    if not found:
        raise SystemExit(f"no images/s in:\n{stderr[-1000:]}")
    return float(found[-1])


def write_list(paths: list[str], where: Path) -> Path:
    where.write_text("".join(p + "\n" for p in paths))
    return where


def repeated_folder(images: list[str], root: Path, times: int) -> Path:
    """``times`` hard-linked copies of ``images`` under ``root`` (distinct paths, no extra disk)."""
    for t in range(times):
        for n, src in enumerate(images):
            dst = root / f"rep{t}" / f"{n // 10000:03d}" / f"{n:06d}{Path(src).suffix}"
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:  # another file system: a symlink is as good for reading
                os.symlink(src, dst)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=Path, required=True, help="folder of images (e.g. unpacked CIFAR-10 JPEGs)")
    parser.add_argument("--repeat", type=int, default=10, help="the larger memory run has the images this many times")
    parser.add_argument("--speed-images", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-memory", default="4G", help="cl-zoo index budget for the larger folder")
    parser.add_argument("--model", default=None, help="default: the bundled model")
    parser.add_argument("--shard-size", type=int, default=None, help="images per shard (default: the CLI's)")
    parser.add_argument("--steps", default="speed,memory,index", help="which of speed,memory,index to run (index needs memory)")
    args = parser.parse_args()

    images = [os.path.abspath(p) for p in discover_images([args.images])]
    model = ["-m", args.model] if args.model else []
    shard = ["--shard-size", str(args.shard_size)] if args.shard_size else []
    print(f"{len(images)} images in {args.images}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs", flush=True)
    steps = set(args.steps.split(","))
    with tempfile.TemporaryDirectory(prefix="embed-shards-") as tmp_name:
        tmp = Path(tmp_name)
        if "speed" in steps:
            speed(args, images, tmp, model, shard)
        if "memory" in steps:
            out = memory(args, images, tmp, model, shard)
            if "index" in steps:
                index(args, tmp, out)


def speed(args: argparse.Namespace, images: list[str], tmp: Path, model: list[str], shard: list[str]) -> None:
    sample = write_list(images[: args.speed_images], tmp / "speed.txt")
    count = min(args.speed_images, len(images))
    rates: dict[str, list[float]] = {"single file (.npy)": [], "shards (DIR/)": []}
    walls: dict[str, list[float]] = {"single file (.npy)": [], "shards (DIR/)": []}
    for r in range(args.rounds):
        for label, out in (("single file (.npy)", tmp / f"single{r}.npy"), ("shards (DIR/)", f"{tmp}/shards{r}/")):
            err, _, _, seconds = run_measured([*CLI, "embed", str(sample), "-o", str(out), "-q", *model, *shard])
            rates[label].append(rate_of(err))
            walls[label].append(seconds)
    # The CLI's own rate counts from engine setup to the last feature; the sharded path's clock also
    # runs while it writes its shard, the single file's stops before it saves. Whole-command wall time
    # (process start to exit, output written) is the like-for-like figure.
    print(f"\n1. the same {count} images ({args.rounds} alternating rounds, best of each):")
    for label in rates:
        print(f"   {label:20s} CLI {max(rates[label]):7.1f} images/s, whole command {min(walls[label]):6.1f} s "
              f"(rounds: {', '.join(f'{v:.1f}' for v in walls[label])} s)")
    single, sharded = min(walls["single file (.npy)"]), min(walls["shards (DIR/)"])
    print(f"   ratio shards / single file, images per whole-command second: {single / sharded:.3f}; "
          f"CLI images/s: {max(rates['shards (DIR/)']) / max(rates['single file (.npy)']):.3f}", flush=True)



def memory(args: argparse.Namespace, images: list[str], tmp: Path, model: list[str], shard: list[str]) -> Path:
    print("\n2. peak RSS of a sharded run at two sizes:")
    big = repeated_folder(images, tmp / "repeated", args.repeat)
    results = []
    for label, source in ((f"{len(images)} images", args.images), (f"{len(images) * args.repeat} images", big)):
        out = tmp / f"emb-{len(results)}"
        err, main_peak, tree_peak, seconds = run_measured([*CLI, "embed", str(source), "-o", f"{out}/", "-q", *model, *shard])
        results.append((main_peak, tree_peak))
        manifest = json.loads((out / "manifest.json").read_text())
        print(f"   {label:16s} main process {format_bytes(main_peak):>10s}, process tree {format_bytes(tree_peak):>10s}, "
              f"{len(manifest['shards'])} shard(s), {seconds:.0f} s, {rate_of(err):.0f} images/s")
    print(f"   ratio larger / smaller: main process {results[1][0] / results[0][0]:.3f}, "
          f"process tree {results[1][1] / results[0][1]:.3f}")
    return out


def index(args: argparse.Namespace, tmp: Path, out: Path) -> None:
    print(f"\n3. cl-zoo index on the larger folder, --max-memory {args.max_memory}:")
    saved = tmp / "INDEX.faiss"
    err, main_peak, _, seconds = run_measured([*CLI, "index", str(out), "--max-memory", args.max_memory, "--out", str(saved), "--json"])
    report = json.loads((tmp / "INDEX.faiss.json").read_text()) if (tmp / "INDEX.faiss.json").is_file() else {}
    print("   " + "\n   ".join(line for line in err.strip().splitlines()[-8:]))
    if report:
        print(f"   recorded: {json.dumps({k: report[k] for k in report if k in ('factory', 'recall_at_10', 'latency_ms', 'search_params')})}")
    print(f"   wall {seconds:.0f} s, peak RSS {format_bytes(main_peak)}")


if __name__ == "__main__":
    main()
