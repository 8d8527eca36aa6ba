"""A FIFO queue of embeddings (MoCo's dictionary), stored as buffers so checkpoints carry it.

MoCo (Sec. 3.2) keeps the keys of the last K/B batches as negatives; JCL enqueues the mean key of
each instance; CACR's MoCo form uses the same queue. Keys are gathered from every rank before
enqueueing so all ranks hold the same queue. Writing wraps around, so K need not be a multiple of
the global batch (MoCo asserts it is; we do not need to). The initial content is random unit
vectors, as in MoCo.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_zoo.distributed import gather


class EmbeddingQueue(nn.Module):
    """``queue`` [size, dim] (float32, unit rows) and ``ptr`` (next write position) buffers."""

    queue: Tensor
    ptr: Tensor

    def __init__(self, size: int, dim: int, *, normalize: bool = True) -> None:
        super().__init__()
        if size < 1 or dim < 1:
            raise ValueError(f"queue size and dim must be >= 1, got size={size}, dim={dim}")
        self.size, self.dim, self.normalize = size, dim, normalize
        self.register_buffer("queue", F.normalize(torch.randn(size, dim), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, keys: Tensor, *, gathered: bool = False) -> None:
        """Write ``keys`` [B, dim] (gathered over ranks unless ``gathered``) at the pointer."""
        if keys.dim() != 2 or keys.shape[1] != self.dim:
            raise ValueError(f"keys must be [B, {self.dim}], got {tuple(keys.shape)}")
        if not gathered:
            keys = gather(keys, grad=False)
        keys = keys.detach().to(self.queue.dtype)
        if self.normalize:
            keys = F.normalize(keys, dim=1)
        if keys.shape[0] >= self.size:
            self.queue.copy_(keys[-self.size :])
            self.ptr.zero_()
            return
        # Rows ptr, ptr+1, ... (mod size), computed on the device: reading ``ptr`` on the host would
        # wait for the GPU every step. n < size here, so the rows are distinct.
        n = keys.shape[0]
        rows = torch.arange(n, device=self.ptr.device).add_(self.ptr).remainder_(self.size)
        self.queue.index_copy_(0, rows.to(self.queue.device), keys)
        self.ptr.add_(n).remainder_(self.size)

    def negatives(self) -> Tensor:
        """The queue content as a snapshot (cloned: the enqueue after the loss must not alter it)."""
        return self.queue.clone().detach()

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}"


@torch.no_grad()
def queue_health(queries: Tensor, negatives: Tensor) -> dict[str, Tensor]:
    """Mean cosines that tell a collapsing queue from a slow start.

    ``neg_sim``: mean cosine between the batch's queries and the queued negatives; ``queue_sim``:
    mean cosine between two different queue entries. A healthy queue of diverse keys keeps both
    near 0; when every entry points the same way ``queue_sim`` goes to 1 and the loss approaches
    ``log(K + 1)``. Both use the identity mean_{i != j} <n_i, n_j> = (|sum n|^2 - K) / (K (K - 1))
    for unit rows, so they cost O(K D), not O(K^2 D).
    """
    q = F.normalize(queries.detach().float(), dim=1)
    n = F.normalize(negatives.detach().float(), dim=1)
    total = n.sum(dim=0)
    k = n.shape[0]
    queue_sim = (total.square().sum() - k) / max(k * (k - 1), 1)
    neg_sim = (q @ (total / k)).mean()
    return {"neg_sim": neg_sim, "queue_sim": queue_sim}
