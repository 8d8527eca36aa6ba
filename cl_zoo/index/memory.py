"""Memory budgets as people write them (``4G``, ``512M``) and the process's peak memory.

Budgets use binary units (``1G`` = 2**30 bytes), as ``free -g`` and faiss's own size reports do,
so ``--max-memory 4G`` is never silently 7% larger than the machine's "4 GB".
"""

from __future__ import annotations

import re
import sys

from cl_zoo.errors import ClZooError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_MAX_BYTES = 1 << 60  # an exbibyte: beyond it a budget is a typo (and int(inf) an OverflowError)
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_memory(text: str) -> int:
    """``"4G"``, ``"512M"``, ``"1.5GiB"``, ``"1000000"`` -> bytes (binary units); ClZooError otherwise."""
    match = _PATTERN.match(str(text))
    if not match:
        raise ClZooError(f"cannot read memory size {text!r}; write e.g. 4G, 512M or a number of bytes")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]  # inf, not an error, for 400 digits
    if value < 1:
        raise ClZooError(f"memory size {text!r} is zero")
    if not value <= _MAX_BYTES:
        raise ClZooError(f"memory size {str(text)[:40]!r}{'...' if len(str(text)) > 40 else ''} is more than any machine has "
                         f"(at most {_MAX_BYTES >> 60} EiB)")
    return int(value)


def format_bytes(n: float) -> str:
    """``1536 << 20`` -> ``"1.50 GiB"``: short and unambiguous in reports."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (``ru_maxrss``; 0 where the OS has no such count)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB


__all__ = ["format_bytes", "parse_memory", "peak_rss_bytes"]
