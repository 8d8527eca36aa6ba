"""Published releases: sources as data (Hub first, then URLs), every value traceable to its page,
lightly's Lightning checkpoints read without running them, and malicious pickles refused.

Fixtures are built here: a Lightning-like ``.ckpt`` (``state_dict`` with ``backbone.*`` in the
torchvision ResNet-50 layout, plus hyper-parameters, loop/callback state and optimizer state that
include objects of classes defined in this module) and CACR's file served by the fake Hub of
``tests/hub_server.py`` to the real ``huggingface_hub`` client.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import torch.nn as nn
from torchvision.models import resnet as tv

import cl_zoo
from cl_zoo.checkpoint import load_folder
from cl_zoo.cli import main
from cl_zoo.convert import sources
from cl_zoo.convert.readers import safe_load_lightning
from cl_zoo.errors import CheckpointError, HubError
from cl_zoo.models.releases import RELEASES, HubSource, UrlSource, lightly_reported
from cl_zoo.registry import PretrainedCfg, register_pretrained, unregister_pretrained

from tests.hub_server import Commit, FakeHub, Repo, serve
from tests.lightning_stand_in import AttributeDict, lightning_names
from tests.official_checkpoints import cacr_file

CACR = "cacr_resnet50.in1k_official"


# --------------------------------------------------------------------------------------------------
# Every published value appears verbatim in the line recorded from its page
# --------------------------------------------------------------------------------------------------


def test_every_source_value_appears_in_its_recorded_quote() -> None:
    assert len(RELEASES) >= 12
    for name, release in RELEASES.items():
        assert release.sources, name
        for source in release.sources:
            assert source.page.startswith("https://") and source.quote, name
            if isinstance(source, UrlSource):
                assert source.url in source.quote, (name, source.url)
                if source.member:
                    assert source.member in source.quote or "not named on the page" in source.note, name
                if source.md5_prefix:
                    assert source.md5_prefix in source.quote, name
            else:
                assert source.repo_id in source.page and source.revision in source.page, name
                assert source.filename in source.quote, name
                if source.sha256:
                    assert source.sha256 in (source.sha256_quote or "") and source.revision in (source.sha256_page or "")
        assert release.licence_page.startswith("https://") and release.licence_quote, name
        first = next(iter(release.reported.values()))
        assert f"{first * 100:.1f}" in release.reported_quote, name  # the headline number is on the quoted line


def test_lightly_numbers_are_read_from_the_quoted_row() -> None:
    dcl = RELEASES["dcl_resnet50.in1k_lightly"]
    assert dcl.reported == pytest.approx({
        "imagenet1k_linear_top1_reported": 0.651, "imagenet1k_linear_top5_reported": 0.862,
        "imagenet1k_finetune_top1_reported": 0.735, "imagenet1k_finetune_top5_reported": 0.917,
        "imagenet1k_knn_top1_reported": 0.496, "imagenet1k_knn_top5_reported": 0.775})
    assert lightly_reported(RELEASES["dclw_resnet50.in1k_lightly"].reported_quote)["imagenet1k_knn_top1_reported"] == pytest.approx(0.485)
    assert RELEASES["simclr_resnet50.in1k_lightly"].reported["imagenet1k_linear_top1_reported"] == pytest.approx(0.632)
    assert RELEASES["mocov2_resnet50.in1k_100ep_lightly"].reported["imagenet1k_knn_top1_reported"] == pytest.approx(0.418)
    for name in ("dcl_resnet50.in1k_lightly", "dclw_resnet50.in1k_lightly"):
        assert RELEASES[name].sources[0].url.endswith("/checkpoints/epoch%3D99-step%3D500400.ckpt")
        assert not RELEASES[name].by_authors and "lightly" in RELEASES[name].trained_by


def test_cacr_lists_the_hub_first_then_google_drive() -> None:
    hub, drive = RELEASES[CACR].sources
    assert isinstance(hub, HubSource) and isinstance(drive, UrlSource)
    assert (hub.repo_id, hub.filename, hub.revision) == (
        "hjzheng/CACR", "checkpoint_resnet_cacr.pth.tar", "5b33a2045e24a9c185d112f028ba2915f33410cf")
    assert hub.sha256 == "e05b7afbc29d79e461f99b2d8da99eff641e92800c1edcf1567f81535308e3dd"
    assert drive.sha256 is None  # the Drive copy has no published checksum


def test_direct_urls_are_rewritten_in_code_not_stored() -> None:
    drive = RELEASES[CACR].sources[1]
    assert sources.direct_url(drive.url) == (
        "https://drive.usercontent.google.com/download?id=17mE7obaWAG0-YMu3ffZLK-DkhNmn2hhB&export=download&confirm=t")
    cmc = RELEASES["cmc_resnet50x1_lab.in1k_official"].sources[0]
    assert sources.direct_url(cmc.url, cmc.member) == (
        "https://www.dropbox.com/sh/5k4t77mt4011gyr/AABkBvKm2bGNNut0m6bLMK84a/CMC_resnet50v2.pth?dl=1")
    lightly = RELEASES["dcl_resnet50.in1k_lightly"].sources[0].url
    assert sources.direct_url(lightly) == lightly  # used exactly as published


def test_models_and_info_show_every_method_and_each_source_with_its_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--pretrained", "*.in1k*", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    methods = {r["method"] for r in rows if r["arch"].startswith(("resnet50", "cmc_resnet50"))}
    assert {"jcl", "dcl", "dclw", "cmc", "cacr", "simclr", "mocov2", "moco"} <= methods
    assert main(["info", CACR]) == 0
    out = capsys.readouterr().out
    hub_at = out.index("1. hf-hub:hjzheng/CACR/checkpoint_resnet_cacr.pth.tar@5b33a2045e24a9c185d112f028ba2915f33410cf")
    drive_at = out.index("2. https://drive.google.com/file/d/17mE7obaWAG0-YMu3ffZLK-DkhNmn2hhB/view?usp=sharing")
    assert hub_at < drive_at and "copied from https://huggingface.co/hjzheng/CACR/tree/5b33a20" in out
    assert main(["info", "dcl_resnet50.in1k_lightly"]) == 0
    out = capsys.readouterr().out
    assert "trained by   : lightly" in out and "not the paper's authors" in out and "benchmarks.rst" in out


# --------------------------------------------------------------------------------------------------
# Lightning checkpoints: the layout, read without running anything
# --------------------------------------------------------------------------------------------------


class LoopState:
    """A class of the training program's own: no allowlist knows it."""

    def __init__(self) -> None:
        self.best = torch.tensor(0.42)


class LightlyLike(nn.Module):
    """lightly's benchmark LightningModule: backbone = torchvision resnet50 with fc = Identity."""

    def __init__(self, momentum: bool) -> None:
        super().__init__()
        resnet = tv.resnet50()
        resnet.fc = nn.Identity()
        self.backbone = resnet
        self.projection_head = nn.Module()
        self.projection_head.layers = nn.Sequential(nn.Linear(2048, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 16))
        self.online_classifier = nn.Module()
        self.online_classifier.classification_head = nn.Linear(2048, 10)
        if momentum:
            self.key_backbone = tv.resnet18()  # a momentum copy; its shape does not matter to the reader
            self.key_backbone.fc = nn.Identity()
            self.criterion = nn.Module()
            self.criterion.memory_bank = nn.Module()
            self.criterion.memory_bank.register_buffer("bank", torch.randn(16, 32))
            self.criterion.memory_bank.register_buffer("bank_ptr", torch.zeros(1, dtype=torch.long))


def lightning_file(tmp_path: Path, momentum: bool = False) -> tuple[Path, nn.Module]:
    torch.manual_seed(5)
    module = LightlyLike(momentum)
    with torch.no_grad():
        for m in module.backbone.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    first = next(module.parameters())
    top = {
        "epoch": 99,
        "global_step": 500400,
        "pytorch-lightning_version": "2.0.4",
        "state_dict": module.state_dict(),
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 100}}}},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None, "dirpath": "/runs/x"}},
        "optimizer_states": [{"state": {0: {"momentum_buffer": torch.randn_like(first)}},
                              "param_groups": [{"lr": 0.3, "weight_decay": 1e-6, "params": [0]}]}],
        "lr_schedulers": [{"base_lrs": [0.3], "last_epoch": 500400, "lr_lambdas": [None]}],
        "hparams_name": "kwargs",
        "hyper_parameters": AttributeDict(batch_size_per_device=128, num_classes=1000),
        "MixedPrecision": {"scale": 65536.0},
    }
    path = tmp_path / "epoch=99-step=500400.ckpt"
    with lightning_names():
        torch.save(top, path)
    return path, module.eval()


def test_lightning_files_load_with_torchs_weights_only_unpickler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning's AttributeDict is read as a plain dict; a class of the training program's own is
    refused before anything is unpickled, in one line that names it."""
    path, _ = lightning_file(tmp_path)
    top = safe_load_lightning(path)
    assert type(top["hyper_parameters"]) is dict
    assert top["hyper_parameters"] == {"batch_size_per_device": 128, "num_classes": 1000}
    torch.save({"state_dict": {"backbone.conv1.weight": torch.zeros(1)}, "extra": LoopState()}, tmp_path / "own.ckpt")
    assert main(["import", "lightly", str(tmp_path / "own.ckpt"), "--out", str(tmp_path / "zoo")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: refusing to load") and "\n" not in err and "test_releases.LoopState" in err
    assert not (tmp_path / "zoo").exists()


def test_lightly_layout_imports_with_features_equal_to_torchvision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # MoCo v2's layout: SimCLR/DCL/DCLW's (backbone, projection head, online classifier) plus the
    # momentum encoder and the loss's memory bank, so one file covers every lightly layout.
    momentum = True
    path, module = lightning_file(tmp_path, momentum)
    out = tmp_path / "zoo"
    assert main(["import", "lightly", str(path), "--out", str(out)]) == 0
    assert "backbone tensors" in capsys.readouterr().out
    model = load_folder(out)
    reference = tv.resnet50()  # the reference way: torchvision's own module, state loaded strictly
    reference.fc = nn.Identity()
    reference.load_state_dict({k[len("backbone."):]: v for k, v in module.state_dict().items() if k.startswith("backbone.")})
    reference.eval()
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), reference(x), rtol=0, atol=1e-5)
    report = json.loads((out / "config.json").read_text())["conversion"]
    assert report["prefix"] == "backbone." and report["backbone_tensors"] == len(reference.state_dict())
    expected = {"projection_head": 2 + 5 + 2, "online_classifier": 2}  # Linear, BatchNorm1d, Linear; Linear
    if momentum:
        expected |= {"key_backbone": len(module.key_backbone.state_dict()), "criterion": 2}
    assert report["dropped"] == expected
    assert "hyper_parameters" in report["top_level"]
    assert json.loads((out / "config.json").read_text())["method"] is None  # SimCLR, DCL, DCLW share this layout
    card = (out / "README.md").read_text()
    assert "weights_only=True" in card and "weights_only=False" not in card


EVIL_MARKER = "cl_zoo_pwned_marker"


class Evil:
    """Pickles to a call of ``target(*args)`` at load time."""

    def __init__(self, target: Any, args: tuple[Any, ...]) -> None:
        self.target, self.args = target, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.target, self.args


@pytest.mark.parametrize("payload", ["os.system", "builtins.eval", "builtins.exec", "subprocess.Popen", "nested"])
def test_malicious_pickle_is_refused_in_one_line_and_nothing_runs(
    tmp_path: Path, payload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / EVIL_MARKER
    evil = {
        "os.system": Evil(os.system, (f"touch {marker}",)),
        "builtins.eval": Evil(eval, (f"open({str(marker)!r}, 'w')",)),
        "builtins.exec": Evil(exec, (f"open({str(marker)!r}, 'w').write('x')",)),
        "subprocess.Popen": Evil(subprocess.Popen, (["touch", str(marker)],)),
        "nested": AttributeDict(inner=[Evil(os.system, (f"touch {marker}",))]),
    }[payload]
    path = tmp_path / "evil.ckpt"
    with lightning_names():
        torch.save({"state_dict": {"backbone.conv1.weight": torch.zeros(1)}, "hyper_parameters": evil}, path)
    assert main(["import", "lightly", str(path), "--out", str(tmp_path / "zoo")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: refusing to load") and "\n" not in err and "nothing was executed" in err
    assert re.search(r"(posix|os|nt|builtins|subprocess|commands)\.\w+", err), err  # commands: protocol 2's name
    assert "weights_only=False" not in err
    assert not marker.exists() and not (tmp_path / "zoo").exists()


def test_hand_written_reduce_opcodes_are_refused(tmp_path: Path) -> None:
    """Protocol 0 INST/REDUCE crafted by hand, inside a torch zip archive, never run."""
    marker = tmp_path / EVIL_MARKER
    benign = tmp_path / "benign.pt"
    torch.save({"state_dict": {}}, benign)
    import zipfile

    crafted = tmp_path / "crafted.pt"
    with zipfile.ZipFile(benign) as src, zipfile.ZipFile(crafted, "w") as dst:
        for item in src.namelist():
            data = src.read(item)
            if item.endswith("/data.pkl"):
                data = b"cposix\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
            dst.writestr(item, data)
    with pytest.raises(CheckpointError, match="posix.system|opcode STRING"):  # either way: refused, not run
        safe_load_lightning(crafted)
    assert not marker.exists()
    assert pickle.loads(b"c_codecs\nencode\n(S'ab'\nS'latin1'\ntR.") == b"ab"  # what the allowlist mirrors


# --------------------------------------------------------------------------------------------------
# Sources in order: the Hub through huggingface_hub, then the URL; offline names every source
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    monkeypatch.delenv("CL_ZOO_OFFLINE", raising=False)
    with serve(tmp_path, monkeypatch, token=None, CL_ZOO_CACHE=str(tmp_path / "cl-cache")) as server:
        yield server


def seed(hub: FakeHub, repo_id: str, revision: str, files: dict[str, bytes]) -> None:
    """Put files in the fake Hub at a given commit sha (the real repo's pinned revision)."""
    repo = hub.repos.setdefault(repo_id, Repo(repo_id, private=False))
    repo.commits[revision] = Commit(revision, {p: hub._store(d) for p, d in files.items()}, "Upload CACR checkpoints", time.time())
    repo.refs["main"] = revision


@pytest.fixture
def cacr_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """CACR's real Hub identifiers (repo, file, revision), a ResNet-18 file in its layout for speed."""
    path, ref = cacr_file(tmp_path)
    data = path.read_bytes()
    drive_copy = tmp_path / "drive" / "cacr.pth.tar"
    drive_copy.parent.mkdir()
    drive_copy.write_bytes(data)
    real_hub, _ = RELEASES[CACR].sources
    name = "cacr_resnet18.test_hub_first"

    def make(hub_sha256: str | None) -> str:
        hub_source = dataclasses.replace(real_hub, sha256=hub_sha256)
        url_source = UrlSource(url=drive_copy.as_uri(), page="test", quote=drive_copy.as_uri())
        release = dataclasses.replace(RELEASES[CACR], name=name, arch="resnet18", filename="cacr_test.pth.tar",
                                      sources=(hub_source, url_source))
        monkeypatch.setitem(RELEASES, name, release)
        register_pretrained(name, "resnet18", PretrainedCfg(url=url_source.url, method="cacr", license="mit",
                                                            metrics=dict(release.reported)))
        return name

    yield make, data, ref, real_hub
    unregister_pretrained(name)


def _origin(tmp_path: Path, name: str) -> str:
    return json.loads((tmp_path / "cl-cache" / "releases" / name / "config.json").read_text())["origin"]


def test_cacr_comes_from_the_hub_first_pinned_verified_and_cached(
    tmp_path: Path, hub: FakeHub, cacr_release: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    make, data, ref, real_hub = cacr_release
    seed(hub, real_hub.repo_id, real_hub.revision, {real_hub.filename: data})
    name = make(hashlib.sha256(data).hexdigest())
    model = cl_zoo.create_model(name, pretrained=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, ref.base_encoder.state_dict()[key]), key
    assert _origin(tmp_path, name) == real_hub.describe()
    assert ("GET", f"/{real_hub.repo_id}/resolve/{real_hub.revision}/{real_hub.filename}") in hub.requests
    assert list((tmp_path / "hf-cache").rglob(real_hub.filename))  # in the HF cache, where huggingface_hub keeps it
    assert not (tmp_path / "cl-cache" / "releases" / "downloads").exists()  # the URL source was never needed
    card = (tmp_path / "cl-cache" / "releases" / name / "README.md").read_text()
    assert "Trained by the paper's authors" in card
    assert f"1. `{real_hub.describe()}` -- copied from {real_hub.page}" in card and "2. `file://" in card
    assert f"verified: sha256 `{hashlib.sha256(data).hexdigest()}`" in card

    # Offline and without the converted folder: huggingface_hub's cache is enough, no request made.
    import shutil

    shutil.rmtree(tmp_path / "cl-cache" / "releases" / name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n_requests = len(hub.requests)
    again = cl_zoo.create_model(name, pretrained=True)
    assert torch.equal(again.state_dict()["conv1.weight"], model.state_dict()["conv1.weight"])
    assert len(hub.requests) == n_requests


def test_a_hub_file_failing_its_pin_falls_through_to_the_url(tmp_path: Path, hub: FakeHub, cacr_release: Any) -> None:
    make, data, _, real_hub = cacr_release
    seed(hub, real_hub.repo_id, real_hub.revision, {real_hub.filename: data + b"tampered"})
    name = make(hashlib.sha256(data).hexdigest())
    cl_zoo.create_model(name, pretrained=True)
    assert _origin(tmp_path, name).startswith("file://")


def test_a_hub_without_the_repo_falls_through_to_the_url(tmp_path: Path, hub: FakeHub, cacr_release: Any) -> None:
    # (An unreachable endpoint takes the same path, after huggingface_hub's own retries, ~25 s.)
    make, data, _, _ = cacr_release
    name = make(hashlib.sha256(data).hexdigest())  # nothing seeded: the Hub answers "repo not found"
    cl_zoo.create_model(name, pretrained=True)
    assert _origin(tmp_path, name).startswith("file://")


def test_every_source_failing_its_pin_is_an_integrity_error_naming_each(hub: FakeHub, cacr_release: Any) -> None:
    make, data, _, real_hub = cacr_release
    seed(hub, real_hub.repo_id, real_hub.revision, {real_hub.filename: data})
    name = make("0" * 64)
    # the URL source has no pin, so make it fail too: remove the file behind it
    url_source = RELEASES[name].sources[1]
    Path(url_source.url[len("file://"):]).unlink()
    with pytest.raises(CheckpointError) as info:
        cl_zoo.create_model(name, pretrained=True)
    message = str(info.value)
    assert "\n" not in message and "1) hf-hub:hjzheng/CACR" in message and "checksum mismatch" in message
    assert "2) file://" in message


def test_offline_names_every_source_in_order_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cl-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError) as info:
        cl_zoo.create_model(CACR, pretrained=True)
    message = str(info.value)
    hub_source, drive = RELEASES[CACR].sources
    assert "\n" not in message
    assert message.index(f"1) {hub_source.describe()}") < message.index(f"2) {drive.url}")
    assert "not in the HF cache" in message and "offline" in message


# --------------------------------------------------------------------------------------------------
# Non-Hub downloads: torch.hub's client, whole-or-nothing, checked, one-line errors
# --------------------------------------------------------------------------------------------------


def served_url(hub: FakeHub, data: bytes, name: str = "weights.pth.tar") -> str:
    """A plain URL on the local test server that answers ``data`` (a fake Hub file: any GET URL will do)."""
    seed(hub, "publisher/weights", "0" * 40, {name: data})
    return f"{hub.endpoint}/publisher/weights/resolve/{'0' * 40}/{name}"


def test_a_url_download_lands_whole_and_checked(
    tmp_path: Path, hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    data = os.urandom(300_000)
    url = served_url(hub, data)
    dest = tmp_path / "downloads" / "weights.pth.tar"
    assert sources.download(url, dest, sha256=hashlib.sha256(data).hexdigest(), progress=False) == dest
    assert dest.read_bytes() == data and sorted(p.name for p in dest.parent.iterdir()) == [dest.name]
    assert capsys.readouterr().err == ""  # progress off: nothing on stderr
    again = tmp_path / "again" / "weights.pth.tar"
    sources.download(url, again, progress=True)  # no pin: fetched as is, with torch.hub's tqdm bar
    assert again.read_bytes() == data and "100%" in capsys.readouterr().err


def test_a_url_download_failing_its_sha256_leaves_nothing(tmp_path: Path, hub: FakeHub) -> None:
    data = b"not the published weights" * 1000
    url = served_url(hub, data)
    dest = tmp_path / "downloads" / "weights.pth.tar"
    with pytest.raises(CheckpointError) as info:
        sources.download(url, dest, sha256="0" * 64, progress=False)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"checksum mismatch for {url}: expected sha256 0000")
    assert hashlib.sha256(data).hexdigest()[:16] in message
    assert not dest.exists() and not list(dest.parent.iterdir())  # no partial file, no wrong file


def test_an_unreachable_host_is_one_line_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.delenv("CL_ZOO_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as sock:  # a port nothing listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/weights.pth.tar"
    dest = tmp_path / "downloads" / "weights.pth.tar"
    started = time.monotonic()
    with pytest.raises(HubError) as info:
        sources.download(url, dest, progress=False)
    assert time.monotonic() - started < 5  # no retry loop
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"cannot download {url} (") and "refused" in message.lower()
    assert not list(dest.parent.iterdir())
    # Offline mode refuses before connecting, and says what to do.
    monkeypatch.setenv("CL_ZOO_OFFLINE", "1")
    with pytest.raises(HubError, match=f"cannot download {url}: offline mode .* unset it, or put the file at"):
        sources.download(url, dest, progress=False)


def test_a_host_that_stalls_is_one_line_after_the_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.hub's urlopen has no timeout: a host that accepts and never answers hung the command."""
    import socket

    monkeypatch.delenv("CL_ZOO_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    before = socket.getdefaulttimeout()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)  # the kernel accepts the connection; nobody ever answers
        url = f"http://127.0.0.1:{server.getsockname()[1]}/weights.pth.tar"
        dest = tmp_path / "downloads" / "weights.pth.tar"
        started = time.monotonic()
        with pytest.raises(HubError) as info:
            sources.download(url, dest, progress=False, timeout=0.5)
        assert time.monotonic() - started < 5
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"cannot download {url} (") and "0.5 s" in message
    assert not list(dest.parent.iterdir()) and socket.getdefaulttimeout() == before  # the default is restored


def test_a_release_url_with_a_pinned_sha256_is_checked_as_it_downloads(
    tmp_path: Path, hub: FakeHub, cacr_release: Any
) -> None:
    make, data, _, real_hub = cacr_release
    name = make(hashlib.sha256(data).hexdigest())  # the Hub source has no repo: the URL source is used
    release = RELEASES[name]
    url = served_url(hub, data + b"tampered", "cacr.pth.tar")
    wrong = dataclasses.replace(release.sources[1], url=url, sha256=hashlib.sha256(data).hexdigest())
    RELEASES[name] = dataclasses.replace(release, sources=(release.sources[0], wrong))
    with pytest.raises(CheckpointError) as info:
        cl_zoo.create_model(name, pretrained=True)
    message = str(info.value)
    assert "\n" not in message and f"2) {url} (checksum mismatch: expected sha256" in message
    assert not list((tmp_path / "cl-cache" / "releases" / "downloads").iterdir())


def test_a_lightly_card_says_plainly_that_lightly_trained_it_not_the_authors() -> None:
    from cl_zoo.convert.readers import ConversionReport, conversion_card_sections

    report = ConversionReport(format="lightly", source="epoch=99-step=500400.ckpt", source_sha256="0" * 64, arch="resnet50",
                              model_args={}, top_level={}, state_key="state_dict", prefix="backbone.",
                              backbone_tensors=320, dropped={"projection_head": 9})
    release = RELEASES["dcl_resnet50.in1k_lightly"]
    sections = conversion_card_sections(report, release, release.sources[0].url, verified=True)
    who = sections["Who trained it"]
    assert who.startswith("Trained by lightly") and "not the paper's authors" in who and "DCLLoss(temperature=0.1)" in who
    assert "This is not the paper's own checkpoint" in who
    assert "the publisher's (not the paper's) numbers" in sections["Reported results"]
    assert "linear_top1 65.1%" in sections["Reported results"] and "knn_top1 49.6%" in sections["Reported results"]
    assert f"copied from {release.sources[0].page}" in sections["Origin"] and "License :: OSI Approved :: MIT" in sections["Origin"]
    authors = conversion_card_sections(report, RELEASES["jcl_resnet50.in1k_official"], None, verified=True)
    assert authors["Who trained it"].startswith("Trained by the paper's authors") and "not the paper's own" not in authors["Who trained it"]
