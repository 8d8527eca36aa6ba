"""Process-group setup for single-process and ``torchrun`` multi-process training.

``torchrun`` exports RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; when they are present the
default process group is created here (``nccl`` for CUDA, ``gloo`` on CPU so CI can run two ranks
on one machine). Everything else in the trainer asks :class:`DistEnv` instead of reading the
environment, and only the main rank writes files.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from cl_zoo.errors import ClZooError
from cl_zoo.torchrun import torchrun_env


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(device: str | torch.device | None, local_rank: int = 0) -> torch.device:
    """``None``/"auto" picks this rank's GPU when there is one, else the CPU."""
    if device is None or str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ClZooError(f"--device {device}: CUDA is not available on this machine")
        if dev.index is None:
            dev = torch.device("cuda", local_rank % torch.cuda.device_count())
    return dev


def init_distributed(device: str | torch.device | None = None) -> DistEnv:
    """Join the ``torchrun`` process group if launched by it; otherwise a single-process env."""
    launched = torchrun_env()
    world_size, rank, local_rank = launched.world_size, launched.rank, launched.local_rank
    dev = resolve_device(device, local_rank)
    if world_size <= 1:
        return DistEnv(device=dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    initialized_here = False
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)
        initialized_here = True
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, initialized_here=initialized_here)


def barrier(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        if env.device.type == "cuda":
            dist.barrier(device_ids=[env.device.index])
        else:
            dist.barrier()


def shutdown(env: DistEnv) -> None:
    """Destroy the process group if this module created it."""
    if env.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_object(env: DistEnv, obj: object) -> object:
    """Rank 0's ``obj`` on every rank (used to agree on one error or one resume decision)."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_mean(env: DistEnv, value: torch.Tensor) -> torch.Tensor:
    """Mean over ranks of a scalar/tensor (logging only; gradients are reduced by DDP)."""
    if not env.distributed:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / env.world_size
