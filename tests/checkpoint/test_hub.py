"""Hub round trips through a local fake Hub (tests/hub_server.py) with the real huggingface_hub client.

Environment: ``HF_ENDPOINT``, ``HF_HUB_CACHE``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are set with
monkeypatch. ``huggingface_hub`` freezes most of them at import, but cl-zoo re-reads them on every
call (``cl_zoo.checkpoint.hub.hub_settings``) and passes them explicitly, so no subprocess or patching of
``huggingface_hub.constants`` is needed except for the saved-token paths in the no-token test.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest

import cl_zoo
from cl_zoo.checkpoint import INDEX_NAME, WEIGHTS_NAME, sha256_file
from cl_zoo.cli import main
from cl_zoo.errors import CheckpointError, HubError
from cl_zoo.checkpoint.publish import publish_folder
from cl_zoo.registry import PretrainedCfg, register_pretrained, unregister_pretrained

from tests.helpers import assert_same_state, tiny_cifar_model
from tests.hub_server import FakeHub, online, serve

TOKEN = "hf_fake_secret_token_123"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve(tmp_path, monkeypatch, TOKEN) as server:
        yield server


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return cl_zoo.save_pretrained(tiny_cifar_model(), tmp_path / "ckpt")


@pytest.fixture
def sharded_folder(tmp_path: Path) -> Path:
    out = cl_zoo.save_pretrained(tiny_cifar_model(1), tmp_path / "ckpt-sharded", max_shard_size="60KB")
    assert (out / INDEX_NAME).is_file()
    return out


def publish_cli(folder: Path, repo_id: str, *extra: str, capsys: pytest.CaptureFixture[str]) -> str:
    code = main(["publish", str(folder), "--repo-id", repo_id, *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert TOKEN not in out + err
    spec = out.strip().splitlines()[-1].split("load_pretrained(")[1].strip("')")
    assert spec.startswith(f"hf-hub:{repo_id}@")
    return spec


def test_publish_load_back_then_offline(
    hub: FakeHub, sharded_folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = publish_cli(sharded_folder, "alice/tiny-sharded", capsys=capsys)
    original = cl_zoo.load_pretrained(sharded_folder)
    loaded = cl_zoo.load_pretrained(spec)
    assert_same_state(original, loaded)
    assert loaded.checkpoint_source == spec
    assert ("GET", "/api/models/alice/tiny-sharded/tree/" + spec.rsplit("@", 1)[1]) in hub.requests

    # Second load: offline, and with the endpoint pointing nowhere, it must come from the cache.
    n_requests = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    again = cl_zoo.load_pretrained(spec)
    assert_same_state(original, again)
    assert len(hub.requests) == n_requests
    # A revision never downloaded is a one-line HubError naming the offline setting.
    with pytest.raises(HubError, match="HF_HUB_OFFLINE"):
        cl_zoo.load_pretrained("hf-hub:alice/never-downloaded")


def test_publish_by_branch_and_pull_request(hub: FakeHub, folder: Path, tmp_path: Path) -> None:
    first = publish_folder(folder, "alice/tiny")
    assert_same_state(cl_zoo.load_pretrained(folder), cl_zoo.load_pretrained("hf-hub:alice/tiny"))

    other = cl_zoo.save_pretrained(tiny_cifar_model(7), tmp_path / "other")
    on_branch = publish_folder(other, "alice/tiny", revision="v2")
    assert on_branch.commit != first.commit
    assert_same_state(cl_zoo.load_pretrained(other), cl_zoo.load_pretrained("hf-hub:alice/tiny@v2"))
    # main is untouched, and the first commit stays addressable by its sha.
    assert_same_state(cl_zoo.load_pretrained(folder), cl_zoo.load_pretrained("hf-hub:alice/tiny@main"))
    assert_same_state(cl_zoo.load_pretrained(folder), cl_zoo.load_pretrained(first.load_spec))

    pr = publish_folder(other, "alice/tiny", create_pr=True)
    assert pr.pr_url and pr.pr_url.endswith("/discussions/1")
    assert_same_state(cl_zoo.load_pretrained(other), cl_zoo.load_pretrained("hf-hub:alice/tiny@refs/pr/1"))
    with pytest.raises(HubError, match="pull request"):
        publish_folder(other, "alice/tiny", create_pr=True, revision="v2")


def test_private_repo_needs_token(
    hub: FakeHub, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish_folder(folder, "alice/secret", private=True)
    assert_same_state(cl_zoo.load_pretrained(folder), cl_zoo.load_pretrained("hf-hub:alice/secret"))
    # huggingface_hub serves an already cached revision even when the Hub refuses: use a fresh cache.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "other-cache"))
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubError, match="not found"):
        cl_zoo.load_pretrained("hf-hub:alice/secret@main")


def test_registered_entry_pins_revision_and_sha256(hub: FakeHub, folder: Path) -> None:
    result = publish_folder(folder, "alice/pinned")
    good = PretrainedCfg(hf_hub_id="alice/pinned", revision=result.commit,
                         sha256={WEIGHTS_NAME: sha256_file(folder / WEIGHTS_NAME)}, method="dcl")
    bad = dataclasses.replace(good, sha256={WEIGHTS_NAME: "0" * 64})
    try:
        register_pretrained("test_resnet18_cifar.hubgood", "resnet18_cifar", good)
        register_pretrained("test_resnet18_cifar.hubbad", "resnet18_cifar", bad)
        model = cl_zoo.create_model("test_resnet18_cifar.hubgood", pretrained=True)
        assert model.model_name == "test_resnet18_cifar.hubgood"
        assert_same_state(cl_zoo.load_pretrained(folder), model)
        with pytest.raises(CheckpointError, match="sha256 mismatch") as info:
            cl_zoo.create_model("test_resnet18_cifar.hubbad", pretrained=True)
        assert "\n" not in str(info.value) and "hf-hub:alice/pinned" in str(info.value)
    finally:
        unregister_pretrained("test_resnet18_cifar.hubgood")
        unregister_pretrained("test_resnet18_cifar.hubbad")


def test_missing_repo_and_revision(hub: FakeHub, folder: Path) -> None:
    with pytest.raises(HubError, match="not found"):
        cl_zoo.load_pretrained("hf-hub:alice/nothing-here")
    publish_folder(folder, "alice/tiny")
    with pytest.raises(HubError, match="no revision"):
        cl_zoo.load_pretrained("hf-hub:alice/tiny@no-such-branch")
    with pytest.raises(HubError, match="bad Hub id"):
        cl_zoo.load_pretrained("hf-hub:just-a-name")


def test_unreachable_hub_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    online(monkeypatch)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    started = time.monotonic()
    with pytest.raises(HubError) as info:
        cl_zoo.load_pretrained("hf-hub:alice/tiny@main")
    assert time.monotonic() - started < 15  # one line soon, not after a long retry loop
    assert endpoint in str(info.value) and "\n" not in str(info.value)

    code = main(["publish", str(folder), "--repo-id", "alice/tiny"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "cannot be reached" in err and TOKEN not in err


def test_publish_without_token(
    hub: FakeHub, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    code = main(["publish", str(folder), "--repo-id", "alice/tiny"])
    err = capsys.readouterr().err
    assert code == 2 and "no Hub token" in err and err.count("\n") == 1
    assert not hub.repos  # nothing was created

    monkeypatch.setenv("HF_TOKEN", "hf_not_the_right_one")
    code = main(["publish", str(folder), "--repo-id", "alice/tiny"])
    err = capsys.readouterr().err
    assert code == 2 and "write access" in err and "hf_not_the_right_one" not in err


def test_publish_refuses_invalid_folder_before_network(hub: FakeHub, folder: Path) -> None:
    (folder / WEIGHTS_NAME).unlink()
    with pytest.raises(CheckpointError, match="weights missing"):
        publish_folder(folder, "alice/tiny")
    assert hub.requests == []
