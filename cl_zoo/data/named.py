"""Named datasets (``cifar10``, ``cifar100``, ``stl10``, ``imagenette``) found under a data root.

Nothing is downloaded: cl-zoo runs on machines without internet, so a name only resolves to an
ImageFolder copy (a folder or an archive of one) that the user placed under ``root``. When nothing
is found, the error lists every place that was tried and the expected layout, so the fix is a
single ``tar xf`` or ``--data-root``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cl_zoo.deprecations import retired_exports


@dataclass(frozen=True)
class NamedDataset:
    name: str
    folders: tuple[str, ...]  # folder (and archive stem) names tried under root, in order
    splits: tuple[str, ...]
    num_classes: int
    # (split, images) as the publisher distributes it: a folder is taken for this dataset only when
    # it holds exactly that many (a subset or a folder that happens to share the name is not it)
    split_images: tuple[tuple[str, int], ...] = ()


NAMED_DATASETS: dict[str, NamedDataset] = {
    d.name: d
    for d in (
        NamedDataset("cifar10", ("cifar10", "cifar10-jpeg", "cifar-10", "CIFAR10"), ("train", "test"), 10,
                     (("train", 50_000), ("test", 10_000))),
        NamedDataset("cifar100", ("cifar100", "cifar100-jpeg", "cifar-100", "CIFAR100"), ("train", "test"), 100,
                     (("train", 50_000), ("test", 10_000))),
        NamedDataset("stl10", ("stl10", "stl10-jpeg", "stl-10", "STL10"), ("train", "test"), 10,
                     (("train", 5_000), ("test", 8_000), ("unlabeled", 100_000))),
        NamedDataset(
            "imagenette",
            ("imagenette", "imagenette2", "imagenette128", "imagenette2-160", "imagenette2-320"),
            ("train", "val"),
            10,
            (("train", 9_469), ("val", 3_925)),  # imagenette2, the release every folder name above holds
        ),
    )
}

_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


def _stem(source: str, split: str | None) -> str:
    """The dataset-ish name of a data source: its folder or archive name, less the archive suffix
    and a ``-<split>`` ending (``imagenette128-train.tar.gz`` -> ``imagenette128``)."""
    name = Path(source.rstrip("/\\")).name
    for suffix in _ARCHIVE_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name[: -len(split) - 1] if split and name.lower().endswith(f"-{split}".lower()) else name


def named_like(source: str, split: str | None, claimed: str | None = None) -> NamedDataset | None:
    """The named dataset ``source`` is named as (its name, or a folder or archive named like one,
    ``claimed`` first), whatever it holds; None when its name is no dataset's."""
    named = NAMED_DATASETS.get(source.strip().lower())
    if named is not None:
        return named
    stem = _stem(source, split).lower()
    by_folder = [d for d in NAMED_DATASETS.values() if stem in {folder.lower() for folder in d.folders}]
    return next((d for d in by_folder if d.name == claimed), by_folder[0] if by_folder else None)


def identify_dataset(source: str, split: str | None, images: int, *, classes: int | None = None,
                     claimed: str | None = None) -> str | None:
    """The named dataset a training or evaluation source is, else None.

    ``source`` is a named dataset's name, or a folder or archive named like one (``claimed``, the
    recipe's dataset, first); either way the split must hold exactly the publisher's
    image count (and ``classes`` its class count, when known). A recipe's default dataset alone
    proves nothing: eight photos trained with an Imagenette recipe are not Imagenette.
    """
    named = named_like(source, split, claimed)
    if named is None or dict(named.split_images).get(str(split)) != images:
        return None
    if classes is not None and classes != named.num_classes:
        return None
    return named.name


def default_data_root() -> Path:
    """``$CL_ZOO_DATA`` or ``./data``: where named datasets are looked for when no root is given."""
    return Path(os.environ.get("CL_ZOO_DATA", "data")).expanduser()


def candidates(ds: NamedDataset, root: Path, split: str) -> list[Path]:
    found: list[Path] = []
    for stem in ds.folders:
        found.append(root / stem)
        for suffix in _ARCHIVE_SUFFIXES:
            found.append(root / f"{stem}-{split}{suffix}")  # per-split archives, e.g. imagenette128-val.tar.gz
            found.append(root / f"{stem}{suffix}")
    found.append(root)  # root may itself be the dataset folder
    return found


# The resolver scans folders, so it lives in cl_zoo.data.folder (which reads this table); the old
# import path still works, with a DeprecationWarning.
__getattr__, __dir__ = retired_exports(globals())
