"""Checkpoint folders built by an attacker (issue 21, points 3-6): the Hub-cache symlink rule, files
that are not regular files, values that are finite only before the cast, negative BatchNorm
variances and preprocessing sizes that would allocate gigabytes. Each is refused in one
``CheckpointError`` line before anything large is read or allocated."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import cl_zoo
from cl_zoo.checkpoint import CONFIG_NAME, WEIGHTS_NAME, sha256_file
from cl_zoo.checkpoint.checks import MAX_INPUT_SIDE
from cl_zoo.cli import main
from cl_zoo.errors import CheckpointError

from tests.helpers import EXAMPLE_PHOTOS_DIR, edit_config, fake_cache_repo, repin, tiny_checkpoint_model

PHOTOS = EXAMPLE_PHOTOS_DIR


def replace_weights(folder: Path, change) -> None:  # type: ignore[no-untyped-def]
    state = load_file(str(folder / WEIGHTS_NAME))
    change(state)
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    repin(folder)


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and len(text) < 600, text
    return text


def test_blobs_linked_to_the_root_cannot_reach_dev_zero(saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``blobs -> /`` and ``config.json -> ../../blobs/dev/zero``: read /dev/zero until memory runs out, before."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo, snap = fake_cache_repo(tmp_path / "hub", saved)
    os.replace(repo / "blobs", tmp_path / "real-blobs")
    (repo / "blobs").symlink_to("/")
    (snap / CONFIG_NAME).unlink()
    (snap / CONFIG_NAME).symlink_to("../../blobs/dev/zero")
    with pytest.raises(CheckpointError) as info:
        cl_zoo.load_pretrained(snap)
    assert "link leading out" in one_line(info)


def test_a_snapshots_folder_outside_the_hf_cache_is_an_ordinary_folder(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "the-real-cache"))
    _, snap = fake_cache_repo(tmp_path / "elsewhere", saved)
    with pytest.raises(CheckpointError) as info:
        cl_zoo.load_pretrained(snap)
    assert "link leading out" in one_line(info)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))  # the same layout inside the cache loads
    assert cl_zoo.load_pretrained(snap).num_features > 0


@pytest.mark.timeout(60)
def test_a_fifo_or_a_device_is_never_opened(saved: Path, tmp_path: Path) -> None:
    config = (saved / CONFIG_NAME).read_bytes()
    (saved / CONFIG_NAME).unlink()
    os.mkfifo(saved / CONFIG_NAME)  # opening it for reading would block forever
    with pytest.raises(CheckpointError) as info:
        cl_zoo.load_pretrained(saved)
    assert "not a regular file" in one_line(info)
    (saved / CONFIG_NAME).unlink()
    (saved / CONFIG_NAME).write_bytes(config)
    (saved / WEIGHTS_NAME).unlink()
    (saved / WEIGHTS_NAME).symlink_to("/dev/zero")  # refused as a link out, and as a device
    with pytest.raises(CheckpointError):
        cl_zoo.load_pretrained(saved)


def test_float64_weights_that_overflow_float32_are_refused(saved: Path) -> None:
    def huge(state: dict[str, torch.Tensor]) -> None:
        state["conv1.weight"] = torch.full_like(state["conv1.weight"], 1e300, dtype=torch.float64)

    replace_weights(saved, huge)
    with pytest.raises(CheckpointError) as info:
        cl_zoo.load_pretrained(saved)
    assert "conv1.weight" in one_line(info) and "infinite" in str(info.value)


def test_negative_batchnorm_variance_is_refused(saved: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    key = next(k for k in tiny_checkpoint_model().state_dict() if k.endswith("running_var"))

    def negative(state: dict[str, torch.Tensor]) -> None:
        state[key] = -state[key].abs() - 0.1

    replace_weights(saved, negative)
    with pytest.raises(CheckpointError) as info:
        cl_zoo.load_pretrained(saved)
    assert key in one_line(info) and "negative" in str(info.value)
    assert main(["embed", str(PHOTOS), "--model", str(saved), "--out", str(tmp_path / "e.npy")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and not (tmp_path / "e.npy").exists()


@pytest.mark.parametrize("size", [[3, 8192, 8192], [3, MAX_INPUT_SIDE + 1, 16], [3, 16, 0], [1, 16, 16]])
def test_input_size_is_bounded_before_anything_is_allocated(saved: Path, size: list[int]) -> None:
    edit_config(saved, lambda c: c["pretrained_cfg"].update(input_size=size))
    with pytest.raises(CheckpointError) as info:
        cl_zoo.load_pretrained(saved)
    assert "input_size" in one_line(info) and str(MAX_INPUT_SIDE) in str(info.value)


def test_input_size_refusal_peak_memory(saved: Path) -> None:
    """What ``cl-zoo embed`` costs on a folder asking for 8192 px: the refusal, not 51 GB."""
    edit_config(saved, lambda c: c["pretrained_cfg"].update(input_size=[3, 8192, 8192]))
    script = textwrap.dedent(f"""
        import resource, sys
        from cl_zoo.cli import main
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        code = main(["embed", {str(PHOTOS)!r}, "--model", {str(saved)!r}, "--out", {str(saved.parent / 'x.npy')!r}])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(code, base, peak)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    code, base, peak = map(int, done.stdout.split()[-3:])
    assert code != 0 and done.stderr.strip().startswith("error:") and "input_size" in done.stderr
    assert (peak - base) < 200_000, f"refusing grew the process by {(peak - base) / 1024:.0f} MiB"
    print(f"input_size [3, 8192, 8192] refused: peak RSS {peak / 1024:.0f} MiB, {(peak - base) / 1024:.0f} MiB over the imports")


def test_a_5000_digit_integer_is_one_line_in_config_index_and_header(saved: Path, tmp_path: Path) -> None:
    """Python refuses int() of more than 4300 digits with a ValueError that is not a JSONDecodeError."""
    huge = "9" * 5000
    text = (saved / CONFIG_NAME).read_text()
    (saved / CONFIG_NAME).write_text(text.replace('"num_params": ', f'"num_params": {huge}, "was": ', 1))
    with pytest.raises(CheckpointError) as info:
        cl_zoo.load_pretrained(saved)
    assert "not valid JSON" in one_line(info)
    (saved / CONFIG_NAME).write_text(text)
    header = b'{"conv1.weight": {"dtype": "F32", "shape": [' + huge.encode() + b'], "data_offsets": [0, 4]}}'
    (saved / WEIGHTS_NAME).write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    edit_config(saved, lambda c: c.update(files={WEIGHTS_NAME: sha256_file(saved / WEIGHTS_NAME)}))  # as a tamperer would
    with pytest.raises(CheckpointError) as info:
        cl_zoo.load_pretrained(saved)
    assert "not valid JSON" in one_line(info)


def test_a_config_larger_than_any_config_is_refused_before_it_is_parsed(saved: Path) -> None:
    from cl_zoo.checkpoint.folder import MAX_CONFIG_BYTES

    text = (saved / CONFIG_NAME).read_text()
    (saved / CONFIG_NAME).write_text(text + " " * MAX_CONFIG_BYTES)  # still valid JSON, just padded
    with pytest.raises(CheckpointError) as info:
        cl_zoo.load_pretrained(saved)
    assert f"more than a checkpoint config can be ({MAX_CONFIG_BYTES} bytes)" in one_line(info)
