"""OpenVINO's compiled models must not leave a thread on a freed alternate signal stack.

:mod:`cl_zoo.backends.signal_stack` says what the CPU plugin does and why it crashed a process. The
hazard runs in a child process, so that a regression kills the child, not the test session.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

from cl_zoo.backends.signal_stack import current_signal_stack, own_signal_stack, owns_signal_stack
from tests.helpers import REPO_ROOT

needs_openvino = pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                                    reason="openvino is not installed (pip install 'cl-zoo[openvino]')")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack is set through Linux's libc")


@linux_only
def test_own_signal_stack_is_kept_and_reused():
    assert own_signal_stack() and owns_signal_stack()
    first = current_signal_stack()
    assert first is not None and first[1] >= 1 << 16
    assert own_signal_stack() and current_signal_stack() == first  # the same buffer, not a new one each call


HAZARD = textwrap.dedent("""
    import os, signal, subprocess, sys
    sys.path.insert(0, {repo!r})
    os.environ["CL_ZOO_CACHE"], os.environ["CL_ZOO_STATE"] = sys.argv[1], sys.argv[2]
    import numpy as np
    from tests.helpers import tiny_model
    from cl_zoo.backends.openvino import OpenVINORunner
    from cl_zoo.backends.signal_stack import current_signal_stack
    from cl_zoo.embedding import Preprocess, model_fingerprint

    signal.signal(signal.SIGCHLD, lambda *args: None)  # what torch's DataLoader installs; SA_ONSTACK, as every Python handler
    model = tiny_model(seed=0)
    pre = Preprocess.from_model(model)
    make = lambda: OpenVINORunner(model, fingerprint=model_fingerprint(model), input_hw=pre.crop_size, mean=pre.mean,
                                  std=pre.std, precision="fp32", threads=2)
    first, second = make(), make()
    first(np.zeros((3, 32, 32, 3), np.uint8)), second(np.zeros((3, 32, 32, 3), np.uint8))
    del first, second  # in the order they were made: the plugin puts back the first one's freed stack
    stack = current_signal_stack()
    mapped = stack is None or any(int(a, 16) <= stack[0] < int(b, 16) for a, b in
                                  (line.split()[0].split("-") for line in open("/proc/self/maps")))
    for _ in range(5):
        subprocess.run([sys.executable, "-c", "pass"], check=True)  # each exit delivers SIGCHLD to this process
    print("survived", "mapped" if mapped else "UNMAPPED")
""")


@linux_only
@needs_openvino
def test_two_runners_released_in_creation_order_leave_a_valid_signal_stack(tmp_path):
    script = tmp_path / "hazard.py"
    script.write_text(HAZARD.format(repo=str(REPO_ROOT)))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "cache"), str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.split()[-2:] == ["survived", "mapped"], done.stdout
