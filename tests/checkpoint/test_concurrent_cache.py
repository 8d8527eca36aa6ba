"""Two processes filling one cache entry at once (an official release converted, a Hub repo
downloaded) both succeed, leave one intact entry, and the work happens once (cl_zoo.fileio.file_lock)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

import cl_zoo
from cl_zoo.checkpoint import load_folder
from cl_zoo.fileio import file_lock
from cl_zoo.checkpoint.publish import publish_folder

from tests.helpers import REPO_ROOT
from tests.hub_server import FakeHub, online
from tests.official_checkpoints import moco_file


# Registers a release whose URL is the loopback server, then loads it like a user would.
LOAD_OFFICIAL = """
import hashlib, sys
import cl_zoo
from cl_zoo.models.releases import RELEASES, Release, UrlSource
from cl_zoo.registry import PretrainedCfg, register_pretrained
name, url, md5 = sys.argv[1:4]
RELEASES[name] = Release(name=name, format="moco", arch="resnet18", filename=name + ".pth.tar",
    sources=(UrlSource(url=url, page=url, quote=url, md5_prefix=md5),), trained_by="test", recipe="test",
    licence_page=url, licence_quote="test", reported={"imagenet1k_linear_top1_reported": 0.5}, reported_source="test")
register_pretrained(name, "resnet18", PretrainedCfg(url=url, method="mocov2", license="test"))
model = cl_zoo.create_model(name, pretrained=True)
print(hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.state_dict().values())).hexdigest())
"""

LOAD_HUB = """
import hashlib, sys
import cl_zoo
model = cl_zoo.load_pretrained(sys.argv[1])
print(hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.state_dict().values())).hexdigest())
"""


class SlowFileServer:
    """Serves one file on 127.0.0.1 in small slow chunks (so two clients overlap) and counts GETs."""

    def __init__(self, path: Path, seconds: float = 1.5) -> None:
        data, gets = path.read_bytes(), []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                gets.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                chunks = 30
                step = len(data) // chunks + 1
                for i in range(0, len(data), step):
                    self.wfile.write(data[i : i + step])
                    time.sleep(seconds / chunks)

        self.gets = gets
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{path.name}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "SlowFileServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_both(script: str, args: list[str], env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", **env}
    procs = [subprocess.Popen([sys.executable, "-c", script, *args], env=full_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def test_file_lock_serialises_processes(tmp_path: Path) -> None:
    lock = tmp_path / "entry.lock"
    log = tmp_path / "log"
    # fileio loaded by path: importing the cl_zoo package would pull in torch (seconds per process).
    script = (
        "import sys, time, importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('fileio', {str(REPO_ROOT / 'cl_zoo' / 'fileio.py')!r})\n"
        "fileio = importlib.util.module_from_spec(spec); spec.loader.exec_module(fileio); file_lock = fileio.file_lock\n"
        "with file_lock(sys.argv[1]):\n"
        "    open(sys.argv[2], 'a').write('in\\n'); time.sleep(0.3); open(sys.argv[2], 'a').write('out\\n')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(lock), str(log)], env=env) for _ in range(3)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    assert log.read_text() == "in\nout\n" * 3  # never two holders at once
    with file_lock(lock):  # released by every exited holder
        pass


def test_file_lock_excludes_a_filelock_holder_in_another_process(tmp_path: Path) -> None:
    """Writers that take ``filelock.FileLock`` directly on the same path wait for file_lock's holder."""
    lock = tmp_path / "sub" / "entry.lock"  # its folder is made
    script = ("import sys, filelock\n"
              "try:\n    filelock.FileLock(sys.argv[1], timeout=0.2).acquire()\nexcept filelock.Timeout:\n    sys.exit(7)\n")
    with file_lock(lock):
        assert subprocess.run([sys.executable, "-c", script, str(lock)], timeout=60).returncode == 7
    assert subprocess.run([sys.executable, "-c", script, str(lock)], timeout=60).returncode == 0


@pytest.mark.slow
def test_two_processes_convert_one_official_release(tmp_path: Path) -> None:
    path, _ = moco_file(tmp_path, mlp=True, name="moco_v2_concurrent.pth.tar")
    md5 = hashlib.md5(path.read_bytes()).hexdigest()[:8]
    name = "mocov2_resnet18.concurrent_official"
    cache = tmp_path / "cache"
    with SlowFileServer(path) as server:
        results = run_both(LOAD_OFFICIAL, [name, server.url, md5],
                           {"CL_ZOO_CACHE": str(cache), "CL_ZOO_OFFLINE": "0", "HF_HUB_OFFLINE": "0"})
    for r in results:
        assert r.returncode == 0, r.stderr[-2000:]
    assert results[0].stdout == results[1].stdout  # the same weights in both processes
    assert len(server.gets) == 1  # downloaded once: the second process waited and found the entry
    official = cache / "releases"
    assert sorted(p.name for p in official.iterdir() if not p.name.endswith(".lock")) == ["downloads", name]
    assert [p.name for p in (official / "downloads").iterdir()] == [f"{name}.pth.tar"]
    load_folder(official / name)  # intact: every file present and its sha256 as recorded


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub(tmp_path / "hub-storage", token="hf_concurrent") as server:
        yield server


@pytest.mark.slow
def test_two_processes_download_one_hub_repo(tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_TOKEN": "hf_concurrent",
           "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    online(monkeypatch)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125)
    folder = cl_zoo.save_pretrained(model, tmp_path / "ckpt", max_shard_size="60KB")
    publish_folder(folder, "me/tiny")
    hub.requests.clear()
    results = run_both(LOAD_HUB, ["hf-hub:me/tiny"], env)
    for r in results:
        assert r.returncode == 0, r.stderr[-2000:]
    assert results[0].stdout == results[1].stdout
    weights = [p for m, p in hub.requests if m == "GET" and p.endswith(".safetensors")]
    assert len(weights) == len(set(weights)), weights  # each weights file fetched once
    repo = tmp_path / "hf-cache" / "models--me--tiny"
    assert not list(repo.rglob("*.incomplete"))
    (snapshot,) = (repo / "snapshots").iterdir()
    load_folder(snapshot)
