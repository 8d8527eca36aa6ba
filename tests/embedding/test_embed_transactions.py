"""An embeddings output is one committed unit: a failed, refused or repeated run leaves what is there as it was.

Each test hashes the output's files (or the whole output tree) before and after the run that must
not damage them, and checks what the user sees: the exit code and the one ``error:`` line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import DATA, GOOD, run_cli_captured

from cl_zoo.embedding import load_embeddings
from cl_zoo.errors import DataError


def tree_hashes(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden ones included) by relative name -> sha256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def photo_folder(root: Path, picks: list[int]) -> Path:
    root.mkdir(parents=True)
    for n, k in enumerate(picks):
        shutil.copy(DATA / GOOD[k % len(GOOD)], root / f"img{n:02d}{Path(GOOD[k % len(GOOD)]).suffix}")
    return root


@pytest.fixture()
def two_sets(tmp_path: Path) -> tuple[Path, Path]:
    """Two folders of the same number of photos with different names (A's rows must never read as B's)."""
    a = photo_folder(tmp_path / "a", [0, 1, 2, 3])
    b = photo_folder(tmp_path / "b", [3, 2, 1, 0])
    for p in b.iterdir():
        p.rename(p.with_name("b_" + p.name))
    return a, b


def embed(capsys: pytest.CaptureFixture[str], inputs: Path, model: Path, out: Path | str, *extra: object) -> tuple[int, str]:
    code, _, err = run_cli_captured(["embed", str(inputs), "-m", str(model), "-o", str(out), "-b", "2", "--save-every", "1",
                                     "-j", "0", "-q", *map(str, extra)], capsys)
    return code, err


def test_disk_full_at_the_array_write_leaves_the_earlier_output_whole(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two_sets
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "emb.npy"
    assert embed(capsys, a, model_dir, out)[0] == 0
    before = tree_hashes(out_dir)

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "save", disk_full)
    code, err = embed(capsys, b, model_dir, out)
    monkeypatch.undo()
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "No space left" in err, err
    after = tree_hashes(out_dir)
    kept = {k: after.pop(k) for k in list(after) if k.startswith("emb.parts/")}
    assert after == before  # A's array, paths and metadata, byte for byte; no temporaries left
    assert any(k.endswith(".npz") for k in kept)  # B's embedded batches stay for a --resume once there is room
    features, paths, _ = load_embeddings(out)
    assert [Path(p).parent for p in paths] == [a] * 4


def mixed_outputs(tmp_path: Path, two_sets: tuple[Path, Path], model_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    a, b = two_sets
    one, two = tmp_path / "one.npy", tmp_path / "two.npy"
    assert embed(capsys, a, model_dir, one)[0] == 0
    assert embed(capsys, b, model_dir, two)[0] == 0
    return one, two


def test_readers_refuse_an_array_that_is_not_the_one_its_metadata_records(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, two = mixed_outputs(tmp_path, two_sets, model_dir, capsys)
    shutil.copy(two, one)  # B's vectors under A's names: what a half-committed write used to leave
    with pytest.raises(DataError, match="does not match"):
        load_embeddings(one)
    for args in (["search", str(one), "--query", str(two_sets[0] / "img00.jpg"), "-k", "1"],
                 ["dedup", str(one)],
                 ["index", str(one), "--out", str(tmp_path / "idx.faiss"), "--max-memory", "1G"]):
        code, _, err = run_cli_captured(args, capsys)
        assert code == 2 and err.startswith("error: ") and "does not match" in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not (tmp_path / "idx.faiss").exists()


def test_readers_refuse_a_path_list_that_is_not_the_one_its_metadata_records(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, two = mixed_outputs(tmp_path, two_sets, model_dir, capsys)
    shutil.copy(tmp_path / "two.paths.jsonl", tmp_path / "one.paths.jsonl")  # same row count, other names
    with pytest.raises(DataError, match="does not match"):
        load_embeddings(one)


def test_outputs_without_recorded_digests_still_read(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, _ = mixed_outputs(tmp_path, two_sets, model_dir, capsys)
    info = tmp_path / "one.meta.json"
    meta = json.loads(info.read_text())
    assert {"array_digest", "listing_sha256"} <= meta.keys()
    info.write_text(json.dumps({k: v for k, v in meta.items() if k not in ("array_digest", "listing_sha256")}))
    assert len(load_embeddings(one)[1]) == 4  # an earlier version's output: row counts checked as before


def test_a_refused_resume_changes_nothing_in_a_finished_shard_folder(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_sets
    out = tmp_path / "emb"
    assert embed(capsys, a, model_dir, f"{out}/", "--shard-size", "2")[0] == 0
    before = tree_hashes(out)
    code, err = embed(capsys, b, model_dir, f"{out}/", "--shard-size", "2", "--resume")
    assert code == 2 and err.startswith("error: ") and "cannot resume" in err and len(err.strip().splitlines()) == 1, err
    assert tree_hashes(out) == before and not (out / ".parts").exists()
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    assert len(load_embeddings(out)[1]) == 4  # still readable, and still its own --resume
    code, err = embed(capsys, a, model_dir, f"{out}/", "--shard-size", "2", "--resume")
    assert code == 0, err


def test_a_refused_resume_keeps_an_interrupted_shard_folder_resumable(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two_sets
    out = tmp_path / "emb"
    monkeypatch.setenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES", "1")
    assert embed(capsys, a, model_dir, f"{out}/", "--shard-size", "2")[0] == 130
    monkeypatch.delenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES")
    before = tree_hashes(out)
    code, err = embed(capsys, b, model_dir, f"{out}/", "--shard-size", "2", "--resume")
    assert code == 2 and "cannot resume" in err, err
    assert tree_hashes(out) == before
    assert embed(capsys, a, model_dir, f"{out}/", "--shard-size", "2", "--resume")[0] == 0


def replace_photo(path: Path, other: Path) -> None:
    """Another picture under the same name, with a modification time of its own."""
    shutil.copy(other, path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


@pytest.mark.parametrize("sharded", [False, True], ids=["npy", "shards"])
def test_resume_embeds_again_a_photo_replaced_after_the_interruption(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, sharded: bool) -> None:
    a, _ = two_sets
    out = f"{tmp_path / 'emb'}/" if sharded else tmp_path / "emb.npy"
    extra = ("--shard-size", "4") if sharded else ()
    monkeypatch.setenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES", "1")  # the first batch (img00, img01) is saved
    assert embed(capsys, a, model_dir, out, *extra)[0] == 130
    monkeypatch.delenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES")
    replace_photo(a / "img00.jpg", DATA / GOOD[3])
    code, err = embed(capsys, a, model_dir, out, *extra, "--resume")
    assert code == 0 and "resumed 0 (re-embedded 1 changed file)" in err, err
    fresh = tmp_path / "fresh.npy"
    assert embed(capsys, a, model_dir, fresh)[0] == 0
    np.testing.assert_array_equal(load_embeddings(Path(out))[0], load_embeddings(fresh)[0])  # the new picture's vector


def test_resume_on_a_finished_output_embeds_again_when_a_photo_was_replaced(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = two_sets
    out = tmp_path / "emb.npy"
    assert embed(capsys, a, model_dir, out)[0] == 0
    code, err = embed(capsys, a, model_dir, out, "--resume")
    assert code == 0 and "already finished" in err, err
    old = load_embeddings(out)[0]
    replace_photo(a / "img00.jpg", DATA / GOOD[3])
    code, err = embed(capsys, a, model_dir, out, "--resume")
    assert code == 0 and "changed since it was written" in err and "embedded 4 images" in err, err
    new = load_embeddings(out)[0]
    assert not np.array_equal(old[0], new[0]) and np.array_equal(old[1:], new[1:])


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_resume_with_other_inputs_leaves_a_finished_file_alone(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str) -> None:
    a, b = two_sets
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / f"emb{suffix}"
    assert embed(capsys, a, model_dir, out)[0] == 0
    before = tree_hashes(out_dir)
    code, err = embed(capsys, b, model_dir, out, "--resume")
    assert code == 2 and err.startswith("error: cannot resume") and "other inputs" in err and len(err.strip().splitlines()) == 1, err
    assert tree_hashes(out_dir) == before


def test_a_second_run_into_the_same_file_is_refused_while_the_first_holds_it(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from filelock import FileLock

    a, b = two_sets
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "emb.npy"
    assert embed(capsys, a, model_dir, out)[0] == 0
    assert sorted(p.name for p in out_dir.iterdir()) == ["emb.meta.json", "emb.npy", "emb.paths.jsonl"]  # no lock left
    with FileLock(out_dir / ".emb.npy.lock", timeout=0):  # what the first run holds while it writes
        before = tree_hashes(out_dir)
        code, err = embed(capsys, b, model_dir, out)
        assert tree_hashes(out_dir) == before
    assert code == 2 and err.startswith("error: another cl-zoo embed is writing") and ".emb.npy.lock" in err, err
    assert len(err.strip().splitlines()) == 1
    assert embed(capsys, b, model_dir, out)[0] == 0  # once released


def test_a_file_of_the_users_under_the_lock_name_is_refused(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = two_sets
    (tmp_path / ".emb.npy.lock").write_text("mine")
    code, err = embed(capsys, a, model_dir, tmp_path / "emb.npy")
    assert code == 2 and "is not a cl-zoo lock file" in err, err
    assert (tmp_path / ".emb.npy.lock").read_text() == "mine" and not (tmp_path / "emb.npy").exists()


def test_a_rerun_that_reads_nothing_leaves_the_earlier_output_and_its_report(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = two_sets
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    shutil.copy(DATA / "truncated.jpg", a / "img99.jpg")
    assert embed(capsys, a, model_dir, out_dir / "emb.npy")[0] == 0
    assert (out_dir / "emb.failures.csv").is_file()
    before = tree_hashes(out_dir)
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("truncated.jpg", "empty.jpg"):
        shutil.copy(DATA / name, broken / name)
    code, err = embed(capsys, broken, model_dir, out_dir / "emb.npy")
    assert code == 2 and "none of the 2 images could be read" in err and "left as they were" in err, err
    assert tree_hashes(out_dir) == before


def test_resume_on_a_finished_shard_folder_embeds_again_the_shard_of_a_replaced_photo(
        two_sets: tuple[Path, Path], model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = two_sets
    out = tmp_path / "emb"
    assert embed(capsys, a, model_dir, f"{out}/", "--shard-size", "2")[0] == 0
    kept = (out / "emb_00001.npy").read_bytes()
    replace_photo(a / "img00.jpg", DATA / GOOD[3])
    code, err = embed(capsys, a, model_dir, f"{out}/", "--shard-size", "2", "--resume")
    assert code == 0 and "resumed 2 (re-embedded 1 changed file)" in err and "1 finished shard" in err, err
    assert (out / "emb_00001.npy").read_bytes() == kept  # the other shard is not redone
    fresh = tmp_path / "fresh.npy"
    assert embed(capsys, a, model_dir, fresh)[0] == 0
    np.testing.assert_array_equal(load_embeddings(out)[0], load_embeddings(fresh)[0])
    code, err = embed(capsys, a, model_dir, f"{out}/", "--shard-size", "2", "--resume")
    assert code == 0 and "resumed 4" in err and "changed" not in err, err
