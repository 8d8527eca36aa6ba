"""Which model made a set of embeddings, recorded so that it can be opened again from anywhere."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import torch.nn as nn

from cl_zoo import __version__
from cl_zoo.arrays import recorded_threshold
from cl_zoo import factory
from cl_zoo.data.images import is_url
from cl_zoo.registry import DEFAULT_MODEL


def load_embedding_model(model: str | os.PathLike[str] | nn.Module | None) -> nn.Module:
    """``load_model`` with the zoo's bundled default for ``None``."""
    return factory.load_model(DEFAULT_MODEL if model is None else model)  # through the module: tests patch it there



def model_reference(spec: str | os.PathLike[str] | None) -> str:
    """``spec`` as a reference that still works from another folder.

    A checkpoint folder or file on disk becomes an absolute path (``runs/x/model`` is meaningless
    to ``cl-zoo search`` run elsewhere); registered names and ``hf-hub:`` ids stay as they are.
    Paths are checked first, as :func:`cl_zoo.factory.load_pretrained` does.
    """
    if spec is None:
        return ""
    text = os.fspath(spec)
    return os.path.abspath(text) if text and os.path.exists(text) else text


def resolve_model_reference(meta: dict[str, str], embeddings: str | os.PathLike[str]) -> str:
    """The model recorded with a set of embeddings, as something :func:`load_embedding_model` opens.

    New files record absolute references. Files written before that may hold a path relative to
    wherever ``embed`` ran; it is tried from here, then beside the embeddings file, and failing
    both the absolute folder the model was loaded from (``source``) is used when it still exists.
    """
    spec = str(meta.get("model") or "")
    if not spec or os.path.isabs(spec) or os.path.exists(spec) or spec.startswith("hf-hub:"):
        return spec
    beside = Path(embeddings).resolve().parent / spec
    if beside.exists():
        return str(beside)
    source = str(meta.get("source") or "")
    if os.path.isabs(source) and os.path.exists(source):
        return source
    return spec


def model_metadata(model: nn.Module, spec: str | None) -> dict[str, str]:
    """What produced a set of embeddings, so they can be queried with the same model later.

    ``dedup_threshold`` is the model's calibrated near-duplicate similarity (see
    :mod:`cl_zoo.index.dedup_calibration`) when its config records one; ``cl-zoo dedup`` defaults to it.
    """
    source = str(getattr(model, "checkpoint_source", "") or "")
    revision = source.rpartition("@")[2] if source.startswith("hf-hub:") and "@" in source else ""
    files = (getattr(model, "checkpoint_config", None) or {}).get("files") or {}
    if not revision and files:
        revision = "sha256:" + str(files[sorted(files)[0]])
    if source and os.path.exists(source):
        source = os.path.abspath(source)
    meta = {
        "model": model_reference(spec),
        "model_name": str(getattr(model, "model_name", "") or type(model).__name__),
        "source": source,
        "revision": revision,
        "cl_zoo_version": __version__,
    }
    threshold = recorded_threshold(getattr(model, "checkpoint_config", None))
    if threshold is not None:
        meta["dedup_threshold"] = str(threshold)
    return meta


def input_metadata(given: Sequence[str | os.PathLike[str]]) -> dict[str, str]:
    """The inputs of a run as typed and as absolute paths (JSON lists), beside absolute row paths."""
    typed = [os.fspath(g) for g in given]
    return {"inputs": json.dumps(typed), "input_roots": json.dumps([g if is_url(g) else os.path.abspath(g) for g in typed])}
