"""A card is somebody else's text (issue 21, point 1): publishing never runs it unless asked, asked
it runs without credentials, and text that reaches a card from a file cannot open a section or a
code fence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint import CARD_NAME, CONFIG_NAME
from cl_zoo.checkpoint.card import contained_section, inline_code, inline_text, render_card
from cl_zoo.checkpoint.publish import card_for_repo
from cl_zoo.checkpoint.usage import section_text, usage_blocks
from cl_zoo.cli import main
from cl_zoo.errors import CheckpointError

HOSTILE = "x\n\n## How to load\n\n```python\nimport cl_zoo, os\nopen(os.environ['PWNED'], 'w').write(os.environ.get('HF_TOKEN', 'none'))\n```\n"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = cl_zoo.create_model("resnet18_cifar", width=0.125)
    model.pretrained_cfg.input_size = (3, 16, 16)
    return cl_zoo.save_pretrained(model, tmp_path / "ckpt")


def hostile_card(folder: Path, pwned: Path) -> str:
    """The bundled card plus a second usage block that writes a file and reads HF_TOKEN."""
    text = (folder / CARD_NAME).read_text(encoding="utf-8")
    block = ("```python\nimport os\nimport cl_zoo\n"
             f"open({str(pwned)!r}, 'w').write(os.environ.get('HF_TOKEN', 'no token'))\n```\n\n")
    text = text.replace("## How to load\n\n", "## How to load\n\n" + block, 1)
    (folder / CARD_NAME).write_text(text, encoding="utf-8")
    return text


def test_publish_dry_run_does_not_run_the_cards_code(folder: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    pwned = tmp_path / "pwned"
    hostile_card(folder, pwned)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    code = main(["publish", str(folder), "--repo-id", "alice/tiny", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1 and "not the one cl-zoo generates" in err
    assert not pwned.exists(), "publish --dry-run executed code from the folder's card"


def test_run_card_code_shows_it_first_and_runs_it_without_credentials(folder: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    pwned = tmp_path / "pwned"
    hostile_card(folder, pwned)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_secret_value")
    assert main(["publish", str(folder), "--repo-id", "alice/tiny", "--dry-run", "--run-card-code"]) == 0
    out = capsys.readouterr().out
    assert out.index("open(") < out.index("ok:")  # shown before the verdict
    assert pwned.read_text() == "no token"  # it ran, and saw no token


def test_values_from_files_cannot_open_a_section_or_a_fence(folder: Path) -> None:
    config = json.loads((folder / CONFIG_NAME).read_text())
    config["model_name"] = HOSTILE
    config["cl_zoo_pretrained_cfg"]["notes"] = HOSTILE
    config["training_data"] = {"source": HOSTILE, "images": 3, "split": HOSTILE, "dataset": "d", "fingerprint": HOSTILE}
    config["metrics"] = {HOSTILE: 0.5}
    config["recipe"] = {"note": "```\n## How to load\n```python\nimport os\n```"}
    sections = {"Conversion": HOSTILE + "\n```python\nunclosed", "Origin": "- key `" + HOSTILE + "`"}
    card = render_card(config, sections, folder=folder)
    titles = [line for line in card.splitlines() if line.startswith("## ")]
    assert titles.count("## How to load") == 1, titles
    assert len(usage_blocks(card, every=True)) == 1  # the generated cl-zoo block only (no timm for this arch)
    assert "PWNED" not in section_text(card)


@pytest.mark.parametrize("text", [HOSTILE, "a\r\nb\u2028c\u2029d\x1b[31m", "``` x ```", "`", "<!-- hide the rest"])
def test_inline_helpers_stay_on_one_line(text: str) -> None:
    for rendered in (inline_text(text), inline_code(text)):
        assert "\n" not in rendered and "\r" not in rendered and "\u2028" not in rendered and "\x1b" not in rendered
    assert "<!--" not in inline_text(text)
    assert contained_section("```python\nx\n## Not a heading").splitlines()[-1] == "```"
    assert contained_section("## heading\ntext").startswith("\\## heading")


def test_an_imported_lightly_style_card_key_cannot_add_a_usage_block(folder: Path) -> None:
    """Conversion sections quote the file's top-level keys: a key holding a fenced block stays a key."""
    config = json.loads((folder / CONFIG_NAME).read_text())
    card = render_card(config, {"Conversion": f"Other entries in the file: `{HOSTILE}`."}, folder=folder)
    (folder / CARD_NAME).write_text(card, encoding="utf-8")
    assert len([b for b in usage_blocks(card)]) == 1
    card_for_repo(folder, "alice/tiny")  # the generated section, unchanged: publishable


def test_an_imported_checkpoints_card_names_its_folder_and_quotes_file_keys_on_one_line(tmp_path: Path) -> None:
    """A lightly-style .ckpt whose top-level dict has a key holding a usage block: the imported card
    quotes it on one line, names the output folder (not the staging one) and publishes as generated."""
    from torchvision.models import resnet18

    backbone = resnet18()
    backbone.fc = torch.nn.Identity()
    path = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": {f"backbone.{k}": v for k, v in backbone.state_dict().items()}, HOSTILE: 1}, path)
    out = tmp_path / "imported"
    assert main(["import", "lightly", str(path), "--out", str(out), "--arch", "resnet18"]) == 0
    card = (out / CARD_NAME).read_text(encoding="utf-8")
    assert ".importing-" not in card and str(out.resolve()) in card
    assert [line for line in card.splitlines() if line.startswith("## ")].count("## How to load") == 1
    assert len(usage_blocks(card)) == 1 and "PWNED" not in section_text(card)
    assert "hf-hub:alice/imported" in card_for_repo(out, "alice/imported")


def test_card_update_without_a_report_restores_the_generated_section(folder: Path, tmp_path: Path, capsys) -> None:
    """The way out the publish refusal names: re-render the card from config.json, hand sections kept."""
    original = (folder / CARD_NAME).read_text(encoding="utf-8")
    hostile_card(folder, tmp_path / "pwned")
    edited = (folder / CARD_NAME).read_text(encoding="utf-8") + "\n## Notes from the author\n\nTrained on my laptop.\n"
    (folder / CARD_NAME).write_text(edited, encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"cl-zoo card-update"):
        card_for_repo(folder, "alice/tiny")
    assert main(["card-update", str(folder)]) == 0
    card = (folder / CARD_NAME).read_text(encoding="utf-8")
    assert section_text(card) == section_text(original) and "Trained on my laptop." in card
    card_for_repo(folder, "alice/tiny")
    assert not (tmp_path / "pwned").exists()
