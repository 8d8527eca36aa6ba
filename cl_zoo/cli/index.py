"""``cl-zoo index``: a faiss index over saved embeddings, built to a memory budget and saved for reuse."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cl_zoo.validation import MAX_SEED

if TYPE_CHECKING:
    from cl_zoo.index.source import EmbeddingSource


@click.command("index")
@click.argument("embeddings", type=click.Path())
@click.option("-o", "--out", required=True, type=click.Path(), help="Index file to write (its description goes to OUT.json beside it).")
@click.option("--max-memory", required=True, help="Most memory the index may take: 4G, 512M, 1.5GiB or bytes (binary units).")
@click.option("--sample", "sample", default=None, type=click.IntRange(min=1), help="Rows to train on (default: 40 per inverted list, at least 65,536, within a quarter of the budget).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, MAX_SEED), help="Seed of the training and evaluation samples.")
@click.option("--progress/--no-progress", default=None, help="Progress lines on stderr (default: on unless --quiet).")
@click.option("-q", "--quiet", is_flag=True, help="Quiet: no progress lines (as --no-progress); the summary, warnings and errors still print.")
@click.option("--json", "as_json", is_flag=True, help="Print the index description as JSON.")
def index_command(embeddings: str, out: str, max_memory: str, sample: int | None, seed: int, quiet: bool, as_json: bool,
                  progress: bool | None = None) -> int:
    """Build a faiss index over EMBEDDINGS that fits --max-memory, measure it, and save it.

    EMBEDDINGS is a .npy written by cl-zoo embed, the folder a cl-zoo embed --out DIR/ run
    wrote (checked against its manifest.json first: a missing, truncated, replaced or unlisted
    shard is refused before anything is built), or a folder of shards emb_00000.npy,
    emb_00001.npy, ... without a manifest (read in numeric order). Rows are read a block at a
    time, never all at once. The index type follows autofaiss's rule: Flat for under 1,000 vectors, an HNSW graph
    when vectors and graph fit, an inverted file over raw vectors up to 1M vectors, product
    quantization (OPQ + IVF + PQ) beyond or when raw vectors do not fit. Recall@10 against exact
    search and query latency are measured on 1,000 held-out rows, and search parameters are
    tuned for recall >= 0.9 where the index can reach it; cl-zoo search and cl-zoo dedup use them
    with --index-file.

    \b
    Examples:
      cl-zoo index runs/emb.npy --out runs/emb.faiss --max-memory 4G
      cl-zoo index runs/shards/ --out runs/shards.faiss --max-memory 512M --json
      cl-zoo search runs/emb.npy --index-file runs/emb.faiss --query photo.jpg
      cl-zoo dedup runs/shards/ --index-file runs/shards.faiss
    """
    from cl_zoo.fileio import check_output_path

    check_output_path(out)  # unwritable, missing parent, a folder: one line, before faiss is even imported
    from cl_zoo.index import build_index, format_bytes, open_source, parse_memory, require_faiss, sidecar_path

    require_faiss("cl-zoo index")  # before the embeddings are read
    check_output_path(sidecar_path(Path(out)), option="--out's description")
    budget = parse_memory(max_memory)
    show = progress if progress is not None else not quiet
    say = (lambda message: click.echo(message, err=True)) if show else None
    source = open_source(embeddings)
    check_index_outputs(source, out)
    result = build_index(source, out, budget, sample_size=sample, seed=seed, progress=say)
    info = result.info
    if as_json:
        report = {**info.to_json(), "estimated_bytes": result.plan.estimated_bytes, "tried": [list(t) for t in result.evaluation.tried]}
        click.echo(json.dumps(report, indent=1))
        return 0
    lists = f", {info.nlist} lists" if info.nlist else ""
    met = "met" if info.recall_target_met else "not reached: quantization caps it"
    params = f" with {info.search_params}" if info.search_params else " (exact)"
    click.echo(f"index: {info.factory} ({info.kind}{lists}) over {info.n} vectors of {info.dim} dims")
    click.echo(f"why: {info.reason}")
    click.echo(f"recall@10: {info.recall_at_10:.4f} (target 0.9, {met}){params}, on {info.eval_queries} held-out queries")
    click.echo(f"latency: {info.latency_ms:.3f} ms/query (median over batches of 100 queries)")
    click.echo(f"size: {format_bytes(info.index_bytes)} of the {format_bytes(budget)} budget (estimated {format_bytes(result.plan.estimated_bytes)})")
    click.echo(f"build: {info.build_seconds:.1f} s, peak memory {format_bytes(info.peak_rss_bytes)}")
    click.echo(f"wrote {result.index_path} and {result.sidecar_path}")
    return 0


def check_index_outputs(source: EmbeddingSource, out: str | os.PathLike[str]) -> None:
    """Refuse, in one line, an index (or its ``.json``) that would replace the embeddings it indexes:
    ``cl-zoo index emb.npy --out emb.npy`` used to replace the embeddings with the index, and ``--out
    emb.meta`` their metadata with the description. ``OUT`` must be absent or a faiss index (an
    earlier build's); ``OUT.json``, a name derived from it, absent or an index description cl-zoo wrote."""
    from cl_zoo.embedding.files import embedding_files
    from cl_zoo.embedding.shards import named_like_ours
    from cl_zoo.fileio import check_replaceable, refuse_inputs_as_outputs
    from cl_zoo.index.sidecar import is_index_description, sidecar_path

    out = Path(out)
    inputs: list[Path] = []
    for npy in source.paths:
        inputs += embedding_files(npy)
    if source.location.is_dir():
        inputs += named_like_ours(source.location)
    refuse_inputs_as_outputs([out, sidecar_path(out)], inputs)
    # --out holiday.jpg is somebody's photo: only an earlier index (its type tag, or its description beside it) is replaced
    check_replaceable(out, lambda p: is_faiss_index(p) or is_index_description(sidecar_path(p)), "a faiss index")
    check_replaceable(sidecar_path(out), is_index_description, "an index description")


def is_faiss_index(path: Path) -> bool:
    """Whether ``path`` starts as every faiss index file does: a four-letter type tag beginning with ``I``."""
    import re

    from cl_zoo.fileio import read_head

    return re.match(rb"I[A-Za-z0-9]{3}", read_head(path, 4)) is not None


__all__ = ["check_index_outputs", "index_command", "is_faiss_index"]
