"""CACR (attraction + repulsion with conditional weights) against explicit sums."""

from __future__ import annotations

import pytest
import torch
from tests.loss_reference import cacr_ref, raw, unit
from tests.loss_reference import check as check_loops

from cl_zoo.losses import CACRLoss, cacr_loss, cacr_multiview_loss


def check(fast_fn, ref_fn, *inputs: torch.Tensor) -> None:  # noqa: ANN001
    # CACR's softmax-weighted costs lose a digit in the gradient: 1e-8 instead of 1e-9.
    check_loops(fast_fn, ref_fn, *inputs, grad_rtol=1e-8)


@pytest.mark.parametrize(("m", "k", "detach"), [(2, 1, False), (3, 4, False), (4, 2, True)])
def test_in_batch_matches_loops(m: int, k: int, detach: bool) -> None:
    q, pos = raw(m, 3, seed=1), raw(m, k, 3, seed=2)
    check(
        lambda a, b: cacr_loss(a, b, None, 1.0, 0.9, detach_pos_weights=detach),
        lambda a, b: cacr_ref(unit(a), unit(b), None, 1.0, 0.9, True, detach),
        q,
        pos,
    )


@pytest.mark.parametrize("in_batch", [True, False])
def test_moco_form_matches_loops(in_batch: bool) -> None:
    q, keys, queue = raw(3, 4, seed=3), raw(3, 2, 4, seed=4), unit(raw(5, 4, seed=5))
    check(
        lambda a, b, c: cacr_loss(a, b, c, 1.0, 2.0, in_batch_negatives=in_batch),
        lambda a, b, c: cacr_ref(unit(a), unit(b), c, 1.0, 2.0, in_batch, True),
        q,
        keys,
        queue,
    )


def test_weight_gradient_default_follows_the_paper() -> None:
    q, pos = raw(3, 4, seed=6), raw(3, 3, 4, seed=7)
    (g_default,) = torch.autograd.grad(cacr_loss(q, pos), q)
    (g_through,) = torch.autograd.grad(cacr_loss(q, pos, detach_pos_weights=False), q)
    (g_detached,) = torch.autograd.grad(cacr_loss(q, pos, detach_pos_weights=True), q)
    torch.testing.assert_close(g_default, g_through)  # in-batch: grad through the weights (Sec. 3.2)
    assert not torch.allclose(g_through, g_detached)
    queue = unit(raw(4, 4, seed=8)).detach()
    (g_moco,) = torch.autograd.grad(cacr_loss(q, pos, queue), q)
    (g_moco_detached,) = torch.autograd.grad(cacr_loss(q, pos, queue, detach_pos_weights=True), q)
    torch.testing.assert_close(g_moco, g_moco_detached)  # MoCo form: no_grad weights (Algorithm 3)


def test_single_positive_attraction_is_the_squared_distance() -> None:
    q, pos = raw(5, 6, seed=9), raw(5, 1, 6, seed=10)
    _, parts = cacr_loss(q, pos, None, 1.0, 2.0, return_parts=True)
    expected = (unit(q) - unit(pos)[:, 0]).pow(2).sum(1).mean()
    torch.testing.assert_close(parts["attraction"], expected.detach())
    torch.testing.assert_close(parts["attraction"], (2 - 2 * (unit(q) * unit(pos)[:, 0]).sum(1)).mean().detach())


def test_far_positives_and_near_negatives_weigh_more() -> None:
    """softmax(+t c) weighting puts the attraction above the plain mean positive cost, and
    softmax(-t c) puts the repulsion magnitude below the plain mean negative cost."""
    q, pos = raw(4, 5, seed=15), raw(4, 3, 5, seed=16)
    _, parts = cacr_loss(q, pos, None, 1.0, 2.0, return_parts=True)
    cost_pos = (unit(q).unsqueeze(1) - unit(pos)).pow(2).sum(2)
    assert parts["attraction"] > cost_pos.mean(1).mean()
    cost_neg = torch.cdist(unit(q), unit(q)).pow(2)
    plain_neg = (cost_neg.sum(1) / 3).mean()
    assert -parts["repulsion"] < plain_neg


def test_multiview_each_view_is_query_in_turn() -> None:
    views = [raw(3, 4, seed=s) for s in (11, 12, 13)]
    loss = cacr_multiview_loss(views, t_neg=0.9)
    stacked = torch.stack(views, 1)
    expected = sum(cacr_loss(views[k], stacked[:, [j for j in range(3) if j != k]], None, 1.0, 0.9) for k in range(3)) / 3
    torch.testing.assert_close(loss, expected)
    assert CACRLoss(1.0, 0.9)(views).item() == pytest.approx(loss.item(), rel=1e-12)
    # MoCo form: momentum keys as positives, queue + other queries as negatives, weights detached.
    keys = [v.detach() + 0.01 for v in views]
    queue = unit(raw(6, 4, seed=14)).detach()
    moco = cacr_multiview_loss(views, keys, queue)
    kst = torch.stack(keys, 1)
    expected = sum(cacr_loss(views[k], kst[:, [j for j in range(3) if j != k]], queue) for k in range(3)) / 3
    torch.testing.assert_close(moco, expected)


def test_bad_inputs_and_autocast() -> None:
    with pytest.raises(ValueError, match="positives"):
        cacr_loss(torch.randn(3, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match="at least 2 queries"):
        cacr_loss(torch.randn(1, 4), torch.randn(1, 1, 4))
    with pytest.raises(ValueError, match="at least 2 views"):
        cacr_multiview_loss([torch.randn(3, 4)])
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(8, 16, generator=g) for _ in range(3)]
    ref = cacr_multiview_loss(views)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = cacr_multiview_loss([v.bfloat16() for v in views])
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(ref.item(), rel=2e-2, abs=1e-2)


# --- repulsion="cross_view": the authors' released small-scale loss ------------------------------

@pytest.mark.parametrize(("m", "num_views", "t_neg"), [(3, 2, 0.9), (4, 3, 2.0), (3, 5, 0.9)])
def test_cross_view_option_matches_the_released_loops(m: int, num_views: int, t_neg: float) -> None:
    from tests.loss_reference import cacr_released_ref

    views = [raw(m, 3, seed=20 + s) for s in range(num_views)]
    check(
        lambda *v: cacr_multiview_loss(list(v), t_pos=1.0, t_neg=t_neg, repulsion="cross_view"),
        lambda *v: cacr_released_ref([unit(x) for x in v], 1.0, t_neg),
        *views,
    )
    assert CACRLoss(1.0, t_neg, repulsion="cross_view")(views).item() == pytest.approx(
        cacr_multiview_loss(views, t_pos=1.0, t_neg=t_neg, repulsion="cross_view").item(), rel=1e-12
    )


def test_cross_view_differs_from_the_paper_only_in_the_repulsion() -> None:
    """Same attraction; with two views the released form never repels view 1's queries."""
    views = [raw(5, 4, seed=30), raw(5, 4, seed=31)]
    paper = cacr_multiview_loss(views, t_neg=0.9)
    released = cacr_multiview_loss(views, t_neg=0.9, repulsion="cross_view")
    assert not torch.allclose(paper, released)
    z0, z1 = unit(views[0]), unit(views[1])
    attraction = (z0 - z1).pow(2).sum(1).mean()  # K=1: both views attract with the plain distance
    cost = torch.cdist(z0, z1).pow(2)
    off = ~torch.eye(5, dtype=torch.bool)
    c = cost[off].view(5, 4)
    repulsion = -(torch.softmax(-0.9 * c, 1) * c).sum(1).mean()
    torch.testing.assert_close(released, attraction + repulsion)
    # view 1's embeddings get gradient only through attraction and as view 0's negatives
    (g1,) = torch.autograd.grad(released, views[1])
    assert torch.isfinite(g1).all() and g1.abs().sum() > 0


def test_cross_view_refuses_the_moco_form() -> None:
    views = [torch.randn(4, 3) for _ in range(2)]
    with pytest.raises(ValueError, match="in-batch"):
        cacr_multiview_loss(views, keys=views, repulsion="cross_view")
    with pytest.raises(ValueError, match="repulsion must be"):
        cacr_multiview_loss(views, repulsion="other_view")
    from cl_zoo.methods import build_method

    with pytest.raises(Exception, match="form='in_batch'"):
        build_method("cacr", "resnet18_cifar", model_args={"width": 0.0625}, form="moco", repulsion="cross_view", queue_size=8)
