"""Keep a thread's alternate signal stack valid around OpenVINO's compiled models.

OpenVINO 2026.4's CPU plugin gives the thread that compiles a model an alternate signal stack of its
own (20,144 bytes on the 2-core AMX Xeon, where signal frames carry the AMX tile state). When the
compiled model is destroyed, the plugin puts back the stack the thread had before. Two compiled
models released in the order they were made leave the thread on the first one's stack, which was
freed with it. Python installs every signal handler with ``SA_ONSTACK``. So the next signal with a
Python handler makes the kernel write its frame into freed memory; SIGCHLD is such a signal once
torch's DataLoader has run with workers, since it installs a handler for it. Two outcomes were seen:
- SIGSEGV from the kernel: pytest was killed in ``close()``/``poll()`` of a subprocess;
- silent corruption where the memory had been reused: a later crash in a dict lookup.

Reproduced with OpenVINO alone: install a Python SIGCHLD handler, compile two models, delete them
in creation order, run a subprocess.

The fix is :func:`own_signal_stack`, called right after each compile. It points the thread's
alternate stack at a buffer that cl-zoo owns for the life of the process. Every stack OpenVINO saves,
and may later put back, is then either that buffer or the one the thread had before any compile.
``tests/backends/test_signal_stack.py`` holds both the hazard and the fix.
"""

from __future__ import annotations

import ctypes
import sys
import threading

STACK_BYTES = 1 << 16  # over three times what the plugin allocates, and over 4x AT_MINSIGSTKSZ with AMX (about 11 KB)
_AT_MINSIGSTKSZ = 51  # getauxval key: the kernel's least signal frame size for this CPU's register state
_buffers: dict[int, ctypes.Array] = {}  # thread ident -> its stack; never freed (a thread that ends leaves one idle buffer)
_lock = threading.Lock()


class _StackT(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def current_signal_stack() -> tuple[int, int] | None:
    """(address, size) of this thread's alternate signal stack, or None when it has none (or off Linux)."""
    libc = _libc()
    if libc is None:
        return None
    old = _StackT()
    if libc.sigaltstack(None, ctypes.byref(old)) != 0 or old.ss_flags & 2 or not old.ss_sp:  # SS_DISABLE = 2
        return None
    return int(old.ss_sp), int(old.ss_size)


def own_signal_stack() -> bool:
    """Point this thread's alternate signal stack at one cl-zoo keeps for the life of the process.

    Returns whether it did: off Linux, or where ``sigaltstack`` refuses (the thread is running on
    its alternate stack, which it never is where cl-zoo calls this), nothing changes.
    """
    libc = _libc()
    if libc is None:
        return False
    size = STACK_BYTES
    try:
        libc.getauxval.restype = ctypes.c_ulong
        size = max(size, 4 * int(libc.getauxval(_AT_MINSIGSTKSZ)))
    except AttributeError:  # a libc without getauxval
        pass
    ident = threading.get_ident()
    with _lock:
        buffer = _buffers.get(ident)
        if buffer is None:
            buffer = _buffers[ident] = ctypes.create_string_buffer(size)
    new = _StackT(ctypes.addressof(buffer), 0, len(buffer))
    return libc.sigaltstack(ctypes.byref(new), None) == 0


def owns_signal_stack() -> bool:
    """Whether this thread's alternate signal stack is the one :func:`own_signal_stack` gave it."""
    current = current_signal_stack()
    buffer = _buffers.get(threading.get_ident())
    return current is not None and buffer is not None and current[0] == ctypes.addressof(buffer)


__all__ = ["STACK_BYTES", "current_signal_stack", "own_signal_stack", "owns_signal_stack"]
