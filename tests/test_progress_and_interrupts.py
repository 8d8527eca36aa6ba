"""The shared helpers for long loops: progress drawn as a bar only on a terminal, and Ctrl-C held
back while a write or a training step must not be cut in half."""

from __future__ import annotations

import io
import os
import signal

import pytest

from cl_zoo.interrupts import held_interrupts
from cl_zoo.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_progress_is_plain_lines(monkeypatch):
    monkeypatch.setenv("CL_ZOO_PROGRESS_EVERY_S", "0")
    log = io.StringIO()
    bar = Progress(3, desc="detect", unit="it", stream=log)
    for loss in (2.5, 2.25, 2.0):
        assert bar.due()
        bar.set_postfix(loss=loss)
        bar.update(1)
    bar.close()
    assert log.getvalue() == "detect: 1/3 it loss=2.5\ndetect: 2/3 it loss=2.25\ndetect: 3/3 it loss=2.0\n"


def test_lines_come_every_interval_and_nothing_when_off(monkeypatch):
    monkeypatch.delenv("CL_ZOO_PROGRESS_EVERY_S", raising=False)
    log = io.StringIO()
    bar = Progress(100, desc="epoch 1/1", unit="steps", stream=log)
    for _ in range(100):
        bar.update(1)
    assert log.getvalue() == "epoch 1/1: 1/100 steps\n"  # the first, then one per 30 s
    quiet = io.StringIO()
    off = Progress(5, desc="x", unit="it", enabled=False, stream=quiet)
    off.update(5)
    assert not off.due() and quiet.getvalue() == ""


def test_on_a_terminal_it_is_a_tqdm_bar():
    screen = _Terminal()
    bar = Progress(2, desc="epoch 1/2", unit="steps", stream=screen)
    bar.set_postfix(loss="1.0000")
    bar.update(2)
    bar.close()
    assert "\r" in screen.getvalue() and "2/2" in screen.getvalue() and "loss=1.0000" in screen.getvalue()


@pytest.fixture
def ctrl_c():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield lambda: os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_held_ctrl_c_is_raised_after_the_block(ctrl_c):
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with held_interrupts() as held:
            ctrl_c()
            ctrl_c()
            finished.append(True)  # the block runs to its end
    assert finished == [True] and held.count == 2 and not held.forced
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_forces_when_asked(ctrl_c):
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with held_interrupts(second_forces=True) as held:
            ctrl_c()
            finished.append("first held")
            ctrl_c()
            finished.append("never")
    assert finished == ["first held"] and held.forced
    with held_interrupts() as quiet:  # no Ctrl-C: nothing raised
        pass
    assert quiet.count == 0
