"""Named transfer settings shared by both engines (``--config``).

Each preset is the protocol's schedule (docs: ../shared/protocols.md, MoCo's detection configs)
and, for the detectron2 engine, the YAML in ``transfer/detectron2/`` that encodes it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from cl_zoo.errors import ClZooError


@dataclass(frozen=True)
class Preset:
    yaml: str
    head: str
    max_iter: int
    steps: tuple[int, ...]
    min_sizes_train: tuple[int, ...]
    min_size_test: int = 800
    warmup_iters: int = 100
    train_split: str = "trainval"
    val_split: str = "test"


_VOC_SIZES = tuple(range(480, 801, 32))
_COCO_SIZES = tuple(range(640, 801, 32))

PRESETS: dict[str, Preset] = {
    "voc-c4": Preset("pascal_voc_R_50_C4_24k.yaml", "c4", 24000, (18000, 22000), _VOC_SIZES),
    "coco-c4-1x": Preset("coco_R_50_C4_1x.yaml", "c4", 90000, (60000, 80000), _COCO_SIZES,
                         warmup_iters=1000, train_split="train2017", val_split="val2017"),
    "coco-c4-2x": Preset("coco_R_50_C4_2x.yaml", "c4", 180000, (120000, 160000), _COCO_SIZES,
                         warmup_iters=1000, train_split="train2017", val_split="val2017"),
    "coco-fpn-1x": Preset("coco_R_50_FPN_1x.yaml", "fpn", 90000, (60000, 80000), _COCO_SIZES,
                          warmup_iters=1000, train_split="train2017", val_split="val2017"),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ClZooError(f"unknown detection config {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


# ------------------------------------------------------------------------------------------------
# Run sizes (``--preset``): option defaults, not protocols
# ------------------------------------------------------------------------------------------------

# What a run uses for an option that neither the command line nor a --preset sets: the MoCo/detectron2
# protocol's values (batch 16, 512 sampled RoIs per image...), sized for GPUs.
PROTOCOL_DEFAULTS: dict[str, int] = {
    "batch_size": 16, "max_size": 1333, "rois_per_image": 512, "proposals_test": 1000, "checkpoint_period": 2000,
}


@dataclass(frozen=True)
class RunPreset:
    """Defaults for the options that set a run's size; each option given on the command line wins.

    A preset exists because the protocol's schedule (24,000 iterations of 16 images at 480-800 px)
    does not finish on a CPU: a user needs one word for "something that runs here", and sees every
    value it chose printed as the options that would set it."""

    name: str
    head: str
    batch_size: int
    lr: float
    max_iter: int
    steps: tuple[int, ...]
    warmup_iters: int
    min_sizes_train: tuple[int, ...]
    min_size_test: int
    max_size: int
    rois_per_image: int
    proposals_test: int
    checkpoint_period: int

    def values(self) -> dict[str, object]:
        """Option destination -> value (``head`` included; the detectron2 engine leaves it to --config)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}

    def scaled_to(self, max_iter: int) -> "RunPreset":
        """This preset for a run of ``max_iter`` iterations: LR steps and warm-up at the same fractions
        of the run, so a shortened run still decays (steps kept at 100/130 never fire in 60)."""
        if max_iter == self.max_iter:
            return self
        return replace(self, max_iter=max_iter, steps=scale_steps(self.steps, self.max_iter, max_iter),
                       warmup_iters=round(self.warmup_iters * max_iter / self.max_iter))

    def as_options(self) -> str:
        """The command-line options that reproduce this preset without it."""
        words = []
        for key, value in self.values().items():
            flag = {"min_sizes_train": "min-size-train"}.get(key, key.replace("_", "-"))
            text = ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)
            words.append(f"--{flag} {text}")
        return " ".join(words)


# cpu-quick: the CPU tier's BCCD fine-tune (scripts/bundle_cpu_tier.py BCCD_SCHEDULE: R18-FPN, 4 images
# of 256 px, lr 0.005, 128 RoIs per image; 300 iterations, ~8.5 min on 2 cores, CACR 48.1 AP) at half
# its iterations, with the LR steps at the same fractions (2/3 and 0.87) of the run. A checkpoint every
# 50 iterations (~1.5 min here) bounds what a hard kill loses.
RUN_PRESETS: dict[str, RunPreset] = {
    "cpu-quick": RunPreset(
        name="cpu-quick", head="fpn", batch_size=4, lr=0.005, max_iter=150, steps=(100, 130), warmup_iters=50,
        min_sizes_train=(256,), min_size_test=256, max_size=352, rois_per_image=128, proposals_test=1000,
        checkpoint_period=50,
    ),
}


def scale_steps(steps: tuple[int, ...], of_iters: int, to_iters: int) -> tuple[int, ...]:
    """LR-decay iterations of a ``of_iters`` schedule moved to the same fractions of ``to_iters``."""
    if of_iters <= 0:
        return tuple(steps)
    return tuple(round(s * to_iters / of_iters) for s in steps)


def get_run_preset(name: str) -> RunPreset:
    if name not in RUN_PRESETS:
        raise ClZooError(f"unknown detection preset {name!r}; choose one of {', '.join(RUN_PRESETS)}")
    return RUN_PRESETS[name]
