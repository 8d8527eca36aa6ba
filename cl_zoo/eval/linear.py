"""Linear probes on a frozen backbone, under three named protocols.

* ``fast``: features extracted once without augmentation, standardised, and a multinomial logistic
  regression fitted full-batch with L-BFGS. The weight decay is picked on a seeded 10% of train and
  the model refitted on all of train. Deterministic, minutes on CPU; what sweeps and the pretraining
  monitor use. Its numbers are *not* comparable with the papers' protocols and reports say which
  protocol produced them.
* ``paper``: the ImageNet protocol of MoCo/JCL/EqCo/CACR (SGD momentum 0.9, lr 30, wd 0, batch 256,
  100 epochs, lr x0.1 at 60 and 80, RandomResizedCrop + flip).
* ``small-scale``: CACR's CIFAR/STL protocol after Wang & Isola (Adam lr 1e-3, betas 0.5/0.999,
  batch 128, 100 epochs, lr x0.2 at 60 and 80).

The two augmented protocols run the frozen backbone in eval mode (BatchNorm running statistics, as
MoCo's ``main_lincls`` does) on every augmented batch, and train only the linear layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from cl_zoo.errors import DataError
from cl_zoo.eval.features import check_input_channels, check_same_classes, eval_transform, ImageListDataset, model_cfg, model_identity, split_features, train_transform
from cl_zoo.eval.knn import rank_classes, validate_split_labels
from cl_zoo.eval.report import build_report, EvalResult
from cl_zoo.threads import torch_threads
from cl_zoo.validation import check_choice, check_number, check_numbers, check_seed, InvalidValueError

DEFAULT_WD_GRID: tuple[float, ...] = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


# ---------------------------------------------------------------------------------------------
# fast: L-BFGS on cached features
# ---------------------------------------------------------------------------------------------


def _accuracies(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[dict[str, float], np.ndarray]:
    top = 5 if num_classes > 5 else 1
    ranked = rank_classes(logits.detach().double().cpu().numpy(), top)
    hits = ranked == labels.cpu().numpy()[:, None]
    metrics = {"top1": float(hits[:, 0].mean())}
    if top == 5:
        metrics["top5"] = float(hits.any(axis=1).mean())
    return metrics, ranked


def fit_logistic_lbfgs(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    weight_decay: float,
    *,
    max_iter: int = 300,
    history: list[float] | None = None,
    init: nn.Linear | None = None,
) -> nn.Linear:
    """Multinomial logistic regression: mean cross-entropy + wd/2 * ||W||^2 (bias not decayed).

    Full-batch L-BFGS with a strong-Wolfe line search converges in a few hundred iterations and,
    unlike SGD, has no learning rate or schedule to tune, so only the weight decay is searched.
    The problem is convex, so ``init`` (a previous solution, e.g. for a neighbouring weight decay)
    changes only how fast the optimum is reached, not which one.
    """
    layer = nn.Linear(x.shape[1], num_classes).to(x.device)
    with torch.no_grad():
        if init is None:
            layer.weight.zero_()
            layer.bias.zero_()
        else:
            layer.weight.copy_(init.weight)
            layer.bias.copy_(init.bias)
    opt = torch.optim.LBFGS(
        layer.parameters(), lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
        tolerance_grad=1e-7, tolerance_change=1e-10,
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(layer(x), y) + 0.5 * weight_decay * layer.weight.pow(2).sum()
        loss.backward()
        if history is not None:
            history.append(float(loss.detach()))
        return loss

    opt.step(closure)
    return layer


@contextlib.contextmanager
def _threads_for(x: torch.Tensor) -> Iterator[None]:
    """One intra-op thread for small CPU problems.

    L-BFGS on a few thousand samples is thousands of tiny ops; splitting each over threads costs
    more in synchronisation than it gains, and on a shared machine it was 10x slower measured
    (1000 x 128 features, 2 busy cores). Large problems keep every thread.
    """
    if x.device.type != "cpu" or x.numel() > 4_000_000:
        yield
        return
    with torch_threads(1):
        yield


def _standardise(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    mean = train.mean(0, keepdim=True)
    std = train.std(0, keepdim=True).clamp_min(1e-6)  # constant features (padding, dead units) stay 0
    return [(t - mean) / std for t in (train, *others)]


def check_fast_settings(wd_grid: Sequence[float], val_fraction: float, max_iter: int) -> list[float]:
    """The ``fast`` protocol's settings, refused in one line before any feature is extracted.

    A NaN weight decay makes every fit NaN and the probe pick a class at random; a zero iteration
    budget fits nothing; either would end in a report with a meaningless top-1. Returns the grid.
    """
    grid = check_numbers("--wd-grid", list(wd_grid), low=0)
    if not grid:
        raise InvalidValueError("--wd-grid (the weight decays tried) is empty")
    check_number("--val-fraction", val_fraction, low=0, high=1, low_open=True, high_open=True)
    check_number("--max-iter", max_iter, low=1, integer=True)
    return [float(w) for w in grid]


def linear_fast(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int | None = None,
    *,
    wd_grid: Sequence[float] = DEFAULT_WD_GRID,
    val_fraction: float = 0.1,
    seed: int = 0,
    max_iter: int = 300,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """The ``fast`` protocol; returns metrics (fractions), the chosen wd, the grid's validation scores,
    top-5 predictions on test and the final fit's loss curve."""
    train_labels = np.asarray(train_labels, dtype=np.int64)
    test_labels = np.asarray(test_labels, dtype=np.int64)
    if num_classes is None:
        num_classes = int(max(train_labels.max(initial=-1), test_labels.max(initial=-1))) + 1
    check_fast_settings(wd_grid, val_fraction, max_iter)
    validate_split_labels(train_labels, test_labels, num_classes)
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timings: dict[str, float] = {}

    # Cached features arrive as read-only memmaps; torch cannot share read-only memory (it warns
    # "NumPy array is not writable"), so such arrays are copied here, writable ones are shared.
    x_all = torch.as_tensor(np.require(train_feats, np.float32, ["C", "W"]), device=device)
    y_all = torch.as_tensor(train_labels, device=device)
    x_test = torch.as_tensor(np.require(test_feats, np.float32, ["C", "W"]), device=device)
    y_test = torch.as_tensor(test_labels, device=device)

    # Seeded hold-out for the weight decay; standardisation statistics come from the fitting part only.
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(train_labels))
    n_val = max(1, int(round(val_fraction * len(perm))))
    if len(perm) - n_val < 2:
        raise DataError(f"train split too small ({len(perm)} samples) to hold out a validation part")
    val_idx, fit_idx = torch.as_tensor(perm[:n_val], device=device), torch.as_tensor(perm[n_val:], device=device)
    with _threads_for(x_all):
        return _fast_fit(x_all, y_all, x_test, y_test, fit_idx, val_idx, num_classes, wd_grid, max_iter, timings, val_fraction)


def _fast_fit(
    x_all: torch.Tensor, y_all: torch.Tensor, x_test: torch.Tensor, y_test: torch.Tensor, fit_idx: torch.Tensor,
    val_idx: torch.Tensor, num_classes: int, wd_grid: Sequence[float], max_iter: int, timings: dict[str, float],
    val_fraction: float,
) -> dict[str, Any]:
    x_fit, x_val = _standardise(x_all[fit_idx], x_all[val_idx])
    val_scores: dict[str, float] = {}
    t0 = time.perf_counter()
    best_wd, best_acc = None, -1.0
    layer = None
    # Strongest decay first, each fit warm-started from the previous one (a regularisation path):
    # weakly regularised fits are the slow ones and start close to their optimum this way.
    for wd in sorted((float(w) for w in wd_grid), reverse=True):
        layer = fit_logistic_lbfgs(x_fit, y_all[fit_idx], num_classes, wd, max_iter=max_iter, init=layer)
        with torch.no_grad():
            acc, _ = _accuracies(layer(x_val), y_all[val_idx], num_classes)
        val_scores[f"{wd:g}"] = acc["top1"]
        if acc["top1"] > best_acc:  # ties go to the larger (more regularised) weight decay
            best_wd, best_acc = wd, acc["top1"]
    timings["wd_search_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    x_train_std, x_test_std = _standardise(x_all, x_test)
    curve: list[float] = []
    layer = fit_logistic_lbfgs(x_train_std, y_all, num_classes, best_wd, max_iter=max_iter, history=curve)
    timings["fit_s"] = time.perf_counter() - t0
    with torch.no_grad():
        test_acc, ranked = _accuracies(layer(x_test_std), y_test, num_classes)
        train_acc, _ = _accuracies(layer(x_train_std), y_all, num_classes)
    metrics = {f"linear_fast_{k}": v for k, v in test_acc.items()}
    return {
        "metrics": metrics,
        "weight_decay": best_wd,
        "val_top1_by_wd": val_scores,
        "train_top1": train_acc["top1"],
        "predictions": ranked,
        "curve": {"x_label": "L-BFGS function evaluation", "loss": curve},
        "timings": timings,
        "hyperparameters": {
            "protocol": "fast",
            "wd_grid": [float(w) for w in wd_grid],
            "val_fraction": val_fraction,
            "max_iter": max_iter,
            "optimizer": "L-BFGS (strong Wolfe, history 20), full batch; final fit from zero init",
            "standardise": True,
        },
    }


# ---------------------------------------------------------------------------------------------
# paper / small-scale: augmented training of a linear layer on the frozen backbone
# ---------------------------------------------------------------------------------------------


@dataclass
class LinearProtocol:
    """Every hyperparameter of an augmented linear protocol (all settable from the CLI)."""

    name: str
    optimizer: str  # "sgd" | "adam"
    lr: float
    epochs: int = 100
    milestones: tuple[int, ...] = (60, 80)
    gamma: float = 0.1
    batch_size: int = 256
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    crop_scale: tuple[float, float] = (0.08, 1.0)
    workers: int = 4
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_protocol_settings(self)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("milestones", "betas", "crop_scale"):
            d[key] = list(d[key])
        return d


def check_protocol_settings(proto: LinearProtocol) -> None:
    """Every setting of an augmented protocol in its range, each refusal one line naming its option.

    Checked when the protocol is built (so before a model loads or a feature is extracted), because
    torch's optimizers accept a NaN or negative learning rate, weight decay or momentum only some of
    the time, and a schedule with a NaN factor trains nothing yet reports a top-1.
    """
    check_choice("--optimizer", proto.optimizer, ("sgd", "adam"))
    check_number("--lr", proto.lr, low=0, low_open=True)
    check_number("--epochs", proto.epochs, low=1, integer=True)
    check_numbers("--milestones", proto.milestones, low=1, integer=True)
    check_number("--gamma", proto.gamma, low=0, high=1, low_open=True)  # the factor lr is multiplied by
    check_number("--train-batch-size", proto.batch_size, low=1, integer=True)
    check_number("--momentum", proto.momentum, low=0, high=1, high_open=True)
    _check_pair("--betas", proto.betas, low=0, high=1, high_open=True)
    check_number("eps", proto.eps, low=0, low_open=True)
    check_number("--weight-decay", proto.weight_decay, low=0)
    low, high = _check_pair("crop_scale", proto.crop_scale, low=0, high=1, low_open=True)
    if low > high:
        raise InvalidValueError(f"crop_scale must be (smallest, largest) area fractions, got {tuple(proto.crop_scale)}")
    check_number("--workers", proto.workers, low=0, integer=True)


def _check_pair(name: str, values: Any, **bounds: Any) -> tuple[Any, Any]:
    if isinstance(values, str) or not isinstance(values, Sequence) or len(values) != 2:
        raise InvalidValueError(f"{name} takes two numbers, got {values!r}")
    first, second = check_numbers(name, values, **bounds)
    return first, second


PROTOCOLS: dict[str, LinearProtocol] = {
    "paper": LinearProtocol("paper", "sgd", lr=30.0, gamma=0.1, batch_size=256, momentum=0.9, weight_decay=0.0),
    "small-scale": LinearProtocol(
        "small-scale", "adam", lr=1e-3, gamma=0.2, batch_size=128, betas=(0.5, 0.999), eps=1e-8, weight_decay=0.0
    ),
}


def protocol(name: str, **overrides: Any) -> LinearProtocol:
    """A named protocol with some fields replaced (``None`` values are ignored)."""
    if name not in PROTOCOLS:
        raise DataError(f"unknown linear protocol {name!r}; choose fast, {', '.join(PROTOCOLS)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(changes) - {f.name for f in dataclasses.fields(LinearProtocol)}
    if unknown:
        raise DataError(f"unknown protocol settings: {', '.join(sorted(unknown))}")
    return dataclasses.replace(PROTOCOLS[name], **changes)  # checked as it is built (__post_init__)


def _make_optimizer(proto: LinearProtocol, params: Any) -> torch.optim.Optimizer:
    if proto.optimizer == "sgd":
        return torch.optim.SGD(params, lr=proto.lr, momentum=proto.momentum, weight_decay=proto.weight_decay)
    if proto.optimizer == "adam":
        return torch.optim.Adam(params, lr=proto.lr, betas=proto.betas, eps=proto.eps, weight_decay=proto.weight_decay)
    raise DataError(f"unknown optimizer {proto.optimizer!r}; choose sgd or adam")


def linear_augmented(
    model: nn.Module,
    train_data: Any,
    test_data: Any,
    proto: LinearProtocol,
    *,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train ``nn.Linear(num_features, C)`` on augmented images through the frozen ``model``.

    ``train_data``/``test_data`` are :class:`~cl_zoo.data.folder.ImageFolderData`. Test images use
    the model's eval preprocessing (resize + centre crop), train images RandomResizedCrop + flip.
    """
    check_protocol_settings(proto)  # again: a protocol's fields can be changed after it was built
    num_classes = len(train_data.classes)
    validate_split_labels(np.asarray(train_data.labels), np.asarray(test_data.labels), num_classes)
    check_input_channels(model)
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = model_cfg(model)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    train_loader = torch.utils.data.DataLoader(
        ImageListDataset(train_data.paths, train_data.labels, train_transform(cfg, tuple(proto.crop_scale))),
        batch_size=proto.batch_size, shuffle=True, generator=gen, num_workers=proto.workers,
        pin_memory=device.type == "cuda", drop_last=False, persistent_workers=proto.workers > 0,
    )
    test_loader = torch.utils.data.DataLoader(
        ImageListDataset(test_data.paths, test_data.labels, eval_transform(cfg)),
        batch_size=proto.batch_size, shuffle=False, num_workers=proto.workers, pin_memory=device.type == "cuda",
    )
    model = model.to(device).eval()
    # No parameter needs a gradient: features are computed under no_grad, and the caller's
    # requires_grad flags are left as they were.
    forward = getattr(model, "forward_features", model)
    dim = int(getattr(model, "num_features", 0)) or None
    if dim is None:
        with torch.no_grad():
            dim = forward(next(iter(test_loader))[0][:1].to(device)).flatten(1).shape[1]
    head = nn.Linear(dim, num_classes).to(device)
    # MoCo's lincls init: N(0, 0.01) weights, zero bias.
    nn.init.normal_(head.weight, std=0.01)
    nn.init.zeros_(head.bias)
    opt = _make_optimizer(proto, head.parameters())
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(proto.milestones), gamma=proto.gamma)

    curve: dict[str, list[float]] = {"epoch": [], "train_loss": [], "train_top1": [], "lr": []}
    t0 = time.perf_counter()
    for epoch in range(proto.epochs):
        head.train()
        total_loss, correct, seen = 0.0, 0, 0
        batches = train_loader
        if progress:
            from tqdm import tqdm

            # disable=None: off when stderr is not a terminal, so a log gets no bar frames
            batches = tqdm(train_loader, desc=f"epoch {epoch + 1}/{proto.epochs}", leave=False, disable=None)
        lr = opt.param_groups[0]["lr"]
        for images, labels in batches:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            with torch.no_grad():
                feats = forward(images).float().flatten(1)
            logits = head(feats)
            loss = F.cross_entropy(logits, labels)
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise DataError(f"linear training diverged (loss {loss_value}) at epoch {epoch + 1}; lower --lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss_value * len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
        sched.step()
        curve["epoch"].append(epoch + 1)
        curve["train_loss"].append(total_loss / max(seen, 1))
        curve["train_top1"].append(correct / max(seen, 1))
        curve["lr"].append(lr)
        if log is not None:
            log(f"epoch {epoch + 1}/{proto.epochs}: loss {curve['train_loss'][-1]:.4f} train top-1 {curve['train_top1'][-1]:.4f} lr {lr:g}")
    train_seconds = time.perf_counter() - t0

    t0 = time.perf_counter()
    head.eval()
    logits_all, labels_all = [], []
    with torch.no_grad():
        for images, labels in test_loader:
            logits_all.append(head(forward(images.to(device)).float().flatten(1)).cpu())
            labels_all.append(labels)
    test_acc, ranked = _accuracies(torch.cat(logits_all), torch.cat(labels_all), num_classes)
    return {
        "metrics": {f"linear_{proto.name.replace('-', '_')}_{k}": v for k, v in test_acc.items()},
        "predictions": ranked,
        "curve": curve,
        "timings": {"train_s": train_seconds, "test_s": time.perf_counter() - t0},
        "hyperparameters": {"protocol": proto.name, **proto.to_dict()},
    }


# ---------------------------------------------------------------------------------------------
# model-level entry point (CLI, pretraining monitor)
# ---------------------------------------------------------------------------------------------


def evaluate_linear(
    model: nn.Module,
    train: Any,
    test: Any,
    *,
    protocol_name: str = "fast",
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    wd_grid: Sequence[float] = DEFAULT_WD_GRID,
    val_fraction: float = 0.1,
    max_iter: int = 300,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    workers: int = 0,
    cache: bool = True,
    cache_dir: Any = None,
    progress: bool = False,
    precision: str = "auto",
    backend: str = "auto",
    force_int8: bool = False,
    want_test_features: bool = False,
    identity: dict[str, Any] | None = None,
    extra_hyperparameters: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> Any:
    """Linear probe of ``model`` on two ImageFolderData splits under a named protocol -> ``EvalResult``.

    Every setting is checked before a feature is extracted (:func:`check_fast_settings`, or the
    protocol built from ``overrides``), each refusal one :class:`~cl_zoo.validation.InvalidValueError` line.
    """
    check_number("--batch-size", batch_size, low=1, integer=True)
    check_seed("--seed", seed)
    if protocol_name == "fast":
        wd_grid = check_fast_settings(wd_grid, val_fraction, max_iter)
    else:
        proto = protocol(protocol_name, **(overrides or {}))
    check_same_classes(train.classes, test.classes)
    for name, split in (("train", train), ("test", test)):
        if len(split.paths) == 0:
            raise DataError(f"the {name} split is empty: {getattr(split, 'source', '?')}")
    identity = identity or model_identity(model)
    opts = dict(identity=identity, cache=cache, cache_dir=cache_dir, batch_size=batch_size, device=device, workers=workers, progress=progress,
                precision=precision, backend=backend, calibration=train.paths, calibration_seed=seed, force_int8=force_int8)
    test_features = None
    if protocol_name == "fast":
        train_fs = split_features(model, train, **opts)
        test_fs = split_features(model, test, **opts)
        out = linear_fast(
            train_fs.features, train_fs.labels, test_fs.features, test_fs.labels, num_classes=len(train.classes),
            wd_grid=wd_grid, val_fraction=val_fraction, seed=seed, max_iter=max_iter, device=device,
        )
        timings = {"train_features_s": train_fs.seconds, "test_features_s": test_fs.seconds, **out["timings"]}
        hyper = {**out["hyperparameters"], "chosen_weight_decay": out["weight_decay"], "val_top1_by_wd": out["val_top1_by_wd"]}
        extra = {"features": {"train_cached": train_fs.cached, "test_cached": test_fs.cached, "dim": int(train_fs.features.shape[1]),
                              "precision": train_fs.precision, "backend": train_fs.backend,
                             **({"quantization": train_fs.quantization} if train_fs.quantization else {})}}
        test_features = test_fs.features
    else:
        out = linear_augmented(model, train, test, proto, seed=seed, device=device, progress=progress, log=log)
        timings = dict(out["timings"])
        hyper = dict(out["hyperparameters"])
        extra = {"features": {"precision": "fp32", "backend": "torch"}}  # trains through the backbone in fp32
        if want_test_features:
            test_features = split_features(model, test, **opts).features
    hyper.update(extra_hyperparameters or {})
    hyper["feature_batch_size"] = batch_size
    report = build_report(
        task="linear", model=identity, train=train, test=test, protocol=protocol_name, hyperparameters=hyper,
        seed=seed, metrics=out["metrics"], timings=timings, extra={**extra, "curve": out["curve"]},
    )
    return EvalResult(
        report, test_labels=np.asarray(test.labels), predictions=out["predictions"], classes=train.classes,
        test_features=test_features, curve=out["curve"],
    )
