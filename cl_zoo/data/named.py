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

from cl_zoo.errors import DataError


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


def _candidates(ds: NamedDataset, root: Path, split: str) -> list[Path]:
    found: list[Path] = []
    for stem in ds.folders:
        found.append(root / stem)
        for suffix in _ARCHIVE_SUFFIXES:
            found.append(root / f"{stem}-{split}{suffix}")  # per-split archives, e.g. imagenette128-val.tar.gz
            found.append(root / f"{stem}{suffix}")
    found.append(root)  # root may itself be the dataset folder
    return found


def open_named_dataset(name: str, root: str | os.PathLike | None = None, split: str | None = None):
    """Resolve a named dataset's ``split`` (default ``train``) under ``root`` to an ImageFolderData."""
    from cl_zoo.data.archive import extract_archive
    from cl_zoo.data.folder import scan_image_folder

    key = name.lower()
    if key not in NAMED_DATASETS:
        raise DataError(f"unknown dataset {name!r}; named datasets: {', '.join(sorted(NAMED_DATASETS))}")
    ds = NAMED_DATASETS[key]
    split = split or "train"
    if split not in ds.splits:
        raise DataError(f"{ds.name} has splits {', '.join(ds.splits)}, not {split!r}")
    base = Path(root).expanduser() if root is not None else default_data_root()
    tried: list[str] = []
    mismatched: list[str] = []
    for cand in _candidates(ds, base, split):
        if cand.is_file():
            folder = extract_archive(cand)
        elif cand.is_dir():
            folder = cand
        else:
            continue
        tried.append(str(cand))
        subs = [folder / split]
        if cand != base:  # an archive or folder may wrap its splits in one top folder
            subs += [p / split for p in sorted(folder.iterdir()) if p.is_dir() and not p.name.startswith(".")]
        for sub in subs:
            if not sub.is_dir():
                continue
            data = scan_image_folder(sub, source=f"{ds.name}:{split}", split=split)
            if data.num_classes == ds.num_classes:
                return data
            mismatched.append(f"{sub} has {data.num_classes} classes")
    looked = ", ".join(tried) if tried else f"{base}/{{{','.join(ds.folders[:2])}}}[.tar.gz]"
    extra = f"; rejected: {'; '.join(mismatched)} ({ds.name} has {ds.num_classes})" if mismatched else ""
    raise DataError(
        f"{ds.name} ({split}) not found under {base} (looked at {looked}{extra}); expected "
        f"<root>/{ds.folders[0]}/{split}/<class>/<image> or an archive <root>/{ds.folders[1]}.tar.gz of that layout "
        f"(cl-zoo does not download; pass --data-root or set CL_ZOO_DATA)"
    )
