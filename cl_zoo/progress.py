"""Progress of a long loop: a tqdm bar on a terminal, a plain line now and then anywhere else.

A bar redraws itself with carriage returns, which a terminal turns into one line but a log file,
a CI console or ``2> run.log`` keeps as thousands of frames. So the bar is drawn only when stderr
is a terminal; otherwise the same counts and values are printed as an ordinary line every
``CL_ZOO_PROGRESS_EVERY_S`` seconds (30 by default; 0 prints every update).

:meth:`Progress.due` tells the caller when the next update will be shown, so a value that costs
something to read (a loss on the GPU: one host sync) is read only for the updates anyone sees,
and the value shown is the current step's, not one from several steps ago.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Literal, TextIO

EVERY_ENV = "CL_ZOO_PROGRESS_EVERY_S"
LINE_EVERY_S = 30.0
BAR_EVERY_S = 0.5  # how often a bar's values are refreshed (tqdm redraws no faster than 0.1 s)

Mode = Literal["bar", "lines", "off"]


def progress_mode(enabled: bool, stream: TextIO | None = None) -> Mode:
    """``bar`` on a terminal, ``lines`` elsewhere, ``off`` when progress was turned off."""
    if not enabled:
        return "off"
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "lines"


def _line_interval() -> float:
    value = os.environ.get(EVERY_ENV, "")
    try:
        return max(0.0, float(value)) if value else LINE_EVERY_S
    except ValueError:
        return LINE_EVERY_S


class Progress:
    """``update``/``set_postfix``/``close`` like tqdm, drawn as :func:`progress_mode` says."""

    def __init__(self, total: int, *, desc: str, unit: str, enabled: bool = True, initial: int = 0,
                 leave: bool = True, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.mode = progress_mode(enabled, self.stream)
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.postfix: dict[str, Any] = {}
        self.every_s = BAR_EVERY_S if self.mode == "bar" else _line_interval()
        self._shown_at: float | None = None
        self._bar = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=leave,
                             file=self.stream)

    def due(self) -> bool:
        """Whether the next :meth:`update` will be shown (always false when off)."""
        if self.mode == "off":
            return False
        return self._shown_at is None or time.monotonic() - self._shown_at >= self.every_s

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values
        if self._bar is not None:
            self._bar.set_postfix(values, refresh=False)

    def update(self, n: int = 1) -> None:
        show = self.due()
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        if show:
            self._shown_at = time.monotonic()
            if self.mode == "lines":
                values = "".join(f" {k}={v}" for k, v in self.postfix.items())
                print(f"{self.desc}: {self.n}/{self.total} {self.unit}{values}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
