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


NAMED_DATASETS: dict[str, NamedDataset] = {
    d.name: d
    for d in (
        NamedDataset("cifar10", ("cifar10", "cifar10-jpeg", "cifar-10", "CIFAR10"), ("train", "test"), 10),
        NamedDataset("cifar100", ("cifar100", "cifar100-jpeg", "cifar-100", "CIFAR100"), ("train", "test"), 100),
        NamedDataset("stl10", ("stl10", "stl10-jpeg", "stl-10", "STL10"), ("train", "test"), 10),
        NamedDataset(
            "imagenette",
            ("imagenette", "imagenette2", "imagenette128", "imagenette2-160", "imagenette2-320"),
            ("train", "val"),
            10,
        ),
    )
}

_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


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
