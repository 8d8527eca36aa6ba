"""The zoo's folders as timm loads them (issue 22): the real ``timm`` package, not a copy of its rules.

For every ResNet folder under ``model_cards/`` that timm has an architecture for,
``timm.create_model("local-dir:FOLDER", pretrained=True)`` and, through the local Hub test server,
``timm.create_model("hf-hub:OWNER/NAME", pretrained=True)`` give the features
``cl_zoo.load_pretrained`` gives. timm reads ``huggingface_hub``'s endpoint once, at import, so the
hf-hub half runs in a child interpreter started with ``HF_ENDPOINT`` pointing at the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cl_zoo
from cl_zoo.checkpoint import INDEX_NAME, read_config
from cl_zoo.checkpoint.timm_compat import TIMM_PRETRAINED_FIELDS, timm_architecture
from cl_zoo.registry import DEFAULT_MODEL

from tests.hub_server import FakeHub, online
from tests.helpers import REPO_ROOT

timm = pytest.importorskip("timm", reason="timm is in the test extra: pip install -e '.[test]'")

REPO = REPO_ROOT
CARDS = REPO / "model_cards"
FOLDERS = sorted(p for p in CARDS.iterdir() if (p / "config.json").is_file())
TIMM_FOLDERS = [p for p in FOLDERS if timm_architecture(read_config(p))]
# Every timm-architecture folder is re-laid out as one model.safetensors (scripts/relayout_model_cards.py);
# timm reads no shard index, so a folder that is sharded again fails test_the_resnet_folders_are_timm_folders.
SHARDED = {p.name for p in TIMM_FOLDERS if (p / INDEX_NAME).is_file()}
TOKEN = "hf_timm_test_token"


def features(model: torch.nn.Module, size: int) -> torch.Tensor:
    torch.manual_seed(0)
    with torch.no_grad():
        return model.eval()(torch.randn(2, 3, size, size))


def test_the_resnet_folders_are_timm_folders() -> None:
    assert TIMM_FOLDERS, "no timm-loadable folder under model_cards/"
    for folder in FOLDERS:
        config = json.loads((folder / "config.json").read_text())
        assert set(config["pretrained_cfg"]) <= TIMM_PRETRAINED_FIELDS, folder.name
        assert config["num_classes"] == 0 and config["num_features"] > 0
    assert DEFAULT_MODEL in {p.name for p in TIMM_FOLDERS}, "the default ships in the wheel: it must be timm-ready"
    assert not SHARDED, f"timm reads one model.safetensors; re-lay out {sorted(SHARDED)}"


@pytest.mark.parametrize("folder", TIMM_FOLDERS, ids=lambda p: p.name)
def test_timm_local_dir_gives_cl_zoo_features(folder: Path, tmp_path: Path) -> None:
    ours = cl_zoo.load_pretrained(folder)
    theirs = timm.create_model(f"local-dir:{folder}", pretrained=True)
    size = ours.pretrained_cfg.input_size[-1]
    assert theirs.num_features == ours.num_features
    assert tuple(theirs.pretrained_cfg["input_size"]) == tuple(ours.pretrained_cfg.input_size)
    torch.testing.assert_close(features(theirs, size), features(ours, size), rtol=0, atol=1e-5)


def test_timm_hf_hub_through_the_local_hub_gives_cl_zoo_features(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import HfApi

    online(monkeypatch)
    with FakeHub(tmp_path / "hub", token=TOKEN) as hub:
        api = HfApi(endpoint=hub.endpoint, token=TOKEN)
        repos = {}
        for folder in TIMM_FOLDERS:
            repo_id = f"timm-test/{folder.name}"
            api.create_repo(repo_id, exist_ok=True)
            api.upload_folder(repo_id=repo_id, folder_path=str(folder))
            repos[repo_id] = str(folder)
        script = """
import json, sys, timm, torch, cl_zoo
out = {}
for repo_id, folder in json.loads(sys.argv[1]).items():
    ours = cl_zoo.load_pretrained(folder)
    size = ours.pretrained_cfg.input_size[-1]
    torch.manual_seed(0)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        a = timm.create_model("hf-hub:" + repo_id, pretrained=True).eval()(x)
        b = cl_zoo.load_pretrained("hf-hub:" + repo_id)(x)
        c = ours(x)
    out[repo_id] = [float((a - c).abs().max()), float((b - c).abs().max())]
print(json.dumps(out))
"""
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "cache"),
               "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_TOKEN": TOKEN}
        done = subprocess.run([sys.executable, "-c", script, json.dumps(repos)], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == set(repos)
    for repo_id, (timm_diff, hub_diff) in result.items():
        assert timm_diff <= 1e-5 and hub_diff == 0.0, (repo_id, timm_diff, hub_diff)
