"""A file is read as a list of paths only under a list's name (.txt, .jsonl, .csv, .tsv, .parquet).

Any other file was read as one: ``embed README.md`` said "none of the 308 images could be read",
``embed README.md examples/photos`` exited 0 having "skipped 308", and ``search --query README.md``
printed 309 warnings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cl_zoo.cli import main
from cl_zoo.data.images import discover_images
from cl_zoo.embedding.inputs import resolve_inputs
from cl_zoo.errors import DataError
from tests.helpers import EXAMPLE_PHOTOS_DIR, REPO_ROOT, refuse_model_loads

README = REPO_ROOT / "README.md"


def refusal(path: Path) -> str:
    return (f"error: {path} is neither an image (.bmp, .gif, .jpeg, .jpg, .png, .tif, .tiff, .webp) nor a list of paths "
            "(.csv, .jsonl, .parquet, .tsv, .txt); a list of paths is read only under one of those names\n")


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_model_loads(monkeypatch, "a model was loaded before the inputs were checked")


@pytest.mark.parametrize("extra", [[], [str(EXAMPLE_PHOTOS_DIR)]], ids=["alone", "beside-a-folder"])
def test_embed_of_a_text_file_that_is_no_list_is_one_line(extra: list[str], tmp_path: Path, no_model_loads: None,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["embed", str(README), *extra, "-o", str(tmp_path / "e.npy"), "-j", "0"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", refusal(README))
    assert not list(tmp_path.iterdir())


def test_search_query_that_is_no_list_is_one_line(tmp_path: Path, no_model_loads: None, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("faiss")
    emb = tmp_path / "emb.npy"
    np.save(emb, np.eye(2, 8, dtype=np.float32))
    (tmp_path / "emb.paths.txt").write_text("a.jpg\nb.jpg\n")
    code = main(["search", str(emb), "--query", str(README), "-m", "resnet18"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", refusal(README))


def test_list_names_are_still_lists(tmp_path: Path) -> None:
    photo = EXAMPLE_PHOTOS_DIR / "pot.jpg"
    for name in ("list.txt", "LIST.TXT", "list.csv", "list.tsv"):
        (tmp_path / name).write_text(f"path\n{photo}\n" if name.endswith("sv") else f"{photo}\n")
        assert discover_images([tmp_path / name]) == [str(photo)]
    (tmp_path / "list.jsonl").write_text(f'"{photo}"\n')
    assert resolve_inputs([tmp_path / "list.jsonl"]).files == [str(photo)]
    for name in ("paths", "notes.md", "model.pth"):
        (tmp_path / name).write_text(f"{photo}\n")
        with pytest.raises(DataError, match=f"{name} is neither an image") as info:
            resolve_inputs([tmp_path / name])
        assert "\n" not in str(info.value)
