"""torch's intra-op thread count, narrowed for a block of work and restored after it.

torch splits an op across its OpenMP threads, and each op ends at a barrier where the finished
threads spin for the others. When every core is already taken (OpenVINO's streams and the decode
processes during an embedding run) a thread the kernel has descheduled keeps its partners spinning,
so a small piece of torch work costs several times its own CPU time: the one-image fp32 reference of
the OpenVINO cache probe, beside two decoders, cost up to four times as much with two threads as
with one (docs/benchmarks.md, "On an Intel Xeon with AMX"). One thread does the same arithmetic
without waiting for anyone.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with at most ``count`` intra-op threads (never more than torch already has)."""
    before = torch.get_num_threads()
    if count >= before:
        yield
        return
    torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["torch_threads"]
