"""The CLI surface of the foundation: help texts, `models`, `info`, and `publish --dry-run` errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint import CARD_NAME, CONFIG_NAME, WEIGHTS_NAME
from cl_zoo.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [["--help"], ["models", "--help"], ["info", "--help"], ["publish", "--help"]])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(argv, capsys)
    assert code == 0 and "Usage: cl-zoo" in out
    if argv == ["--help"]:
        assert all(cmd in out for cmd in ("models", "publish", "info"))
    if argv[0] == "publish":
        assert all(opt in out for opt in ("--repo-id", "--private", "--revision", "--create-pr"))


def test_models_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["models", "resnet*"], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["name", "method", "arch", "dataset", "params(M)", "here", "metrics"]
    assert any(line.startswith("resnet50 ") and "23.51" in line for line in lines)

    code, out, _ = run(["models", "--json"], capsys)
    rows = json.loads(out)
    assert code == 0 and {r["name"] for r in rows} == set(cl_zoo.list_models())
    by_name = {r["name"]: r for r in rows}
    assert by_name["resnet50"]["params"] == 23_508_032 and by_name["resnet50"]["num_features"] == 2048
    assert by_name["cmc_resnet50x05_lab"]["params"] / 1e6 == pytest.approx(11.8, abs=0.05)

    code, out, _ = run(["models", "--pretrained", "--json", "no-such-*"], capsys)
    assert code == 0 and json.loads(out) == []
    code, _, err = run(["models", "no-such-*"], capsys)
    assert code == 2 and err == "error: no model matches 'no-such-*'; cl-zoo models lists them all\n", err


def test_info(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["info", "cmc_resnet50x05_lab"], capsys)
    assert code == 0 and "2048" in out and "11.80M" in out
    code, out, _ = run(["info", "resnet18_cifar", "--json"], capsys)
    assert code == 0 and json.loads(out)["pretrained_cfg"]["input_size"] == [3, 32, 32]
    code, _, err = run(["info", "resnet5"], capsys)
    assert code == 2 and err.startswith("error: unknown model 'resnet5'; did you mean resnet50") and err.count("\n") == 1


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return cl_zoo.save_pretrained(cl_zoo.create_model("resnet18_cifar", width=0.125), tmp_path / "ckpt")


def test_publish_dry_run_validates(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["publish", str(folder), "--repo-id", "a/b", "--dry-run"], capsys)
    assert code == 0 and "nothing uploaded" in out


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("config", "not valid JSON"),
        ("weights", "weights missing"),
        ("shape", "do not match the architecture"),
        ("sha", "sha256 mismatch"),
        ("card", "no README.md"),
        ("front", "no YAML front matter"),
    ],
)
def test_publish_bad_folder_is_one_line(folder: Path, breakage: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    if breakage == "config":
        (folder / CONFIG_NAME).write_text("{")
    elif breakage == "weights":
        (folder / WEIGHTS_NAME).unlink()
    elif breakage == "shape":
        config = json.loads((folder / CONFIG_NAME).read_text())
        config["model_args"]["width"] = 0.25
        (folder / CONFIG_NAME).write_text(json.dumps(config))
    elif breakage == "sha":
        data = bytearray((folder / WEIGHTS_NAME).read_bytes())
        data[-1] ^= 1
        (folder / WEIGHTS_NAME).write_bytes(bytes(data))
    elif breakage == "card":
        (folder / CARD_NAME).unlink()
    elif breakage == "front":
        (folder / CARD_NAME).write_text("# just a title\n")
    code, out, err = run(["publish", str(folder), "--repo-id", "a/b", "--dry-run"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_real_process_exit_code_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cl_zoo.cli", "publish", str(tmp_path / "missing"), "--repo-id", "a/b", "--dry-run"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().startswith("error: ") and "Traceback" not in proc.stderr


def test_warnings_are_one_warning_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A command's warning (a folder walk that skipped symlink repeats, say) reads like an error line."""
    import warnings

    import cl_zoo.cli as cli_module

    def warns(*args: object, **kwargs: object) -> int:
        warnings.warn("data/: skipped 2 linked folders already walked\n(symlink repeats or loops)", stacklevel=2)
        return 0

    monkeypatch.setattr(cli_module.cli, "main", warns)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        # Python's default display (pytest records warnings instead): write formatwarning's text.
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: sys.stderr.write(warnings.formatwarning(m, c, f, n, line))
        assert cli_module.main(["models"]) == 0
    err = capsys.readouterr().err
    assert err == "warning: data/: skipped 2 linked folders already walked (symlink repeats or loops)\n"
    assert warnings.formatwarning is not cli_module.format_warning  # restored after the command
