"""Release mirrors: ``cl-zoo publish --release`` copies a converted third-party release to a zoo repo
(licence permitting), and a mirror recorded in MIRRORS is the release's last source, its weights
checked against the recorded sha256.

The release is a local stand-in built as in ``tests/models/test_releases.py``: CACR's registered sources
(its real Hub repo id, which the fake Hub does not have, then a ``file://`` URL serving a
ResNet-18 checkpoint in CACR's layout), so "the publisher is gone" is simply deleting that file.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint import CARD_NAME, CONFIG_NAME, WEIGHTS_NAME
from cl_zoo.checkpoint.card import parse_front_matter
from cl_zoo.convert.mirror import mirror_info, provenance_section
from cl_zoo.cli import main
from cl_zoo.errors import CheckpointError
from cl_zoo.models.releases import MIRRORS, REDISTRIBUTION, RELEASES, HubSource, Mirror, UrlSource
from cl_zoo.registry import PretrainedCfg, register_pretrained, unregister_pretrained

from tests.hub_server import FakeHub, serve
from tests.official_checkpoints import cacr_file

TOKEN = "hf_release_mirror_token"

CACR = "cacr_resnet50.in1k_official"
NAME = "cacr_resnet18.test_mirror"
MIRROR_REPO = "zoo-mirrors/cacr-test"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    monkeypatch.delenv("CL_ZOO_OFFLINE", raising=False)
    with serve(tmp_path, monkeypatch, TOKEN, CL_ZOO_CACHE=str(tmp_path / "cl-cache")) as server:
        yield server


@pytest.fixture
def release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Path]]:
    """CACR's release with a ResNet-18 file in its layout behind a file:// URL (its Hub source stays real)."""
    (tmp_path / "publisher").mkdir()
    path, _ = cacr_file(tmp_path / "publisher")
    real_hub = RELEASES[CACR].sources[0]
    url = UrlSource(url=path.as_uri(), page="https://example.org/cacr-test/README.md", quote=path.as_uri())
    stand_in = dataclasses.replace(RELEASES[CACR], name=NAME, arch="resnet18", filename="cacr_mirror_test.pth.tar",
                                   sources=(real_hub, url))
    monkeypatch.setitem(RELEASES, NAME, stand_in)
    register_pretrained(NAME, "resnet18", PretrainedCfg(url=url.url, method="cacr", license="mit",
                                                        metrics=dict(stand_in.reported)))
    yield stand_in, path
    unregister_pretrained(NAME)


def features(model: torch.nn.Module) -> torch.Tensor:
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(x)


def publish_release(capsys: pytest.CaptureFixture[str], *extra: str, code: int = 0) -> tuple[list[str], str]:
    rc = main(["publish", "--release", NAME, "--repo-id", MIRROR_REPO, *extra])
    out, err = capsys.readouterr()
    assert rc == code, err
    assert TOKEN not in out + err
    return out.strip().splitlines(), err


def main_files(hub: FakeHub, repo_id: str) -> dict[str, bytes]:
    repo = hub.repos[repo_id]
    return {p: hub.read_blob(sha) for p, sha in repo.commits[repo.refs["main"]].files.items()}


def pins_from(lines: list[str]) -> dict[str, str]:
    """The MIRRORS entry publish prints for the maintainer to paste into releases.py."""
    line = next(line for line in lines if line.strip().startswith(f"MIRRORS[{NAME!r}]"))
    mirror = eval(line.split("=", 1)[1], {"Mirror": Mirror})  # noqa: S307 - our own printed repr
    assert mirror.repo_id == MIRROR_REPO
    return dict(mirror.sha256)


def publisher_gone(tmp_path: Path, path: Path) -> None:
    """The publisher's file disappears and nothing converted is cached: only the mirror is left."""
    path.unlink()
    shutil.rmtree(tmp_path / "cl-cache" / "releases", ignore_errors=True)


def test_mirror_is_published_with_provenance_then_serves_the_release_when_the_publisher_is_gone(
    hub: FakeHub, release: tuple[Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stand_in, path = release
    direct = cl_zoo.create_model(NAME, pretrained=True)  # the publisher's file, converted
    expected = features(direct)
    record = tmp_path / "mirrors.jsonl"

    lines, _ = publish_release(capsys, "--record", str(record))
    assert lines[0].startswith(f"uploaded: {MIRROR_REPO} @ ") and "new repo" in lines[0]
    pins = pins_from(lines)
    files = main_files(hub, MIRROR_REPO)
    config = json.loads(files[CONFIG_NAME])
    assert config["mirror"] == {
        "release": NAME,
        "base_model": "hjzheng/CACR",  # the publisher's own Hub repo (its first HubSource)
        "pages": [stand_in.sources[0].page, "https://example.org/cacr-test/README.md"],
        "licence_page": stand_in.licence_page,
        "licence_quote": "license: mit",
        "licence": "mit",
        "redistribution": REDISTRIBUTION["mit"].terms,
    }
    assert config["files"] == pins and set(pins) == {WEIGHTS_NAME}
    card = files[CARD_NAME].decode()
    assert parse_front_matter(card)["license"] == "mit"
    provenance = card.split("## Provenance", 1)[1].split("\n## ", 1)[0]
    assert f"copy of the release `{NAME}`" in provenance and path.as_uri() in provenance  # where it was copied from
    assert "https://huggingface.co/hjzheng/CACR" in provenance and "Licence: **mit**" in provenance
    assert f"cl_zoo.load_pretrained('hf-hub:{MIRROR_REPO}')" in card and str(tmp_path) not in card.replace(path.as_uri(), "")
    assert "## Who trained it" in card and "## Conversion" in card  # the conversion's own sections are kept
    row = json.loads(record.read_text())
    assert row["action"] == "uploaded" and row["files"][WEIGHTS_NAME] == pins[WEIGHTS_NAME]

    # Publishing again changes nothing on the Hub.
    head = hub.repos[MIRROR_REPO].refs["main"]
    lines, _ = publish_release(capsys)
    assert lines[0] == f"unchanged: {MIRROR_REPO}" and hub.repos[MIRROR_REPO].refs["main"] == head

    # Recorded as the release's mirror, it is the source used once the publisher's are gone.
    monkeypatch.setitem(MIRRORS, NAME, Mirror(MIRROR_REPO, pins))
    publisher_gone(tmp_path, path)
    n_requests = len(hub.requests)
    model = cl_zoo.create_model(NAME, pretrained=True)
    assert torch.equal(features(model), expected)
    assert any(method == "GET" and url.startswith(f"/{MIRROR_REPO}/resolve/") and url.endswith(WEIGHTS_NAME)
               for method, url in hub.requests[n_requests:])  # the weights came from the mirror repo
    cached = tmp_path / "cl-cache" / "releases" / NAME
    assert json.loads((cached / CONFIG_NAME).read_text())["mirror"]["release"] == NAME

    # Cached where a conversion would be: the next load needs neither the publisher nor the Hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n_requests = len(hub.requests)
    assert torch.equal(features(cl_zoo.create_model(NAME, pretrained=True)), expected)
    assert len(hub.requests) == n_requests


def test_a_tampered_mirror_is_refused_and_the_error_names_every_source(
    hub: FakeHub, release: tuple[Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stand_in, path = release
    lines, _ = publish_release(capsys)
    pins = pins_from(lines)
    # Someone with write access replaces the weights (same header, one value changed: still loadable).
    data = bytearray(main_files(hub, MIRROR_REPO)[WEIGHTS_NAME])
    data[-3] ^= 0x01
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.endpoint, token=TOKEN).upload_file(
        path_or_fileobj=bytes(data), path_in_repo=WEIGHTS_NAME, repo_id=MIRROR_REPO, commit_message="tamper")
    monkeypatch.setitem(MIRRORS, NAME, Mirror(MIRROR_REPO, pins))
    publisher_gone(tmp_path, path)
    with pytest.raises(CheckpointError) as info:
        cl_zoo.create_model(NAME, pretrained=True)
    message = str(info.value)
    assert "\n" not in message
    hub_source, url_source = stand_in.sources
    assert f"1) {hub_source.describe()}" in message and f"2) {url_source.url}" in message
    assert f"3) mirror hf-hub:{MIRROR_REPO} (sha256 mismatch" in message
    assert not (tmp_path / "cl-cache" / "releases" / NAME / CONFIG_NAME).exists()  # nothing unverified is cached


def test_a_mirror_with_an_unpinned_weights_file_is_refused(
    hub: FakeHub, release: tuple[Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, path = release
    lines, _ = publish_release(capsys)
    pins = pins_from(lines)
    monkeypatch.setitem(MIRRORS, NAME, Mirror(MIRROR_REPO, {"model-00001-of-00002.safetensors": pins[WEIGHTS_NAME]}))
    publisher_gone(tmp_path, path)
    with pytest.raises(CheckpointError, match="are not the pinned ones"):
        cl_zoo.create_model(NAME, pretrained=True)


def test_staging_a_mirror_over_an_earlier_staging_replaces_its_files_and_never_writes_through_them(
    hub: FakeHub, release: tuple[Any, Path], tmp_path: Path,
) -> None:
    """config.json and the card are written atomically (a new file renamed into place): an earlier
    staging may hold them as hard links to somebody else's file (here, the cached conversion's own
    config), which a write in place would change too."""
    from cl_zoo.convert.mirror import stage_mirror

    first = stage_mirror(NAME, tmp_path / "first")
    cached = tmp_path / "cl-cache" / "releases" / NAME
    before = {name: (cached / name).read_bytes() for name in (CONFIG_NAME, CARD_NAME)}
    dest = tmp_path / "again"
    dest.mkdir()
    for name in (CONFIG_NAME, CARD_NAME):
        (dest / name).hardlink_to(cached / name)
    stage_mirror(NAME, dest)
    assert {name: (cached / name).read_bytes() for name in (CONFIG_NAME, CARD_NAME)} == before  # the cache is untouched
    config = json.loads((dest / CONFIG_NAME).read_text())
    assert config["mirror"]["release"] == NAME and (dest / CONFIG_NAME).read_bytes() == (first / CONFIG_NAME).read_bytes()
    assert (dest / CONFIG_NAME).stat().st_nlink == 1
    assert "# Provenance" in (dest / CARD_NAME).read_text() and (dest / CARD_NAME).stat().st_nlink == 1  # its own file now
    assert not [p.name for p in dest.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_a_release_whose_licence_forbids_copies_is_refused_in_one_line_before_any_download(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    jcl = RELEASES["jcl_resnet50.in1k_official"]  # no licence statement: all rights reserved
    for extra in ([], ["--dry-run"]):
        rc = main(["publish", "--release", jcl.name, "--repo-id", "zoo-mirrors/jcl", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(f"error: refusing to mirror {jcl.name}") and err.count("\n") == 1
        assert "(other;" in err and jcl.licence_page in err and "does not allow redistribution" in err
        assert "all rights are reserved" in err
    # A licence id cl-zoo has no terms for is refused too: a licence is never guessed.
    monkeypatch.setitem(RELEASES, jcl.name, dataclasses.replace(jcl, licence="cc-by-sa-4.0"))
    assert main(["publish", "--release", jcl.name, "--repo-id", "zoo-mirrors/jcl"]) == 2
    assert "no redistribution terms recorded for the licence id 'cc-by-sa-4.0'" in capsys.readouterr().err
    assert hub.requests == [] and not hub.repos
    assert not (tmp_path / "cl-cache" / "releases").exists()  # nothing was fetched


def test_shipped_registry_has_no_mirror_and_a_decision_for_every_release_licence() -> None:
    assert MIRRORS == {}  # no mirror is published yet: nothing may name a repo that does not exist
    for name, release in RELEASES.items():
        assert release.licence in REDISTRIBUTION, name
        assert release.redistribution is REDISTRIBUTION[release.licence]
    assert not RELEASES["jcl_resnet50.in1k_official"].redistribution.allowed
    assert RELEASES["cmc_resnet50x1_lab.in1k_official"].redistribution.allowed  # BSD 2-Clause


def test_cc_by_nc_mirrors_are_allowed_and_carry_the_noncommercial_terms() -> None:
    moco = RELEASES["mocov2_resnet50.in1k_official"]
    assert moco.licence == "cc-by-nc-4.0" and moco.redistribution.allowed
    info = mirror_info(moco)
    assert info["base_model"] is None  # its only source is a URL
    assert info["pages"] == [moco.sources[0].page] and info["licence_quote"] == moco.licence_quote
    text = provenance_section(moco, info, moco.sources[0].url)
    assert "Non-commercial use only" in text and "NON-COMMERCIAL purposes only" in text
    assert "https://creativecommons.org/licenses/by-nc/4.0/" in text and moco.licence_page in text
    assert isinstance(RELEASES[CACR].sources[0], HubSource) and mirror_info(RELEASES[CACR])["base_model"] == "hjzheng/CACR"
