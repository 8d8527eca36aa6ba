"""`cl-zoo pretrain` end to end on tiny data (CPU), the recipe schema and the one-line input errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
import yaml

from cl_zoo.cli import main
from cl_zoo.errors import ClZooError
from cl_zoo.train.recipe import Recipe
from tests.helpers import TINY_PRETRAIN, make_folder, run_cli_captured

TINY = TINY_PRETRAIN
pytestmark = pytest.mark.usefixtures("isolated_cache", "one_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("data") / "train")


def run_pretrain(args: list[str], capsys) -> tuple[int, str]:
    code, _, err = run_cli_captured(["pretrain", "--no-progress", *args], capsys)
    return code, err.strip()


# ---------------------------------------------------------------------- recipe
def test_recipe_types_and_unknown_keys(tmp_path):
    r = Recipe.from_dict(yaml.safe_load("optim: {lr: 1, weight_decay: 5e-4}\nschedule: {warmup_epochs: 2}"))
    assert r.optim.lr == 1.0 and r.optim.weight_decay == pytest.approx(5e-4)  # YAML 1.1 reads 5e-4 as str
    assert r.effective_lr == pytest.approx(1.0 * r.batch_size / 256)
    assert r.with_overrides({"optim.lr": 0.5, "method_args.temperature": 0.2, "epochs": None}).method_args == {"temperature": 0.2}
    for bad, words in [
        ({"optm": {}}, "unknown key optm (did you mean optim?)"),
        ({"optim": {"lr": "fast"}}, "optim.lr must be a number"),
        ({"epochs": 1.5}, "epochs must be an integer"),
        ({"sync_bn": 1}, "sync_bn must be true or false"),
        ({"precision": "fp8"}, "precision must be one of auto, bf16, fp16, fp32"),
        ({"schedule": {"milestones": [5, "x"]}}, "schedule.milestones[1] must be a number"),
        ({"batch_size": 0}, "batch_size must be positive"),
    ]:
        with pytest.raises(ClZooError) as err:
            Recipe.from_dict(bad)
        assert words in str(err.value) and "\n" not in str(err.value)
    path = tmp_path / "r.yaml"
    path.write_text("method: dcl\ndata: {image_sise: 32}\n")
    with pytest.raises(ClZooError, match="unknown key data.image_sise"):
        Recipe.load(path)
    with pytest.raises(ClZooError, match="unknown recipe key"):
        Recipe().with_overrides({"optim.lrr": 1.0})


def test_changing_epochs_moves_the_schedule_in_proportion():
    dcl = Recipe.load("jcl_cifar10")  # a recipe with a 10-epoch warm-up (dcl_cifar10 follows lightly: none)
    assert (dcl.epochs, dcl.schedule.warmup_epochs) == (200, 10)
    short = dcl.with_overrides({"epochs": 1})  # was refused: "warmup_epochs (10.0) exceeds epochs (1)"
    assert (short.epochs, short.schedule.warmup_epochs) == (1, 0.05)
    assert short.with_overrides({"epochs": 200}).schedule.warmup_epochs == 10  # and back
    # What the user sets in the same breath is theirs, as written.
    assert dcl.with_overrides({"epochs": 20, "schedule.warmup_epochs": 0}).schedule.warmup_epochs == 0
    given = dcl.with_overrides({"epochs": 20, "schedule": {"name": "cosine", "warmup_epochs": 3}})
    assert given.schedule.warmup_epochs == 3
    with pytest.raises(ClZooError, match=r"warmup_epochs \(30(\.0)?\) exceeds epochs \(20\)"):
        dcl.with_overrides({"epochs": 20, "schedule.warmup_epochs": 30})
    # Step milestones move too, without rounding two steps into one.
    cmc = Recipe.load("cmc_cifar10")
    assert cmc.schedule.milestones == [155, 170, 185]
    assert cmc.with_overrides({"epochs": 2}).schedule.milestones == [1.55, 1.7, 1.85]
    assert dcl.with_overrides({"epochs": 200}) == dcl and dcl.with_overrides({"epochs": None}) == dcl


def test_pretrain_epochs_says_once_how_the_schedule_moved(tmp_path, folder, capsys):
    out = tmp_path / "run"
    code = main(["pretrain", "--no-progress", "--recipe", "jcl_cifar10", *TINY, "--data", str(folder), "--epochs", "1",
                 "--batch-size", "16", "--knn-every", "0", "--workers", "0", "--device", "cpu", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    note = "epochs 200 -> 1: the schedule is shortened in proportion (warm-up 10 -> 0.05 epochs)"
    assert printed.count(note) == 1, printed
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert (saved["epochs"], saved["schedule"]["warmup_epochs"]) == (1, 0.05)


# ---------------------------------------------------------------------- bad input
def test_bad_input_is_one_line_before_training(tmp_path, folder, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "run"
    cases = [
        (["--method", "dcll", "--data", str(folder)], "unknown method 'dcll'"),
        (["--method", "dcl", "--arch", "resnet19", "--data", str(folder)], "resnet19"),
        (["--method", "dcl", *TINY, "--data", str(empty)], "empty folder"),
        (["--method", "dcl", *TINY, "--data", str(tmp_path / "missing")], "data not found"),
        (["--method", "dcl", *TINY, "--data", str(folder), "--batch-size", "64"], "fewer than one batch of 64"),
        (["--method", "dcl", *TINY, "--data", str(folder), "--set", "optim.name=rmsprop"], "optim.name must be one of"),
        (["--method", "dcl", *TINY, "--data", str(folder), "--set", "data.augment=nope"], "unknown augmentation preset"),
        (["--method", "dcl", *TINY, "--data", str(folder), "--set", "method_args.tau=0.1"], "method_args key 'tau'"),
        (["--method", "dcl", *TINY, "--data", str(folder), "--resume"], "does not exist"),
        (["--method", "simo", *TINY, "--data", str(folder), "--batch-size", "16", "--set", "method_args.num_negatives=16"],
         "batch must be at least K+1=17"),
    ]
    for args, words in cases:
        code, err = run_pretrain([*args, "--out", str(out)], capsys)
        assert code == 2, (args, err)
        assert err.startswith("error:") and "\n" not in err and words in err, (args, err)
        assert not (out / "checkpoint.pt").exists()
    bad = tmp_path / "bad"
    (bad / "a").mkdir(parents=True)
    (bad / "a" / "x.jpg").write_bytes(b"not a jpeg")
    (bad / "b").mkdir()
    (bad / "b" / "y.jpg").write_bytes(b"nor this")
    code, err = run_pretrain(["--method", "dcl", *TINY, "--data", str(bad), "--batch-size", "2", "--out", str(out)], capsys)
    assert code == 2 and "cannot decode image" in err and "\n" not in err


# ---------------------------------------------------------------------- the kNN monitor's two searches
def test_monitor_searches_on_the_device_with_the_faiss_answer(tmp_path, folder, monkeypatch):
    """Issue 39: on a GPU the monitor keeps the features on the device and searches there in torch
    (no GPU idle while faiss runs on the CPU). Forced on the CPU, the same seeded run must log the
    numbers faiss gives."""
    from cl_zoo.train import loop

    assert loop.monitor_search_for(torch.device("cpu")) == "faiss"  # measured faster there
    assert loop.monitor_search_for(torch.device("cuda", 0)) == "device"
    recipe = _tiny_recipe("dcl").with_overrides({"knn_every": 1, "epochs": 2})
    seen = {}
    for search in ("faiss", "device"):
        monkeypatch.setattr(loop, "monitor_search_for", lambda device, __search=search: __search)
        trainer = loop.Trainer(recipe, folder, tmp_path / search, val=folder, progress=False, export=False)
        history = trainer.fit().history
        assert trainer.monitor_search == search
        seen[search] = [row["knn"] for row in history]
    assert [set(knn) for knn in seen["faiss"]] == [{"knn_k20_top1", "knn_k48_top1"}] * 2  # k=200 clipped to 48 images
    assert seen["device"] == seen["faiss"]
    assert 0.5 < seen["faiss"][-1]["knn_k20_top1"] <= 1.0


# ---------------------------------------------------------------------- a full tiny run
def test_pretrain_end_to_end_exports_model(tmp_path, folder, capsys):
    import cl_zoo

    out = tmp_path / "run"
    code, err = run_pretrain(["--method", "dcl", *TINY, "--data", str(folder), "--val", str(folder), "--epochs", "2",
                         "--batch-size", "16", "--lr", "0.5", "--knn-every", "1", "--seed", "3", "--out", str(out)], capsys)
    assert code == 0, err
    rows = (out / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert len(rows) == 3 and {"epoch", "loss", "lr", "images_per_s", "knn_k20_top1"} <= set(header)
    assert (out / "curves.png").stat().st_size > 1000 and any((out / "tb").iterdir())
    assert yaml.safe_load((out / "recipe.yaml").read_text())["arch"] == "pixels"
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["method"] == "dcl" and config["cl_zoo_pretrained_cfg"]["epochs"] == 2
    assert config["recipe"]["method_args"] == {"head_hidden_dim": 32, "head_out_dim": 16}
    assert config["training_head_precision"] == "fp32"  # bundle_cpu_tier.py's card note reads its absence
    knn = config["metrics"]["monitor_knn_k20_top1"]
    assert 0.5 < knn <= 1.0  # three colour classes: far above chance (1/3) even for raw pixels
    card = (out / "model" / "README.md").read_text()
    assert "kNN" in card and "curves.png" in card and (out / "model" / "curves.png").is_file()
    model = cl_zoo.load_pretrained(str(out / "model"))
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 2 and state["method"] == "dcl" and "rng" in state and "optimizer" in state
    assert model.pretrained_cfg.input_size == (3, 16, 16)
    # A second run into the same folder needs --resume.
    code, err = run_pretrain(["--method", "dcl", *TINY, "--data", str(folder), "--out", str(out)], capsys)
    assert code == 2 and "--resume" in err


def test_resnet_step_and_streaming_path_match_in_memory(tmp_path, folder):
    """The streaming DataLoader path sees exactly the in-memory path's batches and views."""
    from cl_zoo.train.loop import Trainer

    recipe = Recipe.from_dict({
        "method": "dcl", "arch": "resnet18_cifar", "model_args": {"width": 0.125},
        "method_args": {"head_hidden_dim": 32, "head_out_dim": 16}, "data": {"image_size": 16, "augment": "cifar"},
        "epochs": 1, "batch_size": 16, "knn_every": 0, "precision": "fp32", "workers": 0,
    })
    finals = []
    for stream in (False, True):
        trainer = Trainer(recipe, folder, tmp_path / f"run{stream}", stream=stream, progress=False, export=False)
        result = trainer.fit()
        assert trainer.in_memory is (not stream)
        finals.append((result.history[-1]["loss"], trainer.method.state_dict()))
    assert finals[0][0] == pytest.approx(finals[1][0], rel=1e-5)
    for key, value in finals[0][1].items():
        torch.testing.assert_close(value, finals[1][1][key], rtol=1e-4, atol=1e-5, msg=key)


def test_resuming_with_more_epochs_keeps_the_runs_own_schedule(tmp_path, folder, capsys):
    """--recipe R --epochs 1, then --resume --epochs 2: the run was shortened once (warm-up 10 -> 0.05);
    the resume extends it with that same schedule (the trainer allows only epochs to change) and
    must not rescale the recipe's warm-up again (it did: 10 -> 0.1, refused as a changed schedule)."""
    out = tmp_path / "run"
    args = ["pretrain", "--no-progress", "--recipe", "jcl_cifar10", *TINY, "--data", str(folder), "--batch-size", "16",
            "--knn-every", "0", "--workers", "0", "--device", "cpu", "--out", str(out)]
    assert main([*args, "--epochs", "1"]) == 0
    capsys.readouterr()
    code = main([*args, "--epochs", "2", "--resume"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "shortened in proportion" not in captured.out
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert (saved["epochs"], saved["schedule"]["warmup_epochs"]) == (2, 0.05)


# ---------------------------------------------------------------------- the step makes no host sync
# Every way Python code reads a tensor's value on the host: on CUDA each one waits for the GPU.
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "__format__", "numpy", "cpu")


# the no-host-read cases beyond a method's defaults: MoCo's split BN shuffles keys, CMC's NCE bank keeps its Z
STEP_CASES = {"mocov2_split_bn": ("mocov2", {"split_bn": 2}),
              "cmc_bank_nce": ("cmc", {"negatives": "memory_bank", "objective": "nce", "bank_size": 64, "num_negatives": 8})}


# Split BN is refused on a backbone without BatchNorm2d (pixels has none): a narrow CIFAR ResNet-18 has some.
SPLIT_BN_BACKBONE = {"arch": "resnet18_cifar", "model_args": {"width": 0.125, "stem_width": 8}}


def _tiny_recipe(method: str, **extra) -> Recipe:
    method, case_args = STEP_CASES.get(method, (method, {}))
    args = {"head_hidden_dim": 32, "head_out_dim": 16, **({"queue_size": 24} if method == "mocov2" else {}), **case_args}
    backbone = SPLIT_BN_BACKBONE if "split_bn" in case_args else {"arch": "pixels", "model_args": {"input_size": 16}}
    return Recipe.from_dict({
        "method": method, **backbone, "method_args": args,
        "data": {"image_size": 16, "augment": "cifar"}, "epochs": 1, "batch_size": 4, "knn_every": 0,
        "precision": "fp32", "workers": 0, **extra,
    })


@pytest.mark.parametrize("method", ["dcl", "dclw", "simclr", "mocov2", "mocov2_split_bn", "jcl", "simo", "cacr", "cmc", "cmc_bank_nce"])
def test_training_steps_read_nothing_on_the_host_between_log_steps(tmp_path, folder, monkeypatch, method):
    """Issue 39: a step that reads a value on the host (``.tolist()`` of the logs, ``if isfinite(loss)``,
    ``.item()`` for the progress bar, ``int(queue.ptr)``) stalls a GPU every step. Each host read made
    while the loop runs a step's body is counted, by step; only the logged steps (the epoch's first and
    every LOG_EVERY-th, which read everything pending in one transfer) may have any. The same losses
    still reach the logs: the logged loss is that step's loss, the epoch's the mean of all 12."""
    from cl_zoo.train.logging import RunLogger
    from cl_zoo.train.loop import Trainer
    from cl_zoo.train.tally import LOG_EVERY

    trainer = Trainer(_tiny_recipe(method), folder, tmp_path / "run", progress=True, export=False)
    assert trainer.steps_per_epoch == 12 and LOG_EVERY == 10
    current: dict[str, int | None] = {"step": None}
    reads: dict[int, list[str]] = {}
    losses: list[float] = []
    logged: dict[int, dict[str, float]] = {}

    build = trainer._build_batches

    def build_and_mark_steps() -> None:  # step i's body runs between its batch and the next request
        build()
        batches = trainer.batches.epoch

        def epoch(e: int, start: int = 0):
            it = batches(e, start)
            for i in itertools.count(start):
                current["step"] = None  # the pipeline's own work is not the step's
                try:
                    item = next(it)
                except StopIteration:
                    return
                current["step"] = i
                yield item

        trainer.batches.epoch = epoch
        forward = trainer.model.forward

        def spy_forward(*args):  # the losses, read outside the counted region
            loss, logs = forward(*args)
            step, current["step"] = current["step"], None
            losses.append(loss.item())
            current["step"] = step
            return loss, logs

        trainer.model.forward = spy_forward

    monkeypatch.setattr(trainer, "_build_batches", build_and_mark_steps)
    monkeypatch.setattr(RunLogger, "log_step", lambda self, step, values: logged.__setitem__(step, dict(values)))
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, __original=original, __name=name, **kwargs):
            if current["step"] is not None:
                reads.setdefault(current["step"], []).append(__name)
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    result = trainer.fit()
    monkeypatch.undo()

    log_steps = {0, LOG_EVERY - 1}  # step indices whose global step (1-based) is 1 and 10
    assert {i: names for i, names in reads.items() if i not in log_steps} == {}
    assert set(reads) == log_steps and all(names == ["tolist"] for names in reads.values())  # one transfer each
    assert sorted(logged) == [1, 10] and len(losses) == 12
    assert logged[10]["loss"] == pytest.approx(losses[9], rel=1e-6) and logged[1]["loss"] == pytest.approx(losses[0], rel=1e-6)
    assert "pos_sim" in logged[10] and isinstance(logged[10]["pos_sim"], float)
    assert result.history[0]["loss"] == pytest.approx(sum(losses) / 12, rel=1e-6)


def test_nan_found_at_a_later_flush_names_its_own_step_and_lr(tmp_path, folder, monkeypatch):
    """The loss is read every LOG_EVERY steps, so a NaN at step 4 is seen at step 10; the error still
    names step 4 and the lr it ran at (mid warm-up, so every step's lr differs) and nothing is saved."""
    from cl_zoo.train.loop import NonFiniteLossError, Trainer
    from cl_zoo.train.optim import lr_factor

    recipe = _tiny_recipe("dcl", schedule={"warmup_epochs": 1.0})
    monkeypatch.setenv("CL_ZOO_FAULT_NAN_STEP", "3")  # 0-based global step 3: epoch 1, step 4
    trainer = Trainer(recipe, folder, tmp_path / "run", progress=False, export=False)
    with pytest.raises(NonFiniteLossError) as err:
        trainer.fit()
    lr = recipe.effective_lr * lr_factor(recipe, 3, trainer.steps_per_epoch)
    assert f"loss became nan at epoch 1 step 4 (lr {lr:.4g})" in str(err.value)
    assert lr != pytest.approx(recipe.effective_lr * lr_factor(recipe, 9, trainer.steps_per_epoch))
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
