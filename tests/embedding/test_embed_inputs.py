"""What ``cl-zoo embed`` reads: Parquet lists, fsspec URLs (file://, http://) and WebDataset shards.

Every input is built here in ``tmp_path``: tiny PIL images, path lists, tar shards written with
``tarfile``, and a throwaway HTTP server on 127.0.0.1 for the ``http://`` cases, so the tests run
offline in seconds.
"""

from __future__ import annotations

import io
import json
import socket
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from cl_zoo.data import images as images_mod
from cl_zoo.data.images import discover_images
from cl_zoo.embedding import preprocess as preprocess_mod
from cl_zoo.embedding.inputs import Inputs, ReadError, is_url, read_bytes, resolve_inputs
from cl_zoo.embedding.preprocess import ImageList, Preprocess, ShardError, TarBatches
from cl_zoo.errors import DataError

PRE = Preprocess(resize_size=16, crop_size=(16, 16))
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


def image_bytes(colour: str, fmt: str, size: tuple[int, int] = (24, 20)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, COLOURS[colour]).save(out, format=fmt)
    return out.getvalue()


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text, text
    return text


@pytest.fixture()
def photos(tmp_path: Path) -> Path:
    """photos/{a.png, b.jpg, sub/c.png, .hidden.png, notes.txt}."""
    root = tmp_path / "photos"
    (root / "sub").mkdir(parents=True)
    (root / "a.png").write_bytes(image_bytes("red", "PNG"))
    (root / "b.jpg").write_bytes(image_bytes("green", "JPEG"))
    (root / "sub" / "c.png").write_bytes(image_bytes("blue", "PNG"))
    (root / ".hidden.png").write_bytes(image_bytes("blue", "PNG"))
    (root / "notes.txt").write_text("not an image\n")
    return root


def write_shard(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> Path:
    """A WebDataset shard: for each (key, {ext: data}) the members key.ext, in that order."""
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- Parquet lists and the list bound ---------------------------------------------------------


def test_parquet_list_picks_the_path_column_then_the_first_text_column(photos: Path, tmp_path: Path) -> None:
    named = tmp_path / "named.parquet"
    pq.write_table(pa.table({"label": [1, 2, 3], "Image_Path": ["photos/a.png", str(photos / "b.jpg"), "photos/missing.png"]}), named)
    found = discover_images([named])
    assert found == sorted([str(photos / "a.png"), str(photos / "b.jpg"), str(tmp_path / "photos" / "missing.png")])
    # No PATH_COLUMNS name: the first string column, here after an integer one; nulls and blanks skipped.
    loose = tmp_path / "lists" / "loose.parquet"
    loose.parent.mkdir()
    pq.write_table(pa.table({"n": [1, 2, 3], "where": ["../photos/sub/c.png", None, " "], "note": ["x", "y", "z"]}), loose)
    assert resolve_inputs([loose]).files == [str(photos / "sub" / "c.png")]
    # cl-zoo embed's own .parquet output (path + embedding columns) is a usable list.
    output = tmp_path / "emb.parquet"
    pq.write_table(pa.table({"path": [str(photos / "a.png")], "embedding": pa.array([[0.5, 0.25]], pa.list_(pa.float32()))}), output)
    assert resolve_inputs([output]).files == [str(photos / "a.png")]
    no_text = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"n": [1, 2]}), no_text)
    with pytest.raises(DataError, match="no text column of paths") as info:
        discover_images([no_text])
    one_line(info.value)
    wrong_type = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"path": [1, 2]}), wrong_type)
    with pytest.raises(DataError, match="'path' of .*typed.parquet holds int64"):
        discover_images([wrong_type])
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="not a readable Parquet list of paths") as info:
        discover_images([broken])
    one_line(info.value)


def test_list_files_are_bounded(photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = tmp_path / "list.txt"
    text.write_text("".join(f"photos/{n}\n" for n in ("a.png", "b.jpg", "sub/c.png")))
    table = tmp_path / "list.parquet"
    pq.write_table(pa.table({"path": ["photos/a.png", "photos/b.jpg", "photos/sub/c.png"]}), table)
    assert len(discover_images([text])) == len(discover_images([table])) == 3
    monkeypatch.setattr(images_mod, "MAX_LIST_BYTES", 30)
    with pytest.raises(DataError, match=r"nor a list of paths of at most 30 bytes \(it has 43 bytes\)") as info:
        discover_images([text])
    one_line(info.value)
    with pytest.raises(DataError, match="paths in .*list.parquet add up to more than 30 bytes") as info:
        resolve_inputs([table])
    one_line(info.value)
    # Today's message for a small binary file under a list's name stays as it was; under any other
    # name the file is not read at all.
    (tmp_path / "blob.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DataError, match="is neither an image .by extension. nor a UTF-8 list of paths"):
        discover_images([tmp_path / "blob.txt"])
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DataError, match=r"blob.bin is neither an image \(.bmp, .* nor a list of paths \(.csv, .jsonl, .parquet, .tsv, .txt\)"):
        discover_images([tmp_path / "blob.bin"])


def test_jsonl_lists_hold_one_json_string_per_line(photos: Path, tmp_path: Path, served: str) -> None:
    """``.jsonl`` lists (an output's ``.paths.jsonl``) are read as JSON, local or remote, bounded as the
    others: without the format a name holding a newline split in two, and quotes stayed in the names."""
    odd = photos / "two\nlines.png"  # a name only JSON lines round-trips
    odd.write_bytes(image_bytes("red", "PNG"))
    listing = tmp_path / "list.jsonl"
    listing.write_text(f'"photos/a.png"\n\n{json.dumps(str(odd))}\n"photos/sub/c.png"\n')
    expected = [str(photos / "a.png"), str(odd), str(photos / "sub" / "c.png")]
    assert discover_images([listing]) == sorted(expected)
    assert resolve_inputs([f"file://{listing}"]).files == sorted(expected)
    (tmp_path / "remote.jsonl").write_text('"photos/b.jpg"\n"/photos/sub/c.png"\n')
    assert resolve_inputs([f"{served}/remote.jsonl"]).files == [f"{served}/photos/b.jpg", f"{served}/photos/sub/c.png"]
    size = listing.stat().st_size
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(images_mod, "MAX_LIST_BYTES", size - 1)
        with pytest.raises(DataError, match=rf"nor a list of paths of at most {size - 1} bytes") as info:
            discover_images([listing])
        one_line(info.value)


@pytest.mark.parametrize("text,message", [
    ('"a.png"\n{"path": "b.png"}\n', "list.jsonl line 2 is dict, not a JSON string path"),
    ('"a.png"\nb.png\n', "list.jsonl line 2 is not a JSON string"),
    ('"a.png"\n""\n', "list.jsonl line 2 is an empty string, not a path"),
    ('[' * 100_000 + '\n', "list.jsonl line 1 is not a JSON string"),
])
def test_a_malformed_jsonl_list_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    from cl_zoo.cli import main

    listing = tmp_path / "list.jsonl"
    listing.write_text(text)
    with pytest.raises(DataError, match=message) as info:
        discover_images([listing])
    one_line(info.value)
    assert main(["embed", str(listing), "-o", str(tmp_path / "emb.npy")]) != 0  # refused before any model loads
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["list.jsonl"]


# --- file:// and http:// ------------------------------------------------------------------------


def test_file_urls_become_local_paths(photos: Path, tmp_path: Path) -> None:
    (tmp_path / "list.csv").write_text("index,path,label\n0,photos/a.png,x\n1,photos/sub/c.png,y\n")
    (tmp_path / "list.txt").write_text(f"# comment\n{photos / 'b.jpg'}\nfile://{photos / 'sub' / 'c.png'}\n")
    got = resolve_inputs([f"file://{tmp_path / 'list.csv'}", f"file://{tmp_path / 'list.txt'}", f"file://{photos / 'a.png'}"])
    assert got == Inputs(files=[str(photos / n) for n in ("a.png", "b.jpg", "sub/c.png")], tars=[], repeats=0)
    assert not got.is_webdataset
    assert resolve_inputs([f"file://{photos}"]).files == [str(photos / n) for n in ("a.png", "b.jpg", "sub/c.png")]
    with pytest.raises(DataError, match="path does not exist"):
        resolve_inputs([f"file://{tmp_path / 'nope.jpg'}"])
    assert is_url("http://host/a.jpg") and is_url("s3://bucket/key") and is_url("file:///tmp/a")
    assert not is_url("/tmp/a.jpg") and not is_url("C://photos/a.jpg") and not is_url("photos/a:b.jpg")


def test_http_images_lists_and_folders(photos: Path, tmp_path: Path, served: str) -> None:
    base = f"{served}/photos"
    (tmp_path / "list.txt").write_text("photos/a.png\n/photos/sub/c.png\n# comment\n")
    (tmp_path / "list.csv").write_text("filename,label\nphotos/b.jpg,1\n")
    pq.write_table(pa.table({"path": ["photos/sub/c.png"]}), tmp_path / "list.parquet")
    got = resolve_inputs([f"{base}/b.jpg", f"{served}/list.txt", f"{served}/list.csv", f"{served}/list.parquet"])
    assert got.files == [f"{base}/a.png", f"{base}/b.jpg", f"{base}/sub/c.png"]
    # A folder is walked through its HTTP listing; hidden files and non-images are left out.
    assert resolve_inputs([f"{base}/"]).files == [f"{base}/a.png", f"{base}/b.jpg", f"{base}/sub/c.png"]
    assert resolve_inputs([base]).files == [f"{base}/a.png", f"{base}/b.jpg", f"{base}/sub/c.png"]
    # A local list may name URLs: they stay URLs instead of being joined onto the list's folder.
    (tmp_path / "local.txt").write_text(f"{base}/a.png\nphotos/b.jpg\n")
    assert resolve_inputs([tmp_path / "local.txt"]).files == sorted([f"{base}/a.png", str(photos / "b.jpg")])
    # The URLs decode like local files; a missing listed one is a failure, not an exception.
    dataset = ImageList([*got.files, f"{base}/gone.png"], PRE)
    items = [dataset[i] for i in range(len(dataset))]
    assert [r for _, _, r in items[:3]] == ["", "", ""]
    red, green, blue = (a.reshape(-1, 3).mean(0) for _, a, _ in items[:3])  # type: ignore[union-attr]
    assert red.argmax() == 0 and green.argmax() == 1 and blue.argmax() == 2
    assert items[3][1] is None and "404" in items[3][2]
    # An image named directly must exist; an unreachable server is one line too.
    with pytest.raises(DataError, match=r"cannot read .*/photos/gone.png: HTTP 404") as info:
        resolve_inputs([f"{base}/gone.png"])
    one_line(info.value)
    with pytest.raises(DataError, match="cannot read http://127.0.0.1") as info:
        resolve_inputs([f"http://127.0.0.1:{closed_port()}/list.txt"])
    one_line(info.value)
    with pytest.raises(DataError, match="cannot read nosuchscheme://x/a.jpg"):
        resolve_inputs(["nosuchscheme://x/a.jpg"])


def test_image_byte_bound(photos: Path, tmp_path: Path, served: str, monkeypatch: pytest.MonkeyPatch) -> None:
    big = photos / "a.png"
    size = big.stat().st_size
    assert read_bytes(str(big), size) == big.read_bytes()
    assert read_bytes(f"{served}/photos/a.png", size) == big.read_bytes()
    for ref in (str(big), f"{served}/photos/a.png", f"file://{big}"):
        with pytest.raises(ReadError, match=f"larger than the {size - 1} bytes limit") as info:
            read_bytes(ref, size - 1)
        one_line(info.value)
        assert isinstance(info.value, DataError)
    # In an ImageList an oversized URL image is that image's failure reason.
    monkeypatch.setattr(preprocess_mod, "MAX_IMAGE_BYTES", size - 1)
    _, pixels, reason = ImageList([f"{served}/photos/a.png"], PRE)[0]
    assert pixels is None and "limit" in reason


# --- WebDataset shards --------------------------------------------------------------------------


def good_sample(key: str, colour: str = "red") -> tuple[str, dict[str, bytes]]:
    return key, {"jpg": image_bytes(colour, "JPEG"), "cls": b"1"}


def test_brace_expanded_shards_local_and_http(tmp_path: Path, served: str) -> None:
    shards = [write_shard(tmp_path / f"data-{i:03d}.tar", [good_sample(f"{i:03d}{k}") for k in range(2)]) for i in range(3)]
    got = resolve_inputs([tmp_path / "data-002.tar", str(tmp_path / "data-{000..002}.tar")])
    assert got.tars == [str(shards[2]), str(shards[0]), str(shards[1])]  # given order, deduplicated
    assert got.files == [] and got.is_webdataset
    with pytest.raises(DataError, match=r"data-003.tar does not exist \(expanded from") as info:
        resolve_inputs([str(tmp_path / "data-{000..005}.tar")])
    one_line(info.value)
    with pytest.raises(DataError, match="WebDataset shard does not exist: .*other.tar"):
        resolve_inputs([tmp_path / "other.tar"])
    remote = resolve_inputs([f"{served}/data-{{000..002}}.tar"])
    assert remote.tars == [f"{served}/data-{i:03d}.tar" for i in range(3)]
    with pytest.raises(DataError, match=r"cannot read .*/data-003.tar: HTTP 404"):
        resolve_inputs([f"{served}/data-{{001..003}}.tar"])
    # A list file may name shards too.
    (tmp_path / "shards.txt").write_text("data-001.tar\ndata-000.tar\n")
    assert resolve_inputs([tmp_path / "shards.txt"]).tars == [str(shards[0]), str(shards[1])]


def test_mixing_shards_and_images_is_refused(photos: Path, tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "data.tar", [good_sample("000")])
    with pytest.raises(DataError, match="mix WebDataset shards with image files; embed them in separate runs") as info:
        resolve_inputs([shard, photos])
    one_line(info.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_tar_batches_read_every_sample_once(tmp_path: Path, served: str, workers: int) -> None:
    first = [
        good_sample("000000", "red"),
        ("000001", {"png": image_bytes("blue", "PNG"), "json": b"{}"}),
        ("000002", {"cls": b"7", "txt": b"no image here"}),
        ("000003", {"jpg": b"\xff\xd8 this is not a jpeg"}),
        good_sample("000004", "green"),
    ]
    write_shard(tmp_path / "s0.tar", first)
    write_shard(tmp_path / "s1.tar", [])  # an empty shard still ends with one batch
    write_shard(tmp_path / "s2.tar", [good_sample(f"2{k:05d}") for k in range(4)])
    shards = [(0, str(tmp_path / "s0.tar")), (1, str(tmp_path / "s1.tar")), (2, f"{served}/s2.tar")]
    loader = torch.utils.data.DataLoader(TarBatches(shards, PRE, batch_size=2), batch_size=None, num_workers=workers)
    seen: dict[int, list[tuple[list[str], list[tuple[str, str]], bool]]] = {0: [], 1: [], 2: []}
    colours: dict[str, int] = {}
    positions: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for shard, keys, pixels, failures, last, ordinals in loader:
        assert len(ordinals) == len(keys)
        positions[shard] += ordinals
        assert not any(done for _, _, done in seen[shard]), "a batch after the shard's last one"
        if keys:
            assert pixels is not None and pixels.dtype == torch.uint8 and tuple(pixels.shape) == (len(keys), 16, 16, 3)
            colours.update({k: int(p.reshape(-1, 3).float().mean(0).argmax()) for k, p in zip(keys, pixels, strict=True)})
        else:
            assert pixels is None
        assert len(keys) + len(failures) <= 2
        seen[shard].append((keys, failures, last))
    for shard, batches in seen.items():
        assert [last for _, _, last in batches][-1] is True and sum(last for _, _, last in batches) == 1, (shard, batches)
    assert seen[1] == [([], [], True)]
    assert positions[2] == [0, 1, 2, 3]  # each decoded sample's position in its tar, failures counted
    assert positions[0] == [0, 1, 4]  # 000002 (no image) and 000003 (corrupt) failed
    keys0 = [k for keys, _, _ in seen[0] for k in keys]
    failed0 = dict(f for _, failures, _ in seen[0] for f in failures)
    assert keys0 == ["000000", "000001", "000004"]
    assert set(failed0) == {"000002", "000003"}
    assert "no image (jpg;jpeg;png;webp)" in failed0["000002"] and "not an image" in failed0["000003"]
    assert [k for keys, _, _ in seen[2] for k in keys] == [f"2{k:05d}" for k in range(4)]
    assert colours["000000"] == 0 and colours["000001"] == 2 and colours["000004"] == 1


def test_tar_batches_image_key_order(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "s.tar", [
        ("a", {"jpg": image_bytes("red", "JPEG"), "png": image_bytes("blue", "PNG")}),
        ("b", {"webp": image_bytes("green", "WEBP")}),
    ])
    # The first extension of the key that a sample has is its image, whatever the member order.
    ((_, keys, pixels, failures, last, _),) = list(TarBatches([(5, str(shard))], PRE, image_key="PNG;.jpg"))
    assert keys == ["a"] and last and failures == [("b", "no image (png;jpg) in the sample")]
    assert pixels is not None and int(pixels[0].reshape(-1, 3).float().mean(0).argmax()) == 2
    ((_, keys, _, failures, _, _),) = list(TarBatches([(5, str(shard))], PRE))
    assert keys == ["a", "b"] and failures == []
    with pytest.raises(DataError, match="names no extension"):
        TarBatches([(0, str(shard))], PRE, image_key=" ; ")


def test_tar_members_beyond_the_image_bound_or_not_images_are_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A member's header declares its size: an image over MAX_IMAGE_BYTES is that sample's failure and
    a member that is not an image is passed over, both without being read into memory (webdataset's
    own tar_file_iterator reads every member whole first)."""
    big = image_bytes("blue", "PNG", size=(400, 300))
    bound = len(big) - 1
    shard = write_shard(tmp_path / "s.tar", [
        good_sample("a"),
        ("b", {"png": big, "txt": b"x" * (3 * bound)}),
        ("c", {"txt": b"y" * (3 * bound), "json": b"{}"}),
        good_sample("d", "green"),
    ])
    monkeypatch.setattr(preprocess_mod, "MAX_IMAGE_BYTES", bound)
    extracted: list[str] = []
    extractfile = tarfile.TarFile.extractfile

    def spy(self: tarfile.TarFile, member: tarfile.TarInfo | str) -> object:
        extracted.append(member.name if isinstance(member, tarfile.TarInfo) else member)
        return extractfile(self, member)

    monkeypatch.setattr(tarfile.TarFile, "extractfile", spy)
    ((_, keys, pixels, failures, last, ordinals),) = list(TarBatches([(0, str(shard))], PRE, batch_size=8))
    assert keys == ["a", "d"] and ordinals == [0, 3] and last and pixels is not None
    assert dict(failures) == {"b": "image of 0 MiB, larger than the 0 MiB limit", "c": "no image (jpg;jpeg;png;webp) in the sample"}
    assert extracted == ["a.jpg", "d.jpg"]


@pytest.mark.parametrize("workers", [0, 2])
def test_damaged_shards_are_one_line(tmp_path: Path, workers: int) -> None:
    whole = write_shard(tmp_path / "whole.tar", [good_sample(f"{k:06d}") for k in range(3)]).read_bytes()
    first_member_end = 512 + ((len(image_bytes("red", "JPEG")) + 511) // 512) * 512
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(whole[: first_member_end + 512 + 1024 + 100])  # inside sample 000001's jpg
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"this is not a tar file at all" * 40)
    cases = [(truncated, r"truncated.tar is damaged at or after its member 000001.jpg \(unexpected end of data: truncated or not a tar\)"),
             (garbage, r"garbage.tar is damaged before its first member \(invalid header: truncated or not a tar\)")]
    for path, message in cases:
        loader = torch.utils.data.DataLoader(TarBatches([(0, str(path))], PRE, batch_size=1), batch_size=None, num_workers=workers)
        got: list[str] = []
        batches = iter(loader)
        try:
            with pytest.raises(ShardError, match=message) as info:
                for _, keys, _, _, _, _ in batches:
                    got.extend(keys)
        finally:  # the error's traceback holds the iterator: stop its workers now, not when it is collected
            getattr(batches, "_shutdown_workers", lambda: None)()
        one_line(info.value)
        assert isinstance(info.value, DataError)
        # Sample 000000 was still being assembled (its end is only known when 000001 begins).
        assert got == []
    with pytest.raises(ShardError, match="cannot read WebDataset shard .*gone.tar: file not found"):
        list(TarBatches([(0, str(tmp_path / "gone.tar"))], PRE))
