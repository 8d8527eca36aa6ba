"""Model cards: the README.md of a checkpoint folder (Hub YAML front matter + sections).

The front matter carries ``library_name: cl-zoo`` and a ``model-index`` so the Hub shows the
metrics in its evaluation widget; the sections say how to load *this* checkpoint (the Python and
command-line calls name its own folder, Hub id or registered name, and the Python block runs as
written: ``cl-zoo publish`` executes it before uploading), what it was trained on, how it was
evaluated, and which paper to cite.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Mapping

import yaml

PAPERS: dict[str, tuple[str, str]] = {
    "jcl": (
        "Joint Contrastive Learning with Infinite Possibilities (Cai et al., NeurIPS 2020)",
        "@inproceedings{cai2020jcl,\n  title={Joint Contrastive Learning with Infinite Possibilities},\n"
        "  author={Cai, Qi and Wang, Yu and Pan, Yingwei and Yao, Ting and Mei, Tao},\n"
        "  booktitle={NeurIPS},\n  year={2020}\n}",
    ),
    "dcl": (
        "Decoupled Contrastive Learning (Yeh et al., ECCV 2022)",
        "@inproceedings{yeh2022dcl,\n  title={Decoupled Contrastive Learning},\n"
        "  author={Yeh, Chun-Hsiao and Hong, Cheng-Yao and Hsu, Yen-Chi and Liu, Tyng-Luh and Chen, Yubei and LeCun, Yann},\n"
        "  booktitle={ECCV},\n  year={2022}\n}",
    ),
    "simo": (
        "EqCo: Equivalent Rules for Self-supervised Contrastive Learning (Zhu et al., 2020)",
        "@article{zhu2020eqco,\n  title={EqCo: Equivalent Rules for Self-supervised Contrastive Learning},\n"
        "  author={Zhu, Benjin and Huang, Junqiang and Li, Zeming and Zhang, Xiangyu and Sun, Jian},\n"
        "  journal={arXiv:2010.01929},\n  year={2020}\n}",
    ),
    "cmc": (
        "Contrastive Multiview Coding (Tian et al., ECCV 2020)",
        "@inproceedings{tian2020cmc,\n  title={Contrastive Multiview Coding},\n"
        "  author={Tian, Yonglong and Krishnan, Dilip and Isola, Phillip},\n  booktitle={ECCV},\n  year={2020}\n}",
    ),
    "cacr": (
        "Contrastive Attraction and Contrastive Repulsion for Representation Learning (Zheng et al., TMLR 2023)",
        "@article{zheng2023cacr,\n  title={Contrastive Attraction and Contrastive Repulsion for Representation Learning},\n"
        "  author={Zheng, Huangjie and Chen, Xu and Yao, Jiangchao and Yang, Hongxia and Li, Chunyuan and Zhang, Ya and Zhang, Hao and Tsang, Ivor and Zhou, Jingren and Zhou, Mingyuan},\n"
        "  journal={TMLR},\n  year={2023}\n}",
    ),
    "simclr": (
        "A Simple Framework for Contrastive Learning of Visual Representations (Chen et al., ICML 2020)",
        "@inproceedings{chen2020simclr,\n  title={A Simple Framework for Contrastive Learning of Visual Representations},\n"
        "  author={Chen, Ting and Kornblith, Simon and Norouzi, Mohammad and Hinton, Geoffrey},\n  booktitle={ICML},\n  year={2020}\n}",
    ),
    "mocov2": (
        "Improved Baselines with Momentum Contrastive Learning (Chen et al., 2020)",
        "@article{chen2020mocov2,\n  title={Improved Baselines with Momentum Contrastive Learning},\n"
        "  author={Chen, Xinlei and Fan, Haoqi and Girshick, Ross and He, Kaiming},\n  journal={arXiv:2003.04297},\n  year={2020}\n}",
    ),
}
PAPERS["dclw"] = PAPERS["dcl"]
PAPERS["eqco"] = PAPERS["simo"]
PAPERS["moco"] = PAPERS["mocov2"]


# Sections render_card builds from config.json alone; any other section of a card was passed in by
# whoever wrote the folder (the trainer's "Training" log, a converter's provenance note).
GENERATED_SECTIONS: tuple[str, ...] = ("Description", "How to load", "Training recipe", "Evaluation", "Citation")


def _metric_entries(metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    entries = []
    for name, value in sorted(metrics.items()):
        if isinstance(value, (int, float)):
            entries.append({"type": name, "value": float(value), "name": name})
    return entries


def front_matter(config: Mapping[str, Any]) -> dict[str, Any]:
    cfg = config.get("pretrained_cfg", {})
    method = (config.get("method") or cfg.get("method") or "").lower()
    dataset = cfg.get("dataset")
    meta: dict[str, Any] = {
        "library_name": "cl-zoo",
        "license": cfg.get("license") or "apache-2.0",
        "tags": sorted({"cl-zoo", "self-supervised", "contrastive-learning", "image-feature-extraction", method} - {""}),
        "pipeline_tag": "image-feature-extraction",
    }
    if dataset:
        meta["datasets"] = [dataset]
    metrics = config.get("metrics") or {}
    if metrics:
        meta["model-index"] = [
            {
                "name": config.get("model_name", config.get("architecture")),
                "results": [
                    {
                        "task": {"type": "image-classification", "name": "Image classification (frozen features)"},
                        "dataset": {"type": dataset or "unknown", "name": dataset or "unknown"},
                        "metrics": _metric_entries(metrics),
                    }
                ],
            }
        ]
    return meta


def registered_name_of(config: Mapping[str, Any]) -> str | None:
    """The registered pretrained name whose pinned weights are exactly this folder's, else None.

    A fine-tuned copy saved from a registered model keeps its ``model_name``; only the sha256 pins
    tell whether ``create_model(name, pretrained=True)`` would give back *these* weights.
    """
    from cl_zoo.registry import find_pretrained

    name = config.get("model_name")
    files = config.get("files") or {}
    entry = find_pretrained(str(name))
    if entry is None or not files or dict(entry.cfg.sha256) != dict(files):
        return None
    return entry.name


def load_source(config: Mapping[str, Any], folder: str | os.PathLike[str] | None = None) -> str:
    """What ``load_pretrained`` / ``--model`` should be given to load the checkpoint ``config`` describes:
    its registered name when the registry pins these very weights, else its folder (absolute, so the
    call works from any directory), else its recorded Hub id."""
    if name := registered_name_of(config):
        return name
    if folder is not None:
        return str(Path(folder).expanduser().resolve())
    hub_id = (config.get("pretrained_cfg") or {}).get("hf_hub_id")
    if hub_id:
        return f"hf-hub:{hub_id}"
    return str(config.get("model_name") or config.get("architecture"))


def how_to_load(config: Mapping[str, Any], source: str) -> str:
    """The "How to load" section for ``source``; its Python block runs as written (publish checks)."""
    cfg = config.get("pretrained_cfg", {})
    size = list(cfg.get("input_size", [3, 224, 224]))
    if registered_name_of(config) == source:
        load = f"model = cl_zoo.create_model({source!r}, pretrained=True)  # same as cl_zoo.load_pretrained({source!r})"
    else:
        load = f"model = cl_zoo.load_pretrained({source!r})"
    if registered_name_of(config) == source:  # hubconf has every registered name as an entry point
        hub_call = f"torch.hub.load('path/to/cl-zoo', {source!r}, source='local')"
    else:
        hub_call = f"torch.hub.load('path/to/cl-zoo', 'load_pretrained', {source!r}, source='local')"
    python = (
        "```python\nimport torch\nimport cl_zoo\n\n"
        f"{load}\n"
        f"images = torch.rand(2, {size[0]}, {size[1]}, {size[2]})  # stand-in for a batch preprocessed as below\n"
        "with torch.no_grad():\n"
        f"    features = model(images)  # [2, {config.get('num_features')}] pooled features\n```"
    )
    return (
        f"{python}\n\n"
        "```bash\n"
        f"cl-zoo embed images/ --model {shlex.quote(source)} --out out/embeddings.npy\n```\n\n"
        f"From a cl-zoo checkout with torch.hub: `{hub_call}`.\n\n"
        f"Preprocessing: resize the shorter side to {int(round(size[-1] / cfg.get('crop_pct', 1.0)))} "
        f"({cfg.get('interpolation', 'bilinear')}), centre-crop {size[-2]}x{size[-1]}, normalise with mean "
        f"{list(cfg.get('mean', []))} and std {list(cfg.get('std', []))}."
    )


def training_data_text(config: Mapping[str, Any]) -> tuple[str, str]:
    """(the "on ..." phrase of the description, a sentence on the data) from config's ``training_data``."""
    cfg = config.get("pretrained_cfg", {})
    data = config.get("training_data") or {}
    if not data.get("images"):
        return (f" on {cfg['dataset']}" if cfg.get("dataset") else ""), ""
    source, split, named = str(data.get("source")), data.get("split"), data.get("dataset")
    if source.lower() == str(named).lower():  # a named dataset: "50,000 images of cifar10 train"
        what = f"{named}{' ' + split if split else ''}"
    else:
        notes = [f"{split} split" if split else "", f"its recipe names it {named}" if named else ""]
        what = f"`{source}`" + (f" ({'; '.join(n for n in notes if n)})" if any(notes) else "")
    phrase = f" on {data['images']:,} images of {what}"
    held = int(data["images"]) - int(data.get("trained_images") or data["images"])
    sentence = (
        f"Training data fingerprint: `{data.get('fingerprint')}` (sha256 over the images' relative paths and sizes)"
        + (f"; {held:,} of the images were held out for the kNN monitor" if held > 0 else "")
        + ("" if data.get("labeled", True) else "; the images had no labels")
        + "."
    )
    return phrase, sentence


def render_card(
    config: Mapping[str, Any],
    sections: Mapping[str, str] | None = None,
    *,
    folder: str | os.PathLike[str] | None = None,
    source: str | None = None,
) -> str:
    """Render README.md for a checkpoint; ``sections`` add or replace named sections.

    ``folder`` is where the checkpoint is written and ``source`` overrides what its load calls name
    (``hf-hub:owner/name`` when publishing); see :func:`load_source`.
    """
    sections = dict(sections or {})
    cfg = config.get("pretrained_cfg", {})
    name = config.get("model_name") or config.get("architecture")
    method = (config.get("method") or cfg.get("method") or "").lower()
    paper, bibtex = PAPERS.get(method, ("", ""))
    source = source or load_source(config, folder)
    metrics = config.get("metrics") or {}
    recipe = config.get("recipe") or {}
    data_phrase, data_sentence = training_data_text(config)

    body: dict[str, str] = {}
    body["Description"] = (
        f"`{name}` is a `{config.get('architecture')}` backbone ({config.get('num_params', 0) / 1e6:.2f}M parameters, "
        f"{config.get('num_features')}-d pooled features)"
        + (f" pretrained with **{method.upper()}**" if method else "")
        + (f" ({paper})" if paper else "")
        + (f" for {cfg['epochs']} epoch{'s' if cfg['epochs'] != 1 else ''}" if cfg.get("epochs") else "")
        + data_phrase
        + ". It is a feature extractor: the projection head and momentum encoder used in pretraining are not included."
        + (f"\n\n{data_sentence}" if data_sentence else "")
        + (f"\n\n{cfg['notes']}" if cfg.get("notes") else "")
    )
    body["How to load"] = how_to_load(config, source)
    if recipe:
        body["Training recipe"] = "```yaml\n" + yaml.safe_dump(dict(recipe), sort_keys=True).rstrip() + "\n```"
    else:
        body["Training recipe"] = "Not recorded for this checkpoint."
    if metrics:
        rows = "\n".join(f"| {k} | {v:.4g} |" if isinstance(v, (int, float)) else f"| {k} | {v} |" for k, v in sorted(metrics.items()))
        body["Evaluation"] = "| metric | value |\n|---|---|\n" + rows
    else:
        body["Evaluation"] = "No evaluation recorded yet (`cl-zoo knn` / `cl-zoo linear-eval`, then `cl-zoo card-update`)."
    body["Citation"] = f"```bibtex\n{bibtex}\n```" if bibtex else "Cite cl-zoo and the method's paper."
    for key, text in sections.items():
        body[key] = text

    order = [k for k in GENERATED_SECTIONS if k != "Citation"]
    order += [k for k in body if k not in order and k != "Citation"] + ["Citation"]
    parts = ["---", yaml.safe_dump(front_matter(config), sort_keys=False).rstrip(), "---", "", f"# {name}", ""]
    for key in order:
        parts += [f"## {key}", "", body[key].rstrip(), ""]
    return "\n".join(parts)


def parse_front_matter(text: str) -> dict[str, Any]:
    """The YAML front matter of a card (raises ValueError when absent or malformed)."""
    if not text.startswith("---"):
        raise ValueError("model card has no YAML front matter")
    end = text.find("\n---", 3)
    if end < 0:
        raise ValueError("model card front matter is not closed with '---'")
    data = yaml.safe_load(text[3:end])
    if not isinstance(data, dict):
        raise ValueError("model card front matter is not a mapping")
    return data


def extra_sections(text: str) -> dict[str, str]:
    """The sections of a rendered card that are not rebuilt from config.json.

    Re-rendering a card (after new metrics, or for a float16 copy) must keep them, or a card would
    silently lose its training log and curve. ``## `` lines inside code fences are not headings.
    """
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            title = line[3:].strip()
            current = None if title in GENERATED_SECTIONS else sections.setdefault(title, [])
            continue
        if current is not None:
            current.append(line)
    return {title: "\n".join(lines).strip() for title, lines in sections.items()}
