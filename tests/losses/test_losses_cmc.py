"""CMC: in-batch core/full-graph losses, the memory bank and its NCE / (K+1)-softmax objectives."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.loss_reference import bank_nce_ref, bank_softmax_ref, info_nce_ref, raw

from cl_zoo.losses import CMCLoss, MemoryBank, bank_nce_loss, bank_softmax_loss, cmc_bank_loss, cmc_loss


def pair_ref(a: torch.Tensor, b: torch.Tensor, tau: float) -> torch.Tensor:
    a, b = F.normalize(a, dim=1), F.normalize(b, dim=1)
    return info_nce_ref(a, b, None, tau) + info_nce_ref(b, a, None, tau)


@pytest.mark.parametrize("graph", ["core", "full"])
def test_three_views_match_loops(graph: str) -> None:
    views = [raw(3, 4, seed=s) for s in range(3)]
    pairs = [(0, 1), (0, 2)] if graph == "core" else [(0, 1), (0, 2), (1, 2)]
    fast = cmc_loss(views, 0.1, graph)
    ref = sum(pair_ref(views[i], views[j], 0.1) for i, j in pairs)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(torch.autograd.grad(fast, views), torch.autograd.grad(ref, views), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    assert CMCLoss(0.1, graph)(views).item() == pytest.approx(fast.item(), rel=1e-12)


def test_two_views_core_equals_full() -> None:
    views = [raw(2, 5, seed=10), raw(2, 5, seed=11)]
    torch.testing.assert_close(cmc_loss(views, 0.07, "core"), cmc_loss(views, 0.07, "full"))
    with pytest.raises(ValueError, match="graph"):
        cmc_loss(views, 0.07, "star")


@pytest.mark.parametrize(("b", "k"), [(2, 1), (3, 4)])
def test_bank_objectives_match_loops(b: int, k: int) -> None:
    anchor = raw(b, 4, seed=20)
    cands = F.normalize(raw(b, k + 1, 4, seed=21).detach(), dim=-1)
    fast = bank_softmax_loss(anchor, cands, 0.07)
    ref = bank_softmax_ref(F.normalize(anchor, dim=1), cands, 0.07)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.autograd.grad(fast, anchor)[0], torch.autograd.grad(ref, anchor)[0])

    loss, z = bank_nce_loss(anchor, cands, 50, 0.07, z=123.0)
    ref = bank_nce_ref(F.normalize(anchor, dim=1), cands, 50, 0.07, 123.0)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.autograd.grad(loss, anchor)[0], torch.autograd.grad(ref, anchor)[0])
    assert z.item() == 123.0


def test_nce_normaliser_is_estimated_once_from_the_first_batch() -> None:
    anchor = raw(4, 3, seed=30)
    cands = F.normalize(raw(4, 6, 3, seed=31).detach(), dim=-1)
    _, z = bank_nce_loss(anchor, cands, 1000, 0.07)
    expected = torch.exp(torch.einsum("bd,bkd->bk", F.normalize(anchor, dim=1), cands) / 0.07).mean() * 1000
    torch.testing.assert_close(z, expected.detach())
    assert not z.requires_grad

    bank = MemoryBank(20, 3, generator=torch.Generator().manual_seed(0)).double()
    views, index = [raw(4, 3, seed=32), raw(4, 3, seed=33)], torch.tensor([0, 5, 7, 19])
    cmc_bank_loss(views, index, bank, 6, objective="nce", generator=torch.Generator().manual_seed(1))
    first = bank.nce_z.clone()
    assert first[0, 1] > 0 and first[1, 0] > 0 and first[0, 0] == -1
    cmc_bank_loss(views, index, bank, 6, objective="nce", generator=torch.Generator().manual_seed(2))
    assert torch.equal(bank.nce_z, first)  # fixed after the first batch


def test_bank_update_uses_momentum_and_normalises() -> None:
    bank = MemoryBank(10, 4, momentum=0.5, generator=torch.Generator().manual_seed(3))
    index = torch.tensor([2, 7])
    feats = torch.randn(2, 4)
    old = bank.memory[1, index].clone()
    untouched = bank.memory[0].clone()
    bank.update(1, index, feats)
    expected = F.normalize(0.5 * old + 0.5 * F.normalize(feats, dim=1), dim=1)
    torch.testing.assert_close(bank.memory[1, index], expected)
    assert torch.equal(bank.memory[0], untouched)
    assert {"memory", "nce_z"} <= set(bank.state_dict())


def test_bank_init_and_sampling_are_reproducible() -> None:
    a = MemoryBank(100, 8, generator=torch.Generator().manual_seed(4))
    b = MemoryBank(100, 8, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.memory, b.memory)
    index = torch.tensor([3, 9, 50])
    s1 = a.sample(index, 16, torch.Generator().manual_seed(5))
    s2 = a.sample(index, 16, torch.Generator().manual_seed(5))
    assert torch.equal(s1, s2) and s1.shape == (3, 17)
    assert torch.equal(s1[:, 0], index)
    assert ((s1 >= 0) & (s1 < 100)).all()
    assert not torch.equal(s1, a.sample(index, 16, torch.Generator().manual_seed(6)))


@pytest.mark.parametrize("objective", ["softmax", "nce"])
def test_bank_loss_scores_against_the_other_views_entries(objective: str) -> None:
    bank = MemoryBank(12, 3, generator=torch.Generator().manual_seed(7)).double()
    views, index = [raw(3, 3, seed=40), raw(3, 3, seed=41)], torch.tensor([1, 4, 11])
    memory_before = bank.memory.clone()
    idx = bank.sample(index, 5, torch.Generator().manual_seed(8))
    loss = cmc_bank_loss(views, index, bank, 5, objective=objective, generator=torch.Generator().manual_seed(8))
    if objective == "softmax":
        expected = bank_softmax_ref(F.normalize(views[0], dim=1), memory_before[1][idx], 0.07) + bank_softmax_ref(
            F.normalize(views[1], dim=1), memory_before[0][idx], 0.07
        )
    else:
        z01, z10 = float(bank.nce_z[0, 1]), float(bank.nce_z[1, 0])
        expected = bank_nce_ref(F.normalize(views[0], dim=1), memory_before[1][idx], 12, 0.07, z01) + bank_nce_ref(
            F.normalize(views[1], dim=1), memory_before[0][idx], 12, 0.07, z10
        )
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    loss.backward()
    assert views[0].grad is not None and not bank.memory.requires_grad
    assert not torch.equal(bank.memory[:, index], memory_before[:, index])  # updated after scoring


def test_autocast_bfloat16() -> None:
    g = torch.Generator().manual_seed(9)
    views = [torch.randn(8, 16, generator=g) for _ in range(3)]
    ref = cmc_loss(views, 0.07, "full")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = cmc_loss([v.bfloat16() for v in views], 0.07, "full")
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(ref.item(), rel=2e-2)
