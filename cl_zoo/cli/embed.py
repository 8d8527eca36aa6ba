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

from cl_zoo.errors import ClZooError, DataError

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
@click.option("-j", "--workers", default=None, type=click.IntRange(min=0), help="Decoding processes (default: the usable CPUs, at most 8).")
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
    from cl_zoo.fileio import check_output_path, check_replaceable
    from cl_zoo.torchrun import torchrun_env

    launched = torchrun_env()  # checked first: leftover torchrun variables are one error line, not a silent exit 0
    if out is None:
        raise ClZooError("give --out FILE.npy, FILE.parquet or DIR/: cl-zoo writes nothing into the current folder unless told where")
    # Where it goes, before the imports below (torchvision: seconds) and long before the model loads;
    # whether a file or a folder is checked once is_shard_output is imported.
    check_output_path(out, folder=None)
    from cl_zoo.data.images import discover_images, is_url
    from cl_zoo.embedding.inputs import resolve_inputs
    from cl_zoo.optional import require, require_url_reader
    from cl_zoo.embedding.preprocess import DEFAULT_IMAGE_KEY
    from cl_zoo.embedding import (
        OUTPUT_SUFFIXES,
        NonFiniteFeatureError,
        extract_features,
        input_metadata,
        load_embedding_model,
        model_metadata,
        save_embeddings,
        saved_progress,
        sidecar,
        write_failures,
    )
    from cl_zoo.embedding.files import FAILURES_SIDECAR, OWN_SIDECARS, check_output_files
    from cl_zoo.embedding.parts import discard_progress
    from cl_zoo.embedding.sharded import check_output_folder
    from cl_zoo.embedding.shards import is_shard_output
    from cl_zoo.registry import DEFAULT_MODEL

    rank = launched.rank
    quiet = not (progress if progress is not None else not quiet)  # below, `quiet` means: no progress bar
    out_path = Path(out)
    sharded = is_shard_output(out)
    if sharded and out_path.exists() and not out_path.is_dir():
        raise DataError(f"--out {out} is a file, not a folder for shards")
    if not sharded and out_path.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ClZooError(f"--out {out} must end in .npy or .parquet, or name a folder (DIR/) for shards")
    if shard_size is not None and not sharded:
        raise ClZooError("--shard-size applies to a folder output (--out DIR/)")
    check_output_path(out_path, folder=sharded)  # unwritable, missing parent, folder for a file: before the model loads
    # Before any work: nothing this run writes, uses or deletes may be an input or somebody else's file.
    if sharded:
        check_output_folder(out_path, (*paths, *calibration))
    else:
        check_output_files(out_path, (*paths, *calibration))
    # Optional packages are checked before any image is read, not when the output is written.
    if sharded or out_path.suffix.lower() == ".parquet":
        require("pyarrow", "--out DIR/ (sharded embeddings)" if sharded else "--out F.parquet")
    # Absolute paths (URLs stay URLs): the rows mean the same from any folder, and so does a --resume.
    found = resolve_inputs(paths)
    if found.is_webdataset:  # read with webdataset, written as shards with Parquet meta tables
        require("webdataset", "reading WebDataset tar shards")
        require("pyarrow", "reading WebDataset tar shards", extra="remote")
    first_url = next((f for f in found.files if is_url(f)), None)
    if first_url is not None:  # URLs listed in a local list file were not opened by resolve_inputs
        require_url_reader(first_url)
    if found.repeats and rank == 0:
        click.echo(f"skipped {found.repeats} linked folder{'s' if found.repeats != 1 else ''} already walked (symlink repeats or loops)", err=True)
    files = found.files
    if image_key is not None and not found.is_webdataset:
        raise ClZooError("--image-key applies to WebDataset tar shards")
    calibration_files = None
    if calibration:
        if precision != "int8":
            raise ClZooError("--calibration applies to --precision int8")
        calibration_files = [os.path.abspath(f) for f in discover_images(calibration)]
    if force_int8 and precision != "int8":
        raise ClZooError("--force-int8 applies to --precision int8")
    if resume and not sharded and not found.is_webdataset and (done := finished_output(out_path, files)) is not None:
        summary = {"output": str(out_path), "images": done, "finished": True}
        if as_json:
            click.echo(json.dumps(summary, indent=1))
        else:
            click.echo(f"{out_path} is already finished ({count(done, 'image')} of these inputs); nothing to resume "
                       "(run without --resume to embed again)", err=True)
        return 0
    net = load_embedding_model(model)
    stop_after = os.environ.get(STOP_AFTER_ENV)
    metadata = {**model_metadata(net, model or DEFAULT_MODEL), **input_metadata(paths)}
    if found.is_webdataset:
        return embed_webdataset(net, found.tars, out_path, metadata, rank=rank, world=launched.world_size, sharded=sharded, image_key=image_key or DEFAULT_IMAGE_KEY,
                                shard_size=shard_size, batch_size=batch_size, device=device, workers=workers, precision=precision,
                                backend=backend, calibration=calibration_files, calibration_seed=calibration_seed,
                                force_int8=force_int8, quiet=quiet, resume=resume, force=force, half=half, as_json=as_json,
                                stop_after=int(stop_after) if stop_after else None)
    if sharded:
        return embed_shards(net, files, out_path, metadata, rank=rank, shard_size=shard_size, batch_size=batch_size, device=device,
                            workers=workers, precision=precision, backend=backend, calibration=calibration_files,
                            calibration_seed=calibration_seed, force_int8=force_int8, quiet=quiet, resume=resume, force=force,
                            half=half, as_json=as_json, save_every=save_every, stop_after=int(stop_after) if stop_after else None)
    parts = sidecar(out_path, ".parts")
    try:
        result = extract_features(
            net,
            files,
            batch_size=batch_size,
            device=device,
            workers=workers,
            precision=precision,
            backend=backend,
            calibration=calibration_files,
            calibration_seed=calibration_seed,
            force_int8=force_int8,
            progress=not quiet,
            progress_dir=parts,
            resume=resume,
            force=force,
            chunk_batches=save_every,
            max_batches=int(stop_after) if stop_after else None,
        )
    except NonFiniteFeatureError:
        # The model cannot produce a usable file; saved parts of this run would only be resumed into the same error.
        if rank == 0:
            discard_progress(parts)
        raise
    except KeyboardInterrupt:
        if rank == 0:
            kept = saved_progress(parts)
            where = os.path.abspath(parts)
            if kept is None:
                click.echo(f"interrupted before the first part was saved; nothing kept in {where}", err=True)
            else:
                click.echo(f"interrupted: kept {kept} in {where}; to continue, run:", err=True)
                click.echo(f"  {resume_command(click.get_current_context())}", err=True)
        raise
    if rank != 0:
        return 0
    failures_csv = sidecar(out_path, FAILURES_SIDECAR)
    if result.failures:
        write_failures(failures_csv, result.failures)
    elif check_replaceable(failures_csv, *OWN_SIDECARS[FAILURES_SIDECAR]):
        failures_csv.unlink()  # a stale report from an earlier run would be misleading
    if not result.paths:
        discard_progress(parts)
        raise DataError(
            f"none of the {len(files)} images could be read; reasons in {failures_csv} "
            f"(first: {result.failures[0][0]}: {result.failures[0][1]})"
        )
    metadata = {**metadata, "precision": result.precision, "backend": result.backend,
                **({"quantization": result.quantization} if result.quantization is not None else {})}
    save_embeddings(out_path, result.features, result.paths, metadata, half=half)
    discard_progress(parts)
    rate = result.images_per_second
    summary = {"output": str(out_path), "images": len(result.paths), "dims": int(result.features.shape[1]),
               "skipped": len(result.failures), "resumed": result.resumed, "seconds": round(result.seconds, 3),
               "images_per_second": round(rate, 3), "backend": result.backend, "precision": result.precision,
               "backend_reason": result.backend_reason}
    echo_summary(summary, as_json,
                 f"embedded {count(len(result.paths), 'image')} ({result.features.shape[1]}-d) into {out_path}, "
                 f"skipped {len(result.failures)}, resumed {result.resumed}, "
                 f"{result.seconds:.1f} s, {rate:.1f} images/s ({result.backend} {result.precision}: {result.backend_reason})")
    if result.failures:
        click.echo(f"warning: skipped {len(result.failures)} unreadable files; reasons in {failures_csv}", err=True)
    return 0


def embed_webdataset(net, tars: list[str], out_path: Path, metadata: dict, *, rank: int, world: int, sharded: bool, quiet: bool,  # noqa: ANN001
                     stop_after: int | None, shard_size: int | None, half: bool, resume: bool, force: bool, as_json: bool = False,
                     **options) -> int:  # noqa: ANN003
    """WebDataset tar shards in: one output shard per input tar (``--out DIR/``), or one file."""
    from cl_zoo.embedding import save_embeddings, sidecar, write_failures
    from cl_zoo.embedding.shards import MANIFEST_NAME
    from cl_zoo.embedding.tars import embed_tars_to_shards, extract_tar_features

    if shard_size is not None:
        raise ClZooError("--shard-size does not apply to WebDataset input: each input tar becomes one output shard")
    if not sharded:
        if resume:
            raise ClZooError("--resume with WebDataset input needs a folder output (--out DIR/), which resumes tar by tar")
        if world > 1:
            raise ClZooError("torchrun with WebDataset input needs a folder output (--out DIR/)")
        result = extract_tar_features(net, tars, progress=not quiet, max_batches=stop_after, **options)
        failures_csv = sidecar(out_path, ".failures.csv")
        if result.failures:
            write_failures(failures_csv, result.failures)
        if not result.paths:
            if not result.failures:
                raise DataError(f"the {len(tars)} WebDataset shard(s) hold no samples; nothing was written")
            raise DataError(f"none of the samples in the {len(tars)} WebDataset shard(s) could be read; reasons in {failures_csv}")
        save_embeddings(out_path, result.features, result.paths, {**metadata, "precision": result.precision, "backend": result.backend},
                        half=half)
        echo_summary({"output": str(out_path), "images": len(result.paths), "dims": int(result.features.shape[1]), "tars": len(tars),
                      "skipped": len(result.failures), "seconds": round(result.seconds, 3),
                      "images_per_second": round(result.images_per_second, 3), "backend": result.backend,
                      "precision": result.precision, "backend_reason": result.backend_reason}, as_json,
                     f"embedded {count(len(result.paths), 'image')} ({result.features.shape[1]}-d) from {len(tars)} WebDataset shard(s) into "
                     f"{out_path}, skipped {len(result.failures)}, {result.seconds:.1f} s, {result.images_per_second:.1f} images/s "
                     f"({result.backend} {result.precision}: {result.backend_reason})")
        return 0
    run = embed_tars_to_shards(net, tars, out_path, metadata=metadata, progress=not quiet, max_batches=stop_after, half=half,
                               resume=resume, force=force, **options)
    if rank == 0:
        echo_summary(shards_summary(run, out_path, tars=len(tars)), as_json,
                     f"embedded {count(run.rows, 'image')} ({run.dims}-d) from {len(tars)} WebDataset shard(s) into "
                     f"{count(len(run.shards), 'shard')} in {out_path}/ ({MANIFEST_NAME}), skipped {run.failures}, resumed {run.resumed} "
                     f"({count(run.skipped_shards, 'finished shard')}), {run.seconds:.1f} s, {run.images_per_second:.1f} images/s "
                     f"({run.backend} {run.precision}: {run.backend_reason})")
        if run.failures:
            click.echo(f"warning: skipped {run.failures} unreadable samples; reasons in {out_path}/failures_*.csv", err=True)
    return 0


def embed_shards(net, files: list[str], out_path: Path, metadata: dict, *, rank: int, quiet: bool, stop_after: int | None,  # noqa: ANN001
                 save_every: int | None, shard_size: int | None, as_json: bool = False,
                 **options) -> int:  # noqa: ANN003 - embed_to_shards' options
    """``--out DIR/``: numbered shards and a manifest, memory flat in the number of images."""
    from cl_zoo.embedding.sharded import PARTS_FOLDER, embed_to_shards
    from cl_zoo.embedding.shards import MANIFEST_NAME

    try:
        run = embed_to_shards(net, files, out_path, metadata=metadata, shard_images=shard_size, progress=not quiet,
                              chunk_batches=save_every, max_batches=stop_after, **options)
    except KeyboardInterrupt:
        if rank == 0:
            finished = sorted(out_path.glob("meta_*.parquet"))
            click.echo(f"interrupted: {len(finished)} finished shard{'s' if len(finished) != 1 else ''} and the progress of the "
                       f"others kept in {os.path.abspath(out_path)} ({PARTS_FOLDER}/); to continue, run:", err=True)
            click.echo(f"  {resume_command(click.get_current_context())}", err=True)
        raise
    if rank != 0:
        return 0
    echo_summary(shards_summary(run, out_path), as_json,
                 f"embedded {count(run.rows, 'image')} ({run.dims}-d) into {count(len(run.shards), 'shard')} in "
                 f"{out_path}/ ({MANIFEST_NAME}), skipped {run.failures}, resumed {run.resumed} "
                 f"({count(run.skipped_shards, 'finished shard')}), {run.seconds:.1f} s, {run.images_per_second:.1f} images/s "
                 f"({run.backend} {run.precision}: {run.backend_reason})")
    if run.failures:
        click.echo(f"warning: skipped {run.failures} unreadable files; reasons in {out_path}/failures_*.csv", err=True)
    return 0


def count(n: int, noun: str) -> str:
    """``1 image``, ``2 images``: summaries read as sentences ("embedded 1 images" did not)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def echo_summary(summary: dict[str, object], as_json: bool, line: str) -> None:
    """The run's result: JSON on stdout for scripts (``--json``), else one line on stderr, where
    it stays out of a pipe carrying the command's stdout."""
    if as_json:
        click.echo(json.dumps(summary, indent=1))
    else:
        click.echo(line, err=True)


def shards_summary(run, out_path: Path, **extra: object) -> dict[str, object]:  # noqa: ANN001 - a ShardRun or TarShardRun
    """``--json`` form of a folder output's summary."""
    return {"output": f"{out_path}/", "images": run.rows, "dims": run.dims, **extra, "shards": len(run.shards),
            "skipped": run.failures, "resumed": run.resumed, "finished_shards": run.skipped_shards,
            "seconds": round(run.seconds, 3), "images_per_second": round(run.images_per_second, 3),
            "backend": run.backend, "precision": run.precision, "backend_reason": run.backend_reason}


def finished_output(out: Path, files: list[str]) -> int | None:
    """Rows of ``out`` when it is a finished run over exactly ``files`` (its rows plus its listed
    failures), with no progress left to resume; else None. Lets ``--resume`` on a finished run say
    so instead of silently embedding everything again."""
    import csv

    from cl_zoo.embedding import load_embeddings, sidecar
    from cl_zoo.embedding.files import FAILURES_SIDECAR, path_listing, read_path_list
    from cl_zoo.embedding.progress import saved_progress

    if not out.is_file() or saved_progress(sidecar(out, ".parts")) is not None:
        return None
    try:
        rows = read_path_list(path_listing(out)) if out.suffix.lower() == ".npy" else load_embeddings(out)[1]
        failed: list[str] = []
        report = sidecar(out, FAILURES_SIDECAR)
        if report.is_file():
            with open(report, newline="", encoding="utf-8") as fh:
                failed = [row["path"] for row in csv.DictReader(fh) if "path" in row]
    except (ClZooError, OSError, ValueError, KeyError):
        return None  # unreadable: not a finished run of ours; the run goes on as before
    return len(rows) if set(rows) | set(failed) == set(files) and len(set(rows)) == len(rows) else None


def resume_command(ctx: click.Context) -> str:
    """The command line that continues this run from any folder: same inputs, options, ``--resume``.

    Options come from what was typed (defaults are left out); paths, the output and a model folder
    are made absolute, because progress is matched on the absolute image paths.
    """
    from cl_zoo.embedding import model_reference

    typed = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    params = ctx.params
    words = ["cl-zoo", "embed", *(os.path.abspath(p) for p in params["paths"])]
    for param in ctx.command.params:
        name = param.name
        if not isinstance(param, click.Option) or name in ("resume", "force", "as_json") or name is None:
            continue
        if ctx.get_parameter_source(name) not in typed and name != "out":
            continue
        value = params[name]
        flag = max(param.opts, key=len)
        if param.is_flag:
            if value:
                words.append(flag)
            elif param.secondary_opts:  # a typed --no-progress
                words.append(param.secondary_opts[0])
            continue
        if name == "out":
            value = os.path.abspath(value)
        elif name == "model":
            value = model_reference(value)
        words += [flag, str(value)]
    words.append("--resume")
    return shlex.join(words)
