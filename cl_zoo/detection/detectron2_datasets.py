"""A user's VOC or COCO folder, checked against what detectron2's own readers need.

``train_net.py`` registers ``--data``/``--val-data`` folders with detectron2's
``register_pascal_voc`` / ``register_coco_instances`` (checked against
``detectron2/data/datasets/{pascal_voc,coco}.py`` and
``detectron2/evaluation/pascal_voc_evaluation.py``). Those readers are stricter than cl-zoo's
loaders, and a mismatch would surface as a traceback deep inside the training process, after the
export. So the folder is checked here, before anything runs, and a mismatch is a one-line
:class:`DataError`:

* VOC: ``ImageSets/Main/<split>.txt`` lists the ids (``np.loadtxt``, so at least two of them);
  each image is ``JPEGImages/<id>.jpg`` (the XML's ``<filename>`` is not consulted); each
  ``Annotations/<id>.xml`` has ``size/width`` and ``size/height``; every object has ``name``,
  ``bndbox`` and, for the evaluator, ``pose``, ``truncated``, ``difficult`` and integer corners.
  The class list is read from the annotations (detectron2's default would be the 20 PASCAL
  classes, and any other name stops its reader).
* COCO: ``annotations/instances_<split>.json`` with images in ``<split>/`` (the layout the
  torchvision engine reads too); classes are its categories sorted by id, which is how detectron2
  maps category ids to contiguous labels.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cl_zoo.detection.datasets import read_annotations, voc_split_ids
from cl_zoo.errors import DataError

_EVALUATOR_TAGS = ("pose", "truncated", "difficult")
_CORNERS = ("xmin", "ymin", "xmax", "ymax")


@dataclass(frozen=True)
class Detectron2Dataset:
    """One dataset as ``train_net.py`` registers it: ``--voc NAME DIR SPLIT`` or ``--coco NAME JSON IMAGES``."""

    name: str
    layout: Literal["voc", "coco"]
    paths: tuple[str, str]  # voc: (folder, split); coco: (annotation json, image folder)
    classes: tuple[str, ...]

    def arguments(self) -> list[str]:
        return [f"--{self.layout}", self.name, *self.paths]


def _voc_error(root: Path, split: str, problem: str) -> DataError:
    return DataError(f"{root} ({split}): {problem}; detectron2's VOC reader cannot use it "
                     "(--engine torchvision reads such folders)")


def _voc_classes(root: Path, split: str, evaluated: bool) -> tuple[str, ...]:
    ids = voc_split_ids(root, split)
    if len(ids) < 2:
        raise _voc_error(root, split, f"ImageSets/Main/{split}.txt lists {len(ids)} image (detectron2 needs two or more)")
    missing = [i for i in ids if not (root / "JPEGImages" / f"{i}.jpg").is_file()]
    if missing:
        raise _voc_error(root, split, f"{len(missing)} of {len(ids)} images are not JPEGImages/<id>.jpg "
                                      f"(first: {missing[0]}.jpg)")
    names: set[str] = set()
    for image_id in ids:
        xml = root / "Annotations" / f"{image_id}.xml"
        try:
            node = ET.parse(xml).getroot()
        except (OSError, ET.ParseError) as exc:
            raise _voc_error(root, split, f"cannot read {xml.name} ({exc})") from None
        for tag in ("size/width", "size/height"):
            if node.find(tag) is None:
                raise _voc_error(root, split, f"{xml.name} has no <{tag}>")
        for obj in node.findall("object"):
            name = obj.findtext("name")
            if not name:
                raise _voc_error(root, split, f"{xml.name} has an object without <name>")
            if obj.find("bndbox") is None:
                raise _voc_error(root, split, f"{xml.name}: object {name!r} has no <bndbox>")
            if evaluated:  # what PascalVOCDetectionEvaluator's parse_rec reads, beyond the loader
                lacking = [t for t in _EVALUATOR_TAGS if obj.find(t) is None]
                if lacking:
                    raise _voc_error(root, split, f"{xml.name}: object {name!r} has no <{lacking[0]}>")
                try:
                    [int(obj.findtext(f"bndbox/{c}") or "") for c in _CORNERS]
                except ValueError:
                    raise _voc_error(root, split, f"{xml.name}: object {name!r} needs integer bndbox corners") from None
            names.add(name)
    return tuple(sorted(names))


def _coco_classes(annotation_file: Path) -> tuple[str, ...]:
    data = read_annotations(annotation_file)
    categories = data.get("categories") if isinstance(data, dict) else None
    if not isinstance(categories, list) or not categories:
        raise DataError(f"{annotation_file} is not a COCO instances file (no categories)")
    try:
        return tuple(str(c["name"]) for c in sorted(categories, key=lambda c: int(c["id"])))
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{annotation_file}: every category needs an integer id and a name") from None


def describe_dataset(root: str | Path, split: str, name: str, *, evaluated: bool = False) -> Detectron2Dataset:
    """``root`` (VOC or COCO layout, see the module docstring) as ``train_net.py`` will register it.

    ``evaluated``: the dataset is a validation set, so the VOC evaluator's needs are checked too.
    ``root`` is made absolute here, so the command works from any directory.
    """
    folder = Path(root).expanduser().resolve()
    if not folder.is_dir():
        raise DataError(f"dataset folder {root} does not exist")
    if (folder / "Annotations").is_dir():
        classes = _voc_classes(folder, split, evaluated)
        if any("," in c for c in classes):
            raise DataError(f"{folder}: a class name contains a comma, which train_net.py's --voc-classes cannot carry")
        return Detectron2Dataset(name, "voc", (str(folder), split), classes)
    annotation = folder / "annotations" / f"instances_{split}.json"
    if annotation.is_file():
        images = folder / split
        if not images.is_dir():
            raise DataError(f"{folder}: annotations/instances_{split}.json has no image folder {split}/ beside it")
        return Detectron2Dataset(name, "coco", (str(annotation), str(images)), _coco_classes(annotation))
    raise DataError(
        f"{folder} is neither a VOC folder (Annotations/, JPEGImages/, ImageSets/Main/) nor a COCO folder "
        f"with annotations/instances_{split}.json"
    )


def shared_classes(datasets: list[Detectron2Dataset]) -> tuple[str, ...]:
    """The one class list every dataset of a run is labelled with (so label i means one thing).

    VOC folders: the sorted union of their names (detectron2 indexes each object's name in it).
    COCO files: their categories must agree, because detectron2 numbers them per file.
    """
    layouts = {d.layout for d in datasets}
    if len(layouts) > 1:
        raise DataError("--data and --val-data mix VOC and COCO folders; detectron2 would number their classes "
                        "differently, so use one layout")
    if layouts == {"voc"}:
        return tuple(sorted({c for d in datasets for c in d.classes}))
    first = datasets[0]
    for other in datasets[1:]:
        if other.classes != first.classes:
            raise DataError(f"{other.paths[0]} and {first.paths[0]} have different categories; "
                            "detectron2 needs the same ones in every file of a run")
    return first.classes
