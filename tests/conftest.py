"""Shared fixtures: the real datasets beside the project (../shared/datasets), unpacked once."""

from __future__ import annotations

import fcntl
import functools
import http.server
import os
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import cl_zoo
from tests.helpers import REPO_ROOT, isolate_cache, tiny_model

SHARED_DATASETS = Path(os.environ.get("CL_ZOO_SHARED_DATASETS", REPO_ROOT.parent / "shared" / "datasets"))
# Unpacked archives are reused across test sessions (CI unpacks each at most once per machine).
UNPACK_ROOT = Path(os.environ.get("CL_ZOO_TEST_DATA", "/tmp/cl-zoo-test-data"))


def shared_archive(name: str) -> Path:
    """Path of ``../shared/datasets/<name>``; skips the test with the reason when it is absent."""
    path = SHARED_DATASETS / name
    if not path.is_file():
        pytest.skip(f"needs {path} (the shared datasets folder beside the project is absent)")
    return path


def unpacked(name: str) -> Path:
    """Unpack ``../shared/datasets/<name>`` once (process-safe) and return the folder it unpacks into."""
    archive = shared_archive(name)
    target = UNPACK_ROOT / name.replace(".tar.gz", "")
    done = target / ".complete"
    if not done.exists():
        UNPACK_ROOT.mkdir(parents=True, exist_ok=True)
        with open(UNPACK_ROOT / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                target.mkdir(parents=True, exist_ok=True)
                with tarfile.open(archive) as tar:
                    tar.extractall(target, filter="data")
                done.touch()
    return target


@pytest.fixture(scope="session")
def cifar10_dir() -> Path:
    """CIFAR-10 as JPEG ImageFolder: ``<dir>/train/<class>/*.jpg`` and ``<dir>/test/...``."""
    return unpacked("cifar10-jpeg.tar.gz")


@pytest.fixture(scope="session")
def imagenet_samples_dir() -> Path:
    """255 real ImageNet photos at full resolution: ``<dir>/photos/*.JPEG``."""
    return unpacked("imagenet-samples.tar.gz")


@pytest.fixture(scope="session")
def tiny_coco_dir() -> Path:
    return unpacked("tiny-coco.tar.gz")


@pytest.fixture(scope="session")
def bccd_voc_dir() -> Path:
    return unpacked("bccd-voc.tar.gz")


@pytest.fixture(scope="session")
def imagenette_val_dir() -> Path:
    return unpacked("imagenette128-val.tar.gz")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # no request lines in the test output
        pass


@pytest.fixture()
def http_folder() -> Iterator[Callable[[Path], str]]:
    """``serve(folder)`` -> ``http://127.0.0.1:<port>`` serving ``folder`` (listings included) until the
    test ends: the one local static server of the URL-input tests."""
    running: list[tuple[http.server.ThreadingHTTPServer, threading.Thread]] = []

    def serve(folder: Path) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(folder)))
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        running.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server, thread in running:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture()
def served(tmp_path: Path, http_folder: Callable[[Path], str]) -> str:
    """``http://127.0.0.1:<port>`` serving ``tmp_path`` (directory listings included)."""
    return http_folder(tmp_path)


@pytest.fixture(scope="session", autouse=True)
def _own_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``CL_ZOO_STATE`` in the session's temp folder: no test reads or writes the user's memo of verified cache files."""
    folder = tmp_path_factory.getbasetemp() / "state"
    before = os.environ.get("CL_ZOO_STATE")
    os.environ["CL_ZOO_STATE"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("CL_ZOO_STATE", None)
    else:
        os.environ["CL_ZOO_STATE"] = before


@pytest.fixture()
def isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``CL_ZOO_CACHE`` in the session's temp folder: shared by the tests that ask, never the user's cache."""
    return isolate_cache(monkeypatch, tmp_path_factory.getbasetemp() / "cache")


@pytest.fixture()
def one_thread() -> None:
    """torch on one thread, as the 2-core CI host runs the training tests (left set: every such test asks)."""
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_model()`` seeded 0 and saved as a checkpoint folder, once per module."""
    folder = tmp_path_factory.mktemp("model") / "tiny"
    torch.manual_seed(0)
    cl_zoo.save_pretrained(tiny_model(), folder)
    return folder
