"""``cl-zoo search`` and ``cl-zoo dedup`` over a file written by ``cl-zoo embed``."""

from __future__ import annotations

import json

import click

from cl_zoo.errors import ClZooError, DataError


@click.command("search")
@click.argument("embeddings", type=click.Path(dir_okay=False))
@click.option("-q", "--query", "queries", multiple=True, required=True, help="Query image, folder or list of paths (repeatable).")
@click.option("-k", default=10, show_default=True, type=click.IntRange(min=1), help="Neighbours per query.")
@click.option("--index", "kind", default="flat", show_default=True, type=click.Choice(["flat", "ivf", "hnsw"]))
@click.option("--nlist", default=None, type=click.IntRange(min=1), help="IVF lists (default ~4*sqrt(N)).")
@click.option("--nprobe", default=None, type=click.IntRange(min=1), help="IVF lists visited per query (default 16).")
@click.option("--save-index", default=None, type=click.Path(dir_okay=False), help="Write the built index here for reuse.")
@click.option("--load-index", default=None, type=click.Path(dir_okay=False), help="Reuse an index written by --save-index.")
@click.option("-m", "--model", default=None, help="Model for the queries (default: the one recorded with the embeddings).")
@click.option("--device", default="auto", show_default=True)
@click.option("-j", "--workers", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def search_command(
    embeddings: str,
    queries: tuple[str, ...],
    k: int,
    kind: str,
    nlist: int | None,
    nprobe: int | None,
    save_index: str | None,
    load_index: str | None,
    model: str | None,
    device: str,
    workers: int,
    as_json: bool,
) -> int:
    """Nearest neighbours (cosine similarity) of query images among saved EMBEDDINGS."""
    from cl_zoo import search as S
    from cl_zoo.data.images import discover_images
    from cl_zoo.embedding import extract_features, load_embedding_model, load_embeddings

    features, paths, meta = load_embeddings(embeddings)
    spec = model or meta.get("model")
    if not spec:
        raise ClZooError(f"{embeddings} does not record its model; pass --model")
    query_files = discover_images(queries)
    net = load_embedding_model(spec)
    result = extract_features(net, query_files, batch_size=32, device=device, workers=workers)
    for path, reason in result.failures:
        click.echo(f"warning: skipped query {path}: {reason}", err=True)
    if not result.paths:
        raise DataError("none of the query images could be read")
    if result.features.shape[1] != features.shape[1]:
        raise DataError(
            f"model {spec} gives {result.features.shape[1]}-d features but {embeddings} holds "
            f"{features.shape[1]}-d ones; pass the --model that made them"
        )
    if load_index:
        index = S.load_index(load_index, count=len(paths), dims=features.shape[1])
    else:
        index = S.build_index(features, kind, nlist=nlist, nprobe=nprobe)
    if save_index:
        S.save_index(index, save_index)
    scores, ids = S.search(index, result.features, k)
    report = [
        {
            "query": q,
            "results": [{"path": paths[i], "score": round(float(s), 6)} for s, i in zip(row_s, row_i) if i >= 0],
        }
        for q, row_s, row_i in zip(result.paths, scores, ids)
    ]
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        for entry in report:
            click.echo(entry["query"])
            for hit in entry["results"]:
                click.echo(f"  {hit['score']:.4f}  {hit['path']}")
    return 0


@click.command("dedup")
@click.argument("embeddings", type=click.Path(dir_okay=False))
@click.option("-t", "--threshold", default=0.95, show_default=True, type=float, help="Cosine similarity that makes two images duplicates.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def dedup_command(embeddings: str, threshold: float, as_json: bool) -> int:
    """List groups of near-duplicate images in saved EMBEDDINGS (exact search, transitive groups)."""
    from cl_zoo.embedding import load_embeddings
    from cl_zoo.search import dedup_groups

    features, paths, _ = load_embeddings(embeddings)
    groups = dedup_groups(features, threshold)
    if as_json:
        click.echo(json.dumps([[paths[i] for i in g] for g in groups], indent=1))
    else:
        for n, group in enumerate(groups, 1):
            click.echo(f"group {n} ({len(group)} images)")
            for i in group:
                click.echo(f"  {paths[i]}")
        dupes = sum(len(g) - 1 for g in groups)
        click.echo(f"{len(groups)} groups, {dupes} redundant images of {len(paths)} (threshold {threshold})", err=True)
    return 0


__all__ = ["search_command", "dedup_command"]
