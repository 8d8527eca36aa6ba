"""``cl-zoo publish --all``: every folder under a model_cards folder to ``<namespace>/<folder name>``,
idempotent, recorded, dry-runnable, and all-or-nothing when a folder is broken.

Runs against the fake Hub of ``tests/hub_server.py`` with the real ``huggingface_hub`` client. The
folders are tiny (``resnet18_cifar`` at width 0.125, a few hundred kB) so that each card's usage
snippet, which publish runs in a subprocess before uploading, stays fast; the real model_cards
folders are never uploaded here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator

import pytest

import cl_zoo
from cl_zoo.checkpoint import CARD_NAME, CONFIG_NAME, WEIGHTS_NAME, sha256_file
from cl_zoo.cli import main

from tests.hub_server import FakeHub, serve
from tests.helpers import assert_same_state, tiny_cifar_model

TOKEN = "hf_publish_all_token"

NS = "zoo-test"
NAMES = ("dcl_resnet18_cifar.tiny_a", "jcl_resnet18_cifar.tiny_b", "simclr_resnet18_cifar.tiny_c")  # sorted: the order published


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve(tmp_path, monkeypatch, TOKEN) as server:
        yield server


def make_zoo(root: Path, names: tuple[str, ...] = NAMES) -> Path:
    for seed, name in enumerate(names):
        cl_zoo.save_pretrained(tiny_cifar_model(seed), root / name)
    (root / "not-a-checkpoint").mkdir()  # no config.json: not published
    return root


def publish_all(zoo: Path, capsys: pytest.CaptureFixture[str], *extra: str, code: int = 0) -> list[str]:
    rc = main(["publish", "--all", "--model-cards", str(zoo), "--namespace", NS, *extra])
    out, err = capsys.readouterr()
    assert rc == code, err
    assert TOKEN not in out + err
    return out.strip().splitlines()


def writes(hub: FakeHub) -> list[tuple[str, str]]:
    return [r for r in hub.requests if r[0] == "POST"]


def main_files(hub: FakeHub, repo_id: str) -> dict[str, bytes]:
    repo = hub.repos[repo_id]
    return {path: hub.read_blob(sha) for path, sha in repo.commits[repo.refs["main"]].files.items()}


def test_publish_all_uploads_each_folder_then_reruns_as_unchanged_and_uploads_only_what_changed(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo = make_zoo(tmp_path / "model_cards")
    record = tmp_path / "pushed.jsonl"

    # First run: three new repos, one commit each, named <namespace>/<folder name>.
    lines = publish_all(zoo, capsys, "--record", str(record))
    uploaded = [line for line in lines if line.startswith("uploaded: ")]
    assert [line.split()[1] for line in uploaded] == [f"{NS}/{name}" for name in NAMES]
    assert all("new repo" in line for line in uploaded) and lines[-1] == "3 uploaded, 0 unchanged"
    assert sorted(hub.repos) == sorted(f"{NS}/{name}" for name in NAMES)
    for name in NAMES:
        assert_same_state(cl_zoo.load_pretrained(zoo / name), cl_zoo.load_pretrained(f"hf-hub:{NS}/{name}"))
        card = main_files(hub, f"{NS}/{name}")[CARD_NAME].decode()
        assert f"hf-hub:{NS}/{name}" in card and str(zoo) not in card  # the card as card_for_repo rewrites it
    heads = {name: hub.repos[f"{NS}/{name}"].refs["main"] for name in NAMES}

    # Second run: the Hub already has every file byte for byte: nothing is written at all.
    n_writes = len(writes(hub))
    lines = publish_all(zoo, capsys, "--record", str(record))
    assert lines == [f"unchanged: {NS}/{name}" for name in NAMES] + ["0 uploaded, 3 unchanged"]
    assert len(writes(hub)) == n_writes
    assert {name: hub.repos[f"{NS}/{name}"].refs["main"] for name in NAMES} == heads

    # One folder's card changes: only that repo gets a commit, and the line says which file differs.
    changed = zoo / NAMES[1]
    (changed / CARD_NAME).write_text((changed / CARD_NAME).read_text() + "\n## Notes\n\nRe-evaluated.\n")
    lines = publish_all(zoo, capsys, "--record", str(record))
    assert lines[0] == f"unchanged: {NS}/{NAMES[0]}" and lines[2] == f"unchanged: {NS}/{NAMES[2]}"
    assert lines[1].startswith(f"uploaded: {NS}/{NAMES[1]} @ ") and "1 file(s) differ: README.md" in lines[1]
    assert hub.repos[f"{NS}/{NAMES[1]}"].refs["main"] != heads[NAMES[1]]
    assert [hub.repos[f"{NS}/{n}"].refs["main"] for n in (NAMES[0], NAMES[2])] == [heads[NAMES[0]], heads[NAMES[2]]]
    assert b"Re-evaluated." in main_files(hub, f"{NS}/{NAMES[1]}")[CARD_NAME]

    # The record: one line per repo per run, what was pushed (or found) and the sha256 of each file.
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["repo_id"].split("/")[1], r["action"]) for r in rows] == (
        [(n, "uploaded") for n in NAMES] + [(n, "unchanged") for n in NAMES]
        + [(NAMES[0], "unchanged"), (NAMES[1], "uploaded"), (NAMES[2], "unchanged")])
    assert all(set(r) == {"repo_id", "action", "commit", "files", "time"} for r in rows)
    for row in rows[-3:]:
        repo_id = row["repo_id"]
        assert row["commit"] == hub.repos[repo_id].refs["main"]  # uploaded: the new commit; unchanged: main's
        remote = main_files(hub, repo_id)
        assert row["files"] == {path: hashlib.sha256(data).hexdigest() for path, data in remote.items()
                                if path != ".gitattributes"}
        folder = zoo / repo_id.split("/")[1]
        assert row["files"][CONFIG_NAME] == sha256_file(folder / CONFIG_NAME)
        assert row["files"][WEIGHTS_NAME] == sha256_file(folder / WEIGHTS_NAME)
    assert rows[0]["commit"] == heads[NAMES[0]] and rows[3]["commit"] == heads[NAMES[0]]


def test_a_file_removed_from_a_folder_is_removed_from_its_repo(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo = make_zoo(tmp_path / "model_cards", NAMES[:1])
    repo_id = f"{NS}/{NAMES[0]}"
    (zoo / NAMES[0] / "eval_knn.json").write_text('{"top1": 0.5}\n')
    publish_all(zoo, capsys)
    assert "eval_knn.json" in main_files(hub, repo_id)
    (zoo / NAMES[0] / "eval_knn.json").unlink()
    lines = publish_all(zoo, capsys)
    assert lines[0].startswith(f"uploaded: {repo_id}") and "eval_knn.json" in lines[0]
    assert "eval_knn.json" not in main_files(hub, repo_id)  # otherwise the repo would never match again
    assert publish_all(zoo, capsys)[0] == f"unchanged: {repo_id}"


def test_dry_run_validates_compares_and_uploads_nothing(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo = make_zoo(tmp_path / "model_cards", NAMES[:2])
    record = tmp_path / "pushed.jsonl"
    lines = publish_all(zoo, capsys, "--dry-run", "--record", str(record))
    assert lines[0].startswith(f"would upload: {NS}/{NAMES[0]} (new repo, ") and str(zoo / NAMES[0]) in lines[0]
    assert lines[1].startswith(f"would upload: {NS}/{NAMES[1]} (new repo, ")
    assert lines[-1].startswith("dry run: 2 folder(s) validated, 2 would be uploaded") and "nothing uploaded" in lines[-1]
    assert not hub.repos and not writes(hub) and not record.exists()

    # Offline it cannot compare, and says so; it still validates every folder (the card's snippet included).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n_requests = len(hub.requests)
    lines = publish_all(zoo, capsys, "--dry-run")
    assert all("cannot tell: offline" in line for line in lines[:2]) and "2 cannot tell" in lines[-1]
    assert len(hub.requests) == n_requests


def test_one_broken_folder_stops_the_run_in_one_line_and_nothing_is_uploaded(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo = make_zoo(tmp_path / "model_cards", NAMES[:2])
    (zoo / NAMES[1] / WEIGHTS_NAME).unlink()
    rc = main(["publish", "--all", "--model-cards", str(zoo), "--namespace", NS])
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert NAMES[1] in err and "weights missing" in err
    assert not hub.repos and not writes(hub)  # validated first: not even the good folder before it went up
    assert not out


@pytest.mark.parametrize("args,message", [
    ([], "give exactly one of FOLDER, --all or --release"),
    (["somewhere", "--all"], "got FOLDER and --all"),
    (["--all", "--repo-id", "a/b"], "use --namespace, not --repo-id"),
    (["--release", "x.y"], "--release needs --repo-id"),
    (["--all", "--namespace", "a/b"], "not a Hub user or organisation name"),
])
def test_usage_mistakes_are_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--model-cards", str(make_zoo(tmp_path / "mc", NAMES[:1]))] if "--namespace" in args else []
    assert main(["publish", *args, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
