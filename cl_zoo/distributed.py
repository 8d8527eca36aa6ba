"""Distributed helpers: who am I, and all-gather that keeps gradients where they belong.

A leaf below both ``cl_zoo.methods`` and ``cl_zoo.train`` (it imports only torch): the methods
gather their embeddings here without reaching up into the trainer's package.

Contrastive methods want negatives from the whole global batch, not only the local shard; the
embeddings therefore go through :func:`gather` before the loss. Every helper degrades to the
single-process answer when ``torch.distributed`` is not initialised, so methods carry no
"am I distributed" branches and run unchanged on a laptop CPU.

Gradient convention of ``gather(x, grad=True)`` (the usual GatherLayer): the forward concatenates
every rank's ``x`` in rank order; the backward all-reduces (sums) the incoming gradient over ranks
and returns this rank's slice. If each rank computes a loss ``L_r`` on the gathered tensor, the
local embeddings thus receive ``sum_r dL_r/dx_local``; DistributedDataParallel then averages
parameter gradients over ranks, which is exactly the gradient of ``mean_r L_r``, i.e. of the same
loss computed on one device with the global batch. In particular, when every rank computes the
*identical* global loss ``L`` (what the in-batch methods here do), the result is ``dL/dtheta``.

All ranks must pass tensors of the same shape (the trainer's loaders use ``drop_last=True``).
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
from torch import Tensor


def is_distributed() -> bool:
    """True when a default process group is initialised (and has more than one member or not)."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_rank() -> int:
    return torch_dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return torch_dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Rank 0 writes checkpoints, logs and reports; the others stay quiet."""
    return get_rank() == 0


def barrier() -> None:
    if is_distributed():
        torch_dist.barrier()


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums the gradient over ranks and keeps the local slice."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        world = torch_dist.get_world_size()
        ctx.rank = torch_dist.get_rank()
        ctx.size = x.shape[0]
        parts = [torch.empty_like(x) for _ in range(world)]
        torch_dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        grad = grad.contiguous()
        torch_dist.all_reduce(grad, op=torch_dist.ReduceOp.SUM)
        start = ctx.rank * ctx.size
        return grad[start : start + ctx.size]


def gather(x: Tensor, grad: bool) -> Tensor:
    """Concatenate ``x`` [N, ...] from all ranks along dim 0 in rank order ([world*N, ...]).

    ``grad=True``: differentiable (see the module docstring for the exact gradient);
    ``grad=False``: a detached copy (keys for queues, memory-bank updates).
    Not distributed: ``x`` itself (``grad=True``) or ``x.detach()`` (``grad=False``).
    """
    if not is_distributed() or get_world_size() == 1:
        return x if grad else x.detach()
    if grad:
        return _GatherWithGrad.apply(x)
    with torch.no_grad():
        parts = [torch.empty_like(x) for _ in range(get_world_size())]
        torch_dist.all_gather(parts, x.detach().contiguous())
        return torch.cat(parts, dim=0)


def local_slice(global_batch: Tensor, local_size: int) -> Tensor:
    """Rows of a gathered tensor that belong to this rank (inverse of :func:`gather`)."""
    start = get_rank() * local_size
    return global_batch[start : start + local_size]


__all__ = ["barrier", "gather", "get_rank", "get_world_size", "is_distributed", "is_main", "local_slice"]
