"""``search --plot``, ``dedup --plot`` and ``index --out`` replace only files of their own kind, never a photo."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from tests.helpers import DATA, GOOD, run_cli_captured

pytest.importorskip("faiss")
pytest.importorskip("matplotlib")


@pytest.fixture()
def embedded(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    """(photo folder, its embeddings): four photos, one a PNG."""
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in GOOD:
        shutil.copy(DATA / name, photos / name)
    out = tmp_path / "emb.npy"
    code, _, err = run_cli_captured(["embed", str(photos), "-m", str(model_dir), "-o", str(out), "-j", "0", "-q"], capsys)
    assert code == 0, err
    return photos, out


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(capsys: pytest.CaptureFixture[str], args: list[str], victim: Path, message: str) -> None:
    before = digest(victim)
    code, _, err = run_cli_captured(args, capsys)
    assert code == 2 and err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err
    assert digest(victim) == before


def test_search_plot_naming_its_own_query_photo_is_refused(embedded: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    photos, emb = embedded
    query = photos / "photo1.png"
    refused(capsys, ["search", str(emb), "--query", str(query), "-k", "1", "--plot", str(query)], query, "is not a plot that cl-zoo wrote")


def test_dedup_plot_naming_an_embedded_photo_is_refused(embedded: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    photos, emb = embedded
    refused(capsys, ["dedup", str(emb), "--threshold", "0.0", "--plot", str(photos / "photo1.png")], photos / "photo1.png",
            "is not a plot that cl-zoo wrote")


def test_a_plot_cl_zoo_drew_is_replaced(embedded: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, emb = embedded
    plot = tmp_path / "groups.png"
    for _ in range(2):
        code, _, err = run_cli_captured(["dedup", str(emb), "--threshold", "0.0", "--plot", str(plot)], capsys)
        assert code == 0 and plot.is_file(), err


def test_index_out_naming_a_photo_is_refused(embedded: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    photos, emb = embedded
    holiday = tmp_path / "holiday.jpg"
    shutil.copy(photos / "photo0.jpg", holiday)
    refused(capsys, ["index", str(emb), "--out", str(holiday), "--max-memory", "1G"], holiday, "is not a faiss index that cl-zoo wrote")
    assert not (tmp_path / "holiday.jpg.json").exists() and not (tmp_path / "holiday.json").exists()
    index = tmp_path / "emb.faiss"
    for _ in range(2):  # an earlier build is replaced
        code, _, err = run_cli_captured(["index", str(emb), "--out", str(index), "--max-memory", "1G"], capsys)
        assert code == 0, err
