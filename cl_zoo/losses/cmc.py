"""Contrastive Multiview Coding (Tian, Krishnan, Isola, "Contrastive Multiview Coding", ECCV 2020).

Two-view loss (Eq. 2-4): with the cosine/tau critic ``h = exp(cos(z_1, z_2)/tau)`` (Eq. 3), anchor
view V1 picks its positive out of {positive + k negatives} of view V2 (Eq. 2) and symmetrically
(Eq. 4: ``L(V1, V2) = L^{V1,V2} + L^{V2,V1}``). With M views the objective is the core-view sum
``sum_{j>=2} L(V1, Vj)`` (Eq. 7) or the full graph ``sum_{i<j} L(Vi, Vj)`` (Eq. 8); we keep the
paper's sums (each ``L^{Vi,Vj}`` is a batch mean).

Negatives come from the batch (:func:`cmc_loss`) or from a memory bank (Sec. 3.4, following
Wu et al.'s instance discrimination): :class:`MemoryBank` keeps one unit-norm entry per training
image and per view, updated with momentum 0.5 (``entry <- normalize(0.5 entry + 0.5 z)``, the
authors' code), and each anchor is scored against the other view's entry of its own image (the
positive) and K entries drawn uniformly at random (K = 4096 / 16384 in the paper). Two objectives:

* (K+1)-way softmax (Sec. 3.4): cross-entropy over ``[pos, neg_1..neg_K]`` logits / tau.
* NCE (supplement B.1, Eq. 9-11): the model density is ``h / Z`` with Z "a constant estimated from
  the first batch" (authors' code: ``Z = mean(h over the first batch's K+1 candidates) * N_data``),
  the noise distribution is uniform ``P_n = 1/N_data`` and with m = K noise samples::

      L = -E[ log P(D=1|pos) + sum_k log P(D=0|neg_k) ],  P(D=1|v) = p(v) / (p(v) + m P_n).

  We compute it in log space instead of adding the code's 1e-7 epsilon.

Embeddings passed to the losses are L2-normalised inside when ``normalize=True``; bank entries are
stored normalised and used as stored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_zoo.losses._common import check_temperature, full_precision, prepare, upcast
from cl_zoo.losses.infonce import info_nce


def _view_pairs(num_views: int, graph: str) -> list[tuple[int, int]]:
    if graph == "core":
        return [(0, j) for j in range(1, num_views)]
    if graph == "full":
        return [(i, j) for i in range(num_views) for j in range(i + 1, num_views)]
    raise ValueError(f"graph must be 'core' (Eq. 7) or 'full' (Eq. 8), got {graph!r}")


def _check_views(views: list[Tensor]) -> None:
    if len(views) < 2:
        raise ValueError(f"CMC needs at least 2 views, got {len(views)}")
    shape = views[0].shape
    if len(shape) != 2 or any(v.shape != shape for v in views):
        raise ValueError(f"all views must be [N, D] with the same shape, got {[tuple(v.shape) for v in views]}")


def cmc_loss(
    views: list[Tensor],
    temperature: float = 0.07,
    graph: str = "core",
    *,
    normalize: bool = True,
) -> Tensor:
    """In-batch CMC: sum over the view pairs of ``graph`` of the symmetric InfoNCE (Eq. 4) whose
    negatives are the other images of the batch in the other view."""
    _check_views(views)
    check_temperature(temperature)
    total = views[0].new_zeros((), dtype=upcast(views[0]).dtype)
    for i, j in _view_pairs(len(views), graph):
        total = total + info_nce(views[i], views[j], None, temperature, normalize=normalize)
        total = total + info_nce(views[j], views[i], None, temperature, normalize=normalize)
    return total


def bank_softmax_loss(anchor: Tensor, candidates: Tensor, temperature: float = 0.07, *, normalize: bool = True) -> Tensor:
    """(K+1)-way softmax: ``anchor`` [B, D] against ``candidates`` [B, K+1, D] whose column 0 is the
    positive (a bank entry, used as stored). Mean over the batch."""
    check_temperature(temperature)
    _check_candidates(anchor, candidates)
    with full_precision(anchor):
        a = prepare(anchor, normalize)
        logits = torch.einsum("bd,bkd->bk", a, upcast(candidates)) / temperature
        targets = torch.zeros(a.shape[0], dtype=torch.long, device=a.device)
        return F.cross_entropy(logits, targets)


def bank_nce_loss(
    anchor: Tensor,
    candidates: Tensor,
    num_entries: int,
    temperature: float = 0.07,
    z: Tensor | float | None = None,
    *,
    normalize: bool = True,
) -> tuple[Tensor, Tensor]:
    """CMC's NCE objective (supplement Eq. 10-11) with column 0 of ``candidates`` the data sample and
    the other K columns the noise samples. ``z`` is the fixed normaliser; when None it is estimated
    from this batch (``mean(h) * num_entries``, no gradient), and so is a negative tensor ``z`` (the
    bank's "not estimated yet" mark), picked on the device so that a training step never waits to
    read it on the host. Returns ``(loss, z)`` so the caller keeps ``z`` for every later batch."""
    check_temperature(temperature)
    _check_candidates(anchor, candidates)
    num_noise = candidates.shape[1] - 1
    if num_noise < 1:
        raise ValueError("bank_nce_loss needs at least one noise sample (candidates must be [B, K+1, D], K >= 1)")
    if num_entries < 1:
        raise ValueError(f"num_entries must be >= 1, got {num_entries}")
    with full_precision(anchor):
        a = prepare(anchor, normalize)
        scores = torch.einsum("bd,bkd->bk", a, upcast(candidates)) / temperature  # log h
        if z is None or isinstance(z, Tensor):
            with torch.no_grad():
                estimate = torch.exp(scores).mean() * num_entries
                z = estimate if z is None else torch.where(z.to(scores.dtype) < 0, estimate, z.to(scores.dtype))
        z = torch.as_tensor(z, dtype=scores.dtype, device=scores.device)
        log_p = scores - torch.log(z)  # log of the model density h / Z
        log_noise = math.log(num_noise / num_entries)  # log(m * P_n)
        # log P(D=1|pos) = -softplus(log mPn - log p_pos); log P(D=0|neg) = -softplus(log p_neg - log mPn)
        data_term = F.softplus(log_noise - log_p[:, 0])
        noise_term = F.softplus(log_p[:, 1:] - log_noise).sum(dim=1)
        return (data_term + noise_term).mean(), z.detach()


def _check_candidates(anchor: Tensor, candidates: Tensor) -> None:
    if anchor.dim() != 2 or candidates.dim() != 3 or candidates.shape[0] != anchor.shape[0] or candidates.shape[2] != anchor.shape[1]:
        raise ValueError(
            f"anchor must be [B, D] and candidates [B, K+1, D], got {tuple(anchor.shape)} and {tuple(candidates.shape)}"
        )


class MemoryBank(nn.Module):
    """One unit-norm entry per training image and per view (buffers, so checkpoints carry them),
    plus the NCE normalisers Z per (anchor view, bank view), -1 until estimated."""

    memory: Tensor
    nce_z: Tensor

    def __init__(
        self,
        num_entries: int,
        dim: int,
        num_views: int = 2,
        momentum: float = 0.5,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if num_entries < 2 or dim < 1 or num_views < 2:
            raise ValueError(f"need num_entries >= 2, dim >= 1, num_views >= 2; got {num_entries}, {dim}, {num_views}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.num_entries = num_entries
        self.num_views = num_views
        self.momentum = momentum
        # The authors' init: uniform in [-a, a] with a = sqrt(3 / dim), i.e. unit expected norm.
        bound = math.sqrt(3.0 / dim)
        init = torch.rand(num_views, num_entries, dim, generator=generator) * (2 * bound) - bound
        self.register_buffer("memory", init)
        self.register_buffer("nce_z", torch.full((num_views, num_views), -1.0))

    def sample(self, index: Tensor, num_negatives: int, generator: torch.Generator | None = None) -> Tensor:
        """[B, K+1] entry indices: column 0 is ``index`` (the positive), then K drawn uniformly with
        replacement from all entries (as the authors' alias sampler does)."""
        if num_negatives < 1:
            raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
        device = generator.device if generator is not None else self.memory.device
        neg = torch.randint(0, self.num_entries, (index.shape[0], num_negatives), generator=generator, device=device)
        return torch.cat([index.view(-1, 1).to(self.memory.device), neg.to(self.memory.device)], dim=1)

    def entries(self, view: int, indices: Tensor) -> Tensor:
        """A copy of view ``view``'s entries at ``indices`` (any shape), safe to use after an update."""
        return self.memory[view][indices.to(self.memory.device)].clone()

    @torch.no_grad()
    def update(self, view: int, index: Tensor, features: Tensor) -> None:
        """``entry <- normalize(m * entry + (1 - m) * normalize(z))`` for the images in ``index``."""
        index = index.to(self.memory.device)
        new = F.normalize(features.detach().to(self.memory.dtype), dim=1)
        mixed = self.memory[view][index] * self.momentum + new * (1 - self.momentum)
        self.memory[view][index] = F.normalize(mixed, dim=1)

    def extra_repr(self) -> str:
        return f"num_entries={self.num_entries}, num_views={self.num_views}, momentum={self.momentum}"


def cmc_bank_loss(
    views: list[Tensor],
    index: Tensor,
    bank: MemoryBank,
    num_negatives: int = 16384,
    temperature: float = 0.07,
    objective: str = "nce",
    graph: str = "core",
    generator: torch.Generator | None = None,
    *,
    normalize: bool = True,
    update: bool = True,
) -> Tensor:
    """CMC with a memory bank: for each view pair (i, j) of ``graph``, view i's embeddings are scored
    against bank view j (positive = own image's entry) and vice versa; then (``update=True``) each
    view's entries of this batch are momentum-updated. The same K sampled images serve all views."""
    _check_views(views)
    if len(views) != bank.num_views:
        raise ValueError(f"got {len(views)} views for a bank of {bank.num_views}")
    if objective not in ("nce", "softmax"):
        raise ValueError(f"objective must be 'nce' or 'softmax', got {objective!r}")
    idx = bank.sample(index, num_negatives, generator)
    total = upcast(views[0]).new_zeros(())
    for i, j in _view_pairs(len(views), graph):
        for anchor, other in ((i, j), (j, i)):
            cands = bank.entries(other, idx)
            if objective == "softmax":
                total = total + bank_softmax_loss(views[anchor], cands, temperature, normalize=normalize)
            else:
                # the first batch's estimate where none is stored yet (-1), else the stored one: no host read
                loss, z_used = bank_nce_loss(views[anchor], cands, bank.num_entries, temperature, bank.nce_z[anchor, other],
                                             normalize=normalize)
                bank.nce_z[anchor, other] = z_used.to(bank.nce_z.dtype)
                total = total + loss
    if update:
        for v, z in enumerate(views):
            bank.update(v, index, upcast(z))
    return total


class CMCLoss(nn.Module):
    """Module form of :func:`cmc_loss` (in-batch negatives; tau 0.07 as in the paper)."""

    def __init__(self, temperature: float = 0.07, graph: str = "core", normalize: bool = True) -> None:
        super().__init__()
        check_temperature(temperature)
        _view_pairs(2, graph)
        self.temperature = temperature
        self.graph = graph
        self.normalize = normalize

    def forward(self, views: list[Tensor]) -> Tensor:
        return cmc_loss(views, self.temperature, self.graph, normalize=self.normalize)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, graph={self.graph!r}, normalize={self.normalize}"
