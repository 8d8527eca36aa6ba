"""Optimizers (SGD, LARS, Adam, AdamW) and the per-iteration learning-rate schedule.

The schedule is a pure function of the global step, so resuming needs only the step count (no
scheduler object to pickle) and the learning rate after a resume equals the uninterrupted run's.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch.optim import Optimizer

from cl_zoo.train.recipe import Recipe


class LARS(Optimizer):
    """SGD with momentum and layer-wise adaptive rate scaling (You et al. 2017), as SimCLR uses it.

    Each parameter's update is scaled by ``eta * ||w|| / (||g|| + wd * ||w||)`` (the trust ratio);
    groups marked ``lars_exclude`` (biases, BN) get plain SGD with momentum and no weight decay.
    """

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 0.001) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, lars_exclude=False))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch's signature
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if not group["lars_exclude"]:
                    if group["weight_decay"]:
                        grad = grad.add(p, alpha=group["weight_decay"])
                    w_norm = torch.linalg.vector_norm(p)
                    g_norm = torch.linalg.vector_norm(grad)
                    trust = torch.where(
                        (w_norm > 0) & (g_norm > 0), group["eta"] * w_norm / g_norm, torch.ones_like(w_norm)
                    )
                    grad = grad.mul(trust)
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = grad.clone()
                else:
                    buf.mul_(group["momentum"]).add_(grad)
                p.add_(buf, alpha=-group["lr"])
        return loss


def build_optimizer(recipe: Recipe, param_groups: list[dict[str, Any]]) -> Optimizer:
    """The recipe's optimizer over the method's parameter groups, at the peak (scaled) lr."""
    o = recipe.optim
    lr = recipe.effective_lr
    groups = [dict(g) for g in param_groups if g["params"]]
    for g in groups:
        g.pop("name", None)
        if o.name != "lars":
            g.pop("lars_exclude", None)
        g.setdefault("weight_decay", o.weight_decay)
        g["initial_lr"] = lr
    if o.name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=o.momentum, weight_decay=o.weight_decay, nesterov=o.nesterov)
    if o.name == "lars":
        return LARS(groups, lr=lr, momentum=o.momentum, weight_decay=o.weight_decay)
    betas = (o.momentum, 0.999) if o.momentum > 0 else (0.9, 0.999)
    if o.name == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=betas, weight_decay=o.weight_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, weight_decay=o.weight_decay)


def lr_factor(recipe: Recipe, step: int, steps_per_epoch: int) -> float:
    """Multiplier of the peak lr at global ``step`` (0-based): linear warmup, then cosine or steps."""
    s = recipe.schedule
    total = recipe.epochs * steps_per_epoch
    warmup = int(round(s.warmup_epochs * steps_per_epoch))
    if step < warmup:
        return (step + 1) / warmup
    if s.name == "cosine":
        span = max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / span)))
    epoch = step / steps_per_epoch
    return s.gamma ** sum(1 for m in s.milestones if epoch >= m)


def set_lr(optimizer: Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
