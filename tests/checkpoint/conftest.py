"""Fixtures of the checkpoint tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import cl_zoo
from tests.helpers import tiny_checkpoint_model


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A fresh tiny checkpoint folder for a test to tamper with (``test_checkpoint.py`` and
    ``test_card_usage.py`` define a ``saved`` of their own, which wins in their module)."""
    return cl_zoo.save_pretrained(tiny_checkpoint_model(), tmp_path / "ckpt")
