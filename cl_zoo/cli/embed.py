"""``cl-zoo embed``: image files, folders or path lists -> an embeddings file.

Also runs under ``torchrun --nproc-per-node N -m cl_zoo.cli embed ...``: every rank embeds its
share of the chunks into ``OUT.parts/`` and rank 0 writes the same file a single process would.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import click

from cl_zoo.errors import ClZooError

# Testing hook: stop (as if interrupted) after this many batches, to exercise --resume.
STOP_AFTER_ENV = "CL_ZOO_EMBED_STOP_AFTER_BATCHES"


@click.command("embed")
@click.argument("paths", nargs=-1, required=True)
@click.option("-m", "--model", default=None, help="Registered name, checkpoint folder/file or hf-hub:owner/name (default: the bundled model).")
@click.option("-o", "--out", default=None,
              help="Required. Output .npy (with .paths.jsonl/.meta.json sidecars) or .parquet; or a folder (DIR/, or no "
                   "suffix) of numbered shards emb_00000.npy + meta_00000.parquet + manifest.json, for collections larger "
                   "than memory. Checked before the model loads.")
@click.option("--image-key", default=None, metavar="EXTS",
              help="WebDataset shards: the image member's extensions, first found wins (default: jpg;jpeg;png;webp).")
@click.option("--shard-size", default=None, type=click.IntRange(min=1), metavar="IMAGES",
              help="Folder output: images per shard (default: ~1M rows or 1 GiB of features, whichever first).")
@click.option("-b", "--batch-size", default=64, show_default=True, type=click.IntRange(min=1), help="Images per forward pass.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("-j", "--workers", default=None, type=click.IntRange(min=0), help="Decoding processes (default: the usable CPUs, at most 8; they start before the model is "
                   "ready and sleep whenever enough images wait decoded).")
@click.option("--precision", default="auto", show_default=True, type=click.Choice(["auto", "fp32", "bf16", "fp16", "int8"]),
              help="auto: bf16 on CUDA and on CPUs with AMX or AVX512_BF16, else fp32. int8 (cl-zoo[int8], CPU): "
                   "quantized on 512 of your images and used only if it keeps neighbour recall@10 >= 0.95 against "
                   "fp32 on the held-out half, else bf16/fp32 with a warning. Features are float32 either way.")
@click.option("--calibration", "calibration", multiple=True, metavar="PATH",
              help="int8: images, folders or path lists to calibrate on (default: a sample of PATHS); repeatable.")
@click.option("--calibration-seed", default=0, show_default=True, type=int, help="int8: which 512 calibration images are drawn.")
@click.option("--force-int8", is_flag=True, help="int8: keep int8 even when it fails its fidelity gate.")
@click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "torch", "openvino"]),
              help="auto: OpenVINO on CPU when installed (cl-zoo[openvino]) and worth converting, else torch.")
@click.option("--half", is_flag=True, help="Store float16 instead of float32.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from OUT.parts/ (a folder output: skip its finished shards); "
              "a finished OUT of the same images is left as it is.")
@click.option("--force", is_flag=True, help="Discard the saved progress in OUT.parts/ (a folder output: its shards) and start over.")
@click.option("--save-every", default=None, type=click.IntRange(min=1), help="Batches per progress part (default: about 1024 images).")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: on unless --quiet).")
@click.option("-q", "--quiet", is_flag=True, help="Quiet: no progress output (as --no-progress); the summary, warnings and errors still print.")
@click.option("--json", "as_json", is_flag=True, help="Print the run's summary as JSON on stdout instead of a line on stderr.")
def embed_command(
    paths: tuple[str, ...],
    model: str | None,
    out: str,
    batch_size: int,
    device: str,
    workers: int | None,
    precision: str,
    calibration: tuple[str, ...],
    calibration_seed: int,
    force_int8: bool,
    backend: str,
    half: bool,
    resume: bool,
    force: bool,
    save_every: int | None,
    quiet: bool,
    shard_size: int | None,
    image_key: str | None,
    progress: bool | None = None,
    as_json: bool = False,
) -> int:
    """Embed images (jpg, png, webp, bmp, tiff, gif) found in PATHS.

    Each PATH is an image, a folder (searched recursively), a list of paths (.txt, .jsonl of JSON
    strings such as an earlier OUT.paths.jsonl, or the path column of a .csv/.tsv/.parquet), or
    WebDataset tar shards (data-{000..009}.tar), each local or an fsspec URL (file://, http://, ...).
    Rows come in sorted path order (tar order for shards). Unreadable files are skipped and listed in
    OUT.failures.csv (failures_NNNNN.csv in a folder output).
    """
    from cl_zoo.fileio import check_output_path
    from cl_zoo.torchrun import torchrun_env

    launched = torchrun_env()  # checked first: leftover torchrun variables are one error line, not a silent exit 0
    if out is None:
        raise ClZooError("give --out FILE.npy, FILE.parquet or DIR/: cl-zoo writes nothing into the current folder unless told where")
    # Where it goes, before the imports below (torchvision: seconds) and long before the model loads;
    # whether a file or a folder is checked once is_shard_output is imported.
    check_output_path(out, folder=None)
    from cl_zoo.embedding.options import EngineOptions
    from cl_zoo.embedding.run import embed_to_output, is_sharded_output

    rank = launched.rank
    stop_after = os.environ.get(STOP_AFTER_ENV)
    options = EngineOptions(precision=precision, backend=backend, device=device, batch_size=batch_size, workers=workers,
                            calibration_seed=calibration_seed, force_int8=force_int8)
    try:
        run = embed_to_output(
            paths, out, model=model, options=options, calibration=calibration, image_key=image_key, shard_size=shard_size, half=half,
            resume=resume, force=force, save_every=save_every, progress=progress if progress is not None else not quiet,
            max_batches=int(stop_after) if stop_after else None, rank=rank, world=launched.world_size,
            say=lambda line: click.echo(line, err=True),
        )
    except KeyboardInterrupt:
        if rank == 0:
            echo_interrupted(Path(out), is_sharded_output(out))
        raise
    if rank != 0 or not run.summary:
        return 0
    echo_summary(run.summary, as_json, run.line)
    if run.warning:
        click.echo(run.warning, err=True)
    return 0


def echo_interrupted(out_path: Path, sharded: bool) -> None:
    """What an interrupted run kept, and the command that continues it."""
    if sharded:
        from cl_zoo.embedding.sharded import PARTS_FOLDER

        finished = sorted(out_path.glob("meta_*.parquet"))
        click.echo(f"interrupted: {len(finished)} finished shard{'s' if len(finished) != 1 else ''} and the progress of the "
                   f"others kept in {os.path.abspath(out_path)} ({PARTS_FOLDER}/); to continue, run:", err=True)
    else:
        from cl_zoo.embedding import saved_progress, sidecar

        parts = sidecar(out_path, ".parts")
        kept = saved_progress(parts)
        where = os.path.abspath(parts)
        if kept is None:
            click.echo(f"interrupted before the first part was saved; nothing kept in {where}", err=True)
            return
        click.echo(f"interrupted: kept {kept} in {where}; to continue, run:", err=True)
    click.echo(f"  {resume_command(click.get_current_context())}", err=True)


def echo_summary(summary: dict[str, object], as_json: bool, line: str) -> None:
    """The run's result: JSON on stdout for scripts (``--json``), else one line on stderr, where
    it stays out of a pipe carrying the command's stdout."""
    if as_json:
        click.echo(json.dumps(summary, indent=1))
    else:
        click.echo(line, err=True)


def resume_command(ctx: click.Context) -> str:
    """The command line that continues this run from any folder: same inputs, options, ``--resume``.

    Options come from what was typed (defaults are left out); paths, the output and a model folder
    are made absolute, because progress is matched on the absolute image paths.
    """
    from cl_zoo.cli.rerun import typed_option_words
    from cl_zoo.embedding import model_reference

    def word(name: str, value: object) -> str:
        if name == "out":
            return os.path.abspath(str(value))
        return model_reference(value) if name == "model" else str(value)

    words = ["cl-zoo", "embed", *(os.path.abspath(p) for p in ctx.params["paths"]),
             *typed_option_words(ctx, skip=("resume", "force", "as_json"), always=("out",), word=word)]
    words.append("--resume")
    return shlex.join(words)


def __getattr__(name: str):  # noqa: ANN202 - old import paths: these moved to cl_zoo.embedding.run
    if name in ("count", "finished_output"):
        from cl_zoo.embedding import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
