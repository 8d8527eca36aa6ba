"""``cl-zoo search`` and ``cl-zoo dedup`` over what ``cl-zoo embed`` wrote: a file or a shard folder.

Without a saved index both read the whole matrix (exact search needs every vector in memory).
With ``--index-file`` they read only what the index cannot answer: ``search`` the row paths and
the metadata naming the model (never the features), ``dedup`` the features one block at a time
(:func:`cl_zoo.index.source.open_rows`), so a shard folder larger than memory can be searched and
deduplicated through its index.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from cl_zoo.errors import ClZooError, DataError
from cl_zoo.validation import check_number

if TYPE_CHECKING:
    import numpy as np


class SearchCommand(click.Command):
    """``search``, refusing the old ``-q PATH`` spelling of ``--query`` in one line.

    ``-q`` is ``--quiet`` in every command now; before, it was ``--query`` here, so a script's
    ``search EMB -q photo.jpg`` would otherwise end in click's "unexpected extra argument".
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        has_query = any(a == "--query" or a.startswith("--query=") for a in args)
        for flag, following in zip(args, args[1:]):
            if flag == "-q" and not following.startswith("-") and not has_query:
                raise ClZooError(f"-q means --quiet in every cl-zoo command; give query images with --query (--query {following})")
        return super().parse_args(ctx, args)


def _refuse_saving_over_inputs(save_index: str, embeddings: str, load_index: str | None, queries: tuple[str, ...]) -> None:
    """One line when ``--save-index`` names a file the search reads: the embeddings, their sidecars, a
    file of their folder, the index it loads or a query (it used to replace them and exit 0)."""
    from cl_zoo.embedding.files import embedding_files
    from cl_zoo.fileio import input_files, refuse_inputs_as_outputs

    refuse_inputs_as_outputs([save_index], input_files(*embedding_files(embeddings), load_index, *queries))


@click.command("search", cls=SearchCommand)
@click.argument("embeddings", type=click.Path())
@click.option("--query", "queries", multiple=True, required=True,
              help="Query image, folder or list of paths (repeatable; -q was its short form before it meant --quiet).")
@click.option("-k", default=10, show_default=True, type=click.IntRange(min=1), help="Neighbours per query.")
@click.option("--index", "kind", default="flat", show_default=True, type=click.Choice(["flat", "ivf", "hnsw"]),
              help="Index built over the embeddings when no --index-file is given: flat is exact.")
@click.option("--nlist", default=None, type=click.IntRange(min=1), help="IVF lists (default ~4*sqrt(N)).")
@click.option("--nprobe", default=None, type=click.IntRange(min=1), help="IVF lists visited per query (default 16).")
@click.option("--save-index", default=None, type=click.Path(), help="Write the built index here for reuse (checked before anything is read).")
@click.option("--index-file", "--load-index", "load_index", default=None, type=click.Path(dir_okay=False),
              help="Reuse an index written by cl-zoo index (with its tuned search parameters) or by --save-index.")
@click.option("-m", "--model", default=None, help="Model for the queries (default: the one recorded with the embeddings).")
@click.option("--device", default="auto", show_default=True, help="Device that embeds the queries: auto, cpu, cuda or cuda:N.")
@click.option("-j", "--workers", default=0, show_default=True, type=click.IntRange(min=0), help="Decoding processes for the query images (0: in this process).")
@click.option("-q", "--quiet", is_flag=True, help="Quiet: no notes on stderr; results, warnings and errors still print.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--plot", default=None, type=click.Path(),
              help="Also draw a PNG grid: a row per query (first 8), the query then its neighbours with their cosine scores.")
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
    plot: str | None = None,
    quiet: bool = False,
) -> int:
    """Nearest neighbours (cosine similarity) of query images among saved EMBEDDINGS.

    EMBEDDINGS is a .npy or .parquet written by cl-zoo embed, or the folder a cl-zoo embed
    --out DIR/ run wrote (checked against its manifest). With --index-file the embeddings' row
    paths are read, not their features.
    """
    if save_index:  # before faiss and the embedding code are imported (seconds), long before a model loads
        from cl_zoo.fileio import check_output_path

        check_output_path(save_index, option="--save-index")
        _refuse_saving_over_inputs(save_index, embeddings, load_index, queries)
    from cl_zoo.index import search as S
    from cl_zoo.data.images import discover_images
    from cl_zoo.embedding import extract_features, load_embedding_model, load_embeddings, resolve_model_reference

    S.require_faiss("cl-zoo search")  # before the embeddings are read and the queries embedded
    from cl_zoo.eval import grids

    grids.check_plot_option(plot, "cl-zoo search --plot")
    features = None
    if load_index:  # the index answers; only row paths and the model are needed from the embeddings
        from cl_zoo.index import load_saved_index
        from cl_zoo.index import open_rows

        saved = open_rows(embeddings)
        paths, meta, dims = saved.paths, saved.metadata, saved.dims
        index, _ = load_saved_index(load_index, embeddings, count=saved.rows, dims=dims, source=saved.source)
    else:
        features, paths, meta = load_embeddings(embeddings)
        dims = int(features.shape[1])
    refuse_no_rows(embeddings, len(paths), "search")
    spec = model or resolve_model_reference(meta, embeddings)
    if not spec:
        raise ClZooError(f"{embeddings} does not record its model; pass --model")
    query_files = discover_images(queries)
    if query_files.repeats and not quiet:
        click.echo(f"skipped {query_files.repeats} linked query folder{'s' if query_files.repeats != 1 else ''} already walked (symlink repeats or loops)", err=True)
    net = load_embedding_model(spec)
    result = extract_features(net, query_files, batch_size=32, device=device, workers=workers)
    for path, reason in result.failures:
        click.echo(f"warning: skipped query {shown(path)}: {reason}", err=True)
    if not result.paths:
        raise DataError("none of the query images could be read")
    if result.features.shape[1] != dims:
        raise DataError(
            f"model {spec} gives {result.features.shape[1]}-d features but {embeddings} holds "
            f"{dims}-d ones; pass the --model that made them"
        )
    if features is not None:
        index = S.build_index(features, kind, nlist=nlist, nprobe=nprobe)
    if save_index:
        from cl_zoo.fileio import refuse_inputs_as_outputs

        refuse_inputs_as_outputs([save_index], query_files)  # a query found inside a queried folder
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
            click.echo(shown(entry["query"]))
            for hit in entry["results"]:
                click.echo(f"  {hit['score']:.4f}  {shown(hit['path'])}")
    if plot:
        grids.plot_neighbours(report, plot, title=f"nearest neighbours by cosine similarity ({grids.short_name(spec, 48)})")
        drawn = min(len(report), grids.MAX_ROWS)
        if not quiet:
            click.echo(f"wrote {shown(plot)}: {drawn} of {len(report)} queries, "
                       f"up to {min(k, grids.MAX_COLUMNS - 1)} neighbours each", err=True)
    return 0


@click.command("dedup")
@click.argument("embeddings", type=click.Path())
@click.option(
    "-t", "--threshold", default=None, type=float,
    help="Cosine similarity that makes two images duplicates (default: the model's calibrated threshold, else 0.99).",
)
@click.option("--show-scores", "-v", "--verbose", "show_scores", is_flag=True,
              help="Verbose: also print a histogram of each image's best similarity to another image.")
@click.option("-q", "--quiet", is_flag=True, help="Quiet: no notes on stderr (the threshold's origin, the index used); results, warnings and errors still print.")
@click.option("--index-file", default=None, type=click.Path(dir_okay=False),
              help="Find pairs through an index written by cl-zoo index instead of comparing all pairs (approximate: it may miss pairs).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--plot", default=None, type=click.Path(),
              help="Also draw a PNG grid: a row per group (first 8), each image's cosine similarity to the group's first.")
def dedup_command(embeddings: str, threshold: float | None, show_scores: bool, index_file: str | None, as_json: bool,
                  plot: str | None = None, quiet: bool = False) -> int:
    """List groups of near-duplicate images in saved EMBEDDINGS (transitive groups).

    Without --index-file every pair is compared (exact). With it, each image's candidates come
    from the saved index and are kept only if their exact cosine reaches the threshold: no
    reported pair is below it, but pairs the index does not return are missed, so groups may be
    split or incomplete (the recall printed by cl-zoo index says how often neighbours are found).
    With it the features are read a block at a time (a .parquet is read whole), so the matrix
    need not fit in memory.

    EMBEDDINGS is a .npy or .parquet written by cl-zoo embed, or the folder a cl-zoo embed
    --out DIR/ run wrote (checked against its manifest).
    """
    if threshold is not None:  # before faiss and the embeddings are read
        check_number("--threshold (a cosine similarity)", threshold, low=-1, high=1)
    from cl_zoo.embedding import load_embeddings
    from cl_zoo.index.search import dedup_groups, dedup_threshold_for, groups_from_pairs, nearest_neighbour_scores, require_faiss

    require_faiss("cl-zoo dedup")  # before the embeddings are read
    from cl_zoo.eval import grids

    grids.check_plot_option(plot, "cl-zoo dedup --plot")
    saved = None
    if index_file:  # rows come block by block from disk; only the paths are held
        from cl_zoo.index import open_rows

        saved = open_rows(embeddings)
        paths, meta = saved.paths, saved.metadata
        rows = saved.source if saved.source is not None else load_embeddings(embeddings)[0]
    else:
        features, paths, meta = load_embeddings(embeddings)
    refuse_no_rows(embeddings, len(paths), "deduplicate")
    if threshold is None:
        threshold, origin = dedup_threshold_for(meta, embeddings)
        if not quiet:
            click.echo(f"threshold {threshold} ({origin}; set one with --threshold)", err=True)
    if saved is not None:
        from cl_zoo.index import index_nearest_neighbour_scores, index_similar_pairs, load_saved_index

        if not -1.0 <= threshold <= 1.0:
            raise ClZooError(f"threshold is a cosine similarity in [-1, 1], got {threshold}")
        index, _ = load_saved_index(index_file, embeddings, count=saved.rows, dims=saved.dims, source=saved.source)
        firsts, seconds, _ = index_similar_pairs(index, rows, threshold)
        groups = groups_from_pairs(saved.rows, firsts, seconds)
        if not quiet:
            click.echo(f"pairs found through {index_file} (approximate: pairs the index does not return are missed)", err=True)
    else:
        groups = dedup_groups(features, threshold)
    if show_scores:
        scores = index_nearest_neighbour_scores(index, rows) if saved is not None else nearest_neighbour_scores(features)
        for line in score_histogram(scores, threshold):
            click.echo(line, err=True)
    if as_json:
        click.echo(json.dumps([[paths[i] for i in g] for g in groups], indent=1))
    else:
        for n, group in enumerate(groups, 1):
            click.echo(f"group {n} ({len(group)} images)")
            for i in group:
                click.echo(f"  {shown(paths[i])}")
        dupes = sum(len(g) - 1 for g in groups)
        click.echo(f"{len(groups)} groups, {dupes} redundant images of {len(paths)} (threshold {threshold})", err=True)
    if plot and not groups:
        click.echo(f"no groups at threshold {threshold}: {shown(plot)} not written", err=True)
    elif plot:
        shown_groups = groups[: grids.MAX_ROWS]
        vectors = rows if saved is not None else features
        grids.plot_groups([[paths[i] for i in g] for g in shown_groups], [grids.similarity_to_first(vectors, g) for g in shown_groups],
                          plot, title=f"near-duplicate groups at cosine >= {threshold}\n(scores: cosine to the row's framed first image)")
        if not quiet:
            click.echo(f"wrote {shown(plot)}: {len(shown_groups)} of {len(groups)} groups", err=True)
    return 0


def refuse_no_rows(embeddings: str, rows: int, task: str) -> None:
    """One line for embeddings with no rows (an embed run that read no image): nothing to ``task``."""
    if rows == 0:
        raise DataError(f"{embeddings} holds no embeddings (0 rows); nothing to {task}")


def shown(path: str) -> str:
    """A result path on one line of text output (``--json`` output needs no such care)."""
    from cl_zoo.embedding import display_path

    return display_path(path)


def score_histogram(scores: np.ndarray, threshold: float, bins: int = 20, width: int = 40) -> list[str]:
    """Text histogram of nearest-neighbour similarities, the threshold's bin marked.

    Bins span the scores' own range (most collections sit between 0.8 and 1), so the gap between
    distinct images and copies, or its absence, is visible.
    """
    import numpy as np

    if len(scores) == 0:
        return ["nearest-neighbour similarity: fewer than 2 images"]
    lo, hi = float(scores.min()), float(scores.max())
    lo, hi = (lo, hi) if hi > lo else (lo - 0.005, hi + 0.005)
    counts, edges = np.histogram(scores, bins=bins, range=(lo, hi))
    peak = max(int(counts.max()), 1)
    lines = [f"nearest-neighbour similarity of {len(scores)} images (>= {threshold} is grouped):"]
    for count, left, right in zip(counts, edges[:-1], edges[1:]):
        mark = " <- threshold" if left <= threshold < right or (right == edges[-1] and threshold == right) else ""
        bar = "#" * int(round(width * count / peak))
        lines.append(f"  {left:.4f}-{right:.4f} {int(count):>7} {bar}{mark}")
    if threshold < lo:
        lines.append(f"  (threshold {threshold} is below every score: every image has a partner)")
    elif threshold > hi:
        lines.append(f"  (threshold {threshold} is above every score: nothing is grouped)")
    return lines


__all__ = ["search_command", "dedup_command", "refuse_no_rows", "score_histogram", "shown"]
