"""JCL (Eq. 8) against an explicit-covariance loop reference, its MoCo limit and its Jensen bound."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.loss_reference import jcl_ref
from tests.loss_reference import raw as _raw

from cl_zoo.losses import JCLLoss, info_nce, jcl_loss, lambda_schedule


def raw(*shape: int, seed: int) -> torch.Tensor:
    """JCL's inputs are normalised before use, so they are plain (non-leaf-grad) tensors here."""
    return _raw(*shape, seed=seed, grad=False)


@pytest.mark.parametrize(("n", "m", "k", "d", "lam"), [(2, 1, 1, 3, 4.0), (2, 3, 4, 3, 2.0), (4, 5, 7, 4, 4.0)])
def test_jcl_matches_loops(n: int, m: int, k: int, d: int, lam: float) -> None:
    q = raw(n, d, seed=1).requires_grad_(True)
    keys = F.normalize(raw(n, m, d, seed=2), dim=-1)
    queue = F.normalize(raw(k, d, seed=3), dim=-1)
    loss, mu = jcl_loss(q, keys, queue, 0.2, lam)
    (grad,) = torch.autograd.grad(loss, q)
    ref = jcl_ref(F.normalize(q, dim=1), keys, queue, 0.2, lam)
    (ref_grad,) = torch.autograd.grad(ref, q)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(mu, keys.mean(dim=1))
    assert not mu.requires_grad
    assert JCLLoss(0.2, lam)(q, keys, queue)[0].item() == pytest.approx(loss.item(), rel=1e-12)


def test_mean_key_is_not_renormalised_and_keys_get_no_gradient() -> None:
    q = raw(3, 4, seed=4).requires_grad_(True)
    keys = raw(3, 5, 4, seed=5).requires_grad_(True)
    loss, mu = jcl_loss(q, keys, raw(6, 4, seed=6), 0.2, 4.0)
    assert (mu.norm(dim=1) < 1).all()  # a mean of distinct unit vectors is shorter than 1
    torch.testing.assert_close(mu, F.normalize(keys.detach(), dim=-1).mean(dim=1))
    loss.backward()
    assert keys.grad is None and q.grad is not None


def test_lambda_zero_single_key_is_moco_infonce() -> None:
    q, k, queue = raw(5, 6, seed=7), raw(5, 6, seed=8), F.normalize(raw(9, 6, seed=9), dim=1)
    loss, _ = jcl_loss(q, k.unsqueeze(1), queue, 0.2, 0.0)
    torch.testing.assert_close(loss, info_nce(q, k, queue, 0.2), rtol=1e-12, atol=1e-12)
    # With one key Sigma = 0, so lambda is irrelevant.
    torch.testing.assert_close(jcl_loss(q, k.unsqueeze(1), queue, 0.2, 4.0)[0], loss, rtol=1e-12, atol=1e-12)


def per_key_infonce(q: torch.Tensor, keys: torch.Tensor, queue: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 3: the mean over the M' keys of each key's own InfoNCE loss, per query [N]."""
    n, m, _ = keys.shape
    flat = info_nce(
        q.repeat_interleave(m, 0), keys.reshape(n * m, -1), queue, tau, normalize=False, reduction="none"
    )
    return flat.view(n, m).mean(dim=1)


def test_empirical_jensen_bound_eq7() -> None:
    """Eq. 7 with the empirical key distribution holds for any keys: log mean >= mean log."""
    tau = 0.2
    q = F.normalize(raw(6, 8, seed=10), dim=1)
    keys = F.normalize(raw(6, 5, 8, seed=11), dim=-1)
    queue = F.normalize(raw(32, 8, seed=12), dim=1)
    pos = torch.einsum("nd,nmd->nm", q, keys) / tau
    neg = torch.logsumexp(q @ queue.T / tau, dim=1)
    bound = torch.logaddexp(torch.logsumexp(pos, dim=1) - torch.log(torch.tensor(5.0)), neg) - pos.mean(dim=1)
    assert (bound >= per_key_infonce(q, keys, queue, tau) - 1e-12).all()


def test_eq8_upper_bounds_monte_carlo_mean_for_gaussian_keys() -> None:
    """Eq. 8 with lambda = 1 is the Gaussian closed form of Eq. 7: with many keys drawn from a
    Gaussian, it must upper-bound the Monte-Carlo mean of the per-key InfoNCE losses."""
    tau, n, d, m = 0.2, 4, 8, 4000
    q = F.normalize(raw(n, d, seed=13), dim=1)
    centers = F.normalize(raw(n, d, seed=14), dim=1)
    keys = centers.unsqueeze(1) + 0.5 * raw(n, m, d, seed=15)
    queue = F.normalize(raw(8, d, seed=16), dim=1)
    loss, _ = jcl_loss(q, keys, queue, tau, 1.0, normalize=False, reduction="none")
    mc = per_key_infonce(q, keys, queue, tau)
    assert (loss > mc).all()  # margins here are >= 4 Monte-Carlo standard errors
    # The variance term is what makes it a bound: the mean key alone (lambda = 0) falls below.
    assert (jcl_loss(q, keys, queue, tau, 0.0, normalize=False, reduction="none")[0] < mc).all()


def test_in_batch_negatives_when_no_queue() -> None:
    q = raw(3, 4, seed=17)
    keys = F.normalize(raw(3, 2, 4, seed=18), dim=-1)
    loss, mu = jcl_loss(q, keys, None, 0.2, 0.0)
    # lambda = 0 with in-batch negatives is InfoNCE against the other instances' mean keys.
    qn = F.normalize(q, dim=1)
    pos = (qn * mu).sum(1) / 0.2
    logits = qn @ mu.T / 0.2
    expected = (torch.logsumexp(logits, dim=1) - pos).mean()
    torch.testing.assert_close(loss, expected)


def test_lambda_schedule_ramps_linearly() -> None:
    assert lambda_schedule(2.0, 0, 200) == pytest.approx(0.01)
    assert lambda_schedule(2.0, 199, 200) == pytest.approx(2.0)
    assert lambda_schedule(4.0, 10, 200, ramp=False) == 4.0
    with pytest.raises(ValueError, match="epoch"):
        lambda_schedule(2.0, 200, 200)
    module = JCLLoss(lam=2.0, ramp=True)
    module.set_epoch(99, 200)
    assert module.lam == pytest.approx(1.0)


def test_bad_shapes_and_autocast() -> None:
    with pytest.raises(ValueError, match="keys"):
        jcl_loss(torch.randn(2, 3), torch.randn(2, 3), None)
    with pytest.raises(ValueError, match="queue"):
        jcl_loss(torch.randn(2, 3), torch.randn(2, 2, 3), torch.randn(4, 5))
    g = torch.Generator().manual_seed(0)
    q, keys, queue = torch.randn(8, 16, generator=g), torch.randn(8, 3, 16, generator=g), torch.randn(32, 16, generator=g)
    queue = F.normalize(queue, dim=1)
    ref, _ = jcl_loss(q, keys, queue)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, mu = jcl_loss(q.bfloat16(), keys.bfloat16(), queue.bfloat16())
    assert out.dtype == torch.float32 and mu.dtype == torch.float32
    assert out.item() == pytest.approx(ref.item(), rel=2e-2)
