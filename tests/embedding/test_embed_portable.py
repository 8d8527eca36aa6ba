"""What a new user trips on with embed outputs (issue 14, points 3, 4 and 7).

Outputs must mean the same from any folder, saved progress must never vanish silently, and embed's
own path list (``.paths.jsonl``, or an older version's ``.csv``) must be usable as an image list.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import cl_zoo
from cl_zoo.cli import main
from cl_zoo.data.images import discover_images
from cl_zoo.embedding import load_embeddings, resolve_model_reference, save_embeddings
from cl_zoo.errors import DataError
from tests.helpers import DATA, GOOD



@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder holding ``photos/`` (5 images) and a tiny model at ``runs/x/model``; cwd."""
    root = tmp_path / "project"
    (root / "photos").mkdir(parents=True)
    for name in GOOD:
        shutil.copy(DATA / name, root / "photos" / name)
    shutil.copy(DATA / GOOD[2], root / "photos" / "copy_of_photo2.jpg")
    torch.manual_seed(0)
    model = cl_zoo.create_model("resnet18", width=0.25)
    model.pretrained_cfg = dataclasses.replace(model.pretrained_cfg, input_size=(3, 32, 32), crop_pct=0.875)
    cl_zoo.save_pretrained(model.eval(), root / "runs" / "x" / "model")
    monkeypatch.chdir(root)
    return root


def run(*args: object) -> int:
    return main([str(a) for a in args])


# -- point 3: portable outputs ------------------------------------------------------------------


def test_outputs_hold_absolute_paths_and_search_works_from_another_folder(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("embed", "photos", "-m", "runs/x/model", "-o", "emb.npy", "-j", "0", "-q") == 0
    _, paths, meta = load_embeddings(project / "emb.npy")
    assert all(os.path.isabs(p) for p in paths) and paths[0] == str(project / "photos" / "copy_of_photo2.jpg")
    assert [json.loads(line) for line in (project / "emb.paths.jsonl").read_text().splitlines()] == paths
    assert meta["model"] == str(project / "runs" / "x" / "model")
    assert json.loads(meta["inputs"]) == ["photos"] and json.loads(meta["input_roots"]) == [str(project / "photos")]
    assert run("embed", "photos", "-m", "runs/x/model", "-o", "emb.parquet", "-j", "0", "-q") == 0
    assert load_embeddings(project / "emb.parquet")[1] == paths
    capsys.readouterr()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    query = project / "photos" / "photo2.JPEG"
    for out in ("emb.npy", "emb.parquet"):
        assert run("search", project / out, "--query", query, "-k", "2", "--json", "-j", "0") == 0, capsys.readouterr().err
        hits = json.loads(capsys.readouterr().out)[0]["results"]
        assert {h["path"] for h in hits} == {str(query), str(project / "photos" / "copy_of_photo2.jpg")}


def test_old_relative_model_reference_is_resolved_beside_the_embeddings(project: Path) -> None:
    """Files written before references were absolute: found beside the file, else via ``source``."""
    save_embeddings(project / "old.npy", np.eye(2, dtype=np.float32), ["a.jpg", "b.jpg"], {"model": "runs/x/model"})
    _, _, meta = load_embeddings(project / "old.npy")
    os.chdir(project.parent)
    assert resolve_model_reference(meta, project / "old.npy") == str(project / "runs" / "x" / "model")
    gone = {"model": "no/such/model", "source": str(project / "runs" / "x" / "model")}
    assert resolve_model_reference(gone, project / "old.npy") == gone["source"]
    assert resolve_model_reference({"model": "hf-hub:o/n"}, project / "old.npy") == "hf-hub:o/n"


# -- point 4: saved progress --------------------------------------------------------------------


def test_interrupt_reports_what_was_kept_and_the_resume_command_works_from_elsewhere(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("embed", "photos", "-m", "runs/x/model", "-o", "fresh.npy", "-b", "1", "-j", "0", "-q") == 0
    capsys.readouterr()
    monkeypatch.setenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES", "2")
    assert run("embed", "photos", "-m", "runs/x/model", "-o", "emb.npy", "-b", "1", "--save-every", "1", "-j", "0", "-q") == 130
    err = capsys.readouterr().err
    assert "kept 2 of 5 images in 2 parts" in err and str(project / "emb.parts") in err, err
    command = next(line.strip() for line in err.splitlines() if line.strip().startswith("cl-zoo embed"))
    words = shlex.split(command)
    assert words[-1] == "--resume" and "--force" not in words and str(project / "emb.npy") in words
    monkeypatch.delenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES")

    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert main(words[1:]) == 0
    assert "resumed 2" in capsys.readouterr().err
    assert (project / "emb.npy").read_bytes() == (project / "fresh.npy").read_bytes()


def test_saved_parts_are_not_overwritten_without_force(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["embed", "photos", "-m", "runs/x/model", "-o", "emb.npy", "-b", "1", "--save-every", "1", "-j", "0", "-q"]
    monkeypatch.setenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES", "3")
    assert run(*args) == 130
    monkeypatch.delenv("CL_ZOO_EMBED_STOP_AFTER_BATCHES")
    capsys.readouterr()
    parts = sorted((project / "emb.parts").glob("part-*.npz"))
    assert len(parts) == 3

    assert run(*args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    assert "--resume" in err and "--force" in err and "3 of 5 images in 3 parts" in err
    assert sorted((project / "emb.parts").glob("part-*.npz")) == parts and not (project / "emb.npy").exists()

    assert run(*args, "--force") == 0
    assert "resumed 0" in capsys.readouterr().err and not (project / "emb.parts").exists()


# -- point 7: embed's outputs as path lists ----------------------------------------------------


def old_row_table(paths: list[str]) -> bytes:
    """The ``index,path`` ``.csv`` sidecar earlier versions wrote beside every ``.npy`` (csv.writer,
    ``\r\n`` line ends, names that are not UTF-8 as their own bytes)."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    writer.writerow(["index", "path"])
    writer.writerows(enumerate(paths))
    return buf.getvalue().encode("utf-8", errors="surrogateescape")


def test_embed_paths_jsonl_is_an_image_list(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An output's one path-list sidecar, ``.paths.jsonl``, is an input list giving the same rows."""
    assert run("embed", "photos", "-m", "runs/x/model", "-o", "emb.npy", "-j", "0", "-q") == 0
    assert not (project / "emb.csv").exists()  # issue 42: one path-list sidecar, not two
    _, paths, _ = load_embeddings(project / "emb.npy")
    assert discover_images([project / "emb.paths.jsonl"]) == paths
    assert run("embed", "emb.paths.jsonl", "-m", "runs/x/model", "-o", "again.npy", "-j", "0", "-q") == 0
    assert "skipped 0" in capsys.readouterr().err
    assert (project / "again.npy").read_bytes() == (project / "emb.npy").read_bytes()
    assert load_embeddings(project / "again.npy")[1] == paths


def test_an_old_csv_sidecar_is_still_an_image_list(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Users have ``emb.csv`` tables from earlier versions; they stay usable as lists."""
    assert run("embed", "photos", "-m", "runs/x/model", "-o", "emb.npy", "-j", "0", "-q") == 0
    _, paths, _ = load_embeddings(project / "emb.npy")
    (project / "old.csv").write_bytes(old_row_table(paths))
    assert discover_images([project / "old.csv"]) == paths
    assert run("embed", "old.csv", "-m", "runs/x/model", "-o", "again.npy", "-j", "0", "-q") == 0
    assert "skipped 0" in capsys.readouterr().err
    assert (project / "again.npy").read_bytes() == (project / "emb.npy").read_bytes()


def test_an_old_output_named_only_by_its_csv_still_reads(tmp_path: Path) -> None:
    """An earlier output whose only listing is its ``index,path`` table: read, names exact."""
    paths = [str(tmp_path / "two\nlines.jpg"), str(tmp_path / "comma,quote\".jpg"), str(tmp_path) + "/not-utf8-\udcff.jpg"]
    out = tmp_path / "emb.npy"
    features = np.arange(6, dtype=np.float32).reshape(3, 2)
    save_embeddings(out, features, paths, {"model": "x"})
    (tmp_path / "emb.paths.jsonl").unlink()
    (tmp_path / "emb.csv").write_bytes(old_row_table(paths))
    got, names, _ = load_embeddings(out)
    assert names == paths and np.array_equal(got, features)
    from cl_zoo.index.source import open_rows

    assert open_rows(out).paths == paths  # what search/dedup/index read
    (tmp_path / "emb.csv").write_bytes(old_row_table(paths).replace(b"\r\n1,", b"\r\n7,"))
    with pytest.raises(DataError, match=r"emb.csv row 3 is not '1,<path>'") as info:
        load_embeddings(out)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "photos/photo0.jpg,cat\nphotos/photo1.png,dog\n",  # no header: first column
        "filename,label\nphotos/photo0.jpg,cat\nphotos/photo1.png,dog\n",  # header found by its cell
        "label,path\ncat,photos/photo0.jpg\ndog,photos/photo1.png\n",  # the path column, wherever it is
        "name;x\nphotos/photo0.jpg\nphotos/photo1.png\n",  # unknown header: not a path, the next row is
    ],
)
def test_csv_list_forms(project: Path, text: str) -> None:
    (project / "list.csv").write_text(text)
    assert discover_images([project / "list.csv"]) == [str(project / "photos" / n) for n in ("photo0.jpg", "photo1.png")]
