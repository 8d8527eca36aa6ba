"""``cl-zoo models`` and ``cl-zoo info``: what the registry holds.

Neither imports torch for the zoo's own models: parameter counts and feature sizes are declared in
the architecture table (:mod:`cl_zoo.models.archs`, checked against built models by the tests).
An architecture registered elsewhere, or built with other arguments, is built on the ``meta``
device: no memory is allocated and no weights are initialised.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import click

# All torch-free (tests/cli/test_cli_startup.py): the registry's tables, Hub and cache look-ups.
from cl_zoo.bundled import installed_folder
from cl_zoo.checkpoint.hub import find_bundled, registered_repo_id
from cl_zoo.convert.sources import cache_root
from cl_zoo.errors import ModelNotFoundError
from cl_zoo.models.releases import MIRRORS, RELEASES
from cl_zoo.registry import build_arch, find_arch, find_pretrained, get_arch, get_pretrained, is_timm_arch, list_models


@lru_cache(maxsize=None)
def _arch_stats(arch: str, kwargs_json: str) -> tuple[int, int]:
    """(parameter count, feature dimension) of an architecture: declared, or built without real memory."""
    entry = get_arch(arch)
    if kwargs_json == "{}" and entry.params is not None and entry.num_features is not None:
        return entry.params, entry.num_features
    import torch  # only for an architecture without declared sizes

    entry.builder  # noqa: B018 - import the family module outside the meta context (module-level tensors stay real)
    with torch.device("meta"):
        model = build_arch(arch, **json.loads(kwargs_json))
    return sum(p.numel() for p in model.parameters()), int(getattr(model, "num_features", 0))


def where_here(name: str) -> dict[str, str | None]:
    """Where a registered checkpoint would be loaded from on this machine, in the order
    :func:`cl_zoo.factory.load_registered` tries its sources, found without the network.

    ``where`` is one of ``wheel`` (bundled in the installed package), ``checkout`` (this source
    tree's model_cards/), ``CL_ZOO_MODEL_CARDS``, ``HF cache`` (already downloaded from the Hub),
    ``release cache`` (a third-party release already fetched and converted), ``download: Hub`` or
    ``download: publisher`` (needs the network on first use); ``path`` is the local folder if any.
    """
    cfg = get_pretrained(name).cfg
    if cfg.bundled and (folder := find_bundled(cfg.bundled)) is not None:
        wheel, env = installed_folder("model_cards"), os.environ.get("CL_ZOO_MODEL_CARDS")
        if env and folder.parent == Path(env):
            where = "CL_ZOO_MODEL_CARDS"
        else:
            where = "wheel" if wheel is not None and folder.parent == wheel else "checkout"
        return {"where": where, "path": str(folder)}
    repo_id = registered_repo_id(cfg)
    if repo_id is not None:
        from huggingface_hub import try_to_load_from_cache  # heavy import, only for a model the Hub serves

        try:
            cached = try_to_load_from_cache(repo_id, "config.json", revision=cfg.revision)
        except Exception:  # noqa: BLE001 - a malformed id or cache reads as "not cached"
            cached = None
        if isinstance(cached, str):
            return {"where": "HF cache", "path": str(Path(cached).parent)}
    if cfg.url and (cache_root() / name / "config.json").is_file():
        return {"where": "release cache", "path": str(cache_root() / name)}
    if repo_id is not None:
        return {"where": "download: Hub", "path": None}
    return {"where": "download: publisher" if cfg.url else "unavailable", "path": None}


def model_rows(pattern: str = "*", pretrained: bool = False) -> list[dict[str, Any]]:
    """One dict per registered name: the data behind the table and ``--json``."""
    rows = []
    names = list_models(pattern, pretrained=pretrained)
    if not pretrained and is_timm_arch(pattern) and find_arch(pattern) is not None:
        names.append(pattern)  # timm's names are resolved when named, never listed (there are over a thousand)
    for name in names:
        if (entry := find_pretrained(name)) is not None:
            arch, cfg, kwargs = entry.arch, entry.cfg, entry.model_kwargs
            kind = "pretrained"
        else:
            arch, cfg, kwargs = name, get_arch(name).default_cfg, {}
            kind = "architecture"
        params, features = _arch_stats(arch, json.dumps(kwargs, sort_keys=True))
        sources: list[dict[str, str | None]] = []  # in the order they are tried; releases add the page's words
        if kind == "pretrained":
            if cfg.bundled and (folder := find_bundled(cfg.bundled)) is not None:
                sources.append({"source": f"bundled: {folder}", "page": None})
            if (repo_id := registered_repo_id(cfg)) is not None:
                pinned = "sha256-pinned" if cfg.sha256 else "unpinned"
                sources.append({"source": f"hf-hub:{repo_id}" + (f"@{cfg.revision}" if cfg.revision else "")
                                + f" ({pinned})", "page": None})
            if name in RELEASES:  # a published release: each source with the page it was copied from
                sources += [{"source": s.describe(), "page": s.page, "quote": s.quote} for s in RELEASES[name].sources]
                if name in MIRRORS:  # a recorded mirror comes after the publisher's own sources
                    sources.append({"source": f"mirror hf-hub:{MIRRORS[name].repo_id} (sha256-pinned)", "page": None})
            elif cfg.url:
                sources.append({"source": cfg.url, "page": None})
        rows.append(
            {
                "name": name,
                "kind": kind,
                "method": cfg.method if kind == "pretrained" else None,
                "arch": arch,
                "dataset": cfg.dataset if kind == "pretrained" else None,
                "params": params,
                "num_features": features,
                "input_size": list(cfg.input_size),
                "metrics": dict(cfg.metrics) if kind == "pretrained" else {},
                "sources": sources,
                "here": where_here(name) if kind == "pretrained" else None,
            }
        )
    return rows


def _compact_metrics(metrics: dict[str, Any]) -> str:
    parts = []
    for key, value in sorted(metrics.items()):
        parts.append(f"{key}={value:.4g}" if isinstance(value, (int, float)) else f"{key}={value}")
    return " ".join(parts) or "-"


def _table(rows: list[dict[str, Any]]) -> str:
    header = ["name", "method", "arch", "dataset", "params(M)", "here", "metrics"]
    body = [
        [
            r["name"],
            r["method"] or "-",
            r["arch"],
            r["dataset"] or "-",
            f"{r['params'] / 1e6:.2f}",
            r["here"]["where"] if r["here"] else "-",
            _compact_metrics(r["metrics"]),
        ]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@click.command("models")
@click.argument("pattern", default="*")
@click.option("--pretrained", is_flag=True, help="Only pretrained checkpoints, not bare architectures.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of the table.")
def models_command(pattern: str, pretrained: bool, as_json: bool) -> int:
    """List registered models matching PATTERN (a glob, e.g. 'dcl_*' or '*resnet50*').

    The "here" column says where each checkpoint would load from on this machine, found without
    the network: wheel (bundled in the installed package), checkout (this source tree's
    model_cards/), CL_ZOO_MODEL_CARDS, HF cache, release cache (a fetched third-party release), or
    download: Hub / download: publisher (needs the network once)."""
    rows = model_rows(pattern, pretrained=pretrained)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return 0
    if not rows:  # (--json prints the empty list: a script asked which models match, and none does)
        where = " among pretrained entries" if pretrained else ""
        raise ModelNotFoundError(f"no model matches {pattern!r}{where}; cl-zoo models lists them all")
    click.echo(_table(rows))
    return 0


@click.command("info")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info_command(name: str, as_json: bool) -> None:
    """Show one registered model: architecture, size, preprocessing, provenance and sources."""
    entry = find_pretrained(name)
    # get_arch raises "unknown model ...; did you mean ..." over every registered name
    cfg = entry.cfg if entry is not None else get_arch(name).default_cfg
    row = next(r for r in model_rows(name) if r["name"] == name)
    info = {**row, "pretrained_cfg": cfg.to_dict()}
    if entry is not None:
        info["model_kwargs"] = dict(entry.model_kwargs)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"{name} ({row['kind']})")
    click.echo(f"  architecture : {row['arch']}")
    click.echo(f"  parameters   : {row['params']:,} ({row['params'] / 1e6:.2f}M)")
    click.echo(f"  features     : {row['num_features']}")
    click.echo(
        f"  input        : {tuple(cfg.input_size)}, resize {cfg.resize_size} ({cfg.interpolation}), "
        f"crop_pct {cfg.crop_pct}, mean {tuple(cfg.mean)}, std {tuple(cfg.std)}"
    )
    for key in ("method", "dataset", "epochs", "paper", "license", "notes"):
        if getattr(cfg, key):
            click.echo(f"  {key:<13}: {getattr(cfg, key)}")
    if row["metrics"]:
        click.echo(f"  metrics      : {_compact_metrics(row['metrics'])}")
    if row["kind"] == "pretrained":
        here = row["here"]
        click.echo(f"  loads from   : {here['where']}" + (f" ({here['path']})" if here["path"] else ""))
        if name in RELEASES:
            release = RELEASES[name]
            click.echo(f"  trained by   : {release.trained_by}")
            click.echo(f"  recipe       : {release.recipe}")
            click.echo(f"  licence from : {release.licence_page}")
        labels = [s["source"] + (f"\n                 copied from {s['page']}" if s["page"] else "")
                  for s in row["sources"]]
        click.echo("  sources      : " + ("\n" + " " * 15).join(f"{i}. {text}" for i, text in enumerate(labels, 1))
                   if labels else "  sources      : none available")
