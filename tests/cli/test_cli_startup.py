"""``import cl_zoo`` and the CLI's help, ``models`` and ``info`` answer without importing torch (issues 43, 44).

Each case runs in a fresh interpreter (``sys.modules`` of the test process already holds torch) and
asserts on ``sys.modules`` afterwards. Timing is not asserted (a loaded CI host varies); the figure
is in the change's report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from cl_zoo.cli import cli
from cl_zoo.registry import DEFAULT_MODEL
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT

PROBE = """
import contextlib, io, json, sys
import cl_zoo
from cl_zoo.cli import main
argv = json.loads(sys.argv[1])
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    code = main(argv) if argv is not None else 0
heavy = sorted(m for m in ("torch", "torchvision", "numpy", "safetensors", "huggingface_hub") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy, "out": out.getvalue()}))
"""


def probe(argv: list[str] | None, tmp_path: Path) -> dict:
    env = {**os.environ, "CL_ZOO_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


CASES = [
    pytest.param(None, id="import cl_zoo"),
    pytest.param(["--help"], id="--help"),
    *[pytest.param([name, "--help"], id=f"{name} --help") for name in cli.list_commands(click.Context(cli))],
    pytest.param(["models"], id="models"),
    pytest.param(["models", "--json"], id="models --json"),
    pytest.param(["info", DEFAULT_MODEL], id="info pretrained"),
    pytest.param(["info", "cmc_resnet50x2_lab.in1k_official"], id="info release"),
    pytest.param(["info", "resnet50"], id="info architecture"),
    pytest.param(["info", "dcl_resnet81"], id="info typo"),
]


@pytest.mark.parametrize("argv", CASES)
def test_answers_without_torch(argv: list[str] | None, tmp_path: Path) -> None:
    result = probe(argv, tmp_path)
    assert "torch" not in result["heavy"], (argv, result["heavy"])
    if argv is None:
        return
    if argv[-1] == "dcl_resnet81":
        assert result["code"] != 0 and "did you mean" in result["out"]
    else:
        assert result["code"] == 0, result["out"]
        assert result["out"].strip()


def test_listing_matches_built_models(tmp_path: Path) -> None:
    """``models --json`` (declared sizes, no torch) says what building each model gives."""
    import cl_zoo

    rows = {r["name"]: r for r in json.loads(probe(["models", "--json"], tmp_path)["out"])}
    for name in ("resnet18_cifar", "cmc_alexnet_cifar_lab", DEFAULT_MODEL):
        model = cl_zoo.create_model(name)
        assert rows[name]["params"] == sum(p.numel() for p in model.parameters())
        assert rows[name]["num_features"] == model.num_features
