"""Model cards: the README.md of a checkpoint folder (Hub YAML front matter + sections).

The front matter follows the Hub's model-card conventions and is written through
``huggingface_hub.ModelCardData`` (which parses and checks the ``model-index``): ``library_name:
timm`` when timm can load the folder as it is (the Hub then shows timm's "Use this model" snippet),
else ``library_name: cl-zoo`` (see :func:`library_name`); ``cl-zoo`` in the tags either way;
``pipeline_tag: image-feature-extraction``; ``datasets`` as Hub dataset ids (:data:`HUB_DATASETS`),
only when the training data is that dataset (:func:`training_dataset`); ``arxiv:<id>`` tags for the
method's paper;
a ``base_model`` for mirrors of third-party releases; and a ``model-index`` whose metric types are
the Hub's standard ``accuracy`` (the protocol goes in the metric's name: a Hub widget or leaderboard
compares metrics by type, and ``imagenette_knn_k200_top1`` is no type it knows). The sections say
how to load *this* checkpoint (the Python and command-line calls name its own folder, Hub id or
registered name; a real photo goes through the checkpoint's own preprocessing; the cl-zoo Python
block runs as written: ``cl-zoo publish`` executes it before uploading, with the sample photo
served from a local file; a timm block follows when timm can load the folder), what it was trained
on, how it was evaluated, and which paper to cite.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from cl_zoo.checkpoint.timm_compat import TIMM_ARCHITECTURES as TIMM_RESNETS
from cl_zoo.checkpoint.timm_compat import TIMM_PRETRAINED_FIELDS, merged_pretrained_cfg, timm_architecture
from cl_zoo.checkpoint.usage import SAMPLE_IMAGE_URL, FenceTracker
from cl_zoo.constants import PAPERS  # noqa: F401  (re-exported: cl_zoo.checkpoint.card.PAPERS)
from cl_zoo.deprecations import retired_exports
from cl_zoo.registry import find_pretrained


# cl-zoo's dataset names -> the Hub dataset ids the card's ``datasets:`` and model-index name (the Hub
# links an id to its dataset page; a bare "imagenette" links nowhere). Each id is copied from the
# dataset's own page on the Hub:
# - uoft-cs/cifar10: https://huggingface.co/datasets/uoft-cs/cifar10 ("Dataset Card for CIFAR-10")
# - uoft-cs/cifar100: https://huggingface.co/datasets/uoft-cs/cifar100 ("Dataset Card for CIFAR-100")
# - frgfm/imagenette: https://huggingface.co/datasets/frgfm/imagenette (its imagenette.py:
#   _REPO = "https://huggingface.co/datasets/frgfm/imagenette/resolve/main/metadata"); cl-zoo's
#   imagenette is a resized copy of the same images and split
# - ILSVRC/imagenet-1k: https://huggingface.co/datasets/ILSVRC/imagenet-1k (the ILSVRC-2012
#   classification data, gated; the releases' "imagenet-1k" / metric prefix "imagenet1k")
# STL-10 has no copy on the Hub from its authors or the Hub team (only personal re-uploads), so it
# is left out rather than pointed at one of them; so is any user's own folder name.
HUB_DATASETS: dict[str, str] = {
    "cifar10": "uoft-cs/cifar10",
    "cifar100": "uoft-cs/cifar100",
    "imagenette": "frgfm/imagenette",
    "imagenet-1k": "ILSVRC/imagenet-1k",
    "imagenet1k": "ILSVRC/imagenet-1k",
}


def hub_dataset_id(name: object) -> str | None:
    """The Hub dataset id of the dataset cl-zoo names ``name``, else None.

    Only known names map: cl-zoo trains on folders, archives and named datasets, never on a Hub
    dataset by id, so a name with a slash is a path, not an id to link to.
    """
    return HUB_DATASETS.get(name.strip().lower()) if isinstance(name, str) else None


# ``library_name`` picks the Hub's "Use this model" snippet and library filter. The Hub knows timm
# (huggingface.js packages/tasks/src/model-libraries.ts lists "timm"), and timm loads a folder
# :func:`timm_model_name` accepts as it is, so those cards say timm. cl-zoo is not a library the Hub
# knows: a card naming it gets no snippet and no filter entry (the card's own "How to load" is the
# snippet), but it is accepted and shown. It is still the deliberate choice for folders timm cannot
# load (CMC's L/ab pairs, CIFAR stems, widths): without a library_name the Hub guesses from the
# files, and "if nothing is detected and there is a config.json file, it's assumed the library is
# transformers" (https://huggingface.co/docs/hub/model-cards, "Specifying a library"), which would
# offer a snippet that cannot work.
LIBRARY_NAMES: tuple[str, ...] = ("timm", "cl-zoo")


def library_name(config: Mapping[str, Any]) -> str:
    """The card's ``library_name``: ``timm`` when timm loads the folder as it is, else ``cl-zoo``."""
    return "timm" if timm_model_name(config) else "cl-zoo"


# Sections render_card builds from config.json alone; any other section of a card was passed in by
# whoever wrote the folder (the trainer's "Training" log, a converter's provenance note).
GENERATED_SECTIONS: tuple[str, ...] = ("Description", "How to load", "Training recipe", "Evaluation", "Citation")


# Metric keys cl-zoo writes: ``<data>_knn_k<K>_top<N>`` (``cl-zoo knn``), ``<data>_linear_<protocol>_top<N>``
# (``cl-zoo linear-eval``), ``monitor_knn_k<K>_top<N>`` (the trainer's online kNN monitor) and, on
# converted releases, ``<data>_<knn|linear>_top<N>_reported`` (the authors' own numbers).
_METRIC_KEY = re.compile(
    r"^(?P<data>[a-z0-9_]+?)_(?P<protocol>knn|linear)(?:_(?P<arg>[a-z0-9]+))?_top(?P<top>\d+)(?P<reported>_reported)?$"
)
_TOP_KEY = re.compile(r"_top(?P<top>[15])$")
MONITOR = "monitor"
UNKNOWN_DATA = "unknown"


@dataclass(frozen=True)
class MetricInfo:
    """What a metric key measured: the data it was measured on and a readable protocol name."""

    data: str  # the dataset slug, MONITOR, or UNKNOWN_DATA
    name: str  # e.g. "kNN top-1 (k=200, T=0.1) on imagenette val: 500 of its 3,925 images (...)"
    split: str | None
    # for a subset of the split (--per-class), what was scored: "imagenette val: 500 of its 3,925 images ..."
    subset: str = ""


def _latest_evaluation(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """The latest recorded evaluation that produced the metric ``key`` ({} when none is recorded)."""
    found: Mapping[str, Any] = {}
    for evaluation in config.get("evaluations") or []:
        if isinstance(evaluation, Mapping) and key in (evaluation.get("metrics") or {}):
            found = evaluation
    return found


def _knn_temperature(evaluation: Mapping[str, Any]) -> float | None:
    value = (evaluation.get("hyperparameters") or {}).get("temperature")
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _counted(evaluation: Mapping[str, Any], role: str) -> tuple[int | None, int | None, str | None]:
    """(images scored, images of the split they were drawn from, how they were drawn) for ``role``
    ("test" or "train") of a recorded evaluation; Nones where the record does not say."""
    subset = evaluation.get(f"{role}_subset")
    subset = subset if isinstance(subset, Mapping) else {}
    per_class = _whole((evaluation.get("hyperparameters") or {}).get("per_class"))
    drawn = subset.get("drawn") or (f"the first {per_class} of each class" if per_class else None)
    return _whole(evaluation.get(f"{role}_images")), _whole(subset.get("of_images")), drawn


def _measured_on(evaluation: Mapping[str, Any]) -> str:
    """What an evaluation scored, when recorded: ": 500 of its 3,925 images (the first 50 of each
    class); neighbours from 500 of 9,469 train images" (a subset is always named as one)."""
    images, whole, drawn = _counted(evaluation, "test")
    if images is None:
        return f" ({inline_text(drawn, 100)})" if drawn else ""
    text = f": {images:,} of its {whole:,} images" if whole not in (None, images) else f": {images:,} images"
    text += f" ({inline_text(drawn, 100)})" if drawn else ""
    train, train_whole, _ = _counted(evaluation, "train")
    if train is not None:
        role = "neighbours from" if evaluation.get("task") == "knn" else "probe trained on"
        text += f"; {role} {train:,}" + (f" of {train_whole:,}" if train_whole not in (None, train) else "") + " train images"
    return text


def _eval_split(data: str) -> str | None:
    """The split ``cl-zoo knn``/``linear-eval`` evaluate a named dataset on (``test``, else ``val``:
    Imagenette has no test split), for evaluations recorded without their split; None for a user's
    folder."""
    from cl_zoo.data.named import NAMED_DATASETS  # the cl_zoo.data package imports torch

    named = NAMED_DATASETS.get(data)
    if named is None:
        return None
    return "test" if "test" in named.splits else named.splits[-1]


def describe_metric(key: str, config: Mapping[str, Any] | None = None) -> MetricInfo | None:
    """What the metric ``key`` measured, or None when its key does not say it is an accuracy.

    Keys are parsed, not looked up, so a metric from any evaluation data gets a name; ``config``
    supplies what the key leaves out, from the latest recorded evaluation that produced it: the kNN
    temperature, the split, and how many of the split's images were scored (a ``--per-class``
    subset is named as one, never as the split).
    """
    config = config or {}
    match = _METRIC_KEY.match(key)
    if match is None:
        top = _TOP_KEY.search(key)
        return MetricInfo(UNKNOWN_DATA, key, None) if top else None
    data, protocol, arg, top = match["data"], match["protocol"], match["arg"], match["top"]
    evaluation = _latest_evaluation(config, key)
    details: list[str] = []
    if protocol == "knn":
        if arg is not None and not re.fullmatch(r"k\d+", arg):
            return MetricInfo(UNKNOWN_DATA, key, None) if top in ("1", "5") else None
        if arg is not None:
            details.append(f"k={arg[1:]}")
        temperature = _knn_temperature(evaluation)
        if temperature is not None:
            details.append(f"T={temperature:g}")
        what = "kNN"
    else:
        what = "Linear probe"
        if arg is not None:
            details.append(f"{arg} protocol")
    label = f"{what} top-{top}" + (f" ({', '.join(details)})" if details else "")
    if data == MONITOR:
        return MetricInfo(MONITOR, f"{label} on held-out images, monitored during pretraining", None)
    recorded_split = evaluation.get("split")
    split = None if match["reported"] else (inline_text(recorded_split, 40) if isinstance(recorded_split, str) and recorded_split
                                            else _eval_split(data))
    where = f"{data} {split}" if split else data
    reported = ", as reported by the original release" if match["reported"] else ""
    measured = "" if match["reported"] else _measured_on(evaluation)
    subset = f"{where}{measured}" if evaluation.get("test_subset") or (evaluation.get("hyperparameters") or {}).get("per_class") else ""
    if subset:  # the model-index's split says it is part of one, so the Hub never files it as the whole split
        images, whole, _ = _counted(evaluation, "test")
        part = f"{images:,} of {whole:,} images" if images is not None and whole is not None else "subset"
        split = f"{split or 'data'} ({part})"
    return MetricInfo(data, f"{label} on {where}{reported}{measured}", split, subset)


def _training_record(config: Mapping[str, Any]) -> Mapping[str, Any]:
    data = config.get("training_data")
    return data if isinstance(data, Mapping) and _whole(data.get("images")) else {}


def training_dataset(config: Mapping[str, Any]) -> str | None:
    """The named dataset the checkpoint was trained on, or None when it is not one.

    A run that recorded its training data is judged by that data (its source's name, split, image and
    class counts; :func:`cl_zoo.data.named.identify_dataset`), never by its recipe's default
    dataset; a checkpoint without that record (a converted release, a folder written by
    ``save_pretrained``) by its ``pretrained_cfg.dataset``.
    """
    data = _training_record(config)
    if not data:
        dataset = merged_pretrained_cfg(config).get("dataset")
        return dataset if isinstance(dataset, str) and dataset.strip() else None
    from cl_zoo.data.named import identify_dataset  # the cl_zoo.data package imports torch

    return identify_dataset(str(data.get("source")), data.get("split"), int(data["images"]),
                            classes=_whole(data.get("classes")), claimed=_recipe_dataset(data))


def _recipe_dataset(data: Mapping[str, Any]) -> str | None:
    """The dataset the run's recipe was written for, as its training-data record names it."""
    return data.get("dataset") if isinstance(data.get("dataset"), str) else None


def _named_like(data: Mapping[str, Any]) -> Any:
    from cl_zoo.data.named import named_like  # the cl_zoo.data package imports torch

    return named_like(str(data.get("source")), data.get("split"), _recipe_dataset(data))


def training_data_name(config: Mapping[str, Any]) -> str | None:
    """A short name for what the checkpoint was trained on: the named dataset it is, else the data
    folder's (or archive's) own name."""
    if dataset := training_dataset(config):
        return dataset
    data = _training_record(config)
    return _source_name(data["source"]) if data else None


def _source_name(source: object) -> str:
    """A data source's own name (a folder's or archive's), never the user's full path."""
    return Path(str(source).rstrip("/\\")).name or str(source)


def dataset_claim_conflict(config: Mapping[str, Any], claimed: object) -> str | None:
    """Why a card's ``datasets:`` list contradicts config.json's record of the training data, or None.

    Only a Hub id the training data is not is a contradiction; a card that names no dataset claims
    nothing.
    """
    ids = [claimed] if isinstance(claimed, str) else list(claimed) if isinstance(claimed, (list, tuple)) else []
    actual = hub_dataset_id(training_dataset(config))
    wrong = [str(i) for i in ids if str(i) != actual]
    if not wrong:
        return None
    data = _training_record(config)
    what = (f"{int(data['images']):,} images of {training_data_name(config)}" if data
            else f"{training_dataset(config) or 'no recorded dataset'}")
    return (f"the card claims datasets {', '.join(wrong)}, but config.json says it was trained on {what}"
            + (f" ({actual})" if actual else ""))


def model_index(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Hub's ``model-index``: one result per evaluation dataset, every metric of type ``accuracy``.

    Values are stored as cl-zoo records them, fractions in [0, 1] (the Hub accepts any number;
    huggingface_hub's own example is ``0.9``). Metrics whose key does not say what they measured
    are left out rather than given an invented type.
    """
    metrics = config.get("metrics") or merged_pretrained_cfg(config).get("metrics") or {}
    grouped: dict[tuple[str, str | None, str], list[tuple[MetricInfo, float]]] = {}
    for key, value in sorted(metrics.items()):
        info = describe_metric(key, config)
        if info is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            grouped.setdefault((info.data, info.split, info.subset), []).append((info, float(value)))
    results = []
    for (data, split, subset), entries in grouped.items():
        if data == MONITOR:
            trained_on = training_data_name(config) or UNKNOWN_DATA
            dataset: dict[str, Any] = {"type": hub_dataset_id(training_dataset(config)) or trained_on,
                                       "name": f"{trained_on} (held-out images, pretraining monitor)"}
        elif subset:
            # A subset is not its split: its own split label ("val (500 of 3,925 images)"; the Hub files
            # results by type and split, and would merge it with the whole split's), and how it was
            # drawn in the name shown beside every number.
            dataset = {"type": hub_dataset_id(data) or data, "name": subset, "split": split}
        else:
            dataset = {"type": hub_dataset_id(data) or data, "name": data}
            if split:
                dataset["split"] = split
        results.append({
            "task": {"type": "image-classification", "name": "Image classification (frozen features)"},
            "dataset": dataset,
            "metrics": [{"type": "accuracy", "value": value, "name": info.name} for info, value in entries],
        })
    if not results:
        return []
    return [{"name": config.get("model_name", config.get("architecture")), "results": results}]


def _timm_refused_keys(config: Mapping[str, Any]) -> list[str]:
    """Keys of config.json's ``pretrained_cfg`` that timm's PretrainedCfg does not have (it refuses them)."""
    cfg = config.get("pretrained_cfg")
    return sorted(set(cfg) - TIMM_PRETRAINED_FIELDS) if isinstance(cfg, Mapping) else []


def timm_model_name(config: Mapping[str, Any]) -> str | None:
    """The timm model name ``timm.create_model("local-dir:..." / "hf-hub:...")`` loads this folder as, or None.

    :func:`timm_architecture` says whether timm has the architecture; timm also needs a
    ``pretrained_cfg`` of its own fields only (format_version 1 keeps cl-zoo's there, and timm's
    PretrainedCfg refuses them) and a single ``model.safetensors`` (timm reads no shard index).
    """
    arch = timm_architecture(config)
    if arch is None or int(config.get("format_version") or 1) < 2 or _timm_refused_keys(config):
        return None
    files = config.get("files")
    if files and set(files) != {"model.safetensors"}:
        return None
    return arch


def timm_refusal(config: Mapping[str, Any]) -> str:
    """One sentence on why timm cannot load the checkpoint (for a card whose folder timm cannot load)."""
    arch = str(config.get("architecture"))
    resave = "`cl_zoo.save_pretrained(cl_zoo.load_pretrained(folder), new_folder)` writes a copy timm loads"
    if arch.startswith("cmc_"):
        why = f"`{arch}` is CMC's pair of encoders (one on L, one on ab, features concatenated), not a timm architecture"
    elif arch.endswith("_cifar") and arch[: -len("_cifar")] in TIMM_RESNETS:
        why = f"`{arch}` has a 3x3 stride-1 stem without max-pool, which timm's `{arch[: -len('_cifar')]}` does not"
    elif arch in TIMM_RESNETS and config.get("model_args"):
        why = f"`{arch}` was built with `{dict(config['model_args'])}`, which timm's `{arch}` does not take"
    elif arch in TIMM_RESNETS and int(config.get("format_version") or 1) < 2:
        why = f"its config.json is format_version 1, whose pretrained_cfg holds cl-zoo's fields, which timm refuses; {resave}"
    elif arch in TIMM_RESNETS and (refused := _timm_refused_keys(config)):
        why = f"its config.json's pretrained_cfg has keys timm refuses ({', '.join(refused)}); {resave}"
    elif arch in TIMM_RESNETS:
        why = "its weights are sharded and timm reads a single `model.safetensors`"
    else:
        why = f"`{arch}` is not a timm architecture"
    return f"timm cannot load this checkpoint: {why}."


def front_matter(config: Mapping[str, Any]) -> dict[str, Any]:
    """The card's YAML front matter (see :func:`library_name` for why timm or cl-zoo)."""
    cfg = merged_pretrained_cfg(config)
    method = str(config.get("method") or cfg.get("method") or "").lower()
    tags = {"cl-zoo", "self-supervised", "contrastive-learning", "image-feature-extraction", method}
    if timm_model_name(config):
        tags.add("timm")
    if paper := PAPERS.get(method):
        tags.add(f"arxiv:{paper.arxiv}")  # the Hub links the card to the paper's page
    meta: dict[str, Any] = {
        "library_name": library_name(config),
        "license": cfg.get("license") or "apache-2.0",
        "tags": sorted(tags - {""}),
        "pipeline_tag": "image-feature-extraction",
    }
    if dataset := hub_dataset_id(training_dataset(config)):
        meta["datasets"] = [dataset]
    mirror = config.get("mirror")
    if isinstance(mirror, Mapping) and isinstance(mirror.get("base_model"), str) and mirror["base_model"].strip():
        meta["base_model"] = mirror["base_model"].strip()
    if index := model_index(config):
        meta["model-index"] = index
    return meta


def front_matter_yaml(config: Mapping[str, Any]) -> str:
    """:func:`front_matter` as huggingface_hub writes it (``ModelCardData.to_yaml``), after its own
    checks: a model-index it cannot parse back into evaluation results raises here, not on the Hub."""
    from huggingface_hub import ModelCardData  # heavy import, made only when a card is rendered

    meta = front_matter(config)
    for entry in meta.get("model-index", []):
        entry["name"] = str(entry.get("name"))  # ModelCardData wants a model name with eval results
    return ModelCardData(**meta).to_yaml()


# ------------------------------------------------------------------------------------- escaping
# Values that reach a card from a file (a checkpoint's keys and names, a dataset's folder name, a
# config's notes) are somebody else's text. In Markdown a line break is all it takes to open a
# heading (a new "## How to load" section, which `cl-zoo publish` would read as the usage block) or
# a code fence that swallows the rest of the card, so every such value is made one line first.
_LINE_BREAKS = re.compile(r"[\r\n\u0085\u2028\u2029\x0b\x0c]+")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f\x1b]")


def inline_text(value: object, limit: int = 300) -> str:
    """``value`` as plain text that stays on one line of Markdown: line breaks become spaces,
    control characters (terminal escapes) go, HTML cannot open a tag or a comment, and a table
    cell cannot be split. Truncated to ``limit`` characters."""
    text = _CONTROL.sub("", _LINE_BREAKS.sub(" ", str(value)))
    text = text.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def inline_code(value: object, limit: int = 300) -> str:
    """``value`` as one Markdown code span: one line, delimited by more backticks than it holds, so
    nothing in it is interpreted. Truncated to ``limit`` characters."""
    text = _CONTROL.sub("", _LINE_BREAKS.sub(" ", str(value)))
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def code_block(text: str, language: str = "") -> str:
    """``text`` in a fenced block whose fence is longer than any backtick run inside it, so no
    line of ``text`` can close it early."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text}\n{fence}"


_SETEXT_UNDERLINE = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")


def contained_section(body: str) -> str:
    """A section body passed in by whoever wrote the folder, unable to leave its section: lines
    that would be headings outside code fences are escaped, and a fence left open is closed."""
    out: list[str] = []
    fences = FenceTracker()
    for line in _CONTROL.sub("", body.replace("\r\n", "\n").replace("\r", "\n")).split("\n"):
        line = _LINE_BREAKS.sub(" ", line)
        outside = fences.feed(line) == "outside"
        # "#" opens a heading; so does a "---"/"===" line under text (a setext heading): both escaped.
        if outside and (line.lstrip(" ").startswith("#") or (_SETEXT_UNDERLINE.match(line) and out and out[-1].strip())):
            line = "\\" + line.lstrip(" ")
        out.append(line)
    if fences.fence is not None:
        out.append(fences.fence)
    return "\n".join(out)


def registered_name_of(config: Mapping[str, Any]) -> str | None:
    """The registered pretrained name whose pinned weights are exactly this folder's, else None.

    A fine-tuned copy saved from a registered model keeps its ``model_name``; only the sha256 pins
    tell whether ``create_model(name, pretrained=True)`` would give back *these* weights.
    """
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
    hub_id = merged_pretrained_cfg(config).get("hf_hub_id")
    if hub_id:
        return f"hf-hub:{hub_id}"
    return str(config.get("model_name") or config.get("architecture"))


def timm_source(config: Mapping[str, Any], source: str, folder: str | os.PathLike[str] | None = None) -> str | None:
    """What ``timm.create_model`` should be given to load what ``source`` names, or None if no such name is known.

    A Hub source is timm's too; a folder is ``local-dir:<folder>`` (``cl-zoo publish`` rewrites it to the
    repo, as it does cl-zoo's call). A registered name is cl-zoo's alone: timm gets the Hub repo the
    registry records for it (never a bundled folder's path, which is only valid on this machine).
    """
    if source.startswith("hf-hub:"):
        return source
    if registered_name_of(config) == source:
        cfg = merged_pretrained_cfg(config)
        if cfg.get("hf_hub_id"):
            return f"hf-hub:{cfg['hf_hub_id']}" + (f"@{cfg['revision']}" if cfg.get("revision") else "")
        return None
    if os.path.isabs(source):
        return f"local-dir:{source}"
    if folder is not None:
        return f"local-dir:{Path(folder).expanduser().resolve()}"
    return None


# The photo timm's own model cards push through their preprocessing ("Model Usage" on e.g.
# https://huggingface.co/timm/fastvit_t8.apple_in1k: ``img = Image.open(urlopen('<this URL>'))``), so
# a card's snippet shows the real path from an image file to features, not a random tensor.
# ``check_usage`` serves it from a local file when it runs a card's snippet (offline, no network).

_OPEN_IMAGE = (
    f"image = Image.open(urlopen(\n    {SAMPLE_IMAGE_URL!r}\n)).convert('RGB')  # or Image.open('photo.jpg').convert('RGB')\n"
)

# One line for every card whatever its calls name (a card written for a folder is retargeted to its
# Hub repo on upload, not re-rendered, so the line must hold for both); the timm clause only where
# the card shows timm's block.
OFFLINE_NOTE = (
    "Offline, open a local photo instead of the sample URL; an `hf-hub:` checkpoint loads from the Hugging Face "
    "cache once an earlier run with network access has downloaded it (`HF_HUB_OFFLINE=1` then skips the network)."
)
TIMM_OFFLINE_NOTE = (
    " timm's `hf-hub:` load needs that earlier download too: without it, it ends in huggingface_hub's own "
    "traceback after retrying the Hub."
)


def _timm_text(config: Mapping[str, Any], source: str, folder: str | os.PathLike[str] | None) -> str:
    """The timm part of "How to load": a block when timm can load the checkpoint, else one line saying why not."""
    arch = timm_model_name(config)
    if arch is None:
        return timm_refusal(config)
    same = (f"timm builds the same network as cl-zoo: config.json's `num_classes: 0` makes timm build `{arch}` "
            "without its classifier, and it loads the same weights. Its transform reads the same mean, std, input size "
            "and crop_pct from config.json; its resize rounds a few pixels one 8-bit level apart from cl-zoo's, so "
            "features of the same photo can differ in the third decimal.")
    target = timm_source(config, source, folder)
    if target is None:
        return (f"With timm, from a download of this checkpoint's folder: "
                f"`timm.create_model('local-dir:path/to/folder', pretrained=True).eval()`. {same}")
    block = (
        "```python\nfrom urllib.request import urlopen\n\nimport timm\nimport torch\nfrom PIL import Image\n\n"
        f"model = timm.create_model({target!r}, pretrained=True).eval()\n"
        "config = timm.data.resolve_model_data_config(model)\n"
        "transform = timm.data.create_transform(**config, is_training=False)\n"
        f"{_OPEN_IMAGE}"
        "with torch.no_grad():\n"
        f"    features = model(transform(image).unsqueeze(0))  # [1, {inline_text(config.get('num_features'), 20)}], as with cl-zoo\n```"
    )
    return f"With timm (`pip install timm`):\n\n{block}\n\n{same}"


def how_to_load(config: Mapping[str, Any], source: str, folder: str | os.PathLike[str] | None = None) -> str:
    """The "How to load" section for ``source``: cl-zoo's Python block (it runs as written: publish
    checks), timm's block or why timm cannot load it, the command line and torch.hub."""
    cfg = merged_pretrained_cfg(config)
    size = list(cfg.get("input_size") or [3, 224, 224])
    if registered_name_of(config) == source:
        load = f"model = cl_zoo.create_model({source!r}, pretrained=True)  # same as cl_zoo.load_pretrained({source!r})"
    else:
        load = f"model = cl_zoo.load_pretrained({source!r})"
    if registered_name_of(config) == source:  # hubconf has every registered name as an entry point
        hub_call = f"torch.hub.load('path/to/cl-zoo', {source!r}, source='local')"
    else:
        hub_call = f"torch.hub.load('path/to/cl-zoo', 'load_pretrained', {source!r}, source='local')"
    python = (
        "```python\nfrom urllib.request import urlopen\n\nimport torch\nfrom PIL import Image\n\nimport cl_zoo\n\n"
        f"{load}\n"
        "transform = cl_zoo.create_transform(model)  # this checkpoint's preprocessing, as described below\n"
        f"{_OPEN_IMAGE}"
        "with torch.no_grad():\n"
        f"    features = model(transform(image).unsqueeze(0))  # [1, {inline_text(config.get('num_features'), 20)}] pooled features\n```"
    )
    return (
        f"{python}\n\n"
        f"{_timm_text(config, source, folder)}\n\n"
        + code_block(f"cl-zoo embed images/ --model {shlex.quote(source)} --out out/embeddings.npy", "bash") + "\n\n"
        f"From a cl-zoo checkout with torch.hub: {inline_code(hub_call, 600)}.\n\n"
        f"Preprocessing: resize the shorter side to {int(round(size[-1] / (cfg.get('crop_pct') or 1.0)))} "
        f"({cfg.get('interpolation') or 'bilinear'}), centre-crop {size[-2]}x{size[-1]}, normalise with mean "
        f"{list(cfg.get('mean') or [])} and std {list(cfg.get('std') or [])}.\n\n"
        f"{OFFLINE_NOTE}{TIMM_OFFLINE_NOTE if timm_model_name(config) else ''}"
    )


def training_data_text(config: Mapping[str, Any]) -> tuple[str, str]:
    """(the "on ..." phrase of the description, a sentence on the data) from config's ``training_data``."""
    cfg = merged_pretrained_cfg(config)
    data = _training_record(config)
    if not data:
        return (f" on {inline_text(cfg['dataset'], 100)}" if cfg.get("dataset") else ""), ""
    split, recipe_dataset = data.get("split"), data.get("dataset")
    split = inline_text(split, 40) if split else split
    if named := training_dataset(config):  # a named dataset: "50,000 images of cifar10 train (`cifar10-jpeg`)"
        what = f"{inline_text(named, 100)}{' ' + split if split else ''}"
        if (folder := _source_name(data["source"])) != named:
            what += f" ({inline_code(folder, 200)})"
    elif like := _named_like(data):  # named like a dataset, but not its published split: "40 images of cifar10 train (...)"
        published = dict(like.split_images).get(str(data.get("split")))
        what = (f"{like.name}{' ' + split if split else ''} ({inline_code(training_data_name(config), 200)}"
                + (f"; the published split has {published:,}" if published else "") + ")")
    else:  # the folder's own name (never the user's full path), and what the recipe was written for
        notes = [f"{split} split" if split else "",
                 f"not {inline_text(recipe_dataset, 100)}, which its recipe was written for" if recipe_dataset else ""]
        what = inline_code(training_data_name(config), 200) + (f" ({'; '.join(n for n in notes if n)})" if any(notes) else "")
    phrase = f" on {int(data['images']):,} images of {what}"
    held = int(data["images"]) - int(data.get("trained_images") or data["images"])
    sentence = (
        f"Training data fingerprint: {inline_code(data.get('fingerprint'), 100)} (sha256 over the images' relative paths and sizes)"
        + (f"; {held:,} of the images were held out for the kNN monitor" if held > 0 else "")
        + ("" if data.get("labeled", True) else "; the images had no labels")
        + "."
    )
    return phrase, sentence


def card_title(config: Mapping[str, Any]) -> str:
    """The card's title: the model's name, and when that is only its architecture (a pretraining
    run's export), the method and the data too, so the title says which checkpoint this is."""
    name = config.get("model_name") or config.get("architecture")
    method = str(config.get("method") or merged_pretrained_cfg(config).get("method") or "")
    data = _training_record(config)
    if name != config.get("architecture") or not data:
        return inline_text(name, 200)
    trained = training_dataset(config) or training_data_name(config)
    return inline_text(f"{name} pretrained with {method.upper() or 'cl-zoo'} on {int(data['images']):,} images of {trained}", 300)


def citation_text(method: str) -> str:
    """The Citation section: the method's paper with its arXiv link, and its BibTeX."""
    paper = PAPERS.get(method)
    if paper is None:
        return "Cite cl-zoo and the method's paper."
    return (f"{paper.citation}, [arXiv:{paper.arxiv}](https://arxiv.org/abs/{paper.arxiv}).\n\n"
            + code_block(paper.bibtex, "bibtex"))


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
    cfg = merged_pretrained_cfg(config)
    name = config.get("model_name") or config.get("architecture")
    method = (config.get("method") or cfg.get("method") or "").lower()
    paper = PAPERS[method].citation if method in PAPERS else ""
    source = source or load_source(config, folder)
    metrics = config.get("metrics") or cfg.get("metrics") or {}
    recipe = config.get("recipe") or {}
    data_phrase, data_sentence = training_data_text(config)

    body: dict[str, str] = {}
    num_params = config.get("num_params", 0)
    num_params = num_params if isinstance(num_params, (int, float)) and not isinstance(num_params, bool) else 0
    epochs = cfg.get("epochs")
    body["Description"] = (
        f"{inline_code(name)} is a {inline_code(config.get('architecture'))} backbone ({num_params / 1e6:.2f}M parameters, "
        f"{inline_text(config.get('num_features'), 20)}-d pooled features)"
        + (f" pretrained with **{inline_text(method.upper(), 40)}**" if method else "")
        + (f" ({paper})" if paper else "")
        + (f" for {inline_text(epochs, 20)} epoch{'s' if epochs != 1 else ''}" if epochs else "")
        + data_phrase
        + ". It is a feature extractor: the projection head and momentum encoder used in pretraining are not included."
        + (f"\n\n{data_sentence}" if data_sentence else "")
        + (f"\n\n{inline_text(cfg['notes'], 4000)}" if cfg.get("notes") else "")
    )
    body["How to load"] = how_to_load(config, source, folder)
    if recipe:
        body["Training recipe"] = code_block(yaml.safe_dump(dict(recipe), sort_keys=True).rstrip(), "yaml")
    else:
        body["Training recipe"] = "Not recorded for this checkpoint."
    if metrics:
        rows = []
        for key, value in sorted(metrics.items()):
            info = describe_metric(key, config)
            shown = f"{value:.4g}" if isinstance(value, (int, float)) else inline_text(value, 40)
            rows.append(f"| {inline_text(key, 120)} | {shown} | {inline_text(info.name) if info else ''} |")
        body["Evaluation"] = "| metric | value | measured as |\n|---|---|---|\n" + "\n".join(rows)
    else:
        body["Evaluation"] = "No evaluation recorded yet (`cl-zoo knn` / `cl-zoo linear-eval`, then `cl-zoo card-update`)."
    body["Citation"] = citation_text(method)
    for key, text in sections.items():
        body[inline_text(key, 100)] = contained_section(text)

    order = [k for k in GENERATED_SECTIONS if k != "Citation"]
    order += [k for k in body if k not in order and k != "Citation"] + ["Citation"]
    parts = ["---", front_matter_yaml(config).rstrip(), "---", "", f"# {card_title(config)}", ""]
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
    fences = FenceTracker()
    for line in text.splitlines():
        if fences.feed(line) == "outside" and line.startswith("## "):
            title = line[3:].strip()
            current = None if title in GENERATED_SECTIONS else sections.setdefault(title, [])
            continue
        if current is not None:
            current.append(line)
    return {title: "\n".join(lines).strip() for title, lines in sections.items()}


# rerender_card reads a folder (cl_zoo.checkpoint.folder, which imports this module to render cards)
# and so lives there; the old import path still works, with a DeprecationWarning.
__getattr__, __dir__ = retired_exports(globals())
