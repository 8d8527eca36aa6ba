"""ImageFolder discovery: one deterministic list of (path, label) for every data source.

Training, k-NN/linear evaluation and the decoded-tensor cache all key on the same list, so the
order must not depend on the filesystem (``os.scandir`` order differs between machines): classes
are sorted by name (torchvision's ImageFolder convention, so label ids agree with it) and files by
their path relative to the class folder. ``file_list_hash`` fingerprints that list so caches built
from one extraction stay valid for another copy of the same data.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cl_zoo.data.archive import extract_archive, is_archive
from cl_zoo.data.images import IMAGE_EXTENSIONS, LinkSafeWalk, is_image_path
from cl_zoo.data.named import NAMED_DATASETS, candidates, default_data_root
from cl_zoo.errors import DataError

SPLIT_NAMES: tuple[str, ...] = ("train", "val", "test")


@dataclass
class ImageFolderData:
    """A labelled image list; ``labels[i]`` indexes ``classes`` and belongs to ``paths[i]``."""

    paths: list[str]
    labels: np.ndarray
    classes: list[str]
    source: str
    file_list_hash: str
    root: str = ""
    split: str | None = None
    class_to_idx: dict[str, int] = field(default_factory=dict)
    repeats: int = 0  # linked folders skipped because their real path was already walked
    # how a subset was drawn from its split ({"of_images": 3925, "drawn": "the first 50 of each class"}),
    # so reports and cards never pass a subset off as the split
    subset: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def labeled(self) -> bool:
        """False for a plain folder of images (no class folders): every label is -1."""
        return bool(self.classes)


def _hidden(name: str) -> bool:
    # Archive tools leave ".DS_Store", "._x.jpg" and "__MACOSX/"; our own cache marker starts with ".".
    return name.startswith(".") or name == "__MACOSX"


def _subdirs(path: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(path) if e.is_dir() and not _hidden(e.name))


def _is_split_layout(path: Path) -> bool:
    dirs = _subdirs(path)
    return bool(dirs) and all(d in SPLIT_NAMES for d in dirs)


def resolve_split_dir(path: Path, split: str | None, label: str | None = None) -> Path:
    """The class-folder directory inside ``path`` for ``split`` (or ``path`` itself).

    Accepts ``path/<class>/...``, ``path/<split>/<class>/...`` and an archive's single wrapping
    folder ``path/<top>/<split>/<class>/...``.
    """
    label = label or str(path)
    dirs = _subdirs(path)
    if len(dirs) == 1 and not _is_split_layout(path) and _is_split_layout(path / dirs[0]):
        path = path / dirs[0]  # an archive that wraps everything in one top folder
    if split is not None:
        if (path / split).is_dir():
            return path / split
        found = ", ".join(_subdirs(path)[:6]) or "nothing"
        raise DataError(f"no '{split}' split folder in {label} (found: {found}); expected <data>/{split}/<class>/<image>")
    if _is_split_layout(path):
        raise DataError(
            f"{label} holds split folders ({', '.join(_subdirs(path))}); choose one with --train-split or --test-split (split=... in Python)"
        )
    return path


def _list_images(class_dir: Path) -> tuple[list[str], int]:
    """Image paths relative to ``class_dir`` (sorted) and how many linked folders were repeats.

    Linked folders are followed once (:class:`~cl_zoo.data.images.LinkSafeWalk`): a link back up
    the tree would otherwise list the same images again, or loop forever.
    """
    found: list[str] = []
    walk = LinkSafeWalk(str(class_dir), hidden=_hidden)
    for dirpath, filenames in walk:
        rel = os.path.relpath(dirpath, class_dir)
        for name in filenames:
            if is_image_path(name):
                found.append(name if rel == "." else os.path.join(rel, name))
    return sorted(found), walk.repeats


def _report_repeats(root: Path, repeats: int) -> None:
    """One warning line when linked folders were skipped, so a shrunken dataset is not silent."""
    if repeats:
        warnings.warn(
            f"{root}: skipped {repeats} linked folder{'s' if repeats != 1 else ''} already walked (symlink repeats or loops)",
            stacklevel=3,
        )


def file_list_hash(relative_paths: list[str], labels: np.ndarray) -> str:
    """sha256 over ``relative_path<TAB>label`` lines: identifies the data independent of location."""
    digest = hashlib.sha256()
    for rel, label in zip(relative_paths, labels.tolist()):
        digest.update(f"{rel.replace(os.sep, '/')}\t{label}\n".encode())
    return digest.hexdigest()


def content_fingerprint(data: ImageFolderData) -> str:
    """``sha256:`` over sorted ``relative_path<TAB>size`` lines of the images.

    Says which data a checkpoint was trained on without shipping it: a subset, a re-encoded copy
    or another folder of the same name gets another fingerprint. (``file_list_hash`` keys caches
    on paths and labels only, so it must not change when a file is re-saved.)
    """
    root = Path(data.root) if data.root else None
    lines = []
    for path in data.paths:
        rel = os.path.relpath(path, root) if root is not None else path
        lines.append(f"{rel.replace(os.sep, '/')}\t{os.stat(path).st_size}\n")
    digest = hashlib.sha256()
    for line in sorted(lines):
        digest.update(line.encode())
    return f"sha256:{digest.hexdigest()}"


def scan_image_folder(directory: str | os.PathLike, *, source: str | None = None, split: str | None = None) -> ImageFolderData:
    """List ``directory/<class>/**/<image>``; every class folder must contain at least one image."""
    root = Path(directory)
    if not root.exists():
        raise DataError(f"image folder not found: {root}")
    if not root.is_dir():
        raise DataError(f"not a folder: {root} (expected an ImageFolder directory or a .tar/.tar.gz/.tgz/.zip archive)")
    entries = [e for e in os.listdir(root) if not _hidden(e)]
    if not entries:
        raise DataError(f"empty folder: {root}")
    classes = _subdirs(root)
    if not classes:
        raise DataError(f"no class folders in {root}: expected {root}/<class>/<image> (ImageFolder layout)")
    paths: list[str] = []
    rel_paths: list[str] = []
    labels: list[int] = []
    repeats = 0
    for idx, cls in enumerate(classes):
        images, skipped = _list_images(root / cls)
        repeats += skipped
        if not images:
            raise DataError(f"class folder without images: {root / cls} (extensions: {', '.join(sorted(IMAGE_EXTENSIONS))})")
        for rel in images:
            rel_paths.append(os.path.join(cls, rel))
            paths.append(str(root / cls / rel))
        labels.extend([idx] * len(images))
    label_arr = np.asarray(labels, dtype=np.int64)
    _report_repeats(root, repeats)
    return ImageFolderData(
        paths=paths,
        labels=label_arr,
        classes=classes,
        source=source if source is not None else str(root),
        file_list_hash=file_list_hash(rel_paths, label_arr),
        root=str(root),
        split=split,
        class_to_idx={c: i for i, c in enumerate(classes)},
        repeats=repeats,
    )


def scan_unlabeled_folder(directory: str | os.PathLike, *, source: str | None = None, split: str | None = None) -> ImageFolderData:
    """Every image under ``directory`` at any depth, without labels (no classes, every label -1).

    Self-supervised training needs no labels, and a flat or nested folder of photos is its common
    input; only the optional kNN monitor needs class folders.
    """
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"image folder not found: {root}")
    if not any(not _hidden(e) for e in os.listdir(root)):
        raise DataError(f"empty folder: {root}")
    rel_paths, repeats = _list_images(root)
    _report_repeats(root, repeats)
    if not rel_paths:
        raise DataError(f"no images in {root} (extensions: {', '.join(sorted(IMAGE_EXTENSIONS))})")
    labels = np.full(len(rel_paths), -1, dtype=np.int64)
    return ImageFolderData(
        paths=[str(root / rel) for rel in rel_paths],
        labels=labels,
        classes=[],
        source=source if source is not None else str(root),
        file_list_hash=file_list_hash(rel_paths, labels),
        root=str(root),
        split=split,
        repeats=repeats,
    )


def _is_class_layout(folder: Path) -> bool:
    """Sub-folders and no loose images beside them (an ImageFolder scan would drop those silently)."""
    entries = [e for e in os.scandir(folder) if not _hidden(e.name)]
    return any(e.is_dir() for e in entries) and not any(e.is_file() and is_image_path(e.name) for e in entries)


def open_image_folder(
    spec: str | os.PathLike,
    root: str | os.PathLike | None = None,
    split: str | None = None,
    require_labels: bool = True,
) -> ImageFolderData:
    """Open a folder, an archive of one, or a named dataset (``cifar10``, ``imagenette``, ...).

    ``root`` is only used for named datasets (where to look; see :mod:`cl_zoo.data.named`).
    ``require_labels=False`` (pretraining) also accepts a flat or nested folder of images that is
    not an ImageFolder: it comes back unlabeled (:func:`scan_unlabeled_folder`).
    """
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if text.lower() in NAMED_DATASETS and not path.exists():
        return open_named_dataset(text.lower(), root=root, split=split)
    if not path.exists():
        hint = f" (or one of the named datasets: {', '.join(sorted(NAMED_DATASETS))})" if os.sep not in text else ""
        raise DataError(f"data not found: {path}{hint}")
    if path.is_file():
        if not is_archive(path):
            raise DataError(f"not an image folder or archive: {path} (expected a directory or .tar/.tar.gz/.tgz/.zip)")
        path = extract_archive(path)
    folder = resolve_split_dir(path, split, label=text)
    if require_labels:
        return scan_image_folder(folder, source=text, split=split)
    if _is_class_layout(folder):
        try:
            return scan_image_folder(folder, source=text, split=split)
        except DataError:
            pass  # e.g. a sub-folder without images: a nested photo collection, not classes
    return scan_unlabeled_folder(folder, source=text, split=split)


def open_named_dataset(name: str, root: str | os.PathLike | None = None, split: str | None = None):
    """Resolve a named dataset's ``split`` (default ``train``) under ``root`` to an ImageFolderData."""
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
    for cand in candidates(ds, base, split):
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
