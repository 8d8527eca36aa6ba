"""The hostile-input suites that feed native parsers (pyarrow, faiss, OpenVINO, NNCF) run in a
process of their own.

Run inside the one pytest process with the rest of the suite, ``isolated_hostile_inputs_bounded.py``
and ``isolated_hostile_openvino_cache.py`` were followed, deterministically but many tests later, by
a SIGSEGV of the whole run (si_code SI_KERNEL, in a plain ``time.monotonic`` call of test_hub's
publish, or in a faiss index build; no Python traceback, faulthandler silent). Each file passes
alone and with its neighbours, and the suite passes without them, so the state one of them leaves
in the process (native thread pools, allocator arenas, fsspec's event-loop thread) is the suspect;
it was not pinned down in the session that found it (see the closing note of 2026-11-27). Running
them in a child keeps every one of their cases, and a crash there names its file instead of taking
the whole suite down.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("name", ["isolated_hostile_inputs_bounded.py", "isolated_hostile_openvino_cache.py"])
def test_in_a_process_of_its_own(name: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / name)],
                          cwd=TESTS.parent, env=os.environ.copy(), capture_output=True, text=True, timeout=1500)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{tail}"
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
