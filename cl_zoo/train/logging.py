"""Run logs: a CSV per epoch, TensorBoard scalars per step, and a loss/accuracy curve at the end.

Only the main rank constructs a :class:`RunLogger`. The CSV is the durable record (it survives a
resume: rows past the resumed epoch are dropped so a re-run epoch is not counted twice);
TensorBoard and the curve (matplotlib) are optional (``cl-zoo[train]``): without their packages the
run goes on, and says once which of them is off and which extra brings it.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Mapping

from cl_zoo.eval import plots
from cl_zoo.fileio import atomic_path
from cl_zoo.optional import is_installed, missing_message

CSV_NAME = "metrics.csv"
CURVE_NAME = "curves.png"


class RunLogger:
    """Epoch rows to ``metrics.csv``, step scalars to TensorBoard under ``RUN_DIR/tb``."""

    def __init__(self, run_dir: str | os.PathLike[str], *, resume_epoch: int = 0, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.csv_path = self.run_dir / CSV_NAME
        self.rows: list[dict[str, Any]] = []
        if self.csv_path.is_file():
            with open(self.csv_path, newline="") as fh:
                self.rows = [
                    {k: _parse(v) for k, v in row.items()}
                    for row in csv.DictReader(fh)
                    if int(float(row.get("epoch") or 0)) <= resume_epoch
                ]
        self._rewrite()
        self.tb = None
        if tensorboard and not is_installed("tensorboard"):
            print(f"{missing_message('tensorboard', 'TensorBoard logging', extra='train')}; the run goes on without it", flush=True)
        elif tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=None)
            except ImportError:
                self.tb = None

    def log_step(self, step: int, values: Mapping[str, float]) -> None:
        if self.tb is not None:
            for key, value in values.items():
                self.tb.add_scalar(f"train/{key}", float(value), step)

    def log_epoch(self, epoch: int, values: Mapping[str, Any]) -> None:
        row = {"epoch": epoch, **{k: _plain(v) for k, v in values.items()}}
        self.rows = [r for r in self.rows if r.get("epoch") != epoch] + [row]
        self._rewrite()
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.tb.add_scalar(f"epoch/{key}", float(value), epoch)
            self.tb.flush()

    def _rewrite(self) -> None:
        """Rewrite the whole CSV atomically: columns can appear later (the first kNN epoch)."""
        if not self.rows:
            return
        columns: list[str] = []
        for row in self.rows:
            columns += [k for k in row if k not in columns]
        with atomic_path(self.csv_path) as tmp, open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: row.get(k, "") for k in columns})

    def plot(self, title: str = "") -> Path | None:
        """Loss (left axis) and kNN accuracy (right axis) per epoch as ``curves.png``."""
        if not self.rows:
            return None
        if not is_installed("matplotlib"):
            print(f"{missing_message('matplotlib', CURVE_NAME, extra='train')}; the model is exported without it", flush=True)
            return None
        return plots.save_figure(plots.training_curves_figure(self.rows, title), self.run_dir / CURVE_NAME)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _parse(text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    return value
