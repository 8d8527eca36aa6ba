"""``cl-zoo index`` on a million 512-d vectors under a roomy and a tight memory budget.

Writes ``--count`` seeded random 512-d float32 vectors to a ``.npy`` in a temporary folder (in
blocks, through a memory map, so the generator never holds the matrix), then runs
``cl-zoo index FILE --max-memory B --json`` once per budget, each in its own process so its peak
resident memory (``ru_maxrss`` of that child, from ``os.wait4``) is its own. Prints per budget:
the chosen index, build seconds, index bytes against the budget, peak RSS (also less the RSS of a
process that only imports the command, which is torch's import for the most part), recall@10
against exact search on 1,000 held-out rows, and median query latency.

Random Gaussian vectors are the worst case for quantization: they have no cluster structure for
IVF to exploit and no correlated dims for OPQ/PQ to compress, so PQ recall here is a floor, far
below what real image embeddings reach at the same code size.

With ``--embeddings PATH`` (a ``.npy`` from ``cl-zoo embed``, e.g. of CIFAR-10 from
``../shared/datasets/cifar10-jpeg.tar.gz``) the same budgets also run on that file, when the
shared dataset is present.

    python benchmarks/index_build.py                        # ~10-20 minutes on 2 cores
    python benchmarks/index_build.py --count 200000 --budgets 1G 128M
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CIFAR = REPO.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"

from cl_zoo.index.memory import format_bytes, parse_memory  # noqa: E402


def write_random(path: Path, count: int, dim: int, seed: int, block: int = 65_536) -> None:
    """Seeded Gaussian vectors written block by block into a ``.npy`` memory map."""
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(count, dim))
    for start in range(0, count, block):
        stop = min(start + block, count)
        out[start:stop] = rng.standard_normal((stop - start, dim), dtype=np.float32)
    out.flush()
    del out


def run_child(args: list[str]) -> tuple[int, str, str, float, int]:
    """Run ``python args...``; (exit code, stdout, stderr, seconds, peak RSS bytes of that child)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, *args], stdout=out, stderr=err, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read().decode(), err.read().decode(), seconds, usage.ru_maxrss * 1024


def bench(embeddings: Path, budgets: list[str], folder: Path, label: str, baseline: int) -> None:
    print(f"\n== {label}: {embeddings}")
    for budget in budgets:
        out = folder / f"index_{budget}.faiss"
        rc, stdout, stderr, seconds, peak = run_child(["-m", "cl_zoo.cli", "index", str(embeddings), "--out", str(out), "--max-memory", budget, "--json", "-q"])
        if rc != 0:
            print(f"budget {budget}: failed ({rc}): {stderr.strip().splitlines()[-1] if stderr.strip() else ''}")
            continue
        info = json.loads(stdout)
        limit = parse_memory(budget)
        print(f"budget {budget}: {info['factory']}")
        print(f"  why:          {info['reason']}")
        print(f"  build:        {info['build_seconds']:.1f} s in the command ({seconds:.1f} s wall with start-up)")
        print(f"  index size:   {format_bytes(info['index_bytes'])} of {format_bytes(limit)} ({100 * info['index_bytes'] / limit:.0f}%; estimated {format_bytes(info['estimated_bytes'])})")
        print(f"  peak RSS:     {format_bytes(peak)} ({format_bytes(peak - baseline)} above the import-only baseline; budget + one block = {format_bytes(limit + 65_536 * info['dim'] * 4)})")
        print(f"  recall@10:    {info['recall_at_10']:.4f} with {info['search_params'] or 'exact search'} (target 0.9 {'met' if info['recall_target_met'] else 'not reached'})")
        print(f"  latency:      {info['latency_ms']:.3f} ms/query (median, batches of 100)")
        print(f"  tried:        {', '.join(f'{p}: {r:.3f}' for p, r in info['tried'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budgets", nargs="+", default=["4G", "512M"])
    parser.add_argument("--embeddings", type=Path, default=None, help="Also run on this .npy (e.g. CIFAR-10 embeddings) when the shared CIFAR-10 archive is present.")
    args = parser.parse_args()

    _, _, _, _, baseline = run_child(["-c", "import cl_zoo.cli.index, cl_zoo.index"])
    print(f"import-only baseline RSS: {format_bytes(baseline)} (cl_zoo imports torch)")
    with tempfile.TemporaryDirectory(prefix="cl-zoo-index-bench-") as tmp:
        folder = Path(tmp)
        data = folder / "random.npy"
        t0 = time.perf_counter()
        write_random(data, args.count, args.dim, args.seed)
        print(f"wrote {args.count} x {args.dim} seeded Gaussian vectors ({format_bytes(data.stat().st_size)}) in {time.perf_counter() - t0:.1f} s")
        bench(data, args.budgets, folder, f"random {args.count} x {args.dim} (worst case for quantization)", baseline)
        data.unlink()
        if args.embeddings is not None:
            if CIFAR.is_file():
                bench(args.embeddings, args.budgets, folder, "embeddings", baseline)
            else:
                print(f"\nskipped --embeddings: {CIFAR} is absent")


if __name__ == "__main__":
    main()
