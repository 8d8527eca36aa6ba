"""An epoch's per-step numbers kept on the training device and read on the host only at flushes.

Why: every ``.item()``, ``float(t)``, ``.tolist()`` or ``if tensor:`` on a CUDA value makes the
host wait until the GPU has finished all queued work, so a loop that reads its loss every step
(to print it, or to stop on NaN) cannot queue the next step while the GPU runs the current one.
The trainer therefore records each step's loss and statistics here with device operations only,
and flushes (one transfer of everything pending) on the steps it logs, before a checkpoint and at
the end of the epoch. A non-finite loss is still found, with its exact step: the steps since the
last flush are all read back, so the first bad one is named; the run stops at the next flush
(at most :data:`LOG_EVERY` steps later) and before any checkpoint could store the damage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

# Steps between the trainer's step logs (TensorBoard scalars, the progress bar's loss) and so
# between host reads of the loss; the first step of each epoch is logged too.
LOG_EVERY = 10


def is_log_step(step_in_epoch: int, global_step: int) -> bool:
    """Whether the step just finished (``global_step`` counts it) is logged.

    The same rule on every rank, so all ranks flush together and a NaN stops them at the same step."""
    return step_in_epoch == 0 or global_step % LOG_EVERY == 0


@dataclass
class Flush:
    """What one flush read: the losses of the steps since the previous flush, and named scalars."""

    first_step: int  # step index (in the epoch) of ``losses[0]``
    losses: list[float]
    values: dict[str, float] = field(default_factory=dict)

    def first_non_finite(self) -> tuple[int, float] | None:
        """(step index in the epoch, loss) of the first NaN/inf loss read, or None."""
        for offset, value in enumerate(self.losses):
            if not math.isfinite(value):
                return self.first_step + offset, value
        return None


class StepTally:
    """Per-step losses, their sum and the mean positive-pair cosine of one epoch, on the device."""

    def __init__(self, device: torch.device, steps_per_epoch: int, start_step: int = 0,
                 loss_sum: Tensor | None = None) -> None:
        self.losses = torch.zeros(steps_per_epoch, device=device, dtype=torch.float32)
        self.loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        if loss_sum is not None:  # a resumed epoch's sum so far
            self.loss_sum += loss_sum.to(device, torch.float64)
        self.pos_sum = torch.zeros((), device=device, dtype=torch.float64)
        self.pos_count = 0
        self.unread = start_step  # first step index whose loss the host has not read yet
        self.recorded = start_step  # steps recorded so far (index of the next one)

    def record(self, step: int, loss: Tensor, logs: dict[str, Tensor]) -> None:
        """Keep step ``step``'s (all-reduced, detached) loss and its ``pos_sim``: device work only."""
        self.losses[step] = loss
        self.loss_sum += loss.double()
        pos = logs.get("pos_sim")
        if pos is not None:
            self.pos_sum += pos.double()
            self.pos_count += 1
        self.recorded = step + 1

    def flush(self, values: dict[str, Tensor] | None = None) -> Flush:
        """Read the unread losses and ``values`` (0-d tensors) in one device-to-host transfer."""
        values = values or {}
        window = self.losses[self.unread : self.recorded]
        parts = [window.double()] + [v.detach().reshape(1).to(window.device, torch.float64) for v in values.values()]
        flat = torch.cat(parts).tolist()
        n = window.shape[0]
        out = Flush(self.unread, flat[:n], dict(zip(values, flat[n:])))
        self.unread = self.recorded
        return out

    def epoch_end(self) -> Flush:
        """The last flush of the epoch: the remaining losses plus ``loss_sum`` and ``pos_sum``."""
        return self.flush({"loss_sum": self.loss_sum, "pos_sum": self.pos_sum})

    def mean_pos_sim(self, flushed: Flush) -> float | None:
        """The epoch's mean positive-pair cosine from :meth:`epoch_end`'s read (None if not logged)."""
        return flushed.values["pos_sum"] / self.pos_count if self.pos_count else None
