"""Naive loss references: explicit Python loops over anchors and candidates, scalar arithmetic.

They exist to check the vectorised losses in ``cl_zoo.losses`` (value and gradient, float64); they
are written straight from the papers' equations, sharing no code with the package. Inputs are
assumed L2-normalised already (the tests pass ``normalize=False`` to the package functions or
normalise before calling both).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor



# --- test inputs and the value+gradient comparison every loss test uses ---------------------------

def raw(*shape: int, seed: int, grad: bool = True) -> Tensor:
    """Seeded float64 standard-normal input (a leaf requiring grad unless ``grad=False``)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return x.requires_grad_(True) if grad else x


def unit(x: Tensor) -> Tensor:
    return torch.nn.functional.normalize(x, dim=-1)


def check(fast_fn, ref_fn, *inputs: Tensor, grad_rtol: float = 1e-9) -> None:  # noqa: ANN001
    """The vectorised loss and its loop reference agree in value and in every input's gradient."""
    v1 = fast_fn(*inputs)
    g1 = torch.autograd.grad(v1, inputs)
    v2 = ref_fn(*inputs)
    g2 = torch.autograd.grad(v2, inputs)
    torch.testing.assert_close(v1, v2, rtol=1e-10, atol=1e-10)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=grad_rtol, atol=1e-10)

def dot(a: Tensor, b: Tensor) -> Tensor:
    out = a[0] * b[0]
    for d in range(1, a.shape[0]):
        out = out + a[d] * b[d]
    return out


def log_sum_exp(values: list[Tensor]) -> Tensor:
    m = max(float(v.detach()) for v in values)
    total = sum(torch.exp(v - m) for v in values)
    return torch.log(total) + m


def nt_xent_ref(z1: Tensor, z2: Tensor, tau: float) -> Tensor:
    n = z1.shape[0]
    views = [z1[i] for i in range(n)] + [z2[i] for i in range(n)]
    losses = []
    for a in range(2 * n):
        p = (a + n) % (2 * n)
        terms = [dot(views[a], views[b]) / tau for b in range(2 * n) if b != a]
        losses.append(-dot(views[a], views[p]) / tau + log_sum_exp(terms))
    return sum(losses) / len(losses)


def info_nce_ref(q: Tensor, k: Tensor, queue: Tensor | None, tau: float) -> Tensor:
    n = q.shape[0]
    losses = []
    for i in range(n):
        pos = dot(q[i], k[i]) / tau
        if queue is None:
            negs = [dot(q[i], k[j]) / tau for j in range(n) if j != i]
        else:
            negs = [dot(q[i], queue[j]) / tau for j in range(queue.shape[0])]
        losses.append(-pos + log_sum_exp([pos] + negs))
    return sum(losses) / n


def mocov3_ref(q1: Tensor, q2: Tensor, k1: Tensor, k2: Tensor, tau: float, offset: int = 0) -> Tensor:
    """MoCo v3 (arXiv 2104.02057, Algorithm 1 with the authors' 2 tau factor): for each direction
    (q1 against k2, q2 against k1), -2 tau log(exp(q_i.k_{offset+i}/tau) / sum_j exp(q_i.k_j/tau)),
    averaged over the queries; the two directions summed."""
    total = 0
    for q, k in ((q1, k2), (q2, k1)):
        losses = []
        for i in range(q.shape[0]):
            logits = [dot(q[i], k[j]) / tau for j in range(k.shape[0])]
            losses.append(2 * tau * (-logits[offset + i] + log_sum_exp(logits)))
        total = total + sum(losses) / len(losses)
    return total


def dcl_ref(z1: Tensor, z2: Tensor, tau: float, weight: list[float] | None = None) -> Tensor:
    n = z1.shape[0]
    losses = []
    for k in (0, 1):
        anchors = z1 if k == 0 else z2
        for i in range(n):
            w = 1.0 if weight is None else weight[i]
            pos = w * dot(z1[i], z2[i]) / tau
            terms = []
            for other in (z1, z2):
                for j in range(n):
                    if j != i:
                        terms.append(dot(anchors[i], other[j]) / tau)
            losses.append(-pos + log_sum_exp(terms))
    return sum(losses) / len(losses)


def dclw_weights_ref(z1: Tensor, z2: Tensor, sigma: float) -> list[float]:
    n = z1.shape[0]
    s = [math.exp(float(dot(z1[i], z2[i]).detach()) / sigma) for i in range(n)]
    total = sum(s)
    return [2.0 - n * s[i] / total for i in range(n)]


def eqco_ref(q: Tensor, k: Tensor, negatives: list[list[Tensor]], tau: float, alpha: float) -> Tensor:
    """Appendix A.1 form: -log(s0 / (s0 + alpha/K sum_i s_i)); ``negatives[i]`` lists q_i's negatives."""
    losses = []
    for i in range(q.shape[0]):
        s0 = torch.exp(dot(q[i], k[i]) / tau)
        kk = len(negatives[i])
        s = sum(torch.exp(dot(q[i], neg) / tau) for neg in negatives[i])
        losses.append(-torch.log(s0 / (s0 + alpha / kk * s)))
    return sum(losses) / len(losses)


def jcl_ref(q: Tensor, keys: Tensor, queue: Tensor, tau: float, lam: float) -> Tensor:
    """Eq. 8 with an explicit d x d covariance (Algorithm 1); mu and Sigma are constants."""
    n, m, d = keys.shape
    losses = []
    for i in range(n):
        with torch.no_grad():
            mu = [sum(float(keys[i, r, c]) for r in range(m)) / m for c in range(d)]
            sigma = [[0.0] * d for _ in range(d)]
            for r in range(m):
                for a in range(d):
                    for b in range(d):
                        sigma[a][b] += (float(keys[i, r, a]) - mu[a]) * (float(keys[i, r, b]) - mu[b]) / m
        q_mu = sum(q[i, c] * mu[c] for c in range(d))
        quad = sum(q[i, a] * sigma[a][b] * q[i, b] for a in range(d) for b in range(d))
        terms = [q_mu / tau + lam / (2 * tau**2) * quad]
        terms += [dot(q[i], queue[j]) / tau for j in range(queue.shape[0])]
        losses.append(log_sum_exp(terms) - q_mu / tau)
    return sum(losses) / n


def bank_softmax_ref(anchor: Tensor, candidates: Tensor, tau: float) -> Tensor:
    losses = []
    for b in range(anchor.shape[0]):
        logits = [dot(anchor[b], candidates[b, c]) / tau for c in range(candidates.shape[1])]
        losses.append(log_sum_exp(logits) - logits[0])
    return sum(losses) / len(losses)


def bank_nce_ref(anchor: Tensor, candidates: Tensor, num_entries: int, tau: float, z: float) -> Tensor:
    """Supplement Eq. 10-11 literally: P(D=1|v) = p / (p + m Pn) with p = h / Z, Pn = 1 / N_data."""
    m = candidates.shape[1] - 1
    pn = 1.0 / num_entries
    losses = []
    for b in range(anchor.shape[0]):
        p = [torch.exp(dot(anchor[b], candidates[b, c]) / tau) / z for c in range(m + 1)]
        loss = -torch.log(p[0] / (p[0] + m * pn))
        for c in range(1, m + 1):
            loss = loss - torch.log(m * pn / (p[c] + m * pn))
        losses.append(loss)
    return sum(losses) / len(losses)


def cacr_ref(
    q: Tensor, pos: Tensor, queue: Tensor | None, t_pos: float, t_neg: float, in_batch: bool, detach_pos: bool
) -> Tensor:
    """Sec. 3.2 mini-batch CACR with explicit sums; cost = squared Euclidean distance."""

    def cost(a: Tensor, b: Tensor) -> Tensor:
        return dot(a - b, a - b)

    m, k = pos.shape[0], pos.shape[1]
    total = 0.0
    for i in range(m):
        c_pos = [cost(q[i], pos[i, r]) for r in range(k)]
        e_pos = [torch.exp(t_pos * (c.detach() if detach_pos else c)) for c in c_pos]
        z_pos = sum(e_pos)
        total = total + sum(e_pos[r] / z_pos * c_pos[r] for r in range(k)) / m
        c_neg = []
        if queue is not None:
            c_neg += [cost(q[i], queue[j]) for j in range(queue.shape[0])]
        if in_batch:
            c_neg += [cost(q[i], q[j]) for j in range(m) if j != i]
        e_neg = [torch.exp(-t_neg * c) for c in c_neg]
        z_neg = sum(e_neg)
        total = total - sum(e_neg[r] / z_neg * c_neg[r] for r in range(len(c_neg))) / m
    return total


# --- the authors' released forms (fidelity options), written from their code's loops -------------

def cacr_released_ref(views: list[Tensor], t_pos: float, t_neg: float) -> Tensor:
    """CACR-SSL small_scale_experiments/losses: ``our_loss1`` (attraction, every view the query in
    turn, averaged over views) + ``our_loss2`` (for view pairs x < y only, query z_x[i] against the
    other view's z_y[j], j != i; averaged over the pairs). alpha = beta = 1 (their defaults)."""

    def cost(a: Tensor, b: Tensor) -> Tensor:
        return dot(a - b, a - b)

    num_views, m = len(views), views[0].shape[0]
    attraction = 0.0
    for x in range(num_views):
        per_view = 0.0
        for i in range(m):
            c = [cost(views[x][i], views[y][i]) for y in range(num_views) if y != x]
            e = [torch.exp(t_pos * ci) for ci in c]
            per_view = per_view + sum(e[r] / sum(e) * c[r] for r in range(len(c))) / m
        attraction = attraction + per_view / num_views
    repulsion, pairs = 0.0, 0
    for x in range(num_views):
        for y in range(x + 1, num_views):
            per_pair = 0.0
            for i in range(m):
                c = [cost(views[x][i], views[y][j]) for j in range(m) if j != i]
                e = [torch.exp(-t_neg * ci) for ci in c]
                per_pair = per_pair - sum(e[r] / sum(e) * c[r] for r in range(len(c))) / m
            repulsion = repulsion + per_pair
            pairs += 1
    return attraction + repulsion / pairs


def simo_released_ref(q: Tensor, k: Tensor, slots: list[int], tau: float, alpha: float | None) -> Tensor:
    """V2AI/SelfSup simo.py NT_Xent: one list of ``slots`` (positions among each query's n-1 other
    keys, in key order with the positive removed) shared by every query; ``alpha=None`` is the code as
    shipped (the alpha/K factor commented out), a number applies it."""
    n = q.shape[0]
    losses = []
    for i in range(n):
        pos = dot(q[i], k[i]) / tau
        others = [j for j in range(n) if j != i]
        negs = [dot(q[i], k[others[s]]) / tau for s in slots]
        scale = 1.0 if alpha is None else alpha / len(slots)
        losses.append(torch.log(torch.exp(pos) + scale * sum(torch.exp(v) for v in negs)) - pos)
    return sum(losses) / n
