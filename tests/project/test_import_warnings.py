"""Importing cl-zoo warns about nothing: a user running ``python -W error`` (or pytest with
``filterwarnings = error``) must be able to import every module, and a retired name must warn only
when it is used, never because the package itself imports it."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO_ROOT

_IMPORT_ALL = """
import importlib, pkgutil, cl_zoo
names = [m.name for m in pkgutil.walk_packages(cl_zoo.__path__, "cl_zoo.") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_every_module_imports_under_w_error() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _IMPORT_ALL], capture_output=True, text=True, cwd=REPO_ROOT, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) > 100  # the walk really found the package's modules
