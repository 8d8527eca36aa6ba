"""``EngineOptions``: how images become features, declared once for every embedding entry point.

``extract_features``, ``extract_tar_features``, ``embed_tars_to_shards``, ``embed_to_shards``,
``cl_zoo.embed`` and ``cl-zoo embed`` all take the same engine settings (precision, backend,
device, batch size, decode workers, int8 calibration). Each used to re-declare them with its own
defaults (``extract_features`` said fp32/torch, the others auto/auto), so the same call gave
different engines depending on the door it came through. Now each takes ``options=`` and its old
keyword arguments, which default to ``None`` = "whatever ``options`` says", and
:meth:`EngineOptions.merge` resolves them against the one set of defaults below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # torch only for the annotation: this module is imported by the CLI before torch is needed
    import torch


@dataclass(frozen=True)
class EngineOptions:
    """The engine settings; the defaults are the CLI's (``auto`` picks what this machine runs fastest).

    ``workers=None`` starts one decode process per usable core, at most 8 (why so many is
    measured in :func:`cl_zoo.embedding.extract.run_batches`); ``calibration=None`` calibrates int8 on the
    images being embedded; ``calibration_size=None`` is :data:`cl_zoo.backends.int8.CALIBRATION_SIZE`.
    """

    precision: str = "auto"
    backend: str = "auto"
    device: "str | torch.device" = "auto"
    batch_size: int = 64
    workers: int | None = None
    fuse: bool = True
    calibration: Sequence[str] | None = None
    calibration_size: int | None = None
    calibration_seed: int = 0
    force_int8: bool = False

    @classmethod
    def merge(cls, options: "EngineOptions | None" = None, **given: Any) -> "EngineOptions":
        """``options`` (default: the defaults) with every keyword that is not ``None`` put over it.

        Entry points pass their keyword arguments straight through, so an old call such as
        ``extract_features(m, paths, precision="bf16")`` means what it meant, and a call that
        passes neither keyword nor ``options`` gets the defaults above.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - fields)
        if unknown:
            raise TypeError(f"EngineOptions has no field {', '.join(unknown)}")
        changes = {k: v for k, v in given.items() if v is not None}
        base = options if options is not None else cls()
        return dataclasses.replace(base, **changes) if changes else base


# What ``extract_features`` runs when neither ``options`` nor precision/backend are given: fp32 on
# torch, bit-exact on every machine. k-NN and linear evaluation embed through it, and their reports
# must mean the same on an AMX laptop and a GPU server; ``cl_zoo.embed`` and ``cl-zoo embed`` (the
# user-facing doors) take the ``auto`` defaults of EngineOptions.
EXACT = EngineOptions(precision="fp32", backend="torch")


@dataclass(frozen=True)
class RunControl:
    """How a run treats earlier progress and reports itself, whatever its inputs and output: what
    ``--resume``, ``--force``, ``--no-progress`` and ``--save-every`` set, declared once."""

    resume: bool = False
    force: bool = False
    progress: bool = False
    chunk_batches: int | None = None  # batches per progress part (--save-every); None: about 1,024 images
    max_batches: int | None = None  # stop with KeyboardInterrupt after this many batches (how tests interrupt a run)


__all__ = ["EXACT", "EngineOptions", "RunControl"]
