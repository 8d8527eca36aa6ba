"""NT-Xent, MoCo InfoNCE, DCL and DCLW against loop references, plus DCL's decoupling identity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.loss_reference import dcl_ref, dclw_weights_ref, info_nce_ref, nt_xent_ref, raw

from cl_zoo.losses import DCLLoss, DCLWLoss, InfoNCELoss, NTXentLoss, dcl, dclw, dclw_weights, info_nce, nt_xent


def value_and_grads(fn, *inputs: torch.Tensor):
    out = fn(*inputs)
    grads = torch.autograd.grad(out, inputs)
    return out.detach(), grads


def assert_same(fast, ref) -> None:
    (v1, g1), (v2, g2) = fast, ref
    torch.testing.assert_close(v1, v2, rtol=1e-10, atol=1e-10)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize(("n", "d", "tau"), [(2, 3, 0.5), (5, 4, 0.1), (7, 8, 0.2)])
def test_nt_xent_matches_loops(n: int, d: int, tau: float) -> None:
    z1, z2 = raw(n, d, seed=n), raw(n, d, seed=n + 100)
    fast = value_and_grads(lambda a, b: nt_xent(a, b, tau), z1, z2)
    ref = value_and_grads(lambda a, b: nt_xent_ref(F.normalize(a, dim=1), F.normalize(b, dim=1), tau), z1, z2)
    assert_same(fast, ref)
    assert NTXentLoss(tau)(z1, z2).item() == pytest.approx(fast[0].item(), rel=1e-12)


@pytest.mark.parametrize(("n", "k", "d"), [(2, 1, 3), (3, 5, 4), (6, 11, 8)])
def test_info_nce_with_queue_matches_loops(n: int, k: int, d: int) -> None:
    q, key = raw(n, d, seed=1), raw(n, d, seed=2)
    queue = F.normalize(raw(k, d, seed=3).detach(), dim=1).requires_grad_(True)
    fast = value_and_grads(lambda a, b, c: info_nce(a, b, c, 0.2), q, key, queue)
    ref = value_and_grads(
        lambda a, b, c: info_nce_ref(F.normalize(a, dim=1), F.normalize(b, dim=1), c, 0.2), q, key, queue
    )
    assert_same(fast, ref)
    assert InfoNCELoss(0.2)(q, key, queue).item() == pytest.approx(fast[0].item(), rel=1e-12)


@pytest.mark.parametrize("n", [2, 6])
def test_info_nce_in_batch_matches_loops(n: int) -> None:
    q, key = raw(n, 5, seed=4), raw(n, 5, seed=5)
    fast = value_and_grads(lambda a, b: info_nce(a, b, None, 0.3), q, key)
    ref = value_and_grads(lambda a, b: info_nce_ref(F.normalize(a, dim=1), F.normalize(b, dim=1), None, 0.3), q, key)
    assert_same(fast, ref)


def test_normalize_false_uses_inputs_as_given() -> None:
    z1, z2 = raw(4, 3, seed=6), raw(4, 3, seed=7)
    # Un-normalised inputs change the value when normalisation is off: the flag is honoured.
    assert not torch.isclose(nt_xent(z1, z2, 0.5), nt_xent(z1, z2, 0.5, normalize=False))
    u1, u2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    torch.testing.assert_close(nt_xent(u1, u2, 0.5, normalize=False), nt_xent(z1, z2, 0.5))


@pytest.mark.parametrize(("n", "d", "tau"), [(2, 3, 0.1), (4, 5, 0.2), (7, 6, 0.5)])
def test_dcl_matches_loops(n: int, d: int, tau: float) -> None:
    z1, z2 = raw(n, d, seed=8), raw(n, d, seed=9)
    fast = value_and_grads(lambda a, b: dcl(a, b, tau), z1, z2)
    ref = value_and_grads(lambda a, b: dcl_ref(F.normalize(a, dim=1), F.normalize(b, dim=1), tau), z1, z2)
    assert_same(fast, ref)
    assert DCLLoss(tau)(z1, z2).item() == pytest.approx(fast[0].item(), rel=1e-12)


@pytest.mark.parametrize("n", [2, 5])
def test_dclw_matches_loops_with_detached_weights(n: int) -> None:
    z1, z2 = raw(n, 4, seed=10), raw(n, 4, seed=11)
    u1, u2 = F.normalize(z1, dim=1).detach(), F.normalize(z2, dim=1).detach()
    w_ref = dclw_weights_ref(u1, u2, 0.5)
    w = dclw_weights(z1, z2, 0.5)
    assert not w.requires_grad
    torch.testing.assert_close(w, torch.tensor(w_ref, dtype=torch.float64))
    assert w.mean().item() == pytest.approx(1.0, abs=1e-12)
    fast = value_and_grads(lambda a, b: dclw(a, b, 0.1, 0.5), z1, z2)
    ref = value_and_grads(lambda a, b: dcl_ref(F.normalize(a, dim=1), F.normalize(b, dim=1), 0.1, w_ref), z1, z2)
    assert_same(fast, ref)
    assert DCLWLoss(0.1, 0.5)(z1, z2).item() == pytest.approx(fast[0].item(), rel=1e-12)


def test_dclw_equal_positive_similarities_reduce_to_dcl() -> None:
    # z2_i = cos(t) z1_i + sin(t) u_i with u_i a unit vector orthogonal to z1_i: all <z_i^1, z_i^2> = cos(t).
    n, d = 5, 4
    z1 = F.normalize(raw(n, d, seed=12).detach(), dim=1)
    r = raw(n, d, seed=13).detach()
    u = F.normalize(r - (r * z1).sum(1, keepdim=True) * z1, dim=1)
    z2 = 0.6 * z1 + 0.8 * u
    torch.testing.assert_close((z1 * z2).sum(1), torch.full((n,), 0.6, dtype=torch.float64))
    w = dclw_weights(z1, z2, 0.5)
    torch.testing.assert_close(w, torch.ones(n, dtype=torch.float64))
    torch.testing.assert_close(dclw(z1, z2, 0.1), dcl(z1, z2, 0.1))


def test_dcl_gradient_has_no_coupling_but_nt_xent_does() -> None:
    """Appendix A.1/A.2: -dL_i^(1)/dz_i^(2) = q_B,i z_i^(1)/tau for NT-Xent, z_i^(1)/tau for DCL."""
    n, d, tau, i = 4, 6, 0.2, 1
    z1 = F.normalize(raw(n, d, seed=14).detach(), dim=1)
    z2 = F.normalize(raw(n, d, seed=15).detach(), dim=1).requires_grad_(True)

    # L_i^(1) is the i-th per-anchor loss (anchors of view 1 come first).
    (g_dcl,) = torch.autograd.grad(dcl(z1, z2, tau, normalize=False, reduction="none")[i], z2)
    torch.testing.assert_close(-g_dcl[i], z1[i] / tau)

    (g_nt,) = torch.autograd.grad(nt_xent(z1, z2, tau, normalize=False, reduction="none")[i], z2)
    views = torch.cat([z1, z2.detach()])
    logits = views @ z1[i] / tau
    logits[i] = float("-inf")  # the anchor itself is not in the denominator
    q_b = 1 - torch.softmax(logits, dim=0)[n + i]
    torch.testing.assert_close(-g_nt[i], q_b * z1[i] / tau)
    assert 0 < q_b < 1  # a genuine down-weighting, not the DCL gradient in disguise
    assert not torch.allclose(g_nt[i], g_dcl[i])


@pytest.mark.parametrize("fn", [nt_xent, dcl, dclw, lambda a, b: info_nce(a, b, None)])
def test_bfloat16_autocast_computes_in_float32(fn) -> None:
    g = torch.Generator().manual_seed(16)
    z1, z2 = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    ref = fn(z1, z2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(z1.bfloat16(), z2.bfloat16())
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(ref.item(), rel=2e-2)


def test_bad_inputs_raise_clear_errors() -> None:
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match="at least 2"):
        nt_xent(z[:1], z[:1])
    with pytest.raises(ValueError, match="equal shapes"):
        dcl(z, z[:3])
    with pytest.raises(ValueError, match="temperature"):
        info_nce(z, z, None, 0.0)
    with pytest.raises(ValueError, match="queue"):
        info_nce(z, z, torch.randn(5, 4))
    with pytest.raises(ValueError, match="weight"):
        dcl(z, z, 0.1, torch.ones(3))
