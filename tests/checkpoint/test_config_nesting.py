"""A checkpoint folder whose config.json nests absurdly deep is refused in one line by every command
that reads it, before any recursive walk over it could end in RecursionError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import EXAMPLE_PHOTOS_DIR, run_cli_captured


@pytest.fixture()
def deep_config_folder(model_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "deep"
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    nested: list = []
    inner = nested
    for _ in range(700):
        inner.append([])
        inner = inner[0]
    config["notes"] = nested
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("command", ["embed", "card-update"])
def test_a_config_nested_700_deep_is_one_error_line(
    command: str, deep_config_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "emb.npy"
    args = {
        "embed": ["embed", str(EXAMPLE_PHOTOS_DIR), "-m", str(deep_config_folder), "-o", str(out), "-j", "0", "-q"],
        "card-update": ["card-update", str(deep_config_folder)],
    }[command]
    before = (deep_config_folder / "config.json").read_bytes()
    code, _, err = run_cli_captured(args, capsys)
    assert code == 2
    assert err.strip().splitlines() == [f"error: {deep_config_folder / 'config.json'} nests deeper than 32 levels, "
                                        "so it cannot be a checkpoint config"]
    assert not out.exists() and (deep_config_folder / "config.json").read_bytes() == before
