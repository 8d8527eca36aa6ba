"""The pretraining loop shared by every method.

:class:`Trainer` turns a :class:`~cl_zoo.train.recipe.Recipe` and an image folder into a trained
backbone in the zoo's checkpoint format. It knows nothing method-specific: the method builds its
views' count and presets, computes the loss, and updates its momentum encoders and queues.

Run folder::

    RUN_DIR/recipe.yaml       the full recipe (what was asked)
    RUN_DIR/checkpoint.pt     the last completed epoch, or the last ``checkpoint_every`` step inside
                              the current one (atomic; what --resume reads)
    RUN_DIR/metrics.csv       one row per epoch (loss, lr, images/s, kNN accuracy)
    RUN_DIR/tb/               TensorBoard scalars
    RUN_DIR/curves.png        loss and kNN accuracy per epoch
    RUN_DIR/model/            the exported backbone (config.json, safetensors, README.md)

Every user mistake (unknown method or architecture, bad recipe, empty data, batch too small,
resuming another method's run) is reported before the first step. A non-finite loss stops the run
with :class:`NonFiniteLossError`, leaving the previous epoch's checkpoint as it was.

The step makes no host sync: losses and statistics stay on the device (:mod:`cl_zoo.train.tally`)
and are read in one transfer on logged steps (every ``LOG_EVERY``), before a checkpoint and at the
end of an epoch; that is also where a non-finite loss is found, naming its exact step.

Fault injection for tests: ``CL_ZOO_FAULT_KILL_STEP=N`` SIGKILLs the process before global step
``N``; ``CL_ZOO_FAULT_NAN_STEP=N`` makes step ``N``'s loss NaN; ``CL_ZOO_FAULT_INTERRUPT_STEP=N`` sends the
process SIGINT (Ctrl-C) as step ``N`` starts.

Ctrl-C waits for the step in progress (a second one does not), then writes the state after the
last finished step and raises :class:`TrainingInterrupted`; a Ctrl-C during a checkpoint write
waits for the write, so the file on disk is always whole.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from cl_zoo.checkpoint import save_pretrained
from cl_zoo.checkpoint.card import training_data_name, training_dataset
from cl_zoo.data.folder import content_fingerprint, open_image_folder
from cl_zoo.data.memory import decode_to_tensor
from cl_zoo.errors import CheckpointError, ClZooError, DataError
from cl_zoo.eval.knn import knn_classify, validate_split_labels
from cl_zoo.eval.knn_device import knn_top1_on_device
from cl_zoo.fileio import atomic_write_bytes, atomic_write_text
from cl_zoo.interrupts import held_interrupts
from cl_zoo.methods import build_method_from_recipe
from cl_zoo.methods.split_bn import has_batchnorm
from cl_zoo.optional import is_installed, missing_message
from cl_zoo.precision import resolve_precision, why
from cl_zoo.progress import Progress
from cl_zoo.train import launch
from cl_zoo.train.data import (
    InMemoryBatches,
    StreamingBatches,
    augment_configs,
    holdout_split,
    normalize_for,
)
from cl_zoo.train.logging import RunLogger
from cl_zoo.train.optim import build_optimizer, lr_factor, set_lr
from cl_zoo.train.recipe import Recipe
from cl_zoo.train.state import CHECKPOINT_NAME, capture_rng_state, load_state, restore_rng_state, save_state
from cl_zoo.train.tally import Flush, StepTally, is_log_step

KNN_KS = (20, 200)
KNN_TEMPERATURE = 0.1
MONITOR_BANK_MAX = 20_000  # train images decoded for the kNN monitor on the streaming path
HOLDOUT_FRACTION = 0.05
# Mean cosine between an image's two embeddings above which an epoch is reported as collapsed. A healthy
# contrastive run keeps its augmented views apart (the CPU tier's runs: at most 0.91 at any logged step,
# 0.73-0.80 at the end); a collapsed one maps every image to the same point, so its views agree to 0.9999
# and its loss has no gradient left (the first GPU run's DCL: loss log(2N-2) from epoch 1 on).
COLLAPSE_POS_SIM = 0.999


def collapse_warning(epoch: int, mean_pos_sim: float | None) -> str | None:
    """The one-line warning for an epoch whose embeddings collapsed, or None.

    Why a warning and not an error: a collapse this deep never recovers on its own, but the run's
    checkpoints and logs are what the user needs to diagnose it, so the run goes on and says so on
    every epoch line's heels instead of hiding the failure until the kNN monitor (or a user) looks."""
    if mean_pos_sim is None or not mean_pos_sim >= COLLAPSE_POS_SIM:
        return None
    return (f"warning: epoch {epoch}: the embeddings collapsed (mean cosine between an image's views {mean_pos_sim:.4f}): "
            "every image maps to nearly the same point and the loss cannot fall; lower the lr, add warm-up "
            "(--set schedule.warmup_epochs=10) or BatchNorm in the head (--set method_args.head_bn=true)")


class TrainingInterrupted(ClZooError):
    """Ctrl-C stopped the run; ``checkpoint`` holds its last whole state (None: nothing was trained)."""

    exit_code = 130

    def __init__(self, message: str, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


@dataclass(frozen=True)
class _Position:
    """Where a run is at a point where its state is whole: what a checkpoint written there records."""

    epoch: int  # completed epochs
    global_step: int
    step: int  # steps done inside ``epoch``
    history_len: int  # epoch rows of the history that belong to this state
    seen: int = 0
    tally: StepTally | None = None


class NonFiniteLossError(ClZooError):
    """The loss became NaN or infinite; the run stopped without overwriting its checkpoint."""


@dataclass
class PretrainResult:
    run_dir: Path
    model_dir: Path | None
    epochs: int
    metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def _fault_step(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def open_train_data(spec: str | os.PathLike[str], split: str | None = None, root: str | os.PathLike[str] | None = None):
    """Training images: ``split`` if given, else ``train`` when the data has splits.

    Labels are optional (self-supervised): a flat or nested folder of images opens unlabeled.
    ``root`` is where named datasets live (``--data-root``).
    """
    if split is not None:
        return open_image_folder(spec, root=root, split=split, require_labels=False)
    try:
        return open_image_folder(spec, root=root, split="train", require_labels=False)
    except DataError:
        return open_image_folder(spec, root=root, require_labels=False)


def open_val_data(spec: str | os.PathLike[str], split: str | None = None, root: str | os.PathLike[str] | None = None):
    """Held-out data for the kNN monitor: ``split``, else ``val``/``test`` when present, else the folder."""
    if split is not None:
        return open_image_folder(spec, root=root, split=split)
    for candidate in ("val", "test"):
        try:
            return open_image_folder(spec, root=root, split=candidate)
        except DataError:
            continue
    return open_image_folder(spec, root=root)


def _free_memory(device: torch.device) -> int:
    """Bytes free on ``device``: the GPU's free memory, or the host's available RAM (8 GiB if unknown)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _memory_budget(device: torch.device) -> int:
    """Bytes the in-memory dataset may take: half of what is free (:func:`_free_memory`)."""
    return _free_memory(device) // 2


def monitor_search_for(device: torch.device) -> str:
    """Where the kNN monitor searches: on a GPU in torch, where the features are made (no copy to the
    host, no GPU idle while a CPU search runs); on a CPU with faiss, which measured faster there
    (:mod:`cl_zoo.eval.knn_device`, ``benchmarks/knn_monitor.py``)."""
    return "device" if device.type == "cuda" else "faiss"


def check_batch_fits(recipe: Recipe, num_views: int, world_size: int, available: int) -> None:
    """Refuse a batch whose augmented views alone (float32, one process's share) exceed ``available``
    bytes: the activations need many times more, so such a run could only die of MemoryError."""
    per_process = max(1, recipe.batch_size // world_size)
    size = recipe.data.image_size
    needed = per_process * num_views * 3 * size * size * 4
    if needed > available:
        raise ClZooError(
            f"a batch of {per_process} images x {num_views} views at {size}x{size} px needs at least "
            f"{needed / 2**30:.1f} GiB for its input tensors alone, more than the {available / 2**30:.1f} GiB free; "
            "lower --image-size or --batch-size"
        )


class Trainer:
    """One pretraining run; construct (validates everything), then :meth:`fit`."""

    def __init__(
        self,
        recipe: Recipe | None,
        data: str | os.PathLike[str] | None,
        run_dir: str | os.PathLike[str],
        *,
        val: str | os.PathLike[str] | None = None,
        data_root: str | os.PathLike[str] | None = None,
        data_split: str | None = None,
        val_split: str | None = None,
        resume: bool = False,
        device: str | torch.device | None = None,
        stream: bool | None = None,
        progress: bool = True,
        export: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.export = export
        self.env = launch.init_distributed(device)
        try:
            self._setup(recipe, data, val, data_root, data_split, val_split, resume, stream)
        except BaseException:
            launch.shutdown(self.env)
            raise

    # ------------------------------------------------------------------ setup (all checks)
    def _setup(self, recipe, data, val, data_root, data_split, val_split, resume, stream) -> None:  # noqa: ANN001
        env = self.env
        self.state: dict[str, Any] | None = None
        ckpt_path = self.run_dir / CHECKPOINT_NAME
        if resume:
            if ckpt_path.is_file():
                self.state = load_state(ckpt_path)
                recipe = self._recipe_for_resume(recipe, self.state, ckpt_path)
            elif not self.run_dir.is_dir():
                raise CheckpointError(f"--resume: run folder {self.run_dir} does not exist")
            else:
                raise CheckpointError(f"--resume: nothing to resume, {self.run_dir} holds no {CHECKPOINT_NAME} "
                                      "(no step was saved); run without --resume to start the run")
        elif ckpt_path.is_file():
            raise ClZooError(f"{self.run_dir} already holds a run ({CHECKPOINT_NAME}); pass --resume or another --out")
        if recipe is None:
            raise ClZooError("no recipe: give --recipe or --method (or --resume an existing run)")
        if data is None:
            data, data_split = (self.state or {}).get("data"), (self.state or {}).get("data_split")
            if data is None:
                raise ClZooError("no training data: give --data (a folder of images, an archive of one, or a named dataset)")
        if val is None and self.state is not None and self.state.get("val"):
            val, val_split = self.state["val"], self.state.get("val_split")
        if data_root is None and self.state is not None:
            data_root = self.state.get("data_root")
        self.data_root = str(data_root) if data_root is not None else None
        self.data_spec, self.data_split = str(data), data_split
        self.val_spec, self.val_split = (str(val) if val is not None else None), val_split
        recipe.validate()  # a Recipe built in Python, not through from_dict, gets the same checks
        self.recipe = recipe
        r = recipe

        # Method and architecture (unknown names, bad method_args: one-line errors).
        torch.manual_seed(r.seed)
        self.method = build_method_from_recipe(r)
        self.num_views = self.method.num_views
        self.view_configs = augment_configs(self.method.view_config.presets(), r.data.image_size)

        if r.batch_size % env.world_size:
            raise ClZooError(f"batch size {r.batch_size} is not divisible by the {env.world_size} processes")
        if r.batch_size < 2:
            raise ClZooError(f"batch size {r.batch_size} is too small: contrastive methods need at least 2 images")
        try:
            self.method.check_batch_size(r.batch_size)  # a method's own constraint (SiMo: K < batch)
        except ValueError as exc:
            raise ClZooError(f"{r.method}: {exc}") from None
        check_batch_fits(r, self.num_views, env.world_size, _free_memory(env.device))
        if r.sync_bn and env.distributed and env.device.type != "cuda":
            raise ClZooError("sync_bn with several processes needs CUDA (torch's SyncBatchNorm has no CPU kernel)")

        # Data (missing, empty, unreadable: DataError before training).
        self.train_data = open_train_data(data, data_split, data_root)
        n = len(self.train_data)
        self.train_index = np.arange(n)
        # The kNN monitor scores training images' labels: without two class folders it has nothing
        # to score, so it is skipped (training itself never needs labels).
        monitor_possible = self.train_data.num_classes >= 2
        if r.knn_every > 0 and not monitor_possible and env.is_main:
            what = "no class folders" if not self.train_data.labeled else "a single class folder"
            print(f"kNN monitor off: {self.train_data.source} has {what}, so there are no labels to score "
                  f"it against{' (--val is not used)' if val is not None else ''}; training does not need labels", flush=True)
        elif r.knn_every > 0 and (val is not None or n >= 40) and not is_installed("faiss"):  # the monitor searches with faiss
            if env.is_main:
                print(f"kNN monitor off: {missing_message('faiss', 'the kNN monitor', extra='train')}; "
                      "training goes on without it", flush=True)
            monitor_possible = False
        self.val_data = open_val_data(val, val_split, data_root) if val is not None and monitor_possible else None
        self.holdout_index: np.ndarray | None = None
        if self.val_data is None and r.knn_every > 0 and n >= 40 and monitor_possible:
            self.train_index, self.holdout_index = holdout_split(n, HOLDOUT_FRACTION, r.seed)
        if len(self.train_index) < r.batch_size:
            raise DataError(
                f"{self.train_data.source}: {len(self.train_index)} training images, fewer than one batch of {r.batch_size}"
            )
        try:
            self.method.check_dataset_size(len(self.train_index))  # CMC's bank: one entry per image
        except ValueError as exc:
            raise ClZooError(f"{r.method}: {exc}") from None
        size = r.data.image_size
        nbytes = len(self.train_index) * 3 * size * size
        self.in_memory = (nbytes <= _memory_budget(env.device)) if stream is None else not stream
        if self.state is not None:
            self._check_resume_data(self.state)
        self.steps_per_epoch = len(self.train_index) // r.batch_size
        self.training_data = self._training_data_record() if env.is_main else {}

    def _training_data_record(self) -> dict[str, Any]:
        """What the backbone was trained on, for its config and card: a 2,000-image subset must not
        be carded as the dataset its recipe names."""
        spec = Path(self.data_spec).expanduser()
        return {
            "source": str(spec.resolve()) if spec.exists() else self.data_spec,  # a path, or a named dataset
            "split": self.train_data.split,
            "dataset": self.recipe.data.dataset,  # what the recipe says the data is
            "images": len(self.train_data),
            "trained_images": len(self.train_index),  # minus the monitor's held-out share
            "labeled": self.train_data.labeled,
            "classes": self.train_data.num_classes,  # with the counts, tells a named dataset from a folder named like it
            "fingerprint": content_fingerprint(self.train_data),
        }

    def _recipe_for_resume(self, requested: Recipe | None, state: dict[str, Any], path: Path) -> Recipe:
        saved = Recipe.from_dict(state["recipe"], source=f"checkpoint {path}")
        if requested is None:
            return saved
        if requested.method != saved.method:
            raise CheckpointError(
                f"cannot resume: {path} is a {saved.method} run, but the method requested is {requested.method}"
            )
        a, b = saved.to_dict(), requested.to_dict()
        for key in a:
            # precision only changes arithmetic (weights and optimizer state are float32 either way);
            # a change is stated when the run continues (_prepare_model).
            if key not in ("epochs", "checkpoint_every", "precision") and a[key] != b[key]:
                raise CheckpointError(
                    f"cannot resume: recipe key {key!r} differs from the saved run ({a[key]!r} vs {b[key]!r}); "
                    "only epochs, checkpoint_every and precision may change on resume"
                )
        if requested.epochs < int(state["epoch"]):
            raise CheckpointError(f"cannot resume: the run already trained {state['epoch']} epochs > --epochs {requested.epochs}")
        return requested

    def _check_resume_data(self, state: dict[str, Any]) -> None:
        if state.get("data_hash") != self.train_data.file_list_hash:
            raise CheckpointError(
                f"cannot resume: the data differs from the saved run's (file list hash {str(state.get('data_hash'))[:12]}...)"
            )
        if state.get("world_size") != self.env.world_size:
            raise CheckpointError(
                f"cannot resume: the run used {state.get('world_size')} processes, now {self.env.world_size}"
            )

    # ------------------------------------------------------------------ model placement
    def _prepare_model(self) -> None:
        env, r = self.env, self.recipe
        method = self.method
        if method.sync_bn and env.distributed and not has_batchnorm(method):
            if env.is_main:
                print(f"note: sync_bn: {r.arch} and the method's heads have no BatchNorm layers, nothing to synchronise")
        elif method.sync_bn and env.distributed:
            if env.device.type == "cuda":
                method = nn.SyncBatchNorm.convert_sync_batchnorm(method)
                self.method = method
            elif env.is_main:
                print("note: SyncBatchNorm needs CUDA; BatchNorm statistics stay per process on CPU")

        precision = resolve_precision(r.precision, env.device, training=True)
        if precision == "fp16" and env.device.type != "cuda":
            if env.is_main:
                print("note: fp16 autocast needs CUDA (loss scaling); this CPU run uses fp32")
            precision = "fp32"
        self.precision = precision
        if env.is_main:
            print(f"precision: {precision} ({why(precision, env.device, training=True)}; requested {r.precision})", flush=True)
        saved = (self.state or {}).get("precision")
        if saved and saved != precision and env.is_main:
            print(f"note: this run trained in {saved} and continues in {precision}; weights and optimizer state are "
                  f"float32 either way, so only the rounding of the forward/backward pass changes", flush=True)
        # Channels-last: the layout cuDNN tensor cores and oneDNN's bf16 (AMX / AVX512_BF16) kernels want.
        self.channels_last = env.device.type == "cuda" or precision == "bf16"
        method.to(env.device)
        if self.channels_last:
            method.to(memory_format=torch.channels_last)
        if r.compile:
            method.backbone.compile()
        self.model: nn.Module = method
        if env.distributed:
            self.model = nn.parallel.DistributedDataParallel(
                method,
                device_ids=[env.device.index] if env.device.type == "cuda" else None,
                broadcast_buffers=False,  # queues are fed identical gathered keys on every rank
                find_unused_parameters=method.ddp_find_unused_parameters,
            )
        self.optimizer = build_optimizer(r, method.parameter_groups(r.optim.weight_decay))
        # Autocast runs the backbone's convolutions/matmuls in bf16 (fp16) while parameters, optimizer
        # state, BatchNorm statistics, the projection head (methods.heads, outside autocast) and the
        # losses (cl_zoo.losses upcast) stay float32.
        amp = precision != "fp32"
        self.autocast_dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        self.amp = amp
        self.monitor_search = monitor_search_for(env.device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=amp and precision == "fp16" and env.device.type == "cuda")

    def _load_images(self, data, index: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001

        paths = data.paths if index is None else [data.paths[i] for i in index]
        key = data.file_list_hash if index is None else None
        images = decode_to_tensor(paths, self.recipe.data.image_size, self.recipe.workers or None,
                                  cache_key=key, progress=self.progress and self.env.is_main)
        labels = torch.as_tensor(np.asarray(data.labels)[index] if index is not None else np.asarray(data.labels))
        return images, labels

    def _build_batches(self) -> None:
        env, r = self.env, self.recipe
        self.train_images: torch.Tensor | None = None
        if self.in_memory:
            images, labels = self._load_images(self.train_data, None)
            if len(self.train_index) != len(self.train_data):
                sel = torch.from_numpy(self.train_index)
                images, labels = images[sel], labels[sel]
            self.train_images = images.to(env.device)
            self.train_labels = labels
            self.batches: InMemoryBatches | StreamingBatches = InMemoryBatches(
                self.train_images, self.view_configs, r.batch_size, env.rank, env.world_size, r.seed
            )
        else:
            paths = [self.train_data.paths[i] for i in self.train_index]
            self.batches = StreamingBatches(paths, r.data.image_size, self.view_configs, r.batch_size,
                                            env.rank, env.world_size, r.seed, env.device, r.workers)

    # ------------------------------------------------------------------ kNN monitor
    def _monitor_sets(self) -> None:
        self.monitor: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        r = self.recipe
        if r.knn_every <= 0 or not self.env.is_main:
            return
        if self.val_data is not None:
            q_img, q_lab = self._load_images(self.val_data, None)
            self.monitor_name = f"val ({self.val_data.source})"
        elif self.holdout_index is not None:
            q_img, q_lab = self._load_images(self.train_data, self.holdout_index)
            self.monitor_name = f"held-out {HOLDOUT_FRACTION:.0%} of train"
        else:
            return
        if self.train_images is not None:
            b_img, b_lab = self.train_images, self.train_labels
        else:
            rng = np.random.default_rng(r.seed)
            sub = np.sort(rng.choice(self.train_index, size=min(MONITOR_BANK_MAX, len(self.train_index)), replace=False))
            b_img, b_lab = self._load_images(self.train_data, sub)
        self.monitor = (b_img, b_lab, q_img, q_lab)

    @torch.no_grad()
    def _features(self, images: torch.Tensor, batch: int = 512, keep_on_device: bool = False) -> torch.Tensor:
        """Float32 features of ``images``; on the host unless ``keep_on_device`` (no sync per batch)."""
        backbone = self.method.backbone
        dev = self.env.device
        out = []
        for i in range(0, len(images), batch):
            x = normalize_for(self.view_configs[0], images[i : i + batch].to(dev, non_blocking=True))
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(dev.type, dtype=self.autocast_dtype, enabled=self.amp):
                feats = backbone.forward_features(x).float()
            out.append(feats if keep_on_device else feats.cpu())
        return torch.cat(out)

    def run_monitor(self) -> dict[str, float]:
        """Weighted kNN top-1 of the current backbone on the held-out split (main rank only)."""
        if self.monitor is None:
            return {}

        b_img, b_lab, q_img, q_lab = self.monitor
        ks = sorted({min(k, len(b_lab)) for k in KNN_KS})
        num_classes = int(max(b_lab.max().item(), q_lab.max().item())) + 1
        try:  # before any feature is computed: a label set no kNN can score ends the monitor
            validate_split_labels(b_lab.numpy(), q_lab.numpy(), num_classes)
        except DataError as exc:  # e.g. a single-class toy folder: monitor is informative only
            print(f"kNN monitor skipped: {exc}")
            self.monitor = None
            return {}
        on_device = self.monitor_search == "device"
        was_training = self.method.training
        self.method.eval()
        try:
            bank = self._features(b_img, keep_on_device=on_device)
            queries = self._features(q_img, keep_on_device=on_device)
        finally:
            self.method.train(was_training)
        if on_device:
            return knn_top1_on_device(bank, b_lab, queries, q_lab, ks, KNN_TEMPERATURE, num_classes)
        result = knn_classify(bank.numpy(), b_lab.numpy(), queries.numpy(), q_lab.numpy(), ks=ks,
                              temperature=KNN_TEMPERATURE, num_classes=num_classes, use_gpu=False)
        return {k: v for k, v in result["metrics"].items() if k.endswith("_top1")}

    # ------------------------------------------------------------------ checkpoints
    def _save(self, epoch: int, global_step: int, history: list[dict[str, Any]],
              partial: dict[str, Any] | None = None) -> None:
        """Checkpoint after ``epoch`` completed epochs; ``partial`` describes progress into the next
        one (steps done, loss sum, images seen) when saving mid-epoch."""
        if not self.env.is_main:
            return
        state = {
            "method": self.recipe.method,
            "arch": self.recipe.arch,
            "recipe": self.recipe.to_dict(),
            "epoch": epoch,
            "global_step": global_step,
            "model": self.method.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"global_step": global_step, "steps_per_epoch": self.steps_per_epoch},
            "grad_scaler": self.scaler.state_dict(),
            "rng": capture_rng_state(),
            "data_hash": self.train_data.file_list_hash,
            "data": self.data_spec,
            "data_split": self.data_split,
            "data_root": self.data_root,
            "val": self.val_spec,
            "val_split": self.val_split,
            "world_size": self.env.world_size,
            "training_data": self.training_data,
            "history": history,
            "precision": self.precision,  # what ran ("auto" resolved on this machine)
        }
        if partial is not None:
            state["partial_epoch"] = partial
        with held_interrupts():  # a Ctrl-C mid-write waits for it: the checkpoint is replaced whole or not at all
            save_state(self.run_dir / CHECKPOINT_NAME, state)

    def _restore(self) -> tuple[int, int, list[dict[str, Any]], dict[str, Any] | None]:
        st = self.state
        if st is None:
            return 0, 0, [], None
        if st.get("method") != self.recipe.method:
            raise CheckpointError(f"cannot resume: checkpoint is a {st.get('method')} run, not {self.recipe.method}")
        missing, unexpected = self.method.load_state_dict(st["model"], strict=False)
        if missing or unexpected:
            raise CheckpointError(
                f"cannot resume: checkpoint does not match the model ({len(missing)} missing, {len(unexpected)} unexpected keys)"
            )
        self.optimizer.load_state_dict(st["optimizer"])
        if st.get("grad_scaler"):
            self.scaler.load_state_dict(st["grad_scaler"])
        restore_rng_state(st["rng"])
        partial = st.get("partial_epoch")
        # ``step == steps_per_epoch``: Ctrl-C came after an epoch's last step, before its end was recorded
        if partial is not None and not 0 < int(partial["step"]) <= self.steps_per_epoch:
            raise CheckpointError(
                f"cannot resume: checkpoint is {partial['step']} steps into an epoch of {self.steps_per_epoch}"
            )
        return int(st["epoch"]), int(st["global_step"]), list(st.get("history", [])), partial

    # ------------------------------------------------------------------ training
    def fit(self) -> PretrainResult:
        try:
            return self._fit()
        finally:
            launch.shutdown(self.env)

    def _fit(self) -> PretrainResult:
        env, r = self.env, self.recipe
        self._prepare_model()
        start_epoch, global_step, history, partial = self._restore()
        if env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.run_dir / "recipe.yaml", r.to_yaml())
        self._build_batches()
        self._monitor_sets()

        logger = RunLogger(self.run_dir, resume_epoch=start_epoch) if env.is_main else None
        kill_at = _fault_step("CL_ZOO_FAULT_KILL_STEP")
        nan_at = _fault_step("CL_ZOO_FAULT_NAN_STEP")
        interrupt_at = _fault_step("CL_ZOO_FAULT_INTERRUPT_STEP")
        peak_lr = r.effective_lr
        last_knn: dict[str, float] = next((dict(h["knn"]) for h in reversed(history) if h.get("knn")), {})
        if env.is_main and (start_epoch or partial):
            into = f" + {partial['step']}/{self.steps_per_epoch} steps" if partial else ""
            print(f"resumed {self.run_dir} at epoch {start_epoch}/{r.epochs}{into}")
        self.method.train()
        # The last point where the run's state is whole (after a step, or at an epoch's end): what
        # Ctrl-C saves. ``saved`` is the point the checkpoint on disk holds.
        here = _Position(start_epoch, global_step, int(partial["step"]) if partial else 0, len(history))
        saved: _Position | None = here if self.state is not None else None
        try:
            for epoch in range(start_epoch, r.epochs):
                t0 = time.perf_counter()
                seen = start_step = 0
                resumed_sum = None
                if partial is not None and epoch == start_epoch:  # resumed mid-epoch
                    start_step, seen = int(partial["step"]), int(partial["seen"])
                    resumed_sum = partial["loss_sum"]
                bar = None
                if env.is_main and self.progress:
                    bar = Progress(self.steps_per_epoch, desc=f"epoch {epoch + 1}/{r.epochs}", unit="steps",
                                   initial=start_step)
                tally = StepTally(env.device, self.steps_per_epoch, start_step, resumed_sum)
                here = _Position(epoch, global_step, start_step, len(history), seen, tally)
                resumed_seen = seen  # throughput counts this process's steps only
                lr = peak_lr
                for i, (index, views) in enumerate(self.batches.epoch(epoch, start_step), start=start_step):
                    if kill_at is not None and global_step == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    if interrupt_at is not None and global_step == interrupt_at:
                        os.kill(os.getpid(), signal.SIGINT)
                    # Ctrl-C waits for the step to finish: mid-step the weights, the optimizer and a
                    # method's queues are half-updated, a state no checkpoint may hold.
                    with held_interrupts(second_forces=True):
                        progress_ = epoch + i / self.steps_per_epoch
                        lr = peak_lr * lr_factor(r, global_step, self.steps_per_epoch)
                        set_lr(self.optimizer, lr)
                        if self.channels_last:
                            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
                        with torch.autocast(env.device.type, dtype=self.autocast_dtype, enabled=self.amp):
                            loss, logs = self.model(views, index, progress_)
                        if nan_at is not None and global_step == nan_at:
                            loss = loss * float("nan")
                        loss_value = launch.all_reduce_mean(env, loss.detach().float())
                        # A non-finite loss is found at the next flush (below), which names this step; the
                        # steps in between only touch weights that are never saved.
                        self.optimizer.zero_grad(set_to_none=True)
                        self.scaler.scale(loss).backward()
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
                        self.method.after_optimizer_step(epoch + (i + 1) / self.steps_per_epoch)
                        tally.record(i, loss_value, logs)
                        seen += 1
                        global_step += 1
                        here = dataclasses.replace(here, global_step=global_step, step=i + 1, seen=seen)
                        log_now = is_log_step(i, global_step)  # the same on every rank, so all stop together on NaN
                        save_now = bool(r.checkpoint_every) and global_step % r.checkpoint_every == 0 and i + 1 < self.steps_per_epoch
                        read = None
                        if log_now or save_now:  # a checkpoint must never hold an unchecked step
                            read = self._flush(tally, logs if log_now else None, epoch, global_step, start_epoch, peak_lr)
                            if log_now and logger is not None:
                                logger.log_step(global_step, {"loss": read.losses[-1], "lr": lr,
                                                              **{k: v for k, v in read.values.items() if k != "loss"}})
                        if bar is not None:
                            if bar.due():  # the loss of this very step, read (one host sync) only when it is shown
                                loss_now = read.losses[-1] if read is not None else float(tally.losses[i])
                                elapsed = max(time.perf_counter() - t0, 1e-9)
                                bar.set_postfix(loss=f"{loss_now:.4f}", lr=f"{lr:.3g}",
                                                img_s=f"{(seen - resumed_seen) * r.batch_size / elapsed:.0f}")
                            bar.update(1)
                    if save_now:
                        self._save(epoch, global_step, [dict(h) for h in history],
                                   partial={"step": i + 1, "seen": seen, "loss_sum": tally.loss_sum.detach().cpu()})
                        saved = here
                end = self._flush(tally, None, epoch, global_step, start_epoch, peak_lr, epoch_end=True)
                if bar is not None:
                    bar.close()
                if env.device.type == "cuda":
                    torch.cuda.synchronize(env.device)
                elapsed = time.perf_counter() - t0
                row: dict[str, Any] = {
                    "loss": float(end.values["loss_sum"] / max(seen, 1)),
                    "lr": lr,
                    "images_per_s": (seen - resumed_seen) * r.batch_size / elapsed,
                    "views_per_s": (seen - resumed_seen) * r.batch_size * self.num_views / elapsed,
                    "epoch_time_s": elapsed,
                }
                knn: dict[str, float] = {}
                due = r.knn_every > 0 and ((epoch + 1) % r.knn_every == 0 or epoch + 1 == r.epochs)
                if due and env.is_main:
                    knn = self.run_monitor()
                    last_knn = knn or last_knn
                    row.update(knn)
                launch.barrier(env)
                epoch_history = [*history, {"epoch": epoch + 1, **{k: v for k, v in row.items()}, "knn": knn}]
                self._save(epoch + 1, global_step, [{k: v for k, v in h.items()} for h in epoch_history])
                history = epoch_history
                here = saved = _Position(epoch + 1, global_step, 0, len(history))
                if logger is not None:
                    logger.log_epoch(epoch + 1, row)
                    msg = " ".join(f"{k}={v:.4g}" for k, v in row.items())
                    print(f"epoch {epoch + 1}/{r.epochs} {msg}", flush=True)
                    warning = collapse_warning(epoch + 1, tally.mean_pos_sim(end))
                    if warning:
                        print(warning, flush=True)
                launch.barrier(env)
            model_dir = self._export(last_knn, logger) if (self.export and env.is_main) else None
        except KeyboardInterrupt:
            raise self._interrupted(here, saved, history, start_epoch, peak_lr) from None
        finally:
            if logger is not None:
                logger.close()
        return PretrainResult(self.run_dir, model_dir, r.epochs, last_knn, history)

    def _interrupted(self, here: _Position, saved: _Position | None, history: list[dict[str, Any]],
                     start_epoch: int, peak_lr: float) -> TrainingInterrupted:
        """Save the last whole state (unless the checkpoint already holds it) and say what was kept."""
        ckpt = self.run_dir / CHECKPOINT_NAME
        if (saved is None or saved.global_step != here.global_step) and here.step > 0 and here.tally is not None:
            self._flush(here.tally, None, here.epoch, here.global_step, start_epoch, peak_lr)  # never save a NaN step
            self._save(here.epoch, here.global_step, [dict(h) for h in history[: here.history_len]],
                       partial={"step": here.step, "seen": here.seen, "loss_sum": here.tally.loss_sum.detach().cpu()})
            saved = here
        if saved is None:
            return TrainingInterrupted("interrupted before the first step was trained; nothing was saved", None)
        epochs, into = saved.epoch, f" + {saved.step}/{self.steps_per_epoch} steps" if saved.step else ""
        if saved.step == self.steps_per_epoch:  # every step of the epoch: only its end (monitor, log row) is redone
            epochs, into = saved.epoch + 1, ""
        kept = f"epoch {epochs}{into} of {self.recipe.epochs} (step {saved.global_step})"
        return TrainingInterrupted(f"interrupted: kept {kept} in {ckpt.resolve()}", ckpt)

    def _flush(self, tally: StepTally, logs: dict[str, torch.Tensor] | None, epoch: int, global_step: int,
               start_epoch: int, peak_lr: float, *, epoch_end: bool = False) -> Flush:
        """Read the steps since the last flush (and ``logs``) on the host; stop on a non-finite loss.

        ``global_step`` counts the steps done, so step index ``j`` of this epoch ran at global step
        ``global_step - (tally.recorded - j)``, whose lr the schedule gives again for the message.
        """
        read = tally.epoch_end() if epoch_end else tally.flush(logs)
        bad = read.first_non_finite()
        if bad is not None:
            step, value = bad
            lr = peak_lr * lr_factor(self.recipe, global_step - (tally.recorded - step), self.steps_per_epoch)
            raise NonFiniteLossError(self._nan_message(value, epoch, step, lr, start_epoch))
        return read

    def _nan_message(self, value: float, epoch: int, step: int, lr: float, start_epoch: int) -> str:
        ckpt = self.run_dir / CHECKPOINT_NAME
        if epoch > start_epoch or self.state is not None:
            kept = f"the last good checkpoint {ckpt} (epoch {epoch}) is intact"
        else:
            kept = "no checkpoint was written yet"
        return (f"loss became {value} at epoch {epoch + 1} step {step + 1} (lr {lr:.4g}); training stopped, {kept}; "
                "lower optim.lr, add warmup or use precision fp32")

    # ------------------------------------------------------------------ export
    def _export(self, knn: dict[str, float], logger) -> Path:  # noqa: ANN001

        r = self.recipe
        backbone = self.method.backbone
        # The data the run had, not the recipe's default: eight photos are not Imagenette.
        dataset = training_data_name({"training_data": self.training_data})
        describe_backbone(backbone, r, self.view_configs[0], epochs=r.epochs, dataset=dataset)
        metrics = monitor_metrics(knn)
        images = f"{self.training_data['images']:,} images of " if training_dataset({"training_data": self.training_data}) is None else ""
        curve = (logger.plot(title=f"{r.method} {r.arch} on {images}{dataset}, {r.epochs} epoch{'s' if r.epochs != 1 else ''}, seed {r.seed}")
                 if logger is not None else None)
        model_dir = self.run_dir / "model"
        sections = {}
        if knn:
            where = getattr(self, "monitor_name", "held-out data")
            lines = [f"Online kNN monitor (k in {list(KNN_KS)}, T={KNN_TEMPERATURE}, cosine) on {where}, "
                     f"image size {r.data.image_size}, after epoch {r.epochs}:", ""]
            lines += [f"- {k}: {100 * v:.2f}%" for k, v in sorted(knn.items())]
            if curve is not None:
                lines += ["", "![loss and kNN accuracy per epoch](curves.png)"]
            sections["Training"] = "\n".join(lines)
        was = backbone.training
        backbone.eval()
        save_pretrained(backbone, model_dir, recipe=r.to_dict(), metrics=metrics, card_sections=sections,
                        extra_config={"training_data": self.training_data, "training_precision": self.precision,
                                      # the projection head runs outside autocast (methods.heads); a
                                      # config without this key trained its head in training_precision
                                      "training_head_precision": "fp32"})
        backbone.train(was)
        if curve is not None:
            atomic_write_bytes(model_dir / "curves.png", curve.read_bytes())
        return model_dir


def monitor_metrics(knn: dict[str, float]) -> dict[str, float]:
    """The online monitor's kNN accuracies as checkpoint metrics, prefixed ``monitor_``: they come from
    the training run's own held-out split and temperature, and must not be mistaken for a
    ``cl-zoo knn`` evaluation (whose metrics are named after the evaluation data)."""
    return {f"monitor_{k}": round(float(v), 6) for k, v in knn.items()}


def describe_backbone(backbone: nn.Module, recipe: Recipe, view0: Any, *, epochs: int, dataset: str | None) -> None:
    """Record how the backbone was trained, and the input statistics it saw, in its pretrained_cfg
    (so embed/knn/linear-eval preprocess exactly as training did)."""
    updates: dict[str, Any] = {
        "method": recipe.method,
        "dataset": dataset,
        "epochs": epochs,
        "input_size": (3, recipe.data.image_size, recipe.data.image_size),
    }
    if view0.mean is not None:
        updates.update(mean=tuple(view0.mean), std=tuple(view0.std))
    backbone.pretrained_cfg = dataclasses.replace(backbone.pretrained_cfg, **updates)


def pretrain(
    recipe: Recipe,
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    **kwargs: Any,
) -> PretrainResult:
    """Train ``recipe`` on ``data`` into run folder ``out``; see :class:`Trainer` for options."""
    return Trainer(recipe, data, out, **kwargs).fit()


def export_run(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
               dtype: torch.dtype | None = None) -> Path:
    """Export the backbone of a run's last checkpoint (e.g. a run stopped before its last epoch).

    The config records the epochs actually trained and the last kNN monitor result, if any.
    """
    run_dir = Path(run_dir)
    state = load_state(run_dir / CHECKPOINT_NAME)
    recipe = Recipe.from_dict(state["recipe"], source=f"checkpoint {run_dir / CHECKPOINT_NAME}")
    method = build_method_from_recipe(recipe)
    method.load_state_dict(state["model"])
    backbone = method.backbone
    view0 = augment_configs(method.view_config.presets(), recipe.data.image_size)[0]
    recorded = {"training_data": state["training_data"]} if state.get("training_data") else {}
    dataset = training_data_name(recorded) if recorded else recipe.data.dataset
    describe_backbone(backbone, recipe, view0, epochs=int(state["epoch"]), dataset=dataset)
    knn = {}
    for row in state.get("history", []):
        knn = dict(row.get("knn") or {}) or knn
    backbone.eval()
    target = Path(out) if out is not None else run_dir / "model"
    extra = {"training_data": state["training_data"]} if state.get("training_data") else None
    return save_pretrained(backbone, target, recipe=recipe.to_dict(), metrics=monitor_metrics(knn), dtype=dtype,
                           extra_config=extra)
