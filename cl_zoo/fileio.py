"""Atomic file writes: every output is either complete or absent, never half-written.

The project's rule is that a crash, a full disk or Ctrl-C while writing must not leave a truncated
file where a reader (a resume, a cache lookup, a user) expects a whole one. All writers go through
:func:`atomic_path`: the data goes to a hidden temporary file in the destination's own folder (same
file system, so the final ``os.replace`` is atomic), which is moved over the destination only once
the writer returned without error, and removed on any exception. Temporary names come from
``mkstemp`` so two processes writing the same destination never write into each other's temporary.
Their names start with ``.`` followed by the destination's name, which keeps them out of folder
listings, dataset scans and hub uploads (``publish.IGNORE_PATTERNS`` skips dot files).

``mkstemp`` creates files readable by the owner only; the result is given the mode a plain
``open()`` would have produced (``0o666 & ~umask``) so runs and caches stay shareable.

Atomic writes keep every file whole, but two processes filling the same cache entry (two jobs
converting one official release, two notebooks downloading one Hub repo) would still both do the
work and swap folders under each other. :func:`file_lock` serialises them: the first fills the
entry, the second waits, then finds it done.

Reading is the other half: every JSON file cl-zoo reads back (a checkpoint's config and shard index,
an embedding manifest, an index sidecar, an evaluation report, a COCO annotation file) may come from
someone else or have been copied around. :func:`read_bounded_json` is the one reader for all of them: it
refuses a file larger than the caller's bound before reading it, refuses what is not a regular file
(a FIFO would block forever, ``/dev/zero`` never ends), and turns every failure (missing, unreadable,
not UTF-8, malformed, nested deep enough to exhaust the parser's recursion, an integer with more
digits than Python converts) into one line of the caller's error class.

Writing over is the third: a command may replace only what it wrote itself. An output's sidecar
(``emb.meta.json``), a progress folder (``emb.parts/``) or a shard (``DIR/emb_00000.npy``) has a name
that somebody else's file can already hold (the user's own ``train.meta.json`` beside ``--out
train.npy``), so before replacing or deleting one the writer recognises it by its content
(:func:`check_replaceable`, with a recogniser from the module that owns the format), and refuses,
naming the file, when it is not its own or is not a regular file at all (a folder, a link: a link
would be written through). :func:`refuse_inputs_as_outputs` refuses an output that is one of the
command's inputs, however it is spelt (another relative path, a link, a hard link).

Checking before working is the fourth: :func:`check_output_path` is the one preflight every command
that writes runs on its outputs before any slow step (imports of torchvision or faiss, a model load,
reading the data), so an unwritable place (``/proc``, ``/sys``, a read-only mount), a missing parent
or a folder where a file goes is one line in a second rather than a traceback after the work.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Sequence

from filelock import FileLock

from cl_zoo.errors import ClZooError, DataError
from cl_zoo.text import one_line
from cl_zoo.validation import MAX_NESTING, nesting_depth

__all__ = [
    "atomic_path",
    "atomic_write_text",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_save_torch",
    "atomic_save_npy",
    "file_lock",
    "files_fingerprint",
    "read_bounded_json",
    "check_replaceable",
    "check_output_path",
    "read_head",
    "refuse_inputs_as_outputs",
    "same_file",
]


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (thread-safe on Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(
    final: str | os.PathLike[str],
    *,
    suffix: str = ".tmp",
    fsync: bool = False,
    mkdir: bool = True,
) -> Iterator[Path]:
    """Yield a temporary path next to ``final``; on clean exit it replaces ``final``.

    The caller writes the whole file to the yielded path (by name: ``torch.save``, ``savefig``,
    ``pyarrow`` ... all accept one). ``suffix`` matters to writers that pick a format from the
    extension (matplotlib: pass ``".png"``). ``fsync=True`` flushes the data to disk before the
    rename, for files whose loss after a power cut would cost real work (training checkpoints).
    ``mkdir`` creates the destination's parent folders first. Exceptions propagate unchanged.
    """
    final = Path(final)
    if mkdir:
        final.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=suffix, dir=final.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDWR)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, fsync: bool = False, mkdir: bool = True
) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``path`` as a :class:`Path`."""
    with atomic_path(path, fsync=fsync, mkdir=mkdir) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(
    path: str | os.PathLike[str],
    text: str,
    *,
    encoding: str = "utf-8",
    fsync: bool = False,
    mkdir: bool = True,
) -> Path:
    """Write ``text`` to ``path`` atomically (UTF-8 unless told otherwise)."""
    with atomic_path(path, fsync=fsync, mkdir=mkdir) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)


def atomic_write_json(
    path: str | os.PathLike[str],
    obj: Any,
    *,
    indent: int | None = 2,
    sort_keys: bool = False,
    allow_nan: bool = True,
    fsync: bool = False,
    mkdir: bool = True,
) -> Path:
    """``json.dumps(obj)`` plus a final newline, written atomically.

    The text is produced before anything touches the disk, so an unserialisable object (or NaN with
    ``allow_nan=False``) raises its ``TypeError``/``ValueError`` and leaves no file behind.
    """
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=allow_nan) + "\n"
    return atomic_write_text(path, text, fsync=fsync, mkdir=mkdir)


def atomic_save_torch(path: str | os.PathLike[str], obj: Any, *, fsync: bool = False) -> Path:
    """``torch.save(obj)`` to ``path`` atomically."""
    import torch

    with atomic_path(path, fsync=fsync) as tmp:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
    return Path(path)


def atomic_save_npy(
    path: str | os.PathLike[str], array: Any, *, allow_pickle: bool = False, fsync: bool = False
) -> Path:
    """``np.save`` to exactly ``path`` atomically.

    Goes through a file handle because ``np.save`` given a name not ending in ``.npy`` would add
    the extension and write somewhere else than the temporary.
    """
    import numpy as np

    with atomic_path(path, fsync=fsync) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, array, allow_pickle=allow_pickle)
    return Path(path)


@contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold an exclusive cross-process lock on ``path`` (created if absent) for the ``with`` block.

    The ``filelock`` package's lock (``flock`` on POSIX, ``msvcrt`` on Windows): the kernel releases
    it when the holder exits, so a killed holder never leaves a stale lock. The lock file gets the
    umask's mode (filelock sets the mode it is given regardless of the umask), so a shared cache
    stays shared. Where the lock cannot be created at all (a read-only shared cache, which nobody
    fills) the block runs unlocked and concurrent fills fall back to the atomic writes alone.
    """
    path = Path(path)
    lock = FileLock(path, mode=0o666 & ~current_umask())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError as exc:
        if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
            yield path
            return
        raise
    try:
        yield path
    finally:
        lock.release()


# Bounds for JSON that several modules read, kept here (no heavy imports) so a light reader such as
# ``cl_zoo.index.search`` shares them with the module that owns the format instead of repeating a literal.
# The zoo's largest checkpoint config is 9 KB (a tier card with every seed's figures).
MAX_CHECKPOINT_CONFIG_BYTES = 4 << 20
# An embeddings ``.meta.json`` / shard ``manifest.json`` is a few hundred bytes.
MAX_EMBEDDINGS_META_BYTES = 16 << 20


def read_bounded_json(
    path: str | os.PathLike[str],
    max_bytes: int,
    what: str = "JSON file",
    *,
    error: type[ClZooError] = DataError,
) -> Any:
    """The parsed content of the JSON file ``path``, read only when it is at most ``max_bytes``.

    ``max_bytes`` is the caller's statement of what the file can reasonably hold (a config: a few KB;
    COCO's train annotations: 450 MB); ``what`` names the file in the refusal. Every failure raises
    ``error`` (a :class:`ClZooError`, so the CLI prints one line) and nothing else: callers that treat
    an unreadable file as absent (a cache entry) catch ``ClZooError``. The size is checked on the
    open descriptor before a byte is read, so a huge file costs nothing.
    """
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer that never comes.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise error(f"{path} is missing") from None
    except OSError as exc:
        raise error(f"cannot read {path} ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path} is not a regular file, so it cannot be a {what}")
        if info.st_size > max_bytes:
            raise error(f"{path} is {info.st_size} bytes, more than a {what} can be ({max_bytes} bytes)")
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read(max_bytes + 1)  # +1: a file that grew after the fstat is still caught
    except OSError as exc:
        raise error(f"cannot read {path} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise error(f"{path} grew past {max_bytes} bytes while being read; it cannot be a {what}")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError, a 5000-digit integer
        raise error(f"{path} is not valid JSON ({one_line(exc)})") from None
    # json parses a few hundred levels, but every recursive walk over the result (a config's checks, a
    # card's render) would then end in RecursionError: no file cl-zoo reads nests anywhere near this.
    if nesting_depth(data) > MAX_NESTING:
        raise error(f"{path} nests deeper than {MAX_NESTING} levels, so it cannot be a {what}")
    return data



def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name one file: the same inode when both exist (links, hard links, case
    folding), else the same absolute path with links resolved (an output not written yet)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return os.path.realpath(a) == os.path.realpath(b)


def refuse_inputs_as_outputs(
    outputs: Iterable[str | os.PathLike[str]],
    inputs: Iterable[str | os.PathLike[str]],
    *,
    error: type[ClZooError] = DataError,
) -> None:
    """One line of ``error`` when a file the command would write or delete is one of its inputs."""
    from urllib.parse import unquote, urlsplit

    outputs = [Path(o) for o in outputs]
    for given in inputs:
        text = os.fspath(given)
        if text.lower().startswith("file://"):  # a local file all the same
            text = unquote(urlsplit(text).path)
        if "://" in text or not os.path.lexists(text):  # remote URLs and patterns are never our outputs
            continue
        for out in outputs:
            if same_file(out, text):
                raise error(f"{out} is also an input ({text}); writing it would replace that input: choose another output")


def input_files(*given: str | os.PathLike[str] | None) -> list[str]:
    """The files a command reads from what the user named: each path, and the entries of a named folder
    (one level; what :func:`refuse_inputs_as_outputs` checks an output against). ``None`` and names that
    do not exist (registry names, URLs, patterns) add nothing."""
    files: list[str] = []
    for path in given:
        if path is None or not os.path.lexists(path):
            continue
        files.append(os.fspath(path))
        if os.path.isdir(path):
            with contextlib.suppress(OSError):
                files += [entry.path for entry in os.scandir(path)]
    return files


def open_regular_file(path: str | os.PathLike[str]) -> BinaryIO:
    """``open(path, "rb")`` that refuses, at once, anything but a regular file (links followed).

    A FIFO met inside an image folder or a path list blocked ``open`` until a writer came, which is
    forever: ``embed``, ``knn`` and ``linear-eval`` hung without a word. Opening non-blocking and
    checking the opened descriptor (not the name, which could be swapped in between) cannot block;
    a device such as ``/dev/zero`` is refused too, before an endless read.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket)", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_head(path: str | os.PathLike[str], size: int = 4096) -> bytes:
    """The first ``size`` bytes of a regular file (b"" when unreadable): enough to recognise a format
    without reading the file, and never blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, size)
    except OSError:
        return b""
    finally:
        os.close(fd)


def check_replaceable(
    path: str | os.PathLike[str],
    ours: Callable[[Path], bool],
    what: str,
    *,
    error: type[ClZooError] = DataError,
) -> bool:
    """Whether ``path`` exists; one line of ``error`` when it does and cannot be replaced or deleted.

    ``ours`` recognises the writer's own files by their content; ``what`` names them in the refusal
    ("an embeddings path list"). A link is refused whatever it points to (replacing it would write
    through it, or leave the user's target), and so is anything that is not a regular file.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return False
    if path.is_symlink():
        raise error(f"{path} is a symbolic link; cl-zoo writes {what} there and will not replace a link: "
                    "remove it or choose another output")
    if not path.is_file():
        raise error(f"{path} exists and is not a file; cl-zoo writes {what} there: move it away or choose another output")
    if not ours(path):
        raise error(f"{path} exists and is not {what} that cl-zoo wrote; cl-zoo will not replace it: "
                    "move it away or choose another output")
    return True


def _writable_folder(folder: Path) -> str | None:
    """Why nothing can be created in ``folder`` (None when something can).

    Probed by creating and removing a hidden file: ``os.access`` answers yes to root for /proc, /sys
    and read-only mounts, where the real write fails only after the model has loaded.
    """
    try:
        fd, name = tempfile.mkstemp(prefix=".cl-zoo-write-check.", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass
    return None


def check_output_path(
    path: str | os.PathLike[str],
    *,
    folder: bool | None = False,
    create_parents: bool = False,
    option: str = "--out",
    error: type[ClZooError] = DataError,
) -> Path:
    """Refuse, in one line of ``error``, an output that cannot be written, before any slow work.

    Every command that writes calls this first, because the writers themselves fail only at the end
    (after the model loaded, after an hour of embedding) and with a traceback. ``folder`` says the
    output is a folder (a run, a checkpoint), else a file: a folder where a file is expected (or a
    file where a folder is) is refused; ``None`` (either, decided later) checks only where it goes. The parent must exist unless ``create_parents`` (writers
    that make their parents: a run folder, a report under ``eval-reports/``), in which case the
    nearest existing ancestor must be a folder cl-zoo can create files in. ``option`` names the
    output in the message (``--out``, ``OUT``, ``--save-index``). Returns ``path`` as a Path.
    """
    text = os.fspath(path)
    path = Path(text)
    if not text:
        raise error(f"{option} is empty")
    if path.is_dir() and folder is False:
        raise error(f"{option} {text} is a folder; a file is written there: name a file")
    if os.path.lexists(path) and not path.is_dir() and folder:
        raise error(f"{option} {text} is a file; a folder is written there: name a folder")
    if folder is False and text.endswith(("/", os.sep)):
        raise error(f"{option} {text} ends in {os.sep}, which names a folder; a file is written there: name a file")
    target = path if folder is not False and path.is_dir() else path.parent
    existing = target
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing != target and not create_parents:
        raise error(f"{option} {text}: folder {target} does not exist; create it first")
    if not existing.is_dir():
        raise error(f"{option} {text}: {existing} is not a folder")
    reason = _writable_folder(existing)
    if reason is not None:
        raise error(f"{option} {text}: cannot create files in {existing} ({reason})")
    return path


def cache_root() -> Path:
    """``$CL_ZOO_CACHE`` (default ``~/.cache/cl-zoo``): shared by extracted datasets, decoded tensors
    and fetched releases. Here, in a torch-free leaf, so ``cl-zoo models`` can look in it without
    importing :mod:`cl_zoo.data` (``cl_zoo.data.archive.cache_root`` re-exports it)."""
    return Path(os.environ.get("CL_ZOO_CACHE", "~/.cache/cl-zoo")).expanduser()


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """sha256 of a whole file's bytes, read in ``chunk``-byte blocks (checkpoint pins, archive
    digests, an embeddings output's path list)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def files_fingerprint(paths: Sequence[str]) -> str:
    """sha256 over each file's absolute path, size and mtime: who the files are, without reading them.

    The file-list hash names files relative to their class folder, so it is equal for the train
    and test halves of CIFAR's ``<class>/0000.jpg`` layout and for two encodings of one dataset; a
    feature cache keyed on it alone would serve one split's features for another. This fingerprint
    tells such copies apart (and misses the cache, correctly, when files are rewritten). The int8
    calibration memo (:mod:`cl_zoo.backends.int8`) trusts it the same way, as make and ccache trust
    file stats.
    """
    digest = hashlib.sha256()
    for p in paths:
        try:
            st = os.stat(p)
        except OSError as exc:
            raise DataError(f"cannot read image {p}: {exc.strerror or exc}") from exc
        digest.update(f"{os.path.abspath(p)}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()
