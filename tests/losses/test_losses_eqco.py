"""EqCo margin loss and SiMo's in-batch form against loop references; alpha == K is InfoNCE."""

from __future__ import annotations

import math

import pytest
import torch
from tests.loss_reference import check, eqco_ref, raw, unit

from cl_zoo.losses import EqCoLoss, SiMoLoss, eqco_loss, eqco_margin, info_nce, simo_loss
from cl_zoo.losses.eqco import sample_other_indices


def test_margin_is_eq5() -> None:
    assert eqco_margin(0.2, 256, 16) == pytest.approx(0.2 * math.log(16))
    assert eqco_margin(0.2, 64, 64) == 0.0
    with pytest.raises(ValueError, match="alpha"):
        eqco_margin(0.2, 0, 4)


@pytest.mark.parametrize(("n", "k", "alpha"), [(2, 1, 65536.0), (3, 5, 7.0), (5, 9, 256.0)])
def test_eqco_shared_queue_matches_loops(n: int, k: int, alpha: float) -> None:
    q, key, queue = raw(n, 4, seed=1), raw(n, 4, seed=2), raw(k, 4, seed=3)
    check(
        lambda a, b, c: eqco_loss(a, b, unit(c), 0.2, alpha),
        lambda a, b, c: eqco_ref(unit(a), unit(b), [list(unit(c))] * n, 0.2, alpha),
        q,
        key,
        queue,
    )


@pytest.mark.parametrize(("n", "k"), [(2, 1), (4, 3)])
def test_eqco_per_query_negatives_match_loops(n: int, k: int) -> None:
    q, key, negs = raw(n, 3, seed=4), raw(n, 3, seed=5), raw(n, k, 3, seed=6)
    check(
        lambda a, b, c: eqco_loss(a, b, c, 0.1, 32.0, normalize_negatives=True),
        lambda a, b, c: eqco_ref(unit(a), unit(b), [list(unit(c[i])) for i in range(n)], 0.1, 32.0),
        q,
        key,
        negs,
    )
    assert EqCoLoss(0.1, 32.0)(q, key, unit(negs)).item() == pytest.approx(
        eqco_loss(q, key, negs, 0.1, 32.0, normalize_negatives=True).item(), rel=1e-12
    )


@pytest.mark.parametrize("k", [1, 6, 50])
def test_alpha_equal_to_k_is_plain_infonce(k: int) -> None:
    q, key, queue = raw(4, 8, seed=7), raw(4, 8, seed=8), unit(raw(k, 8, seed=9).detach())
    a = eqco_loss(q, key, queue, 0.2, float(k))
    b = info_nce(q, key, queue, 0.2)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-14)
    (ga,) = torch.autograd.grad(a, q)
    (gb,) = torch.autograd.grad(b, q)
    torch.testing.assert_close(ga, gb, rtol=0, atol=1e-14)
    # alpha != K really changes the loss (the margin is applied).
    assert eqco_loss(q, key, queue, 0.2, 4.0 * k) > b


@pytest.mark.parametrize("n", [2, 3, 6])
def test_simo_all_other_keys_matches_loops(n: int) -> None:
    q, key = raw(n, 5, seed=10), raw(n, 5, seed=11)
    check(
        lambda a, b: simo_loss(a, b, 0.2, 256.0),
        lambda a, b: eqco_ref(unit(a), unit(b), [[unit(b)[j] for j in range(n) if j != i] for i in range(n)], 0.2, 256.0),
        q,
        key,
    )


def test_simo_symmetric_averages_both_directions() -> None:
    q, key = raw(5, 4, seed=12), raw(5, 4, seed=13)
    both = simo_loss(q, key, 0.2, 16.0, symmetric=True)
    expected = (simo_loss(q, key, 0.2, 16.0) + simo_loss(key, q, 0.2, 16.0)) / 2
    torch.testing.assert_close(both, expected)


def test_sampled_negatives_are_distinct_other_keys_and_reproducible() -> None:
    n, num = 7, 4
    idx = sample_other_indices(n, num, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert idx.shape == (n, num)
    for i in range(n):
        row = idx[i].tolist()
        assert len(set(row)) == num and i not in row and all(0 <= j < n for j in row)
    again = sample_other_indices(n, num, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert torch.equal(idx, again)
    # Every other key gets drawn over many draws (uniform over j != i, not a fixed window).
    seen = set()
    g = torch.Generator().manual_seed(2)
    for _ in range(60):
        many = sample_other_indices(n, 1, g, torch.device("cpu"))
        seen.add(int(many[0, 0]))
    assert seen == set(range(1, n))


def test_simo_sampled_matches_loops_on_the_same_sample() -> None:
    n, num = 6, 2
    q, key = raw(n, 4, seed=14), raw(n, 4, seed=15)
    idx = sample_other_indices(n, num, torch.Generator().manual_seed(3), torch.device("cpu"))
    check(
        lambda a, b: simo_loss(a, b, 0.2, 256.0, num, torch.Generator().manual_seed(3)),
        lambda a, b: eqco_ref(unit(a), unit(b), [[unit(b)[int(j)] for j in idx[i]] for i in range(n)], 0.2, 256.0),
        q,
        key,
    )
    module = SiMoLoss(0.2, 256.0, num_negatives=num)
    assert module(q, key, torch.Generator().manual_seed(3)).item() == pytest.approx(
        simo_loss(q, key, 0.2, 256.0, num, torch.Generator().manual_seed(3)).item(), rel=1e-12
    )


def test_simo_rejects_too_many_negatives() -> None:
    q = torch.randn(4, 3)
    with pytest.raises(ValueError, match="between 1 and batch size - 1 = 3"):
        simo_loss(q, q, num_negatives=4)
    with pytest.raises(ValueError, match="at least 2"):
        simo_loss(q[:1], q[:1])
    with pytest.raises(ValueError, match="negatives must be"):
        eqco_loss(q, q, torch.randn(3, 4, 3))


def test_autocast_bfloat16() -> None:
    g = torch.Generator().manual_seed(4)
    q, key = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    ref = simo_loss(q, key, 0.2, 256.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = simo_loss(q.bfloat16(), key.bfloat16(), 0.2, 256.0)
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(ref.item(), rel=2e-2)


# --- the authors' released SiMo code: shared negative slots, margin commented out ----------------

@pytest.mark.parametrize(("n", "num", "margin"), [(5, 2, False), (6, 3, True), (4, 3, False)])
def test_simo_released_options_match_the_released_loops(n: int, num: int, margin: bool) -> None:
    from tests.loss_reference import simo_released_ref

    q, key = raw(n, 4, seed=40), raw(n, 4, seed=41)
    slots = torch.randperm(n - 1, generator=torch.Generator().manual_seed(5))[:num].tolist()  # their draw
    check(
        lambda a, b: simo_loss(
            a, b, 0.2, 256.0, num, torch.Generator().manual_seed(5), negative_sampling="shared", margin=margin
        ),
        lambda a, b: simo_released_ref(unit(a), unit(b), slots, 0.2, 256.0 if margin else None),
        q,
        key,
    )


def test_shared_sampling_uses_one_slot_list_for_every_query() -> None:
    from cl_zoo.losses.eqco import shared_other_indices

    n, num = 7, 3
    idx = shared_other_indices(n, num, torch.Generator().manual_seed(1), torch.device("cpu"))
    slots = torch.randperm(n - 1, generator=torch.Generator().manual_seed(1))[:num]
    for i in range(n):
        others = [j for j in range(n) if j != i]
        assert idx[i].tolist() == [others[s] for s in slots.tolist()]
        assert i not in idx[i].tolist()


def test_no_margin_is_plain_infonce_over_the_sampled_negatives() -> None:
    q, key = raw(6, 4, seed=42), raw(6, 4, seed=43)
    g = lambda: torch.Generator().manual_seed(9)  # noqa: E731
    no_margin = simo_loss(q, key, 0.2, 256.0, 2, g(), margin=False)
    alpha_is_k = simo_loss(q, key, 0.2, 2.0, 2, g())
    torch.testing.assert_close(no_margin, alpha_is_k, rtol=0, atol=1e-14)
    assert simo_loss(q, key, 0.2, 256.0, 2, g()) > no_margin  # the paper's margin really applies
    with pytest.raises(ValueError, match="negative_sampling must be"):
        simo_loss(q, key, negative_sampling="batch")
    module = SiMoLoss(0.2, 256.0, num_negatives=2, negative_sampling="shared", margin=False)
    assert module(q, key, g()).item() == pytest.approx(
        simo_loss(q, key, 0.2, 256.0, 2, g(), negative_sampling="shared", margin=False).item(), rel=1e-12
    )
