"""MoCo v3's symmetric loss against a float64 loop reference, in value and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cl_zoo.losses.mocov3 import MoCoV3Loss, mocov3_contrast, mocov3_loss
from tests.loss_reference import check, mocov3_ref, raw, unit


@pytest.mark.parametrize(("n", "d", "tau"), [(2, 3, 1.0), (5, 4, 0.2), (7, 8, 0.1)])
def test_mocov3_loss_matches_loops(n: int, d: int, tau: float) -> None:
    q1, q2, k1, k2 = (raw(n, d, seed=s) for s in (1, 2, 3, 4))
    check(lambda a, b, c, e: mocov3_loss(a, b, c, e, tau),
          lambda a, b, c, e: mocov3_ref(unit(a), unit(b), unit(c), unit(e), tau), q1, q2, k1, k2)


@pytest.mark.parametrize(("n", "ranks", "rank"), [(3, 2, 1), (2, 4, 3), (4, 3, 0)])
def test_gathered_keys_put_the_positive_at_the_ranks_offset(n: int, ranks: int, rank: int) -> None:
    """Keys of R ranks [R N, D]; this rank's queries' positives are keys rank*N .. rank*N + N-1."""
    q1, q2 = raw(n, 6, seed=5), raw(n, 6, seed=6)
    k1, k2 = raw(ranks * n, 6, seed=7), raw(ranks * n, 6, seed=8)
    off = rank * n
    check(lambda a, b, c, e: mocov3_loss(a, b, c, e, 0.2, offset=off),
          lambda a, b, c, e: mocov3_ref(unit(a), unit(b), unit(c), unit(e), 0.2, offset=off), q1, q2, k1, k2)


def test_the_2tau_factor_and_the_module_form() -> None:
    q, k = raw(4, 5, seed=9, grad=False), raw(4, 5, seed=10, grad=False)
    plain = F.cross_entropy(unit(q) @ unit(k).T / 0.2, torch.arange(4))
    assert mocov3_contrast(q, k, 0.2).item() == pytest.approx(0.4 * plain.item(), rel=1e-12)
    assert MoCoV3Loss(0.2)(q, q, k, k).item() == pytest.approx(2 * 0.4 * plain.item(), rel=1e-12)


def test_bad_inputs_are_one_line_errors() -> None:
    q, k = raw(4, 5, seed=1, grad=False), raw(4, 5, seed=2, grad=False)
    with pytest.raises(ValueError, match="outside the 4 keys"):
        mocov3_contrast(q, k, offset=1)
    with pytest.raises(ValueError, match="temperature"):
        mocov3_contrast(q, k, 0.0)
    with pytest.raises(ValueError, match="same shapes"):
        mocov3_loss(q, q[:3], k, k)
