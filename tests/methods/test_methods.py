"""Methods: the trainer-facing interface, momentum/queue mechanics, resume exactness, dist.gather."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from cl_zoo.errors import ClZooError
from cl_zoo.methods import METHODS, build_method
from cl_zoo.methods.heads import ProjectionHead
from cl_zoo.methods.momentum import ema_update, momentum_at
from cl_zoo.methods.queue import EmbeddingQueue
from cl_zoo import distributed as dist

TINY = dict(model_args=dict(width=0.125), head_hidden_dim=32, head_out_dim=16)
B, SIZE = 8, 16

# name -> (arch, extra hparams) small enough for a 2-core CI machine.
CASES = {
    "simclr": ("resnet18_cifar", {}),
    "dcl": ("resnet18_cifar", {}),
    "dclw": ("resnet18_cifar", {}),
    "mocov2": ("resnet18_cifar", dict(queue_size=20)),
    "mocov2_eqco_sym": ("resnet18_cifar", dict(queue_size=20, eqco_alpha=4096.0, symmetric=True)),
    "simo": ("resnet18_cifar", dict(num_negatives=3, alpha=256.0)),
    "simo_sym": ("resnet18_cifar", dict(symmetric=True)),
    "simo_released": ("resnet18_cifar", dict(num_negatives=3, negative_sampling="shared", margin=False)),
    "jcl": ("resnet18_cifar", dict(queue_size=20, num_keys=3, lambda_ramp=True, epochs=4, lam=2.0)),
    "cmc": ("cmc_resnet18_cifar_lab", dict(head_hidden_dim=None)),
    "cmc_multiview": ("resnet18_cifar", dict(num_views=3, graph="full")),
    "cmc_bank_nce": ("cmc_resnet18_cifar_lab", dict(negatives="memory_bank", objective="nce", bank_size=32, num_negatives=10)),
    "cmc_bank_softmax": ("cmc_resnet18_cifar_lab", dict(negatives="memory_bank", objective="softmax", bank_size=32, num_negatives=10)),
    "cmc_independent": ("cmc_resnet18_cifar_lab", dict(view_crops="independent")),
    "cacr": ("resnet18_cifar", dict(num_positives=2, t_neg=0.9)),
    "cacr_moco": ("resnet18_cifar", dict(num_positives=1, form="moco", queue_size=20)),
    "cacr_released": ("resnet18_cifar", dict(num_positives=2, t_neg=0.9, repulsion="cross_view")),
}


def make(case: str, **extra: object) -> torch.nn.Module:
    arch, hp = CASES[case]
    name = case.split("_")[0]
    kwargs = {**TINY, **hp, **extra}
    if arch == "cmc_resnet18_cifar_lab":
        kwargs["model_args"] = dict(width=0.0625)
    torch.manual_seed(0)
    return build_method(name, arch, **kwargs)


def make_views(method: torch.nn.Module, seed: int = 1) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    views = [torch.randn(B, 3, SIZE, SIZE, generator=g) for _ in range(method.num_views)]
    if method.name == "cmc" and method.colour_views:  # the dual encoder takes RGB in [0, 1]
        views = [v.sigmoid() for v in views]
    return views, torch.randperm(32, generator=g)[:B]


def test_registry_covers_all_methods() -> None:
    assert {"simclr", "mocov2", "dcl", "dclw", "simo", "jcl", "cmc", "cacr"} <= set(METHODS)
    for name, cls in METHODS.items():
        assert cls.name == name


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_step_is_finite_and_reaches_backbone(case: str) -> None:
    method = make(case)
    views, index = make_views(method)
    loss, logs = method(views, index, 0.5)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in logs.values()) and logs["loss"] == pytest.approx(loss.item())
    loss.backward()
    grads = [p.grad for p in method.backbone.parameters()]
    assert all(g is not None for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0
    # Momentum encoders are frozen and absent from the optimizer's groups.
    group_params = {id(p) for g in method.parameter_groups(1e-4) for p in g["params"]}
    assert group_params == {id(p) for p in method.parameters() if p.requires_grad}
    if hasattr(method, "key_encoder"):
        assert all(not p.requires_grad and p.grad is None for p in method.key_encoder.parameters())
    # DDP (find_unused_parameters=False) fails on a trainable parameter without gradient.
    unused = [n for n, p in method.named_parameters() if p.requires_grad and p.grad is None]
    assert method.ddp_find_unused_parameters or not unused, unused
    method.after_optimizer_step(0.5)


def test_views_and_sync_bn_defaults() -> None:
    assert make("jcl").num_views == 4 and make("jcl").view_config.presets() == ["mocov2"] * 4
    assert make("cacr").num_views == 3
    assert make("cmc").num_views == 1 and make("cmc").view_config.preset == "cmc"
    assert make("cmc_multiview").num_views == 3 and make("cmc_multiview").view_config.preset == "simclr"
    assert make("simo").sync_bn and make("mocov2").sync_bn and not make("simclr").sync_bn
    assert make("simclr", augment="cifar").view_config.preset == "cifar"


def test_no_decay_groups() -> None:
    method = make("simclr", no_decay_norm_bias=True)
    groups = {g["name"]: g for g in method.parameter_groups(1e-6)}
    assert groups["no_decay"]["weight_decay"] == 0.0 and groups["decay"]["weight_decay"] == 1e-6
    assert all(p.ndim <= 1 for p in groups["no_decay"]["params"])
    assert all(p.ndim > 1 for p in groups["decay"]["params"])


def test_momentum_update_is_ema() -> None:
    method = make("mocov2", momentum=0.9)
    before = copy.deepcopy(method.key_encoder.encoder.state_dict())
    with torch.no_grad():
        for p in method.backbone.parameters():
            p.add_(1.0)
    query = {**{f"backbone.{k}": v for k, v in method.backbone.state_dict().items()},
             **{f"head.{k}": v for k, v in method.head.state_dict().items()}}
    method.after_optimizer_step(1.0)
    after = method.key_encoder.encoder.state_dict()
    names = dict(method.key_encoder.encoder.named_parameters())
    assert names
    for name in names:
        expected = 0.9 * before[name] + 0.1 * query[name]
        torch.testing.assert_close(after[name], expected)
    # Buffers (BN running stats) are not averaged.
    for name, buf in method.key_encoder.encoder.named_buffers():
        assert torch.equal(buf, before[name])


def test_momentum_schedules() -> None:
    assert momentum_at(0.99, 5.0, 10, "constant") == 0.99
    assert momentum_at(0.99, 0.0, 10, "cosine") == pytest.approx(0.99)
    assert momentum_at(0.99, 10.0, 10, "cosine") == pytest.approx(1.0)
    assert momentum_at(0.99, 5.0, 10, "cosine") == pytest.approx(0.995)
    with pytest.raises(ValueError):
        momentum_at(0.99, 1.0, None, "cosine")
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    expected = [0.75 * p.detach() + 0.25 * q.detach() for p, q in zip(a.parameters(), b.parameters())]
    ema_update(a, b, 0.75)
    for p, e in zip(a.parameters(), expected):
        torch.testing.assert_close(p, e)


def test_queue_fifo_wraparound_and_state_dict() -> None:
    q = EmbeddingQueue(5, 2, normalize=False)
    q.enqueue(torch.tensor([[1.0, 0], [2, 0], [3, 0]]))
    assert int(q.ptr) == 3
    q.enqueue(torch.tensor([[4.0, 0], [5, 0], [6, 0]]))  # 6 wraps to slot 0
    assert int(q.ptr) == 1
    assert q.queue[:, 0].tolist() == [6, 2, 3, 4, 5]
    q.enqueue(torch.arange(14.0).view(7, 2))  # larger than the queue: keep the newest 5
    assert q.queue[:, 0].tolist() == [4, 6, 8, 10, 12] and int(q.ptr) == 0
    state = q.state_dict()
    assert set(state) == {"queue", "ptr"}
    fresh = EmbeddingQueue(5, 2, normalize=False)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.queue, q.queue) and int(fresh.ptr) == 0
    with pytest.raises(ValueError):
        q.enqueue(torch.zeros(2, 3))


def test_mocov2_enqueues_normalised_keys() -> None:
    method = make("mocov2")
    assert "queue.queue" in method.state_dict() and "queue.ptr" in method.state_dict()
    views, index = make_views(method)
    method(views, index, 0.0)
    assert int(method.queue.ptr) == B % 20
    with torch.no_grad():
        k = F.normalize(method.key_encoder(views[1]).float(), dim=1)
    torch.testing.assert_close(method.queue.queue[:B], k, atol=1e-5, rtol=1e-4)


def test_jcl_enqueues_mean_keys_and_ramps_lambda() -> None:
    method = make("jcl")
    views, index = make_views(method)
    _, logs = method(views, index, 2.5)
    assert logs["lam"] == pytest.approx(2.0 * 3 / 4)
    assert method.lambda_at(0.2) == pytest.approx(0.5) and method.lambda_at(9.0) == pytest.approx(2.0)
    with torch.no_grad():
        keys = torch.stack([F.normalize(method.key_encoder(v).float(), dim=1) for v in views[1:]], dim=1)
    # Keys were computed in one concatenated forward (BN in train mode): recompute the same way.
    with torch.no_grad():
        cat = F.normalize(method.key_encoder(torch.cat(views[1:])).float(), dim=1)
        mu = cat.view(3, B, -1).mean(dim=0)
    torch.testing.assert_close(method.queue.queue[:B], mu, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(method.queue.queue[:B].norm(dim=1), torch.ones(B))  # means are not renormalised
    assert keys.shape == (B, 3, 16)
    with pytest.raises(ClZooError, match="epochs"):
        build_method("jcl", "resnet18_cifar", lambda_ramp=True, **TINY)


@pytest.mark.parametrize("case", ["mocov2", "simo", "jcl", "cmc_bank_nce", "cacr_moco", "dclw"])
def test_state_dict_round_trip_reproduces_next_loss(case: str) -> None:
    method = make(case)
    opt = torch.optim.SGD([p for g in method.parameter_groups(0.0) for p in g["params"]], lr=0.1)
    views, index = make_views(method, seed=1)
    loss, _ = method(views, index, 0.0)
    loss.backward()
    opt.step()
    method.after_optimizer_step(0.1)
    state = copy.deepcopy(method.state_dict())
    restored = make(case)
    restored.load_state_dict(state)
    views2, index2 = make_views(method, seed=2)
    torch.manual_seed(5)
    expected, _ = method(views2, index2, 0.2)
    torch.manual_seed(5)
    got, _ = restored(views2, index2, 0.2)
    assert torch.equal(expected.detach(), got.detach())


def test_check_batch_size_hook() -> None:
    for case in sorted(c for c in CASES if not c.startswith("simo")):
        make(case).check_batch_size(2)  # queues, banks and in-batch forms need no more than 2 images
    make("simo_sym").check_batch_size(2)  # num_negatives=None: all N-1 other keys, no K to satisfy
    simo = make("simo", num_negatives=B)
    simo.check_batch_size(B + 1)
    with pytest.raises(ValueError, match=f"batch size {B} is too small: .*at least K\\+1={B + 1}"):
        simo.check_batch_size(B)


def test_simo_rejects_k_not_below_batch() -> None:
    method = make("simo", num_negatives=B)
    views, index = make_views(method)
    with pytest.raises(ValueError, match="K=8 needs a global batch of at least K\\+1=9"):
        method(views, index, 0.0)


def test_build_method_errors_are_one_line() -> None:
    with pytest.raises(ClZooError, match="did you mean temperature"):
        build_method("simclr", "resnet18_cifar", tempreature=0.1, **TINY)
    with pytest.raises(ClZooError, match="unknown method"):
        build_method("simclrr", "resnet18_cifar")
    with pytest.raises(ClZooError, match="num_views must be 1"):
        build_method("cmc", "cmc_resnet18_cifar_lab", num_views=2, model_args=dict(width=0.0625))
    with pytest.raises(ClZooError, match="bank_size"):
        build_method("cmc", "cmc_resnet18_cifar_lab", negatives="memory_bank", model_args=dict(width=0.0625))
    with pytest.raises(ClZooError, match="view_crops must be 'shared'"):
        build_method("cmc", "cmc_resnet18_cifar_lab", view_crops="both", model_args=dict(width=0.0625))
    with pytest.raises(ClZooError, match="view_crops applies to the dual"):
        build_method("cmc", "resnet18_cifar", view_crops="independent", **TINY)


def test_cmc_independent_crops_take_l_from_the_first_crop_and_ab_from_the_second() -> None:
    """view_crops='independent': two crops per image, L of crop 1 against ab of crop 2 (the pair then
    contrasts in space too); the default keeps the authors' one crop for both."""
    shared, independent = make("cmc"), make("cmc_independent")
    assert shared.num_views == 1 and independent.num_views == 2
    (first, second), _ = make_views(independent)
    dual = independent.backbone
    l_feat, ab_feat = dual.forward_views(first, second)
    torch.testing.assert_close(l_feat, dual.forward_views(first)[0])
    torch.testing.assert_close(ab_feat, dual.forward_views(second)[1])
    assert not torch.allclose(ab_feat, dual.forward_views(first)[1])


def test_projection_head_bn_layout() -> None:
    head = ProjectionHead(8, 16, 4, batch_norm=True)
    kinds = [type(m).__name__ for m in head.net]
    assert kinds == ["Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d"]
    assert head.net[0].bias is None and not head.net[4].affine
    assert ProjectionHead(8, None, 4, num_layers=1)(torch.randn(2, 8)).shape == (2, 4)


def test_projection_head_runs_in_fp32_inside_autocast() -> None:
    """Issue 39: the head's output is what the loss compares; rounded to bf16 it cost DCL 0.9 kNN points."""
    torch.manual_seed(0)
    head = ProjectionHead(8, 16, 4, batch_norm=True)
    x = torch.randn(6, 8).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert head.net[0](x).dtype == torch.bfloat16  # what autocast alone would do
        out = head(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, head(x.detach().float()))  # the same float32 math as outside autocast
    out.sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16  # the gradient goes back to the bf16 backbone


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_method_feeds_its_loss_float32_heads_under_bf16(case: str) -> None:
    method = make(case)
    views, index = make_views(method)
    dtypes: list[torch.dtype] = []
    for module in method.modules():
        if isinstance(module, ProjectionHead):
            module.register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = method(views, index, 0.5)
    assert dtypes and set(dtypes) == {torch.float32}
    assert torch.isfinite(loss)


def test_gather_single_process_identity_and_gradient() -> None:
    assert not dist.is_distributed() and dist.get_rank() == 0 and dist.get_world_size() == 1 and dist.is_main()
    x = torch.randn(4, 3, requires_grad=True)
    y = dist.gather(x, grad=True)
    assert torch.equal(y, x) and y.requires_grad
    (y * 2).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    z = dist.gather(x, grad=False)
    assert torch.equal(z, x) and not z.requires_grad
    assert torch.equal(dist.local_slice(y, 4), y)


def test_methods_do_not_import_the_trainer_package() -> None:
    """methods/ sits below train/: importing a method must not load cl_zoo.train (no methods -> train arrow)."""
    import subprocess
    import sys

    code = ("import sys, cl_zoo.methods, cl_zoo.methods.queue, cl_zoo.methods.cmc, cl_zoo.methods.simo; "
            "print(sorted(m for m in sys.modules if m.startswith('cl_zoo.train')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cmc_bank_checks_the_dataset_size_once_not_every_step(tmp_path, monkeypatch) -> None:
    """CMC's bank holds one entry per training image. The step no longer compares indices on the host
    (a GPU sync per step), so the trainer asks once, before loading a batch, and says what to set."""
    from cl_zoo.train.loop import Trainer
    from cl_zoo.train.recipe import Recipe
    from PIL import Image

    method = make("cmc_bank_softmax")  # bank_size=32
    method.check_dataset_size(32)
    make("cmc").check_dataset_size(10**6)  # in-batch negatives: no bank, no limit
    with pytest.raises(ValueError, match="method_args.bank_size=33"):
        method.check_dataset_size(33)

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(40):
        Image.new("RGB", (16, 16), (i * 6, 0, 0)).save(folder / f"{i}.png")
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    recipe = Recipe.from_dict({
        "method": "cmc", "arch": "cmc_resnet18_cifar_lab", "model_args": {"width": 0.125},
        "method_args": {"negatives": "memory_bank", "objective": "softmax", "bank_size": 32, "num_negatives": 4,
                        "head_hidden_dim": None},
        "data": {"image_size": 16}, "epochs": 1, "batch_size": 8, "knn_every": 0, "workers": 0,
    })
    with pytest.raises(ClZooError, match="memory bank has 32 entries .* 40 images"):
        Trainer(recipe, folder, tmp_path / "run", progress=False)
