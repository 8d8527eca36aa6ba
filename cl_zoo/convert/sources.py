"""Fetch a registered release from its sources, in order: verify, convert once, cache.

A :class:`~cl_zoo.models.releases.Release` lists its sources (a Hub file first where one exists,
then published URLs). :func:`load_release` returns the cached zoo folder when there is one;
otherwise it tries each source in turn -- the Hub through ``huggingface_hub.hf_hub_download``
(pinned revision, the HF cache, ``HF_ENDPOINT``/``HF_HUB_OFFLINE``/``HF_HUB_CACHE`` re-read on
every call), URLs through ``torch.hub.download_url_to_file`` (see :func:`download`) -- checks the
checksum the publisher gives for that source,
converts the file with its layout's reader and caches the result under
``$CL_ZOO_CACHE/releases/<name>``. When every publisher source fails and the release has a
mirror (:data:`cl_zoo.models.releases.MIRRORS`: a zoo Hub repo made by ``cl-zoo publish
--release``), the converted folder comes from there instead, through
:func:`cl_zoo.checkpoint.hub.download_folder`, and only after every weights file matches the sha256
recorded in the registry (the mirror's own config is not trusted for that). When no source works,
the error is one line naming every source tried, the mirror included, and why it failed.

Published links are stored verbatim; :func:`direct_url` is the only place where one is turned into
a direct-download address (documented per host below).
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import socket
import sys
import tempfile
import urllib.error
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cl_zoo.checkpoint.hub import download_folder, hub_settings
from cl_zoo.checkpoint.layout import CARD_NAME, CONFIG_NAME, INDEX_NAME
from cl_zoo.errors import CheckpointError, ClZooError, HubError, is_transport_error
from cl_zoo.fileio import cache_root as cl_zoo_cache
from cl_zoo.fileio import file_lock
from cl_zoo.models.releases import MIRRORS, RELEASES

if TYPE_CHECKING:
    import torch.nn as nn

_TRUE = {"1", "ON", "YES", "TRUE"}
_DRIVE_VIEW = re.compile(r"^https://drive\.google\.com/file/d/([\w-]+)/view")
_DROPBOX_FOLDER = re.compile(r"^(https://www\.dropbox\.com/sh/[\w-]+/[\w-]+)\?dl=0$")


def cache_root() -> Path:
    """``$CL_ZOO_CACHE/releases`` (default ``~/.cache/cl-zoo/releases``)."""
    return cl_zoo_cache() / "releases"


def offline() -> bool:
    """``CL_ZOO_OFFLINE`` or ``HF_HUB_OFFLINE``, read now (not at import)."""
    return any((os.environ.get(v) or "").strip().upper() in _TRUE for v in ("CL_ZOO_OFFLINE", "HF_HUB_OFFLINE"))


def direct_url(url: str, member: str | None = None) -> str:
    """The address that serves a published link's bytes.

    * Google Drive publishes a viewer page (``drive.google.com/file/d/<id>/view?...``); the same
      file's bytes come from ``drive.usercontent.google.com/download?id=<id>&export=download&confirm=t``
      (``confirm=t`` skips the "cannot scan large files for viruses" interstitial).
    * A Dropbox shared-folder link (``.../sh/<a>/<b>?dl=0``) is a folder preview; a file inside it is
      ``.../sh/<a>/<b>/<member>?dl=1`` (``dl=1`` asks for the bytes).
    * Anything else is used exactly as published.
    """
    if found := _DRIVE_VIEW.match(url):
        return f"https://drive.usercontent.google.com/download?id={found.group(1)}&export=download&confirm=t"
    if member is not None:
        if not (found := _DROPBOX_FOLDER.match(url)):
            raise HubError(f"do not know how to fetch {member} from the shared folder {url}")
        return f"{found.group(1)}/{urllib.parse.quote(member)}?dl=1"
    return url


_HASH_REFUSED = re.compile(r'invalid hash value \(expected "(?P<expected>[0-9a-f]*)", got "(?P<got>[0-9a-f]*)"\)')


def _default_progress() -> bool:
    """A progress bar on an interactive terminal, unless huggingface_hub's switch turns them off."""
    disabled = (os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") or "").strip().upper() in _TRUE
    return not disabled and sys.stderr.isatty()


def download(url: str, dest: Path, *, sha256: str | None = None, progress: bool | None = None,
             timeout: float = 60.0) -> Path:
    """Fetch ``url`` into ``dest`` with ``torch.hub.download_url_to_file``: errors are one line.

    torch.hub (what torchvision and timm download published weights with) writes to a
    ``<dest>.<uuid>.partial`` file beside ``dest``, moves it into place only once it is complete and,
    given ``sha256`` (passed as its ``hash_prefix``: the whole digest is a prefix of itself), only
    when it matches; the partial file is deleted otherwise, so neither a broken nor a wrong download
    is ever found at ``dest``. Its tqdm bar goes to stderr (``progress``; default: on a terminal,
    unless ``HF_HUB_DISABLE_PROGRESS_BARS`` is set). It neither retries nor resumes: a refused or
    unresolvable host fails at once, so a release's next source is tried without a retry loop. It
    sets no timeout of its own either (``urlopen`` without one), so a host that accepts the
    connection and then stalls would hang the command: the socket default is set to ``timeout``
    seconds for the call (per blocking read, not for the whole file) and restored after it. Offline mode (``CL_ZOO_OFFLINE``/``HF_HUB_OFFLINE``) is refused
    before any connection. A checksum mismatch is a :class:`CheckpointError`; anything else that
    stops the download is a :class:`HubError` naming ``url``.
    """
    from torch.hub import download_url_to_file  # torch, only when a URL is downloaded

    if offline():
        raise HubError(f"cannot download {url}: offline mode (CL_ZOO_OFFLINE/HF_HUB_OFFLINE) forbids the network; "
                       f"unset it, or put the file at {dest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)
    try:
        download_url_to_file(url, str(dest), hash_prefix=sha256 or None,
                             progress=_default_progress() if progress is None else progress)
    except TimeoutError as exc:
        raise HubError(f"cannot download {url} (no data for {timeout:g} s)") from exc
    except RuntimeError as exc:
        refused = _HASH_REFUSED.search(str(exc))
        if refused is None:
            raise
        raise CheckpointError(f"checksum mismatch for {url}: expected sha256 {refused['expected'][:16]}..., "
                              f"got {refused['got'][:16]}...; the download was discarded") from exc
    except urllib.error.HTTPError as exc:
        raise HubError(f"cannot download {url} (HTTP {exc.code} {' '.join(str(exc.reason).split())[:120]})") from exc
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        text = " ".join(str(reason).split())[:160] or type(exc).__name__
        raise HubError(f"cannot download {url} ({text})") from exc
    finally:
        socket.setdefaulttimeout(previous)
    return dest


def _verify(path: Path, source: Any, *, quarantine: bool) -> None:
    """The publisher's checksum for this source, when there is one; a mismatch is an integrity error."""
    from cl_zoo.convert.readers import file_digests  # imports torch

    sha, md5 = file_digests(path)
    md5_prefix = getattr(source, "md5_prefix", None)
    if (source.sha256 and sha != source.sha256) or (md5_prefix and not md5.startswith(md5_prefix)):
        expected = f"sha256 {source.sha256[:16]}..." if source.sha256 else f"md5 {md5_prefix}..."
        kept = ""
        if quarantine:
            bad = path.with_name(path.name + ".bad")
            os.replace(path, bad)
            kept = f"; kept as {bad} for inspection"
        raise CheckpointError(f"checksum mismatch for {source.describe()}: expected {expected}, "
                              f"got sha256 {sha[:16]}... / md5 {md5[:8]}...{kept}")


def _fetch_hub(source: Any) -> Path:
    from huggingface_hub import hf_hub_download  # heavy import, made only when the Hub is used
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    settings = hub_settings()
    local_only = bool(settings["local_files_only"]) or offline()
    try:
        path = hf_hub_download(
            source.repo_id, source.filename, revision=source.revision, cache_dir=settings["cache_dir"],
            endpoint=settings["endpoint"], local_files_only=local_only,
        )
    except RepositoryNotFoundError as exc:
        raise HubError("repo not found (or private without a token)") from exc
    except RevisionNotFoundError as exc:
        raise HubError(f"no revision {source.revision}") from exc
    except LocalEntryNotFoundError as exc:  # before EntryNotFoundError, its base class
        why = "offline mode (HF_HUB_OFFLINE/CL_ZOO_OFFLINE) forbids the network" if local_only else "the Hub cannot be reached"
        raise HubError(f"not in the HF cache and {why}") from exc
    except EntryNotFoundError as exc:
        raise HubError(f"no file {source.filename} at that revision") from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise HubError(" ".join(str(exc).split())[:160]) from exc
    except Exception as exc:  # noqa: BLE001 - transport errors of the client's HTTP stack (httpx)
        if not is_transport_error(exc):
            raise
        raise HubError(f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}") from exc
    return Path(path)


def _fetch_url(source: Any, dest: Path) -> Path:
    """``dest`` when a previous run left it there, else the source's file downloaded to it (checked
    against the source's sha256 on the way in); errors leave out the URL, which the caller names."""
    if not dest.is_file():
        if offline():
            raise HubError("not cached and offline mode (CL_ZOO_OFFLINE/HF_HUB_OFFLINE) forbids downloading; "
                           f"unset it, or download the file yourself and put it at {dest}")
        url = direct_url(source.url, source.member)
        try:
            download(url, dest, sha256=getattr(source, "sha256", None))
        except ClZooError as exc:
            message = str(exc).replace(f"cannot download {url} ", "cannot download ")
            raise type(exc)(message.replace(f"checksum mismatch for {url}: ", "checksum mismatch: ")) from exc
    return dest


def _first_file(release: Any) -> tuple[tuple[Path, Any] | None, list[str], bool]:
    """Try the publisher's sources in order: ((path, source) or None, failures, any integrity failure)."""
    failures: list[str] = []
    integrity = False
    for source in release.sources:
        try:
            if hasattr(source, "repo_id"):
                path = _fetch_hub(source)
                _verify(path, source, quarantine=False)  # the HF cache is huggingface_hub's to manage
            else:
                path = _fetch_url(source, cache_root() / "downloads" / release.filename)
                _verify(path, source, quarantine=True)
            return (path, source), failures, integrity
        except ClZooError as exc:
            integrity = integrity or isinstance(exc, CheckpointError)
            failures.append(f"{source.describe()} ({exc})")
    return None, failures, integrity


def _no_source(failures: list[str], integrity: bool) -> ClZooError:
    message = "no source could be used; tried " + "; ".join(f"{i}) {text}" for i, text in enumerate(failures, 1))
    # A source that answered with wrong bytes is an integrity problem, not an availability one.
    return (CheckpointError if integrity else HubError)(message)


def fetch_release_file(release: Any) -> tuple[Path, Any]:
    """The first source that yields a file passing its checksum: (local path, source)."""
    found, failures, integrity = _first_file(release)
    if found is None:
        raise _no_source(failures, integrity)
    return found


def _copy_from_mirror(name: str, mirror: Any, folder: Path) -> None:
    """Download ``mirror``, check it against its registry pins, and install it as the cache folder.

    Every weights file in the repo must be pinned and match (an unpinned extra shard would be
    weights nobody vouched for), and the repo must say it mirrors this release. The copy then
    sits where a conversion would have put it, so later loads neither retry dead publisher links
    nor need the network.
    """
    from cl_zoo.checkpoint.folder import load_folder, read_config, weight_files  # imports torch

    snapshot = download_folder(mirror.repo_id)
    pins = dict(mirror.sha256)
    present = set(weight_files(snapshot))
    if present != set(pins):
        raise CheckpointError(f"its weights files ({', '.join(sorted(present)) or 'none'}) are not the pinned "
                              f"ones ({', '.join(sorted(pins))})")
    load_folder(snapshot, sha256=pins, model_name=name)  # every pin verified, shapes and values checked
    config = read_config(snapshot)
    info = config.get("mirror")
    mirrored = info.get("release") if isinstance(info, dict) else None
    if mirrored != name:
        raise CheckpointError(f"its config.json says it mirrors {mirrored!r}, not {name!r}")
    if any((config.get("files") or {}).get(k) != v for k, v in pins.items()):
        raise CheckpointError("its config.json records other sha256 digests than the registry's pins")
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.mirror-", dir=folder.parent))
    try:
        for member in [CONFIG_NAME, CARD_NAME, INDEX_NAME, *present]:
            if (snapshot / member).is_file():
                shutil.copyfile(snapshot / member, staging / member)  # the HF cache holds symlinks to blobs
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def release_folder(name: str, arch: str | None = None, *, mirror: bool = True) -> Path:
    """The cached zoo folder of release ``name``: fetched, verified and converted once.

    ``mirror=False`` uses the publisher's sources only (building a mirror from a mirror would
    launder it); a folder already cached is returned either way, since it passed its checks.
    """
    from cl_zoo.convert.readers import import_checkpoint  # imports torch

    release = RELEASES.get(name)
    if release is None:
        raise HubError(f"{name} has no published release to fetch")
    folder = cache_root() / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    # One process downloads, verifies and converts; another asking at the same time waits on the
    # lock (a file beside the cache entry), then finds the finished folder.
    with file_lock(folder.with_name(f".{folder.name}.lock")):
        if (folder / CONFIG_NAME).is_file():
            return folder
        found, failures, integrity = _first_file(release)
        if found is not None:
            raw, source = found
            import_checkpoint(release.format, raw, folder, arch=arch or release.arch, origin=source.describe(),
                              release_name=name)
            return folder
        pinned = MIRRORS.get(name) if mirror else None
        if pinned is not None:
            try:
                _copy_from_mirror(name, pinned, folder)
                return folder
            except ClZooError as exc:
                integrity = integrity or isinstance(exc, CheckpointError)
                failures.append(f"{pinned.describe()} ({' '.join(str(exc).split())})")
        raise _no_source(failures, integrity)


def load_release(entry: Any) -> "nn.Module":
    """A registered release as a zoo model: cached folder, or fetched (publisher first, then its
    mirror), verified and converted once."""
    from cl_zoo.checkpoint.folder import load_folder  # imports torch

    folder = release_folder(entry.name, entry.arch)
    model = load_folder(folder, model_name=entry.name)
    model.checkpoint_source = str(folder)
    return model
