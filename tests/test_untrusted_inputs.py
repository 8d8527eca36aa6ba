"""Small hand-made inputs that used to cost unbounded work, break outputs or end in a traceback.

Each case is built from bytes or files made here: a folder whose symlinks loop, a recipe of
nested YAML aliases, file names holding line breaks, damaged ``.meta.json``/``.npy``/Parquet/faiss
files, and a model whose features are NaN. Every refusal must be one ``error:`` line with a
non-zero exit, and must leave existing outputs untouched.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import cl_zoo
from cl_zoo.cli import main
from cl_zoo.data.folder import open_image_folder, scan_image_folder, scan_unlabeled_folder
from cl_zoo.data.images import discover_images
from cl_zoo.embedding import NonFiniteFeatureError, extract_features, load_embeddings, save_embeddings
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.index.search import build_index, load_index, save_index
from cl_zoo.train.recipe import RECIPES_DIR, Recipe

from tests.helpers import DATA, tiny_model

PHOTOS = ["photo0.jpg", "photo1.png", "photo2.JPEG", "photo3.webp"]
ODD_NAMES = ["line\nbreak.jpg", "carriage\rreturn.png", "para\u2028sep.webp", "plain.JPEG"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """A real ``cl-zoo embed`` output (``.npy`` + sidecars, and ``.parquet``) of four photos."""
    root = tmp_path_factory.mktemp("saved")
    photos = root / "photos"
    photos.mkdir()
    for name in PHOTOS:
        shutil.copy(DATA / name, photos / name)
    assert main(["embed", str(photos), "-m", str(model_dir), "-o", str(root / "emb.npy"), "-j", "0", "-q"]) == 0
    assert main(["embed", str(photos), "-m", str(model_dir), "-o", str(root / "emb.parquet"), "-j", "0", "-q"]) == 0
    return root


def one_error_line(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def copy_output(src: Path, dst: Path, stem: str = "emb") -> Path:
    """The .npy output of ``src`` with its sidecars, under ``dst``."""
    dst.mkdir(exist_ok=True)
    for f in src.glob(f"{stem}.*"):
        if f.suffix != ".parquet":
            shutil.copy(f, dst / f.name)
    return dst / f"{stem}.npy"


# ---------------------------------------------------------------------------------------------
# 1. folder walks: symlinks followed once, never in a loop
# ---------------------------------------------------------------------------------------------


@pytest.fixture()
def looped(tmp_path: Path) -> Path:
    """Two images; ``up -> ..`` and ``sub/loop -> root`` (which never finished) and a doubly linked folder."""
    root = tmp_path / "data" / "photos"
    (root / "sub").mkdir(parents=True)
    (root / "real").mkdir()
    shutil.copy(DATA / PHOTOS[0], root / PHOTOS[0])
    shutil.copy(DATA / PHOTOS[1], root / "sub" / PHOTOS[1])
    shutil.copy(DATA / PHOTOS[2], root / "real" / PHOTOS[2])
    (root / "up").symlink_to("..")
    (root / "sub" / "loop").symlink_to(root)
    (root / "alias").symlink_to("real")  # the same folder twice: the real name is the one kept
    return root


def test_discover_follows_each_folder_once(looped: Path) -> None:
    start = time.perf_counter()
    found = discover_images([looped])
    assert time.perf_counter() - start < 2
    assert found == sorted([str(looped / PHOTOS[0]), str(looped / "sub" / PHOTOS[1]), str(looped / "real" / PHOTOS[2])])
    assert found.repeats == 3  # up, sub/loop, alias


def test_embed_reports_skipped_repeats(looped: Path, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "emb.npy"
    assert main(["embed", str(looped), "-m", str(model_dir), "-o", str(out), "-j", "0", "-q"]) == 0
    err = capsys.readouterr().err
    assert "skipped 3 linked folders already walked" in err and "embedded 3 images" in err
    assert len(load_embeddings(out)[1]) == 3


def test_training_folders_follow_each_folder_once(looped: Path, tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"skipped 3 linked folders already walked"):
        data = scan_unlabeled_folder(looped)
    assert len(data) == 3 and data.repeats == 3
    labelled = tmp_path / "classes"
    for cls in ("cat", "dog"):
        (labelled / cls).mkdir(parents=True)
        shutil.copy(DATA / PHOTOS[0], labelled / cls / "a.jpg")
        (labelled / cls / "back").symlink_to("..")  # into the dataset root: every class again, forever
        (labelled / cls / "self").symlink_to(".")
    with pytest.warns(UserWarning, match="skipped 4 linked folders"):
        data = scan_image_folder(labelled)
    assert data.paths == [str(labelled / "cat" / "a.jpg"), str(labelled / "dog" / "a.jpg")] and data.repeats == 4
    with pytest.warns(UserWarning, match="skipped 2 linked folders"):
        assert len(open_image_folder(labelled / "cat", require_labels=False)) == 1


# ---------------------------------------------------------------------------------------------
# 2. recipes: no YAML aliases
# ---------------------------------------------------------------------------------------------

ALIAS_BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
method_args: {bomb: *f}
"""


def test_alias_bomb_recipe_is_refused_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    start = time.perf_counter()
    with pytest.raises(ClZooError, match="anchors and aliases are not allowed") as info:
        Recipe.load(bomb).with_overrides({"epochs": 1})
    assert time.perf_counter() - start < 2
    assert str(bomb) in str(info.value) and "\n" not in str(info.value)
    lone = tmp_path / "alias.yaml"
    lone.write_text("epochs: 3\nseed: *x\n")  # an alias with no anchor is refused the same way
    with pytest.raises(ClZooError, match="alias"):
        Recipe.load(lone)
    start = time.perf_counter()
    assert main(["pretrain", "--recipe", str(bomb), "--out", str(tmp_path / "run")]) != 0
    assert time.perf_counter() - start < 2
    one_error_line(capsys, str(bomb), "aliases")


def test_bundled_recipes_still_load() -> None:
    recipes = sorted(glob.glob(str(RECIPES_DIR / "*.yaml")))
    assert recipes
    for path in recipes:
        recipe = Recipe.load(path).with_overrides({"seed": 1})
        assert recipe.seed == 1


# ---------------------------------------------------------------------------------------------
# 3. outputs hold any file name; old outputs still read
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_names_with_line_breaks_round_trip(suffix: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for name, src in zip(ODD_NAMES, PHOTOS):
        shutil.copy(DATA / src, photos / name)
    shutil.copy(DATA / PHOTOS[0], photos / "copy\nof photo0.jpg")
    out = tmp_path / f"emb{suffix}"
    assert main(["embed", str(photos), "-m", str(model_dir), "-o", str(out), "-j", "0", "-q"]) == 0
    capsys.readouterr()
    features, paths, _ = load_embeddings(out)
    assert paths == sorted(str(photos / n) for n in [*ODD_NAMES, "copy\nof photo0.jpg"]) and features.shape[0] == 5

    query = str(photos / ODD_NAMES[0])
    assert main(["search", str(out), "--query", query, "-k", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # The query and "copy\nof photo0.jpg" are the same photo: the two top hits, in whichever order the
    # stored features' last bits put them (bf16 on an AMX host ranks the copy first, an EPYC the query).
    assert report[0]["query"] == query
    assert {hit["path"] for hit in report[0]["results"]} == {query, str(photos / "copy\nof photo0.jpg")}
    assert main(["search", str(out), "--query", query, "-k", "5"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert len(text) == 1 + 5 and json.dumps(query) == text[0]  # one line per hit, odd names quoted
    assert main(["dedup", str(out), "--threshold", "0.9999", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [[str(photos / "copy\nof photo0.jpg"), query]]


def test_old_paths_txt_output_is_still_read(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    emb = copy_output(saved, tmp_path / "old")
    features, paths, _ = load_embeddings(emb)
    listing = emb.with_name("emb.paths.jsonl")
    listing.unlink()
    emb.with_name("emb.paths.txt").write_text("".join(p + "\n" for p in paths), encoding="utf-8")  # what 0.x wrote
    again, old_paths, meta = load_embeddings(emb)
    assert old_paths == paths and np.array_equal(again, features) and meta["count"] == len(paths)
    assert main(["dedup", str(emb), "--threshold", "0.99"]) == 0
    assert "0 groups" in capsys.readouterr().err
    # Writing over it replaces the old listing, so no stale file contradicts the new one.
    save_embeddings(emb, features, paths, {"model": "x"})
    assert listing.is_file() and not emb.with_name("emb.paths.txt").exists()


# ---------------------------------------------------------------------------------------------
# 4. damaged outputs: one error line each
# ---------------------------------------------------------------------------------------------


def npy_bytes(header: str, data: bytes = b"") -> bytes:
    """A version-1.0 .npy with this header dict text, padded as numpy pads it."""
    body = header.encode("latin1")
    total = 10 + len(body) + 1
    body += b" " * ((64 - total % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body + data


BAD_META = {
    "not JSON": (b"{not json", "is not valid JSON"),
    "a list": (b"[1, 2, 3]", "not an object"),
    "deep nesting": (b"[" * 100000, "is not valid JSON"),
    "text dims": (b'{"dims": "512", "count": 4}', "dims must be a non-negative integer"),
    "wrong count": (b'{"dims": 128, "count": 7}', "records count 7"),
    "model not text": (b'{"model": {"a": 1}}', "model must be a string"),
    "not UTF-8": (b'{"model": "\xff"}', "is not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_bad_meta_json(case: str, saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content, message = BAD_META[case]
    emb = copy_output(saved, tmp_path / "o")
    emb.with_name("emb.meta.json").write_bytes(content)
    with pytest.raises(DataError, match=message):
        load_embeddings(emb)
    assert main(["dedup", str(emb)]) == 2
    one_error_line(capsys, message)
    assert main(["search", str(emb), "--query", str(DATA / PHOTOS[0])]) == 2
    one_error_line(capsys, message)


BAD_NPY = {
    "unicode": (npy_bytes("{'descr': '<U8', 'fortran_order': False, 'shape': (4, 1), }", b"x" * 128), "not floating-point"),
    "object": (npy_bytes("{'descr': '|O', 'fortran_order': False, 'shape': (4, 128), }", b"\x80\x04N."), "not floating-point"),
    "10^14 elements": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000000, 1), }"), "header describes"),
    "truncated": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 128), }", b"\0" * 100), "header describes"),
    "1-D": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (512,), }", b"\0" * 2048), "2-D"),
    "header junk": (npy_bytes("{'descr': __import__('os'), }"), "not a readable .npy"),
    "not npy": (b"PK\x03\x04 a zip file", "not a readable .npy"),
    "NaN rows": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 128), }", np.full(512, np.nan, "<f4").tobytes()), "not finite"),
    "integers": (npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (4, 128), }", b"\0" * 2048), "not floating-point"),
}


@pytest.mark.parametrize("case", sorted(BAD_NPY))
def test_bad_npy(case: str, saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content, message = BAD_NPY[case]
    emb = copy_output(saved, tmp_path / "o")
    emb.write_bytes(content)
    # As an earlier version wrote it (no digest of the array in its metadata), so each check of the array itself is reached.
    info = emb.with_name("emb.meta.json")
    info.write_text(json.dumps({k: v for k, v in json.loads(info.read_text()).items() if k != "array_digest"}))
    with pytest.raises(DataError, match=message):
        load_embeddings(emb)
    assert main(["dedup", str(emb)]) == 2
    one_error_line(capsys, message)


def test_listing_that_disagrees_or_is_not_json(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    emb = copy_output(saved, tmp_path / "o")
    listing = emb.with_name("emb.paths.jsonl")
    rows = listing.read_text().splitlines()
    listing.write_text("\n".join(rows[:-1]) + "\n")
    assert main(["dedup", str(emb)]) == 2
    one_error_line(capsys, "lists 3 paths")
    listing.write_text("\n".join([*rows[:-1], "/raw/path.jpg"]) + "\n")
    assert main(["dedup", str(emb)]) == 2
    one_error_line(capsys, "line 4 is not a JSON string")
    listing.write_text("\n".join([*rows[:-1], "[1]"]) + "\n")
    assert main(["dedup", str(emb)]) == 2
    one_error_line(capsys, "not a JSON string path")


def parquet_table(tmp_path: Path, name: str, columns: dict, metadata: dict[str, str] | None = None) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns)
    if metadata is not None:
        table = table.replace_schema_metadata({f"cl_zoo.{k}": v for k, v in metadata.items()})
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    return path


def bad_parquets(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    import pyarrow as pa

    paths = pa.array(["/a.jpg", "/b.jpg"])
    good = pa.array([[1.0, 0.0], [0.0, 1.0]], pa.list_(pa.float32()))
    return {
        "text dims": (parquet_table(tmp_path, "dims", {"path": paths, "embedding": good}, {"dims": "two"}), "dims must be a non-negative integer"),
        "string embeddings": (parquet_table(tmp_path, "strings", {"path": paths, "embedding": pa.array(["1,0", "0,1"])}), "not lists of numbers"),
        "string lists": (parquet_table(tmp_path, "strlists", {"path": paths, "embedding": pa.array([["1"], ["0"]])}), "not floating-point"),
        "ragged": (parquet_table(tmp_path, "ragged", {"path": paths, "embedding": pa.array([[1.0, 0.0, 0.5], [0.0]], pa.list_(pa.float32()))}), "differ in length"),
        "null row": (parquet_table(tmp_path, "nullrow", {"path": paths, "embedding": pa.array([[1.0, 0.0], None], pa.list_(pa.float32()))}), "null"),
        "null value": (parquet_table(tmp_path, "nullval", {"path": paths, "embedding": pa.array([[1.0, None], [0.0, 1.0]], pa.list_(pa.float32()))}), "null numbers"),
        "numeric paths": (parquet_table(tmp_path, "numpaths", {"path": pa.array([1, 2]), "embedding": good}), "not strings"),
        "no columns": (parquet_table(tmp_path, "nocols", {"x": paths}), "no 'path' and 'embedding' columns"),
        "dims disagree": (parquet_table(tmp_path, "dimsoff", {"path": paths, "embedding": good}, {"dims": "3"}), "records dims 3"),
    }


def test_bad_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = bad_parquets(tmp_path)
    (tmp_path / "junk.parquet").write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    cases["junk"] = (tmp_path / "junk.parquet", "not a readable parquet file")
    for case, (path, message) in cases.items():
        with pytest.raises(DataError, match=message):
            load_embeddings(path)
        assert main(["dedup", str(path), "--threshold", "0.9"]) == 2, case
        one_error_line(capsys, message)


def test_ragged_parquet_is_not_reshaped(tmp_path: Path) -> None:
    import pyarrow as pa

    # 2 + 4 + 0 = 6 numbers would reshape into three rows of 2, each with the wrong path.
    column = pa.array([[1.0, 2.0], [3.0, 4.0, 5.0, 6.0], []], pa.list_(pa.float32()))
    path = parquet_table(tmp_path, "shifted", {"path": pa.array(["/a", "/b", "/c"]), "embedding": column}, {"dims": "2"})
    with pytest.raises(DataError, match="row 1"):
        load_embeddings(path)


def test_bad_faiss_index_files(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    emb = copy_output(saved, tmp_path / "o")
    features, _, _ = load_embeddings(emb)
    good = save_index(build_index(features), tmp_path / "good.faiss")
    raw = good.read_bytes()
    keep = tmp_path / "keep.faiss"
    keep.write_bytes(b"an index the user made earlier")
    huge = bytearray(raw)
    huge[8:16] = (10**15).to_bytes(8, "little")  # ntotal
    vector = bytearray(raw)
    vector[-(features.size * 4) - 8 : -(features.size * 4)] = (1 << 39).to_bytes(8, "little")  # codes size: 2 TB
    cases = {
        "junk": (b"not an index at all", "not a faiss index"),
        "empty": (b"", "empty file"),
        "huge count": (bytes(huge), "index"),
        "huge vector": (bytes(vector), "not a faiss index"),
        "truncated": (raw[: len(raw) // 2], "not a faiss index"),
    }
    for case, (content, message) in cases.items():
        bad = tmp_path / f"{case}.faiss"
        bad.write_bytes(content)
        with pytest.raises(DataError, match=message):
            load_index(bad)
        argv = ["search", str(emb), "--query", str(DATA / PHOTOS[0]), "--load-index", str(bad), "--save-index", str(keep)]
        assert main(argv) == 2, case
        one_error_line(capsys, message)
        assert keep.read_bytes() == b"an index the user made earlier"  # nothing overwritten


def test_hnsw_index_with_links_out_of_range_is_refused(tmp_path: Path) -> None:
    import faiss

    x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    index = build_index(x, "hnsw")
    neighbors = faiss.vector_to_array(index.hnsw.neighbors)
    neighbors[neighbors >= 0] = 10_000  # a search would read far past the vectors
    faiss.copy_array_to_vector(neighbors, index.hnsw.neighbors)
    save_index(index, tmp_path / "h.faiss")
    # faiss 1.15 checks the links itself; older versions leave it to load_index.
    with pytest.raises(DataError, match="links name vectors that do not exist|validate_HNSW"):
        load_index(tmp_path / "h.faiss")


# ---------------------------------------------------------------------------------------------
# 5. a model whose features are not finite
# ---------------------------------------------------------------------------------------------


def overflowing_model() -> torch.nn.Module:
    """Finite weights (so the checkpoint loads) whose first convolution overflows to inf and NaN."""
    torch.manual_seed(0)
    model = tiny_model()
    with torch.no_grad():
        model.conv1.weight.fill_(3e38)
    return model


def test_nan_model_embed_refuses_without_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in PHOTOS:
        shutil.copy(DATA / name, photos / name)
    model = tmp_path / "damaged"
    cl_zoo.save_pretrained(overflowing_model(), model)
    out = tmp_path / "emb.npy"
    out.write_bytes(b"an earlier output")
    assert main(["embed", str(photos), "-m", str(model), "-o", str(out), "-j", "0", "-q", "-b", "2", "--save-every", "1"]) == 2
    one_error_line(capsys, str(model), str(photos / PHOTOS[0]), "non-finite")
    assert out.read_bytes() == b"an earlier output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged", "emb.npy", "photos"]  # no sidecars, no parts

    with pytest.raises(NonFiniteFeatureError, match=PHOTOS[0]):
        extract_features(overflowing_model(), [str(photos / n) for n in PHOTOS], batch_size=2, device="cpu", workers=0)
    with pytest.raises(NonFiniteFeatureError):
        save_embeddings(tmp_path / "x.npy", np.full((1, 4), np.nan, np.float32), ["/a.jpg"], {})
    assert not (tmp_path / "x.npy").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_fifo_in_an_image_folder_is_skipped_not_waited_on(model_dir: Path, tmp_path: Path, workers: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO named like a photo, inside a folder or a path list, blocked ``open`` (and the run) forever."""
    folder = tmp_path / "photos"
    folder.mkdir()
    shutil.copy(DATA / PHOTOS[0], folder / PHOTOS[0])
    os.mkfifo(folder / "pipe.jpg")
    listing = tmp_path / "list.txt"
    listing.write_text(f"{folder / PHOTOS[0]}\n{folder / 'pipe.jpg'}\n")
    for source, out in ((folder, tmp_path / "a.npy"), (listing, tmp_path / "b.npy")):
        assert main(["embed", str(source), "-m", str(model_dir), "-o", str(out), "-j", workers, "-q"]) == 0
        assert load_embeddings(out)[1] == [str(folder / PHOTOS[0])]
        assert "pipe.jpg,\"not a regular file (a FIFO, device or socket)\"" in out.with_suffix(".failures.csv").read_text()
    capsys.readouterr()


@pytest.mark.timeout(60)
def test_knn_refuses_a_fifo_in_a_class_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for split in ("train", "test"):
        for i, cls in enumerate(("a", "b")):
            (tmp_path / split / cls).mkdir(parents=True)
            shutil.copy(DATA / PHOTOS[i], tmp_path / split / cls / PHOTOS[i])
    os.mkfifo(tmp_path / "train" / "b" / "pipe.jpg")
    code = main(["knn", "--random-init", "-m", "resnet18_cifar", "--train", str(tmp_path / "train"),
                 "--test", str(tmp_path / "test"), "--k", "1", "--out", str(tmp_path / "k.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err and "not a regular file" in err


@pytest.mark.parametrize("version, message", [("abc", "must be a whole number >= 1, got 'abc'"), (None, "got None"),
                                              (True, "got True"), (-1, "got -1"), (99, "format_version 99, newer than")])
def test_a_forged_format_version_is_one_line(tmp_path: Path, version: object, message: str) -> None:
    """``"format_version": "abc"`` was an int() traceback in publish and card-update; 99 loaded without a word."""
    from cl_zoo.checkpoint import load_folder

    folder = cl_zoo.save_pretrained(tiny_model(seed=0), tmp_path / "ck")
    config = json.loads((folder / "config.json").read_text())
    config["format_version"] = version
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ClZooError, match=message.replace("(", r"\(")):
        load_folder(folder)
