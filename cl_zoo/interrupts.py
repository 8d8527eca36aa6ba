"""Ctrl-C held back while a piece of work must not be cut in half.

Python raises ``KeyboardInterrupt`` at whatever bytecode the main thread is running, so a Ctrl-C
that lands inside ``torch.save`` leaves its zip writer half-way (``RuntimeError: [enforce fail at
inline_container.cc]`` from its destructor) and one that lands inside ``optimizer.step()`` leaves
the weights half-updated: neither is a state anyone can continue from. :func:`held_interrupts`
records the Ctrl-C instead and raises it once the block is done, where the state is whole again.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType


@dataclass
class HeldInterrupts:
    """What happened to Ctrl-C inside a :func:`held_interrupts` block."""

    count: int = 0  # Ctrl-Cs received
    forced: bool = False  # a repeated Ctrl-C was let through at once (the block did not finish)


@contextmanager
def held_interrupts(*, second_forces: bool = False) -> Iterator[HeldInterrupts]:
    """Hold SIGINT for the block and raise ``KeyboardInterrupt`` after it if one came.

    ``second_forces``: a second Ctrl-C raises at once, for blocks that may run long (a training
    step on a CPU), so a user who insists is never stuck; ``forced`` then says the block was cut.
    Outside the main thread (where Python delivers no signal) and where SIGINT is ignored or
    handled by someone else, the block runs unchanged.
    """
    held = HeldInterrupts()
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield held
        return

    def hold(_signum: int, _frame: FrameType | None) -> None:
        held.count += 1
        if second_forces and held.count > 1:
            held.forced = True
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, hold)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held.count:
        raise KeyboardInterrupt
