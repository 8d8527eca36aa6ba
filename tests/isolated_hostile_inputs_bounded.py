"""Issue 40 (part 2): hostile lists, brace patterns, tar headers and index files are bounded before
they are materialised, and every refusal is one ``error:`` line.

Each case is built here from hand-made bytes. The peak-memory cases (8-10) also run in a
subprocess that reads its own VmHWM against a control run on tiny valid inputs, because a bound
checked only after materialising still costs the memory it was meant to save.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cl_zoo.cli import main
from cl_zoo.data import images
from cl_zoo.embedding.inputs import MAX_BRACE_DEPTH, MAX_EXPANSION, brace_size, resolve_inputs
from cl_zoo.embedding.preprocess import MAX_TAR_HEADER_BYTES, Preprocess, ShardError, TarBatches
from cl_zoo.errors import DataError
from tests.helpers import REPO_ROOT, embed_test_photos, mutate, run_cli_captured

REPO = REPO_ROOT
PRE = Preprocess(resize_size=16, crop_size=(16, 16))
COUNTS: Counter[str] = Counter()


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def jpeg(colour: str = "red") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (20, 20), colour).save(buf, "JPEG")
    return buf.getvalue()


# ----------------------------------------------------------------- hand-made hostile files (cases 8 and 10)


def identical_rows_parquet(path: Path, rows: int, value: str = "a.jpg") -> Path:
    """``rows`` copies of one path: dictionary + RLE encoding keeps 2M rows in ~7 KB."""
    chunk = pa.table({"path": pa.array([value] * min(rows, 1_000_000), pa.string())})
    with pq.ParquetWriter(path, chunk.schema, compression="zstd", use_dictionary=True) as writer:
        left = rows
        while left:
            writer.write_table(chunk.slice(0, min(left, len(chunk))), row_group_size=64 << 20)
            left -= min(left, len(chunk))
    return path


def _header(name: str, size: int, kind: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def declared_header_tar(path: Path, declared: int, kind: bytes) -> Path:
    """A .tar.gz whose first record is a GNU long name / pax header declaring ``declared`` bytes (zeros,
    so 512 MiB gzip to ~0.5 MiB), then one image member."""
    image = jpeg()
    with gzip.open(path, "wb", compresslevel=9) as out:
        out.write(_header("././@LongLink", declared, kind))
        zero, left = bytes(1 << 20), declared + (-declared % 512)
        while left:
            out.write(zero[: min(left, len(zero))])
            left -= min(left, len(zero))
        out.write(_header("s0.jpg", len(image), tarfile.REGTYPE) + image + bytes(-len(image) % 512) + bytes(1024))
    return path


def shard(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT) -> Path:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


# ----------------------------------------------------------------- case 6: remote lists never switch scheme


@pytest.fixture()
def served(tmp_path: Path, http_folder) -> str:  # noqa: ANN001 - conftest's server factory
    (tmp_path / "www").mkdir()
    return http_folder(tmp_path / "www")


@pytest.mark.parametrize("row", ["file://{secret}", "FILE://{secret}", "file:{secret}", "s3://bucket/x.jpg", "C:\\x.jpg"])
@pytest.mark.parametrize("kind", ["txt", "csv", "parquet"])
def test_a_remote_list_cannot_name_local_files(tmp_path: Path, served: str, capsys: pytest.CaptureFixture[str], row: str, kind: str) -> None:
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(jpeg())
    before = secret.read_bytes()
    cell = row.format(secret=secret)
    www = tmp_path / "www"
    if kind == "txt":
        (www / "list.txt").write_text(f"a.jpg\n{cell}\n")
    elif kind == "csv":
        (www / "list.csv").write_text(f"path\na.jpg\n{cell}\n")
    else:
        pq.write_table(pa.table({"path": ["a.jpg", cell]}), www / "list.parquet")
    with pytest.raises(DataError, match=r"lists .* which is not on http://; a remote list may only name entries relative to itself"):
        resolve_inputs([f"{served}/list.{kind}"])
    code, out, err = run_cli_captured(["embed", f"{served}/list.{kind}", "--out", str(tmp_path / "o.npy"), "-q"], capsys)
    assert code != 0 and "not on http://" in one_line(err)
    assert not (tmp_path / "o.npy").exists() and secret.read_bytes() == before


def test_a_remote_list_keeps_its_relative_rows_and_its_scheme(tmp_path: Path, served: str) -> None:
    (tmp_path / "www" / "sub").mkdir()
    (tmp_path / "www" / "sub" / "list.txt").write_text("a.jpg\n../b.jpg\n/c.jpg\nhttps://cdn.example/d.jpg\n")
    got = resolve_inputs([f"{served}/sub/list.txt"]).files
    assert got == sorted([f"{served}/sub/a.jpg", f"{served}/b.jpg", f"{served}/c.jpg", "https://cdn.example/d.jpg"])


# ----------------------------------------------------------------- case 8: lists bounded by rows before they are read


def test_parquet_lists_are_bounded_by_declared_rows_before_any_row_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.jpg").write_bytes(jpeg())
    listing = identical_rows_parquet(tmp_path / "list.parquet", 3000)
    # 3000 identical rows are one image (rows are deduplicated while read, not held 3000 times)
    assert resolve_inputs([listing]).files == [str(tmp_path / "a.jpg")]
    monkeypatch.setattr(images, "MAX_LIST_ROWS", 2999)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a row was decoded before the declared row count was checked")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", never)
    code, out, err = run_cli_captured(["embed", str(listing), "--out", str(tmp_path / "o.npy"), "-q"], capsys)
    assert code != 0 and "declares 3000 rows, more than 2999, the limit for a list of paths" in one_line(err)


def test_parquet_lists_are_bounded_by_the_columns_declared_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listing = tmp_path / "list.parquet"
    pq.write_table(pa.table({"path": [f"/data/{i:08d}-{'x' * 40}.jpg" for i in range(4000)]}), listing, use_dictionary=False,
                   compression="zstd")
    monkeypatch.setattr(images, "MAX_LIST_BYTES", 50_000)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a row was decoded before the declared size was checked")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", never)
    with pytest.raises(DataError, match=r"the path column of .*list.parquet holds .* uncompressed, more than the 131536 bytes "
                                        r"4000 paths within the 50000 bytes limit"):
        resolve_inputs([listing])


@pytest.mark.parametrize("sep", ["\n", "\r", "\x0c", "\u2028"])
def test_text_lists_are_bounded_by_their_line_breaks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sep: str) -> None:
    monkeypatch.setattr(images, "MAX_LIST_ROWS", 1000)
    for suffix in (".txt", ".csv", ".jsonl"):
        listing = tmp_path / f"list{suffix}"
        listing.write_text(sep * 1001, encoding="utf-8")
        with pytest.raises(DataError, match=r"has 1001 lines, more than 1000, the limit for a list of paths"):
            resolve_inputs([listing])


# ----------------------------------------------------------------- case 9: brace patterns counted before expansion


def test_brace_patterns_are_counted_before_they_are_expanded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    cases = {
        f"{tmp_path}/d-{{0..99999999}}.tar": "expands to 100000000 names, more than 1000000",
        f"{tmp_path}/" + "{a," * 1000 + "b" + "}" * 1000 + ".tar": f"nests braces 1000 deep; at most {MAX_BRACE_DEPTH} levels",
        f"{tmp_path}/" + "p" * 100_000 + "{0..999}{0..999}.tar": "000000 characters of names, more than",  # the count includes tmp_path
        f"{tmp_path}/" + "p" * 100_000 + "{0..99}{0..99}.tar": "characters of names, more than",
        f"{tmp_path}/d-{{0..{'9' * 5000}}}.tar": "Exceeds the limit",
    }
    for pattern, fragment in cases.items():
        code, out, err = run_cli_captured(["embed", pattern, "--out", str(tmp_path / "o.npy"), "-q"], capsys)
        assert code != 0 and fragment in one_line(err), (pattern[:40], err[:300])
    assert time.perf_counter() - start < 30  # counted: nothing of 10^8 names or 4.8 GB is built


def test_a_pattern_within_the_bounds_still_expands(tmp_path: Path) -> None:
    for i in range(3):
        shard(tmp_path / f"d-{i:02d}.tar", [(f"k{i}.jpg", jpeg())])
    assert resolve_inputs([f"{tmp_path}/d-{{00..02}}.tar"]).tars == [str(tmp_path / f"d-{i:02d}.tar") for i in range(3)]
    assert brace_size("x{a,b{1..3}}") == (4, 11)  # xa xb1 xb2 xb3
    assert MAX_EXPANSION == 1_000_000


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.text(alphabet="{},.ab01-\\", min_size=1, max_size=16))
def test_brace_size_counts_what_braceexpand_yields(pattern: str) -> None:
    """The arithmetic count must be braceexpand's exactly (and the characters at least its), or the bound lies."""
    from braceexpand import braceexpand

    try:
        names = list(itertools.islice(braceexpand(pattern), 100_000))
    except Exception:  # noqa: BLE001 - unbalanced: the counter must say so too (or agree it is no pattern)
        COUNTS["brace: unbalanced"] += 1
        return
    count, chars = brace_size(pattern)
    assert count == len(names) and chars >= sum(map(len, names)), (pattern, count, chars, names[:5])
    COUNTS["brace: counted exactly"] += 1


# ----------------------------------------------------------------- case 10: tar header records bounded before they are read


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE])
def test_an_oversized_tar_header_record_is_refused_unread(tmp_path: Path, kind: bytes) -> None:
    path = declared_header_tar(tmp_path / "s.tar.gz", MAX_TAR_HEADER_BYTES + 512, kind)
    with pytest.raises(ShardError, match=rf"s.tar.gz is damaged before its first member \(a .* header record declares {MAX_TAR_HEADER_BYTES + 512} bytes"):
        list(TarBatches([(0, str(path))], PRE))


def test_long_names_within_the_bound_still_read(tmp_path: Path) -> None:
    name = "d" * 300 + "/k0.jpg"
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = shard(tmp_path / f"s{fmt}.tar", [(name, jpeg())], fmt)
        (batch,) = list(TarBatches([(0, str(path))], PRE))
        assert batch[1] == ["d" * 300 + "/k0"]


# ----------------------------------------------------------------- peak memory of cases 8-10 (VmHWM against a control)

_PEAK = textwrap.dedent('''
    import json, sys
    def hwm():
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) * 1024
    from cl_zoo.embedding.inputs import resolve_inputs
    from cl_zoo.embedding.preprocess import tar_members
    def run(kind, arg):
        try:
            if kind == "list":
                resolve_inputs([arg])
            else:
                with open(arg, "rb") as fh:
                    for _ in tar_members(fh, arg, ["jpg"]):
                        pass
            return "ok"
        except Exception as exc:
            return type(exc).__name__
    out = {}
    for name, kind, arg in json.loads(sys.argv[1]):
        outcome = run(kind, arg)
        out[name] = [outcome, hwm()]
    print(json.dumps(out))
''')


def test_hostile_lists_braces_and_tar_headers_cost_no_memory(tmp_path: Path) -> None:
    """Before: +281 MiB (2M identical Parquet rows), MemoryError (50M rows), +775 MiB (10^7 brace
    names), +1044 MiB (a 512 MiB long name or pax header). Control first: VmHWM only rises."""
    (tmp_path / "a.jpg").write_bytes(jpeg())
    identical_rows_parquet(tmp_path / "tiny.parquet", 3)
    shard(tmp_path / "tiny.tar", [("k.jpg", jpeg())])
    runs = [("control list", "list", str(tmp_path / "tiny.parquet")), ("control tar", "tar", str(tmp_path / "tiny.tar")),
            ("2M rows", "list", str(identical_rows_parquet(tmp_path / "rows2m.parquet", 2_000_000))),
            ("10^7 names", "list", f"{tmp_path}/d-{{0..9999999}}.tar"),
            ("long name", "tar", str(declared_header_tar(tmp_path / "l.tar.gz", 512 << 20, tarfile.GNUTYPE_LONGNAME))),
            ("pax", "tar", str(declared_header_tar(tmp_path / "p.tar.gz", 512 << 20, tarfile.XHDTYPE)))]
    proc = subprocess.run([sys.executable, "-c", _PEAK, json.dumps(runs)], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    control = got["control tar"][1]
    print({name: (outcome, (peak - control) >> 20) for name, (outcome, peak) in got.items()})
    assert got["2M rows"][0] == "ok"
    assert [got[n][0] for n in ("10^7 names", "long name", "pax")] == ["DataError", "OversizedTarHeader", "OversizedTarHeader"]
    assert max(peak for _, peak in got.values()) - control < 48 << 20


# ----------------------------------------------------------------- case 11: index sidecars and degenerate shard folders


def _embeddings(path: Path, n: int, dim: int) -> np.ndarray:
    from cl_zoo.embedding import write_path_list

    x = np.random.default_rng(0).standard_normal((n, dim), dtype=np.float32)
    np.save(path, x)
    write_path_list(path.with_name(path.stem + ".paths.jsonl"), [f"/images/{i:06d}.jpg" for i in range(n)])
    return x


@pytest.mark.parametrize(("factory_budget", "param"), [
    ("1G", "efSearch=9999999"), ("1G", "efSearch=1048577"), ("1G", "efSearch=0"),
    ("7M", "nprobe=0"), ("7M", "nprobe=9999999"), ("7M", "nprobe=16,quantizer_efSearch=0"),
])
def test_sidecar_search_parameters_are_bounded_like_the_files_own(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  factory_budget: str, param: str) -> None:
    from cl_zoo.index.sidecar import sidecar_path

    emb = tmp_path / "emb.npy"
    _embeddings(emb, 20_000 if factory_budget == "7M" else 5_000, 64)
    index = tmp_path / "emb.faiss"
    assert main(["index", str(emb), "--out", str(index), "--max-memory", factory_budget, "-q"]) == 0
    capsys.readouterr()
    side = sidecar_path(index)
    info = json.loads(side.read_text())
    info["search_params"] = param
    side.write_text(json.dumps(info))
    for args in (["dedup", str(emb), "-t", "0.99", "--index-file", str(index)],
                 ["search", str(emb), "--query", str(emb), "--index-file", str(index)]):
        code, out, err = run_cli_captured(args, capsys)
        assert code != 0 and out == ""
        line = one_line(err)
        assert ("is outside 1.." in line or "do not apply" in line) and "rebuild" in line, line


def test_zero_dimensional_rows_are_refused_by_every_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:

    from cl_zoo.embedding.shards import MANIFEST_NAME
    from cl_zoo.index.fingerprint import file_digest

    folder = embed_test_photos(tmp_path, out="shards/", extra=("--shard-size", "2"))
    capsys.readouterr()
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["dims"] = 0
    for record in manifest["shards"]:
        rows = np.load(folder / record["emb"]).shape[0]
        np.save(folder / record["emb"], np.zeros((rows, 0), np.float32))
        record["digest"] = file_digest(folder / record["emb"])
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    single = tmp_path / "flat.npy"
    _embeddings(single, 5, 4)
    np.save(single, np.zeros((5, 0), np.float32))
    for target in (folder, single):
        for args in (["dedup", str(target), "-t", "0.9"], ["index", str(target), "--out", str(tmp_path / "x.faiss"), "--max-memory", "64M"],
                     ["search", str(target), "--query", str(tmp_path / "photos")]):
            code, out, err = run_cli_captured(args, capsys)
            assert code != 0 and out == "" and "rows of 0 dims" in one_line(err), (target.name, args[0], err)
    assert not (tmp_path / "x.faiss").exists()


# ----------------------------------------------------------------- low: a meta footer that is not a count


def test_a_meta_footer_failure_count_that_is_not_a_count_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:

    model_dir = tmp_path / "m"
    model_dir.mkdir()
    embed_test_photos(model_dir)  # saves the tiny seeded model in m/model
    tar = shard(tmp_path / "d.tar", [("k0.jpg", jpeg()), ("k1.jpg", jpeg("blue"))])
    out = tmp_path / "out"
    args = ["embed", str(tar), "-m", str(model_dir / "model"), "-o", f"{out}/", "-j", "0", "-q"]
    assert main(args) == 0
    capsys.readouterr()
    meta = out / "meta_00000.parquet"
    table = pq.read_table(meta)
    footer = dict(table.schema.metadata)
    footer[b"cl_zoo.failures"] = b"abc"
    pq.write_table(table.replace_schema_metadata(footer), meta)
    code, _, err = run_cli_captured([*args, "--resume"], capsys)
    assert code != 0 and "records 'abc' failures, not a count" in one_line(err)


# ----------------------------------------------------------------- fuzz: the list readers and the tar reader

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
INTERESTING = [0, 0x7F, 0xFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]
edit = st.one_of(
    st.tuples(st.just("byte"), st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
    st.tuples(st.just("int64"), st.floats(0, 1, exclude_max=True), st.sampled_from(INTERESTING)),
    st.tuples(st.just("octal"), st.floats(0, 1, exclude_max=True), st.sampled_from([b"77777777777", b"7777777", b"0000000", b"\x80\xff\xff\xff"])),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True), st.just(0)),
    st.tuples(st.just("insert"), st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
)
edits = st.lists(edit, min_size=1, max_size=3)


def _list_seeds() -> dict[str, bytes]:
    buf = io.BytesIO()
    pq.write_table(pa.table({"path": ["a.jpg", "sub/b.png", "/abs/c.webp"], "label": [1, 2, 3]}), buf)
    return {"list.txt": b"a.jpg\n# c\nsub/b.png\n/abs/c.webp\n", "list.csv": b"filename,label\na.jpg,1\nsub/b.png,2\n",
            "list.tsv": b"path\tlabel\na.jpg\t1\n", "list.parquet": buf.getvalue(),
            "list.jsonl": b'"a.jpg"\n"sub/b.png"\n"/abs/c.webp"\n'}


LIST_SEEDS = _list_seeds()


@FUZZ
@given(name=st.sampled_from(sorted(LIST_SEEDS)), changes=edits)
def test_fuzz_list_readers(name: str, changes: list[tuple[str, float, object]]) -> None:
    """A damaged list gives a list of non-empty strings or one DataError line; nothing else."""
    data = mutate(LIST_SEEDS[name], changes)
    for reader in ("parse", "remote"):
        try:
            if reader == "parse":
                cells = images.parse_path_list(data, name)
            else:
                from cl_zoo.embedding.inputs import join_list_entry

                cells = [join_list_entry(f"http://h/{name}", c) for c in images.parse_path_list(data, f"http://h/{name}")]
                assert all(c.startswith(("http://", "https://")) for c in cells)
        except DataError as exc:
            assert "\n" not in str(exc)
            COUNTS[f"list {reader}: refused"] += 1
            continue
        assert all(isinstance(c, str) and c for c in cells)
        COUNTS[f"list {reader}: read"] += 1


def _tar_seed() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in [("k0.jpg", jpeg()), ("k0.txt", b"label"), ("L" * 120 + "/k1.jpg", jpeg("blue"))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        pax = tarfile.TarInfo("k2.jpg")
        pax.size = 3
        pax.pax_headers = {"comment": "x" * 200}
        tar.format = tarfile.PAX_FORMAT
        tar.addfile(pax, io.BytesIO(b"abc"))
    return buf.getvalue()


TAR_SEED = _tar_seed()


@FUZZ
@given(changes=edits)
def test_fuzz_tar_reader(tmp_path_factory: pytest.TempPathFactory, changes: list[tuple[str, float, object]]) -> None:
    """A damaged shard yields samples (decoded, or failures with a reason) or one ShardError line."""
    path = tmp_path_factory.getbasetemp() / "fuzz.tar"
    path.write_bytes(mutate(TAR_SEED, changes))
    try:
        batches = list(TarBatches([(0, str(path))], PRE))
    except ShardError as exc:
        assert "\n" not in str(exc)
        COUNTS["tar: refused (damaged shard)"] += 1
        return
    assert batches and batches[-1][4] is True
    COUNTS["tar: read"] += 1


def test_zz_fuzz_counts() -> None:
    """Print what the fuzz saw (``pytest -s``); runs last in this file."""
    print(dict(sorted(COUNTS.items())))
