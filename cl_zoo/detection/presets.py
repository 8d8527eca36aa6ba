"""Named transfer settings shared by both engines (``--config``).

Each preset is the protocol's schedule (docs: ../shared/protocols.md, MoCo's detection configs)
and, for the detectron2 engine, the YAML in ``transfer/detectron2/`` that encodes it.
"""

from __future__ import annotations

from dataclasses import dataclass

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
