"""Detection datasets in PASCAL VOC and COCO layouts, validated on load.

Both loaders produce the same thing: a list of :class:`DetectionSample` (absolute ``x1,y1,x2,y2``
boxes in pixels, labels ``1..K`` with 0 left for torchvision's background) and a tally of what
was skipped and why. Bad annotations (zero or negative area, outside the image, unknown class) are
dropped one by one and counted rather than failing the whole dataset: a few broken boxes are
common in real data (BCCD has some) and should not stop a run, but the user must see the count.

Coordinates: VOC XML is 1-based and inclusive; like detectron2 we subtract 1 from ``xmin``/``ymin``
and keep ``xmax``/``ymax``, which gives 0-based continuous boxes. Plain IoU on these equals the
VOC devkit's "+1" IoU on the original integers, so the VOC evaluator needs no pixel fudge.
"Difficult" objects are kept for training (as detectron2 does) and ignored in VOC evaluation.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from cl_zoo.errors import DataError
from cl_zoo.fileio import read_bounded_json

# Boxes may poke out of the image by up to this many pixels (rounding in the annotation tools);
# they are clipped. Anything further out is an error and is skipped.
BOUNDS_TOLERANCE = 1.0


@dataclass
class DetectionSample:
    image_path: str
    image_id: int
    width: int
    height: int
    boxes: np.ndarray  # [N, 4] float32, x1 y1 x2 y2 in pixels
    labels: np.ndarray  # [N] int64 in 1..K
    difficult: np.ndarray  # [N] bool; True for VOC "difficult" and COCO crowd regions
    name: str = ""


@dataclass
class DetectionData:
    """Samples plus what the loader dropped, and enough to map labels back to dataset ids."""

    samples: list[DetectionSample]
    classes: list[str]  # label i+1 -> classes[i]
    category_ids: list[int]  # label i+1 -> the dataset's category id (COCO) or i+1 (VOC)
    skipped: Counter = field(default_factory=Counter)  # reason -> count of annotations
    layout: str = "voc"
    root: str = ""

    def summary(self) -> str:
        boxes = sum(len(s.boxes) for s in self.samples)
        text = f"{len(self.samples)} images, {boxes} boxes, {len(self.classes)} classes ({self.layout}: {self.root})"
        if self.skipped:
            text += "; skipped " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return text


def _check_box(
    box: Sequence[float], width: int, height: int, skipped: Counter
) -> list[float] | None:
    x1, y1, x2, y2 = (float(v) for v in box)
    if not all(np.isfinite([x1, y1, x2, y2])):
        skipped["non-finite boxes"] += 1
        return None
    if x2 - x1 <= 0 or y2 - y1 <= 0:
        skipped["zero-area boxes"] += 1
        return None
    t = BOUNDS_TOLERANCE
    if x1 < -t or y1 < -t or x2 > width + t or y2 > height + t:
        skipped["out-of-bounds boxes"] += 1
        return None
    x1, y1 = max(0.0, x1), max(0.0, y1)
    x2, y2 = min(float(width), x2), min(float(height), y2)
    if x2 - x1 <= 0 or y2 - y1 <= 0:
        skipped["zero-area boxes"] += 1
        return None
    return [x1, y1, x2, y2]


def _sample(path: str, image_id: int, w: int, h: int, boxes: list, labels: list, difficult: list, name: str) -> DetectionSample:
    return DetectionSample(
        image_path=path,
        image_id=image_id,
        width=w,
        height=h,
        boxes=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        labels=np.asarray(labels, dtype=np.int64),
        difficult=np.asarray(difficult, dtype=bool),
        name=name,
    )


# ------------------------------------------------------------------------------------------------
# PASCAL VOC
# ------------------------------------------------------------------------------------------------


def _xml_text(node: ET.Element, tag: str) -> str | None:
    child = node.find(tag)
    return child.text.strip() if child is not None and child.text is not None else None


def voc_split_ids(root: str | os.PathLike[str], split: str) -> list[str]:
    root = Path(root)
    for sub in ("Annotations", "JPEGImages"):
        if not (root / sub).is_dir():
            raise DataError(f"{root} is not a PASCAL VOC folder: {sub}/ is missing")
    sets = root / "ImageSets" / "Main"
    if not sets.is_dir():
        raise DataError(f"{root} is missing ImageSets/Main/ (the VOC split lists such as trainval.txt)")
    listing = sets / f"{split}.txt"
    if not listing.is_file():
        have = ", ".join(sorted(p.stem for p in sets.glob("*.txt") if "_" not in p.stem)) or "none"
        raise DataError(f"{listing} does not exist (splits here: {have})")
    ids = [line.split()[0] for line in listing.read_text().splitlines() if line.strip()]
    if not ids:
        raise DataError(f"{listing} is empty")
    return ids


def load_voc(
    root: str | os.PathLike[str], split: str = "trainval", classes: Sequence[str] | None = None
) -> DetectionData:
    """Read ``root/{Annotations,JPEGImages,ImageSets/Main/<split>.txt}``.

    ``classes`` fixes the label order (pass the training set's classes to the test split);
    without it the classes are the sorted names found in this split.
    """
    root = Path(root)
    ids = voc_split_ids(root, split)
    parsed: list[tuple[str, ET.Element]] = []
    skipped: Counter = Counter()
    for image_name in ids:
        xml_path = root / "Annotations" / f"{image_name}.xml"
        try:
            parsed.append((image_name, ET.parse(xml_path).getroot()))
        except (OSError, ET.ParseError):
            skipped["images with unreadable XML"] += 1
    if not parsed:
        raise DataError(f"{root}: no readable annotations for split {split!r}")
    if classes is None:
        names = {(_xml_text(o, "name") or "") for _, r in parsed for o in r.findall("object")}
        classes = sorted(n for n in names if n)
    classes = list(classes)
    index = {c: i + 1 for i, c in enumerate(classes)}
    samples: list[DetectionSample] = []
    for number, (image_name, node) in enumerate(parsed):
        filename = _xml_text(node, "filename") or f"{image_name}.jpg"
        image_path = root / "JPEGImages" / filename
        if not image_path.is_file():
            image_path = root / "JPEGImages" / f"{image_name}.jpg"
        if not image_path.is_file():
            skipped["images missing from JPEGImages"] += 1
            continue
        size = node.find("size")
        try:
            w = int(float(_xml_text(size, "width") or 0)) if size is not None else 0
            h = int(float(_xml_text(size, "height") or 0)) if size is not None else 0
        except ValueError:
            w = h = 0
        if w <= 0 or h <= 0:
            with Image.open(image_path) as im:
                w, h = im.size
        boxes, labels, difficult = [], [], []
        for obj in node.findall("object"):
            name = _xml_text(obj, "name") or ""
            if name not in index:
                skipped["boxes of unknown classes"] += 1
                continue
            bb = obj.find("bndbox")
            try:
                raw = [float(_xml_text(bb, t) or "nan") for t in ("xmin", "ymin", "xmax", "ymax")]  # type: ignore[arg-type]
            except (ValueError, TypeError):
                skipped["unparsable boxes"] += 1
                continue
            box = _check_box([raw[0] - 1.0, raw[1] - 1.0, raw[2], raw[3]], w, h, skipped)
            if box is None:
                continue
            boxes.append(box)
            labels.append(index[name])
            difficult.append((_xml_text(obj, "difficult") or "0") == "1")
        samples.append(_sample(str(image_path), number, w, h, boxes, labels, difficult, image_name))
    return DetectionData(samples, classes, list(range(1, len(classes) + 1)), skipped, "voc", str(root))


# ------------------------------------------------------------------------------------------------
# COCO
# ------------------------------------------------------------------------------------------------


# COCO's train2017 instances file is 448 MB and LVIS v1's train file 1.1 GB; parsing either takes
# several times its size in memory, so a file claiming more than this is refused before it is read.
MAX_ANNOTATION_BYTES = 2 << 30


def read_annotations(path: Path) -> Any:
    """A COCO-style annotation file's JSON; unreadable, oversized or malformed files are one-line errors."""
    return read_bounded_json(path, max_bytes=MAX_ANNOTATION_BYTES, what="COCO annotation file")


def load_coco(images_dir: str | os.PathLike[str], annotation_file: str | os.PathLike[str]) -> DetectionData:
    """Read a COCO instances JSON. Crowd regions are kept as "difficult" (ignored in training and
    evaluation), boxes are converted from ``x,y,w,h`` and validated against the image size."""
    images_dir, annotation_file = Path(images_dir), Path(annotation_file)
    data = read_annotations(annotation_file)
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "annotations", "categories")):
        raise DataError(f"{annotation_file} is not a COCO instances file (needs images, annotations, categories lists)")
    if not images_dir.is_dir():
        raise DataError(f"image folder {images_dir} does not exist")
    categories = sorted(data["categories"], key=lambda c: c["id"])
    category_ids = [int(c["id"]) for c in categories]
    label_of = {cid: i + 1 for i, cid in enumerate(category_ids)}
    skipped: Counter = Counter()
    images: dict[int, dict[str, Any]] = {}
    for im in data["images"]:
        try:
            images[int(im["id"])] = {"file": str(im["file_name"]), "w": int(im["width"]), "h": int(im["height"])}
        except (KeyError, TypeError, ValueError):
            skipped["images without id/file_name/width/height"] += 1
    per_image: dict[int, tuple[list, list, list]] = {i: ([], [], []) for i in images}
    for ann in data["annotations"]:
        image = images.get(ann.get("image_id"))
        if image is None:
            skipped["boxes of unknown images"] += 1
            continue
        if ann.get("category_id") not in label_of:
            skipped["boxes of unknown classes"] += 1
            continue
        bbox = ann.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4:
            skipped["unparsable boxes"] += 1
            continue
        x, y, w, h = (float(v) for v in bbox)
        box = _check_box([x, y, x + w, y + h], image["w"], image["h"], skipped)
        if box is None:
            continue
        boxes, labels, crowd = per_image[ann["image_id"]]
        boxes.append(box)
        labels.append(label_of[ann["category_id"]])
        crowd.append(bool(ann.get("iscrowd", 0)))
    samples = []
    for image_id, image in images.items():
        path = images_dir / image["file"]
        if not path.is_file():
            skipped["images missing from the image folder"] += 1
            continue
        boxes, labels, crowd = per_image[image_id]
        samples.append(_sample(str(path), image_id, image["w"], image["h"], boxes, labels, crowd, image["file"]))
    if not samples:
        raise DataError(f"{annotation_file}: none of its images were found in {images_dir}")
    classes = [str(c.get("name", c["id"])) for c in categories]
    return DetectionData(samples, classes, category_ids, skipped, "coco", str(annotation_file))


def load_detection_data(root: str | os.PathLike[str], split: str, classes: Sequence[str] | None = None,
                        *, split_option: str = "--train-split") -> DetectionData:
    """Open ``root`` in whichever layout it has: VOC (``Annotations/``) or COCO
    (``annotations/instances_<split>.json`` with images in ``<split>/``).

    ``split_option`` is the option that picks ``split``, named when a COCO folder lacks it."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"dataset folder {root} does not exist")
    if (root / "Annotations").is_dir():
        return load_voc(root, split, classes)
    ann = root / "annotations" / f"instances_{split}.json"
    if ann.is_file():
        return load_coco(root / split, ann)
    splits = sorted(p.name[len("instances_"):-len(".json")] for p in (root / "annotations").glob("instances_*.json"))
    if splits:
        role = "val" if "val" in split_option else "train"
        pick = next((name for name in splits if role in name), splits[0])
        raise DataError(f"{root} is a COCO folder without annotations/instances_{split}.json; its splits are "
                        f"{', '.join(splits)}: pass {split_option} {pick}")
    raise DataError(
        f"{root} is neither a VOC folder (Annotations/, JPEGImages/, ImageSets/Main/) nor a COCO folder "
        f"with annotations/instances_{split}.json"
    )


# ------------------------------------------------------------------------------------------------
# torch Dataset
# ------------------------------------------------------------------------------------------------


class DetectionDataset(torch.utils.data.Dataset):
    """Images as float RGB in [0, 1] with torchvision detection targets.

    Resizing and normalisation happen inside the model (torchvision's ``GeneralizedRCNNTransform``),
    so the only augmentation here is the horizontal flip of the detectron2 recipe.
    """

    def __init__(self, data: DetectionData, train: bool = False, flip_prob: float = 0.5) -> None:
        self.data = data
        self.train = train
        self.flip_prob = flip_prob if train else 0.0

    def __len__(self) -> int:
        return len(self.data.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        s = self.data.samples[index]
        try:
            with Image.open(s.image_path) as im:
                image = torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.uint8).copy())
        except OSError as exc:
            raise DataError(f"cannot decode {s.image_path} ({exc})") from exc
        image = image.permute(2, 0, 1).float().div_(255.0)
        boxes = torch.from_numpy(s.boxes.copy())
        labels = torch.from_numpy(s.labels.copy())
        if self.train and self.data.layout == "coco":
            # COCO crowd regions are not objects to regress; VOC "difficult" ones are trained on.
            keep = torch.from_numpy(~s.difficult)
            boxes, labels = boxes[keep], labels[keep]
        h, w = image.shape[-2:]
        if (w, h) != (s.width, s.height):
            # The annotation's size disagrees with the file; rescale boxes to the real pixels.
            scale = torch.tensor([w / s.width, h / s.height, w / s.width, h / s.height])
            boxes = boxes * scale
        if self.flip_prob and torch.rand(()) < self.flip_prob:
            image = image.flip(-1)
            boxes = torch.stack([w - boxes[:, 2], boxes[:, 1], w - boxes[:, 0], boxes[:, 3]], dim=1)
        target = {"boxes": boxes.reshape(-1, 4), "labels": labels, "image_id": torch.tensor(s.image_id)}
        return image, target


def collate(batch: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> tuple[list, list]:
    images, targets = zip(*batch)
    return list(images), list(targets)
