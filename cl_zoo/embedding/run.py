"""``embed_to_output``: from the user's inputs to an embeddings file, a shard folder, or memory.

The one road ``cl-zoo embed`` and ``cl_zoo.embed`` both take: resolve the inputs (files, folders,
path lists, URLs, WebDataset tars), check the output before the model loads, dispatch to the
right loop (path list or tars; one file, numbered shards, or in memory) and write the result.
The CLI only parses arguments and prints what this returns; ``cl_zoo.embed`` asks for the
features in memory (``out=None``).
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch.nn as nn

from cl_zoo.data.images import discover_images, is_url
from cl_zoo.embedding.checks import NonFiniteFeatureError
from cl_zoo.embedding.extract import FeatureResult, extract_features
from cl_zoo.embedding.files import (
    FAILURES_SIDECAR,
    META_SIDECAR,
    OUTPUT_SUFFIXES,
    OWN_SIDECARS,
    check_output_files,
    load_embeddings,
    path_listing,
    read_metadata,
    read_path_list,
    save_embeddings,
    sidecar,
    write_failures,
)
from cl_zoo.embedding.inputs import resolve_inputs
from cl_zoo.embedding.options import EngineOptions, RunControl
from cl_zoo.embedding.parts import discard_progress
from cl_zoo.embedding.preprocess import DEFAULT_IMAGE_KEY
from cl_zoo.embedding.progress import input_stat, saved_progress
from cl_zoo.embedding.reference import input_metadata, load_embedding_model, model_metadata
from cl_zoo.embedding.sharded import check_output_folder, embed_to_shards
from cl_zoo.embedding.shards import MANIFEST_NAME, is_shard_output
from cl_zoo.embedding.tars import embed_tars_to_shards, extract_tar_features
from cl_zoo.errors import ClZooError, DataError
from cl_zoo.fileio import check_output_path, check_replaceable
from cl_zoo.optional import require, require_url_reader
from cl_zoo.registry import DEFAULT_MODEL


# The .meta.json field a finished output's --resume compares its inputs by (:func:`inputs_digest`).
INPUTS_DIGEST_KEY = "inputs_sha256"


@dataclass
class EmbedRun:
    """What a run did: its summary (``--json``), the summary line, and a warning line if any.

    ``result`` holds the features when they stayed in memory (``out=None``).
    """

    summary: dict[str, object]
    line: str
    warning: str | None = None
    result: FeatureResult | None = None
    sharded: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def count(n: int, noun: str) -> str:
    """``1 image``, ``2 images``: summaries read as sentences ("embedded 1 images" did not)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def changed_since(changed: int) -> str:
    """The summary's word on inputs whose saved progress was dropped: they changed after it was saved."""
    return f" (re-embedded {count(changed, 'changed file')})" if changed else ""


def is_sharded_output(out: str | os.PathLike[str]) -> bool:
    return is_shard_output(os.fspath(out))


def check_output(out: str, inputs: Sequence[str], shard_size: int | None) -> tuple[Path, bool]:
    """(output path, whether it is a shard folder), refused before any image or the model is read."""
    out_path = Path(out)
    sharded = is_sharded_output(out)
    if sharded and out_path.exists() and not out_path.is_dir():
        raise DataError(f"--out {out} is a file, not a folder for shards")
    if not sharded and out_path.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ClZooError(f"--out {out} must end in .npy or .parquet, or name a folder (DIR/) for shards")
    if shard_size is not None and not sharded:
        raise ClZooError("--shard-size applies to a folder output (--out DIR/)")
    check_output_path(out_path, folder=sharded)  # unwritable, missing parent, folder for a file: before the model loads
    # Before any work: nothing this run writes, uses or deletes may be an input or somebody else's file.
    if sharded:
        check_output_folder(out_path, inputs)
    else:
        check_output_files(out_path, inputs)
        check_lock_path(out_path)
    # Optional packages are checked before any image is read, not when the output is written.
    if sharded or out_path.suffix.lower() == ".parquet":
        require("pyarrow", "--out DIR/ (sharded embeddings)" if sharded else "--out F.parquet")
    return out_path, sharded


def embed_to_output(
    inputs: Sequence[str | os.PathLike[str]],
    out: str | None,
    *,
    model: str | os.PathLike[str] | nn.Module | None = None,
    options: EngineOptions | None = None,
    calibration: Sequence[str | os.PathLike[str]] = (),
    image_key: str | None = None,
    shard_size: int | None = None,
    half: bool = False,
    resume: bool = False,
    force: bool = False,
    save_every: int | None = None,
    progress: bool = False,
    max_batches: int | None = None,
    rank: int = 0,
    world: int = 1,
    say: Callable[[str], None] = lambda line: None,
) -> EmbedRun:
    """Embed ``inputs`` into ``out`` (``.npy``/``.parquet`` file or ``DIR/`` of shards), or into memory (``None``).

    ``options`` are the engine settings (:class:`EngineOptions`'s defaults when ``None``);
    ``calibration`` are int8's calibration inputs as the user gave them (files, folders, path
    lists). ``say`` hears the informational lines a run prints as it goes (rank 0 only).
    ``KeyboardInterrupt`` passes through with the progress kept (the caller says how to resume).
    """
    opts = options if options is not None else EngineOptions()
    specs = [os.fspath(p) for p in inputs]
    out_path, sharded = check_output(out, [*specs, *(os.fspath(c) for c in calibration)], shard_size) if out is not None else (None, False)
    # Absolute paths (URLs stay URLs): the rows mean the same from any folder, and so does a --resume.
    found = resolve_inputs(specs)
    if found.is_webdataset:  # read with webdataset, written as shards with Parquet meta tables
        require("webdataset", "reading WebDataset tar shards")
        require("pyarrow", "reading WebDataset tar shards", extra="remote")
    first_url = next((f for f in found.files if is_url(f)), None)
    if first_url is not None:  # URLs listed in a local list file were not opened by resolve_inputs
        require_url_reader(first_url)
    if found.repeats and rank == 0:
        say(f"skipped {found.repeats} linked folder{'s' if found.repeats != 1 else ''} already walked (symlink repeats or loops)")
    files = found.files
    if image_key is not None and not found.is_webdataset and out_path is not None:  # cl_zoo.embed has always ignored it there
        raise ClZooError("--image-key applies to WebDataset tar shards")
    if calibration:
        if opts.precision != "int8":
            raise ClZooError("--calibration applies to --precision int8")
        opts = EngineOptions.merge(opts, calibration=[os.path.abspath(f) for f in discover_images(calibration)])
    if opts.force_int8 and opts.precision != "int8" and out_path is not None:
        raise ClZooError("--force-int8 applies to --precision int8")
    done = finished_output(out_path, files) if out_path is not None and resume and not sharded and not found.is_webdataset else None
    if done is not None and not done.same_inputs:
        raise DataError(f"cannot resume: {out_path} is a finished run over other inputs ({count(done.rows, 'image')}); "
                        "run without --resume to replace it, or choose another --out")
    if done is not None and done.unchanged:
        return EmbedRun({"output": str(out_path), "images": done.rows, "finished": True},
                        f"{out_path} is already finished ({count(done.rows, 'image')} of these inputs); nothing to resume "
                        "(run without --resume to embed again)")
    if done is not None and rank == 0:
        say(f"inputs of {out_path} changed since it was written (size or modification time): embedding them again")

    with out_of_space_is_one_line(out_path), one_writer(out_path if out_path is not None and not sharded and rank == 0 else None):
        net = load_embedding_model(model)
        if out_path is None:
            return EmbedRun({}, "", result=_in_memory(net, found, opts, image_key or DEFAULT_IMAGE_KEY, progress))
        reference = model if isinstance(model, (str, os.PathLike)) else getattr(model, "model_name", None)
        metadata = {**model_metadata(net, os.fspath(reference) if reference else DEFAULT_MODEL), **input_metadata(specs)}
        plan = OutputPlan(out_path, sharded, shard_size, half, metadata)
        control = RunControl(resume=resume, force=force, progress=progress, chunk_batches=save_every, max_batches=max_batches)
        if found.is_webdataset:
            return _webdataset(net, found.tars, plan, opts, control, world=world, image_key=image_key or DEFAULT_IMAGE_KEY)
        if sharded:
            run = embed_to_shards(net, files, out_path, metadata=metadata, shard_images=shard_size, half=half, options=opts,
                                  progress=progress, resume=resume, force=force, chunk_batches=save_every, max_batches=max_batches)
            return _shards_run(run, out_path, "unreadable files")
        return _single_file(net, files, plan, opts, control, rank=rank)


# What a full disk or an exhausted quota raises while an output is written: a condition of the
# machine the user can fix, so one line, never a traceback.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


@contextmanager
def out_of_space_is_one_line(out: Path | None) -> Iterator[None]:
    """Turn a full disk or quota while writing ``out`` into one :class:`ClZooError` line.

    The writers commit each output whole (temporary names, then renames), so what was there before
    is still there; the progress kept so far stays for ``--resume``.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        raise ClZooError(f"cannot write {out or 'the embeddings'}: {exc.strerror or os.strerror(exc.errno)}; what was there "
                         "before is unchanged: free some space and run again (--resume continues from the saved progress)") from None


def lock_path(out: Path) -> Path:
    """The lock file a run writing the single-file output ``out`` holds (hidden, beside it)."""
    return out.with_name(f".{out.name}.lock")


def check_lock_path(out: Path) -> None:
    """Refuse an output whose lock file name holds something a run did not leave: only an empty
    regular file (what a lock leaves behind) may be taken over."""
    lock = lock_path(out)
    if os.path.lexists(lock) and (lock.is_symlink() or not lock.is_file() or lock.stat().st_size):
        raise DataError(f"{lock} exists and is not a cl-zoo lock file; cl-zoo locks {out} there while writing it: "
                        "move it away or choose another --out")


@contextmanager
def one_writer(out: Path | None) -> Iterator[None]:
    """Hold ``out``'s lock for the whole run: two runs writing one output would share (and delete)
    one progress folder and one set of temporaries. A second run is refused in one line at once."""
    if out is None:
        yield
        return
    from filelock import FileLock, Timeout

    lock = FileLock(lock_path(out), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise DataError(f"another cl-zoo embed is writing {out} (it holds {lock_path(out)}); "
                        "wait for it to finish, or choose another --out") from None
    try:
        yield
    finally:
        lock.release()
        left = lock_path(out)  # filelock versions before 4 leave the (empty) file behind
        if left.is_file() and not left.is_symlink() and left.stat().st_size == 0:
            left.unlink(missing_ok=True)


def _in_memory(net: nn.Module, found: Any, opts: EngineOptions, image_key: str, progress: bool) -> FeatureResult:
    if found.is_webdataset:
        return extract_tar_features(net, found.tars, options=opts, image_key=image_key, progress=progress)
    return extract_features(net, found.files, options=opts, progress=progress)


@dataclass(frozen=True)
class OutputPlan:
    """Where a run writes and how: the output checked by :func:`check_output`, and what goes into it."""

    path: Path
    sharded: bool
    shard_size: int | None
    half: bool
    metadata: dict[str, Any]


def _single_file(net: nn.Module, files: list[str], plan: OutputPlan, opts: EngineOptions, control: RunControl, *, rank: int) -> EmbedRun:
    out_path, half = plan.path, plan.half
    parts = sidecar(out_path, ".parts")
    try:
        result = extract_features(net, files, options=opts, progress=control.progress, progress_dir=parts, resume=control.resume,
                                  force=control.force, chunk_batches=control.chunk_batches, max_batches=control.max_batches)
    except NonFiniteFeatureError:
        # The model cannot produce a usable file; saved parts of this run would only be resumed into the same error.
        if rank == 0:
            discard_progress(parts)
        raise
    if rank != 0:
        return EmbedRun({}, "", extra={"rank": rank})
    failures_csv = sidecar(out_path, FAILURES_SIDECAR)
    if not result.paths:
        discard_progress(parts)
        first = f"(first: {result.failures[0][0]}: {result.failures[0][1]})"
        if out_path.exists():  # an earlier output keeps its own failure report
            raise DataError(f"none of the {len(files)} images could be read {first}; {out_path} and its sidecars were left as they were")
        write_failures(failures_csv, result.failures)
        raise DataError(f"none of the {len(files)} images could be read; reasons in {failures_csv} {first}")
    metadata = {**plan.metadata, INPUTS_DIGEST_KEY: inputs_digest(files), "precision": result.precision, "backend": result.backend,
                **({"quantization": result.quantization} if result.quantization is not None else {})}
    save_embeddings(out_path, result.features, result.paths, metadata, half=half)
    # After the embeddings are committed: a run that failed before then leaves the earlier report with its output.
    if result.failures:
        write_failures(failures_csv, result.failures)
    elif check_replaceable(failures_csv, *OWN_SIDECARS[FAILURES_SIDECAR]):
        failures_csv.unlink()  # a stale report from an earlier run would be misleading
    discard_progress(parts)
    rate = result.images_per_second
    summary: dict[str, object] = {
        "output": str(out_path), "images": len(result.paths), "dims": int(result.features.shape[1]),
        "skipped": len(result.failures), "resumed": result.resumed, "changed": result.changed, "seconds": round(result.seconds, 3),
        "images_per_second": round(rate, 3), "backend": result.backend, "precision": result.precision,
        "backend_reason": result.backend_reason}
    line = (f"embedded {count(len(result.paths), 'image')} ({result.features.shape[1]}-d) into {out_path}, "
            f"skipped {len(result.failures)}, resumed {result.resumed}{changed_since(result.changed)}, "
            f"{result.seconds:.1f} s, {rate:.1f} images/s ({result.backend} {result.precision}: {result.backend_reason})")
    warning = f"warning: skipped {len(result.failures)} unreadable files; reasons in {failures_csv}" if result.failures else None
    return EmbedRun(summary, line, warning, result)


def _webdataset(net: nn.Module, tars: list[str], plan: OutputPlan, opts: EngineOptions, control: RunControl, *, world: int,
                image_key: str) -> EmbedRun:
    """WebDataset tar shards in: one output shard per input tar (``--out DIR/``), or one file."""
    out_path, metadata, half = plan.path, plan.metadata, plan.half
    resume, force, progress, max_batches = control.resume, control.force, control.progress, control.max_batches
    shard_size, sharded = plan.shard_size, plan.sharded
    if shard_size is not None:
        raise ClZooError("--shard-size does not apply to WebDataset input: each input tar becomes one output shard")
    if sharded:
        run = embed_tars_to_shards(net, tars, out_path, metadata=metadata, options=opts, image_key=image_key, progress=progress,
                                   max_batches=max_batches, half=half, resume=resume, force=force)
        return _shards_run(run, out_path, "unreadable samples", tars=len(tars))
    if resume:
        raise ClZooError("--resume with WebDataset input needs a folder output (--out DIR/), which resumes tar by tar")
    if world > 1:
        raise ClZooError("torchrun with WebDataset input needs a folder output (--out DIR/)")
    result = extract_tar_features(net, tars, options=opts, image_key=image_key, progress=progress, max_batches=max_batches)
    failures_csv = sidecar(out_path, FAILURES_SIDECAR)
    if not result.paths:
        if not result.failures:
            raise DataError(f"the {len(tars)} WebDataset shard(s) hold no samples; nothing was written")
        if out_path.exists():  # an earlier output keeps its own failure report
            raise DataError(f"none of the samples in the {len(tars)} WebDataset shard(s) could be read (first: {result.failures[0][0]}: "
                            f"{result.failures[0][1]}); {out_path} and its sidecars were left as they were")
        write_failures(failures_csv, result.failures)
        raise DataError(f"none of the samples in the {len(tars)} WebDataset shard(s) could be read; reasons in {failures_csv}")
    save_embeddings(out_path, result.features, result.paths, {**metadata, "precision": result.precision, "backend": result.backend},
                    half=half)
    if result.failures:  # after the embeddings are committed, as for image files
        write_failures(failures_csv, result.failures)
    summary: dict[str, object] = {
        "output": str(out_path), "images": len(result.paths), "dims": int(result.features.shape[1]), "tars": len(tars),
        "skipped": len(result.failures), "seconds": round(result.seconds, 3),
        "images_per_second": round(result.images_per_second, 3), "backend": result.backend,
        "precision": result.precision, "backend_reason": result.backend_reason}
    line = (f"embedded {count(len(result.paths), 'image')} ({result.features.shape[1]}-d) from {len(tars)} WebDataset shard(s) into "
            f"{out_path}, skipped {len(result.failures)}, {result.seconds:.1f} s, {result.images_per_second:.1f} images/s "
            f"({result.backend} {result.precision}: {result.backend_reason})")
    return EmbedRun(summary, line, None, result)


def _shards_run(run: Any, out_path: Path, what: str, **extra: object) -> EmbedRun:
    """A folder output's summary (``run``: a ShardRun) and its warning."""
    summary: dict[str, object] = {
        "output": f"{out_path}/", "images": run.rows, "dims": run.dims, **extra, "shards": len(run.shards),
        "skipped": run.failures, "resumed": run.resumed, "changed": run.changed, "finished_shards": run.skipped_shards,
        "seconds": round(run.seconds, 3), "images_per_second": round(run.images_per_second, 3),
        "backend": run.backend, "precision": run.precision, "backend_reason": run.backend_reason}
    source = f" from {extra['tars']} WebDataset shard(s)" if "tars" in extra else ""
    line = (f"embedded {count(run.rows, 'image')} ({run.dims}-d){source} into {count(len(run.shards), 'shard')} in "
            f"{out_path}/ ({MANIFEST_NAME}), skipped {run.failures}, resumed {run.resumed}{changed_since(run.changed)} "
            f"({count(run.skipped_shards, 'finished shard')}), {run.seconds:.1f} s, {run.images_per_second:.1f} images/s "
            f"({run.backend} {run.precision}: {run.backend_reason})")
    warning = f"warning: skipped {run.failures} {what}; reasons in {out_path}/failures_*.csv" if run.failures else None
    return EmbedRun(summary, line, warning, sharded=True)


@dataclass(frozen=True)
class FinishedOutput:
    """What ``--resume`` finds in a finished single-file output: its rows, and how they relate to this run's inputs."""

    rows: int
    same_inputs: bool  # its rows plus its listed failures are exactly this run's inputs
    unchanged: bool  # and none of them changed (size, mtime_ns) since it was written, as far as it records


def inputs_digest(paths: Sequence[str]) -> str:
    """sha256 of each input's path, size and mtime_ns (in path order): what a finished output
    records so that ``--resume`` can tell a file replaced since from the one embedded."""
    stats = [[p, *input_stat(p)] for p in sorted(paths)]
    return hashlib.sha256(json.dumps(stats).encode("utf-8", "surrogatepass")).hexdigest()


def finished_output(out: Path, files: list[str]) -> FinishedOutput | None:
    """``out`` as a finished run (no progress left to resume), or None when it is not one of ours.

    Lets ``--resume`` on a finished run say so instead of silently embedding everything again,
    refuse one over other inputs, and embed again one whose inputs changed since.
    """
    if not out.is_file() or saved_progress(sidecar(out, ".parts")) is not None:
        return None
    try:
        if out.suffix.lower() == ".parquet":
            _, rows, meta = load_embeddings(out)
        else:
            info = sidecar(out, META_SIDECAR)
            rows, meta = read_path_list(path_listing(out)), read_metadata(info) if info.is_file() else {}
        failed: list[str] = []
        report = sidecar(out, FAILURES_SIDECAR)
        if report.is_file():
            with open(report, newline="", encoding="utf-8") as fh:
                failed = [row["path"] for row in csv.DictReader(fh) if "path" in row]
    except (ClZooError, OSError, ValueError, KeyError):
        return None  # unreadable: not a finished run of ours; the run goes on as before
    same = set(rows) | set(failed) == set(files) and len(set(rows)) == len(rows)
    recorded = meta.get(INPUTS_DIGEST_KEY)
    unchanged = same and (recorded is None or recorded == inputs_digest(files))
    return FinishedOutput(len(rows), same, unchanged)


__all__ = ["EmbedRun", "FinishedOutput", "OutputPlan", "check_output", "count", "embed_to_output", "finished_output", "inputs_digest"]
