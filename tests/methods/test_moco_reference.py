"""MoCo v2 against a loop written straight from the MoCo paper's Algorithm 1.

Issue 16 saw the queue methods (MoCo v2, JCL) learn nothing in short CPU runs while every in-batch
method did. Before blaming the budget, the queue path itself must be right: what is enqueued and
when, the EMA order, the key encoder's BatchNorm mode, the queue snapshot used as negatives. This
test trains :class:`cl_zoo.methods.mocov2.MoCoV2` and an independent plain-PyTorch transcription of
Algorithm 1 (with MoCo v2's L2 normalisation and MLP head, as in the authors' ``moco/builder.py``)
from the same initial weights on the same batches, and requires the same loss at every step and the
same query encoder, key encoder and queue at the end. The queue is small enough to wrap around.

Both run in float64: in float32 the two (equally valid) orders of summation drift apart by 1e-4 within
a few steps through the tiny batch's BatchNorm, which would force a tolerance loose enough to hide a
real defect. Keys still pass through float32 once (``MomentumMethod.key`` casts them, as in training),
which bounds the agreement at about 1e-7.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cl_zoo.methods import build_method
from cl_zoo.methods.heads import Encoder

BATCH, QUEUE, STEPS, SIZE = 6, 16, 10, 16
TEMPERATURE, MOMENTUM, LR, WD = 0.2, 0.9, 0.05, 1e-4


class Algorithm1:
    """MoCo, Algorithm 1 (He et al., 2020), with v2's normalised embeddings.

    ``f_k.params = f_q.params``; per batch: q = f_q(x_q), k = f_k(x_k).detach(), logits
    [q.k, q.queue] / t with label 0, SGD update of f_q, ``f_k = m f_k + (1 - m) f_q``, enqueue k
    and dequeue the oldest keys.
    """

    def __init__(self, f_q: nn.Module, queue: torch.Tensor) -> None:
        self.f_q = f_q
        self.f_k = copy.deepcopy(f_q)
        for p in self.f_k.parameters():
            p.requires_grad = False
        self.queue = queue.clone()  # [K, C], oldest entry at self.ptr
        self.ptr = 0
        self.opt = torch.optim.SGD(self.f_q.parameters(), lr=LR, momentum=0.9, weight_decay=WD)

    def step(self, x_q: torch.Tensor, x_k: torch.Tensor) -> float:
        q = F.normalize(self.f_q(x_q), dim=1)
        with torch.no_grad():
            k = F.normalize(self.f_k(x_k), dim=1)
        l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
        l_neg = torch.einsum("nc,kc->nk", q, self.queue)
        logits = torch.cat([l_pos, l_neg], dim=1) / TEMPERATURE
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        loss = F.cross_entropy(logits, labels)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        with torch.no_grad():
            for p_k, p_q in zip(self.f_k.parameters(), self.f_q.parameters()):
                p_k.mul_(MOMENTUM).add_(p_q.detach(), alpha=1 - MOMENTUM)
            for row in k:  # enqueue the newest keys, overwriting the oldest
                self.queue[self.ptr] = row
                self.ptr = (self.ptr + 1) % self.queue.shape[0]
        return float(loss.detach())


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def test_mocov2_matches_algorithm_1_step_for_step(float64: None) -> None:
    torch.manual_seed(0)
    method = build_method(
        "mocov2",
        "resnet18_cifar",
        model_args=dict(width=0.125),
        head_hidden_dim=32,
        head_out_dim=16,
        queue_size=QUEUE,
        temperature=TEMPERATURE,
        momentum=MOMENTUM,
    )
    assert method.queue.queue.dtype == torch.float64
    method.train()
    reference = Algorithm1(copy.deepcopy(Encoder(method.backbone, method.head)), method.queue.queue)
    reference.f_q.train()
    reference.f_k.train()
    params = [p for g in method.parameter_groups(WD) for p in g["params"]]
    assert len(params) == len(list(reference.f_q.parameters()))  # the key encoder is not optimised
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=WD)

    g = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        x_q = torch.randn(BATCH, 3, SIZE, SIZE, generator=g)
        x_k = torch.randn(BATCH, 3, SIZE, SIZE, generator=g)
        expected = reference.step(x_q, x_k)
        loss, logs = method([x_q, x_k], torch.arange(BATCH), step / STEPS)
        opt.zero_grad()
        loss.backward()
        opt.step()
        method.after_optimizer_step((step + 1) / STEPS)
        assert float(loss.detach()) == pytest.approx(expected, rel=1e-6), f"step {step}"

    ours_q = Encoder(method.backbone, method.head).state_dict()
    for name, value in reference.f_q.state_dict().items():
        torch.testing.assert_close(ours_q[name], value, rtol=1e-5, atol=1e-6, msg=f"query {name}")
    ours_k = method.key_encoder.encoder.state_dict()
    for name, value in reference.f_k.state_dict().items():
        torch.testing.assert_close(ours_k[name], value, rtol=1e-5, atol=1e-6, msg=f"key {name}")
    torch.testing.assert_close(method.queue.queue, reference.queue, rtol=1e-5, atol=1e-6)
    assert int(method.queue.ptr) == reference.ptr == (STEPS * BATCH) % QUEUE


def test_mocov2_logs_queue_health() -> None:
    """The step logs tell a queue collapse from a slow start (issue 16): cosine statistics."""
    torch.manual_seed(0)
    method = build_method(
        "mocov2", "resnet18_cifar", model_args=dict(width=0.125), head_hidden_dim=32, head_out_dim=16,
        queue_size=QUEUE,
    )
    x = torch.randn(BATCH, 3, SIZE, SIZE)
    _, logs = method([x, x.flip(-1)], torch.arange(BATCH), 0.0)
    queue = method.queue.queue
    for key in ("neg_sim", "queue_sim"):
        assert key in logs and -1.0 <= logs[key] <= 1.0
    # A collapsed queue (every entry the same unit vector) reads as mean cosine 1 between entries.
    method.queue.queue.copy_(F.normalize(torch.ones_like(queue), dim=1))
    _, logs = method([x, x.flip(-1)], torch.arange(BATCH), 0.0)
    assert logs["queue_sim"] == pytest.approx(1.0, abs=1e-4)
