"""Image file -> uint8 pixels exactly as the model was trained to see them.

Preprocessing comes from ``model.pretrained_cfg`` (shorter side to ``resize_size`` with the
model's interpolation, centre crop to ``input_size``), so features match training. DataLoader
workers decode JPEGs in draft mode (DCT-scaled) and resample only the region that survives the
centre crop, then hand back uint8 arrays: a quarter of the bytes of float32; the float conversion
and normalisation happen once per batch on the device.

Images come from three places: local files (streamed to PIL), URLs (read through fsspec by
:func:`cl_zoo.embedding.inputs.read_bytes`, bounded by ``MAX_IMAGE_BYTES``) and WebDataset tar
shards, which :class:`TarBatches` streams into samples and hands over already batched, one shard
per DataLoader worker, so a shard is read once, front to back.

Samples are grouped by webdataset's own ``group_by_keys`` (so a key means what it means to
``webdataset.WebDataset``), but the members come from :func:`tar_members`, not webdataset's
``tar_file_iterator``: that one reads every member whole into memory before anyone can look at its
size, so a shard with one 20 GB member (or a ``.txt`` that claims to be one) takes 20 GB before our
``MAX_IMAGE_BYTES`` check runs. A tar header declares each member's size; :func:`tar_members` reads
only image members within the bound and passes the others over in tarfile's fixed-size blocks.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from cl_zoo.data.images import ImageDecodeError, decode_image, load_image
from cl_zoo.embedding.inputs import MAX_IMAGE_BYTES, ReadError, is_url, open_input, read_bytes
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.optional import require

_INTERPOLATION = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


@dataclass(frozen=True)
class Preprocess:
    """Shorter side to ``resize_size``, centre crop ``crop_size`` (h, w); returns uint8 HWC RGB.

    Equivalent to torchvision's ``Resize(resize_size)`` + ``CenterCrop(crop_size)`` (same output
    geometry, same antialiased filter), but only the pixels inside the crop are resampled.
    """

    resize_size: int
    crop_size: tuple[int, int]
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)

    @classmethod
    def from_model(cls, model: nn.Module) -> "Preprocess":
        cfg = getattr(model, "pretrained_cfg", None)
        if cfg is None:
            raise ClZooError(
                f"{type(model).__name__} has no pretrained_cfg (preprocessing); build it with "
                "cl_zoo.create_model or load it with cl_zoo.load_model"
            )
        if cfg.interpolation not in _INTERPOLATION:
            raise ClZooError(f"unsupported interpolation {cfg.interpolation!r} in the model's pretrained_cfg")
        _, h, w = cfg.input_size
        return cls(
            resize_size=int(cfg.resize_size),
            crop_size=(int(h), int(w)),
            interpolation=cfg.interpolation,
            mean=tuple(float(m) for m in cfg.mean),  # type: ignore[arg-type]
            std=tuple(float(s) for s in cfg.std),  # type: ignore[arg-type]
        )

    @property
    def min_short_side(self) -> int:
        return max(self.resize_size, *self.crop_size)

    def __call__(self, img: Image.Image) -> np.ndarray:
        w, h = img.size
        ch, cw = self.crop_size
        size = self.resize_size
        # torchvision's Resize(int): the shorter side becomes `size`, the longer one is truncated.
        if w <= h:
            rw, rh = size, int(size * h / w)
        else:
            rw, rh = int(size * w / h), size
        resample = _INTERPOLATION[self.interpolation]
        if rw < cw or rh < ch:
            # Crop larger than the resized image: torchvision pads with black; do the same.
            resized = img.resize((rw, rh), resample)
            canvas = Image.new("RGB", (max(rw, cw), max(rh, ch)))
            canvas.paste(resized, ((canvas.width - rw) // 2, (canvas.height - rh) // 2))
            img, w, h, rw, rh = canvas, canvas.width, canvas.height, canvas.width, canvas.height
        left = int(round((rw - cw) / 2.0))
        top = int(round((rh - ch) / 2.0))
        sx, sy = w / rw, h / rh
        box = (left * sx, top * sy, (left + cw) * sx, (top + ch) * sy)
        out = img.resize((cw, ch), resample, box=box) if (rw, rh) != (w, h) or (cw, ch) != (w, h) else img
        return np.asarray(out, dtype=np.uint8)


class ImageList(torch.utils.data.Dataset):
    """Index -> (index, uint8 HWC array or None, failure reason).

    A reference is a local path (decoded from the file) or a URL (read through fsspec, refused past
    ``MAX_IMAGE_BYTES``): a missing, unreachable or oversized image is a failure reason, never an
    exception, so one bad entry among millions skips one row.
    """

    def __init__(self, paths: Sequence[str], preprocess: Preprocess) -> None:
        self.paths = paths
        self.preprocess = preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | None, str]:
        ref = self.paths[index]
        try:
            if is_url(ref):
                img = decode_image(read_bytes(ref, MAX_IMAGE_BYTES), ref, self.preprocess.min_short_side)
            else:
                img = load_image(ref, self.preprocess.min_short_side)
            return index, self.preprocess(img), ""
        except (ImageDecodeError, ReadError) as exc:
            return index, None, exc.reason
        except Exception as exc:  # noqa: BLE001 - a codec bug on one file must not end the run
            return index, None, f"decode error ({type(exc).__name__}: {exc})"


def collate_images(items: list[tuple[int, np.ndarray | None, str]]) -> tuple[list[int], torch.Tensor | None, list[tuple[int, str]]]:
    ok = [(i, a) for i, a, _ in items if a is not None]
    failed = [(i, r) for i, a, r in items if a is None]
    pixels = stack_pixels([a for _, a in ok]) if ok else None
    return [i for i, _ in ok], pixels, failed


def stack_pixels(arrays: Sequence[np.ndarray]) -> torch.Tensor:
    """One uint8 NHWC batch of same-shaped HWC arrays.

    In a DataLoader worker the batch is stacked straight into shared memory (as torch's own
    ``default_collate`` does), so handing it to the main process moves a file descriptor instead
    of copying the batch once more into shared memory on the way out.
    """
    shape = (len(arrays), *arrays[0].shape)
    if torch.utils.data.get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))  # uint8: one byte per element
        out = torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)
    else:
        out = torch.empty(shape, dtype=torch.uint8)
    np.stack(arrays, out=out.numpy())
    return out


def decode_images(paths: Sequence[str], preprocess: Preprocess, workers: int = 0) -> np.ndarray:
    """uint8 NHWC pixels of the ``paths`` that decode (in order), preprocessed as for embedding."""
    loader = torch.utils.data.DataLoader(
        ImageList(list(paths), preprocess), batch_size=64, num_workers=min(workers, max(1, len(paths) // 64)),
        collate_fn=collate_images,
    )
    parts = [pixels.numpy() for _, pixels, _ in loader if pixels is not None]
    h, w = preprocess.crop_size
    return np.concatenate(parts) if parts else np.zeros((0, h, w, 3), np.uint8)


# The image of a WebDataset sample: the first of these extensions the sample has (webdataset's
# own convention for "the image of a sample", as in its ``to_tuple("jpg;png")``).
DEFAULT_IMAGE_KEY = "jpg;jpeg;png;webp"

# (shard index, sample keys of the decoded images, their uint8 NHWC pixels or None,
#  (key, reason) failures, whether this is the shard's last batch)
# (shard, keys, pixels, failures, last, ordinals): ordinals[i] is keys[i]'s position among the tar's samples
TarBatch = tuple[int, list[str], torch.Tensor | None, list[tuple[str, str]], bool, list[int]]


def parse_image_key(image_key: str) -> tuple[str, ...]:
    """``"jpg;jpeg;png"`` -> ``("jpg", "jpeg", "png")``: lower-cased, leading dots dropped."""
    keys = tuple(k.strip().lstrip(".").lower() for k in image_key.split(";") if k.strip().lstrip("."))
    if not keys:
        raise DataError(f"image key {image_key!r} names no extension (for example {DEFAULT_IMAGE_KEY})")
    return keys


class ShardError(DataError):
    """A WebDataset shard that cannot be read to its end: one line naming the shard and the damage.

    A DataLoader worker hands its exception to the main process as ``type(exc)(text)``, the text
    being "Caught ShardError in DataLoader worker process N" followed by the worker's traceback.
    This constructor recognises that text and keeps only the original line (the traceback's last
    line, ``<module>.ShardError: <message>``), so the CLI prints one line wherever the shard was read.
    """

    def __init__(self, message: str) -> None:
        if "\n" in message:
            marker = f"{ShardError.__module__}.{ShardError.__qualname__}: "
            lines = [line for line in message.splitlines() if line.startswith(marker)]
            message = lines[-1][len(marker):] if lines else " ".join(message.split())
        super().__init__(message)


@dataclass(frozen=True)
class OversizedMember:
    """Stands in a sample for an image member whose header declares more than ``MAX_IMAGE_BYTES``."""

    size: int


# The members webdataset's tar_file_iterator skips: "__key__"-style metadata at the top level and
# anything matching its skip_meta pattern.
_SKIP_META = re.compile(r"__[^/]*__($|/)")

# The largest tar header record read: a GNU long name or link ('L'/'K') or a pax header ('x'/'g'/'X')
# is read whole by tarfile, before the member it describes and before any member bound could see
# it (a small .tar.gz declaring a 512 MiB long name would cost a gigabyte or more). Real ones
# hold a path or a few keywords; 1 MiB is far above them and far below MAX_IMAGE_BYTES.
MAX_TAR_HEADER_BYTES: int = 1 << 20
_HEADER_RECORDS = {tarfile.GNUTYPE_LONGNAME: "GNU long-name", tarfile.GNUTYPE_LONGLINK: "GNU long-link",
                   tarfile.XHDTYPE: "pax", tarfile.XGLTYPE: "pax global", tarfile.SOLARIS_XHDTYPE: "pax (Solaris)"}


class OversizedTarHeader(DataError):
    """A tar header record declares more than :data:`MAX_TAR_HEADER_BYTES`; nothing of it was read."""


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's member header, refusing an oversized header record before tarfile reads it."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        kind = _HEADER_RECORDS.get(self.type)
        if kind is not None and self.size > MAX_TAR_HEADER_BYTES:
            raise OversizedTarHeader(f"a {kind} header record declares {self.size} bytes, more than the "
                                     f"{MAX_TAR_HEADER_BYTES} a tar header may hold")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def tar_members(
    fh: IO[bytes], url: str, image_keys: Sequence[str], note: Callable[[str], object] = lambda name: None,
) -> Iterator[dict[str, Any]]:
    """A tar stream's regular members as webdataset's ``{"fname", "data", "__url__"}`` records.

    The same members, in the same order, as ``webdataset.tariterators.tar_file_iterator``, so
    ``group_by_keys`` forms the same samples; what differs is what gets read. An image member (its
    extension one of ``image_keys``) is read when its header declares at most ``MAX_IMAGE_BYTES``
    and is an :class:`OversizedMember` otherwise; any other member's data is ``b""``, never read
    (``group_by_keys`` drops it anyway: only image extensions are kept). ``note`` hears each member's
    name before its data is touched, so damage can be placed.
    """
    require("webdataset", "reading WebDataset tar shards")
    from webdataset.tariterators import base_plus_ext

    keys = {k.lower() for k in image_keys}
    with tarfile.open(fileobj=fh, mode="r|*", tarinfo=_BoundedTarInfo) as stream:
        for info in stream:
            name = info.name
            if not info.isreg() or ("/" not in name and name.startswith("__") and name.endswith("__")) or _SKIP_META.match(name):
                continue
            note(name)
            suffix = base_plus_ext(name)[1]
            data: bytes | OversizedMember = b""
            if suffix is not None and suffix.lower() in keys:
                if info.size > MAX_IMAGE_BYTES:
                    data = OversizedMember(info.size)
                else:
                    data = stream.extractfile(info).read()  # type: ignore[union-attr]  # a regular member
            yield {"fname": name, "data": data, "__url__": url}
            stream.members = []  # stream mode would otherwise keep every TarInfo of the shard


def _damage(ref: str, member: str | None, exc: BaseException) -> str:
    """One line for an exception raised while opening or streaming a shard."""
    if isinstance(exc, ReadError):
        return f"cannot read WebDataset shard {ref}: {exc.reason}"
    # webdataset appends " @ <stream repr>" to the first argument, and (stream, url) to the rest.
    text = str(exc.args[0]).partition(" @ ")[0] if exc.args else ""
    text = " ".join(text.split())[:200] or type(exc).__name__
    if type(exc).__module__ == "tarfile" or isinstance(exc, EOFError):
        text += ": truncated or not a tar"
    where = f"at or after its member {member}" if member is not None else "before its first member"
    return f"WebDataset shard {ref} is damaged {where} ({text}); re-create it or leave it out"


class TarBatches(torch.utils.data.IterableDataset):
    """WebDataset shards -> pre-batched :data:`TarBatch` tuples, each shard read once, in order.

    ``tars`` are ``(shard_index, path_or_url)`` pairs; the shard at position ``p`` of that list is
    read by DataLoader worker ``p % num_workers`` (all of them without workers), so
    ``DataLoader(TarBatches(...), batch_size=None, num_workers=W)`` reads every shard exactly once
    and keeps each shard's batches in order, while batches of different shards interleave. A batch
    holds up to ``batch_size`` samples: the keys and pixels of those whose image decoded, in tar
    order (with ``ordinals``, each one's position among the shard's samples, failed ones counted),
    and ``(key, reason)`` for those without a readable one (no ``image_key`` extension, an
    undecodable or oversized image). Every shard ends with one batch whose ``last`` is True, empty
    for a shard without samples, so a consumer can record the shard as done.

    Samples are grouped and named by webdataset's ``group_by_keys`` (a key is a member name up to
    its first dot), so keys mean what they mean to ``webdataset.WebDataset``; the members come from
    :func:`tar_members`, which reads only image members within ``MAX_IMAGE_BYTES``, one sample at a
    time. A shard that cannot be opened or is damaged (a truncated or corrupt tar) raises
    :class:`ShardError` rather than reporting the rest of the shard as a failure: how many samples
    were lost is unknown, and a run that quietly finishes without them would look complete. The message names the member where reading
    stopped; batches yielded before stand, but the sample being assembled there is lost with the
    rest (webdataset knows a sample is complete only when the next one begins). A tar cut exactly
    between two members cannot be told from a complete one: tar records no length.
    """

    def __init__(
        self,
        tars: Sequence[tuple[int, str]],
        preprocess: Preprocess,
        batch_size: int = 64,
        image_key: str = DEFAULT_IMAGE_KEY,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.tars = [(int(i), str(ref)) for i, ref in tars]
        self.preprocess = preprocess
        self.batch_size = batch_size
        self.image_keys = parse_image_key(image_key)

    def __iter__(self) -> Iterator[TarBatch]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for position, (shard, ref) in enumerate(self.tars):
            if position % workers == worker:
                yield from self.shard_batches(shard, ref)

    def _decode(self, ref: str, sample: dict[str, Any]) -> np.ndarray | str:
        """The sample's preprocessed image, or why it has none."""
        ext = next((e for e in self.image_keys if e in sample), None)
        if ext is None:
            return f"no image ({';'.join(self.image_keys)}) in the sample"
        data = sample[ext]
        size = data.size if isinstance(data, OversizedMember) else len(data)
        if size > MAX_IMAGE_BYTES:
            return f"image of {size >> 20} MiB, larger than the {MAX_IMAGE_BYTES >> 20} MiB limit"
        try:
            return self.preprocess(decode_image(data, f"{ref}:{sample['__key__']}.{ext}", self.preprocess.min_short_side))
        except ImageDecodeError as exc:
            return exc.reason
        except Exception as exc:  # noqa: BLE001 - a codec bug on one image must not end the run
            return f"decode error ({type(exc).__name__}: {exc})"

    def shard_batches(self, shard: int, ref: str) -> Iterator[TarBatch]:
        """The batches of one shard, the last one flagged; :class:`ShardError` if it is damaged."""
        require("webdataset", "reading WebDataset tar shards")
        from webdataset.tariterators import group_by_keys

        try:
            fh = open_input(ref)
        except ReadError as exc:
            raise ShardError(_damage(ref, None, exc)) from None
        keys: list[str] = []
        arrays: list[np.ndarray] = []
        failures: list[tuple[str, str]] = []
        ordinals: list[int] = []
        seen = 0
        member: list[str] = []  # the member webdataset last began to read, to say where damage is

        def note(name: str) -> str:
            member[:] = [name]
            return name

        with fh:
            files = tar_members(fh, ref, self.image_keys, note)
            samples = group_by_keys(files, suffixes=set(self.image_keys))
            while True:
                try:
                    sample = next(samples)
                except StopIteration:
                    break
                except Exception as exc:  # noqa: BLE001 - tarfile, gzip, network: all mean a damaged shard
                    raise ShardError(_damage(ref, member[0] if member else None, exc)) from None
                # A full batch goes out only once another sample exists, so `last` is never
                # followed by an empty batch, and an empty shard still gets its one batch.
                if len(keys) + len(failures) >= self.batch_size:
                    yield _tar_batch(shard, keys, arrays, failures, ordinals, last=False)
                    keys, arrays, failures, ordinals = [], [], [], []
                key = str(sample["__key__"])
                decoded = self._decode(ref, sample)
                if isinstance(decoded, str):
                    failures.append((key, decoded))
                else:
                    keys.append(key)
                    arrays.append(decoded)
                    ordinals.append(seen)
                seen += 1
        yield _tar_batch(shard, keys, arrays, failures, ordinals, last=True)


def _tar_batch(shard: int, keys: list[str], arrays: list[np.ndarray], failures: list[tuple[str, str]], ordinals: list[int], *,
               last: bool) -> TarBatch:
    pixels = stack_pixels(arrays) if arrays else None
    return shard, keys, pixels, failures, last, ordinals
