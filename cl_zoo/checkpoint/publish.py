"""Publishing a checkpoint folder to the Hugging Face Hub.

A folder is checked before anything leaves the machine (its config parses, its weights load into
the architecture it names and match the checksums recorded at save time, its model card has
front matter, and the card's usage snippet, pointed at the target repo, runs against the folder:
see :mod:`cl_zoo.checkpoint.usage`), because a broken upload is public and cached by every user who
pulls it. A card written by ``save_pretrained`` names the folder's local path in its load calls;
the uploaded card names ``hf-hub:<repo id>`` there instead, and the local folder's card is left as
it was (the upload is staged from hard links, never by editing the user's files).

Uploads go through ``HfApi.create_repo`` and ``HfApi.upload_folder``; the token comes from the
argument, ``HF_TOKEN`` or the saved Hub login (``huggingface_hub.get_token``). It is never
printed or put in an error message.

Publishing many repos (``cl-zoo publish --all``: every checkpoint folder under ``model_cards/`` to
``<namespace>/<folder name>``) must be safe to re-run, so :func:`sync_folders` first compares what
it would upload (the staged files, the card as :func:`card_for_repo` rewrites it) with the files on
the repo's ``main``: a regular file by its git blob sha1, an LFS file by its sha256. A repo whose
files all match is left alone ("unchanged"); any other is uploaded as one commit that also deletes
files the folder no longer has, so the repo ends up equal to the folder. Every folder is validated
before the first upload, so one broken folder stops the run with nothing of it (or after it) pushed.

Mirrors of third-party releases (``cl-zoo publish --release NAME``) are staged by
:mod:`cl_zoo.convert.mirror` (they start from a converted release) and published with
:func:`sync_folders`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from cl_zoo.checkpoint.card import LIBRARY_NAMES, dataset_claim_conflict, how_to_load, parse_front_matter, registered_name_of
from cl_zoo.checkpoint.folder import CARD_NAME, CONFIG_NAME, load_folder, read_config, weight_files
from cl_zoo.checkpoint.hub import hub_settings, is_namespace, model_card_dirs, zoo_namespace
from cl_zoo.checkpoint.timm_compat import merged_pretrained_cfg
from cl_zoo.checkpoint.usage import USAGE_SECTION, FenceTracker, check_usage, retarget, section_text, usage_blocks
from cl_zoo.errors import CheckpointError, ClZooError, HubError, is_transport_error
from cl_zoo.text import is_repo_id, listed, one_line

# Files written by save_pretrained's staging step or editors: never part of a release.
IGNORE_PATTERNS = [".*", "**/.*", ".staging-*/**", "__pycache__/**", "*.tmp"]


@dataclass(frozen=True)
class FolderReport:
    """What :func:`validate_folder` found; printed by ``cl-zoo publish --dry-run``."""

    folder: Path
    model_name: str
    architecture: str
    num_params: int
    weight_files: list[str]
    front_matter: dict[str, Any]


@dataclass(frozen=True)
class PublishResult:
    repo_id: str
    commit: str  # the commit sha: pin it with hf-hub:<repo_id>@<commit>
    commit_url: str
    pr_url: str | None

    @property
    def load_spec(self) -> str:
        return f"hf-hub:{self.repo_id}@{self.commit}"


def validate_folder(folder: str | os.PathLike[str]) -> FolderReport:
    """Check that a folder is a complete, loadable checkpoint with a model card."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder")
    for _ in _folder_files(folder):  # links and special files refused before anything is read
        pass
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(f"{folder} has no {CONFIG_NAME}; write it with cl_zoo.save_pretrained")
    files = weight_files(folder)
    model = load_folder(folder)  # config, shapes, recorded sha256 of every weight file
    card = folder / CARD_NAME
    if not card.is_file():
        raise CheckpointError(f"{folder} has no {CARD_NAME} model card")
    try:
        meta = parse_front_matter(card.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{card}: {' '.join(str(exc).split())}") from exc
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError and friends from a hand-edited card
        raise CheckpointError(f"{card}: front matter is not valid YAML ({type(exc).__name__})") from exc
    if meta.get("library_name") not in (None, *LIBRARY_NAMES):
        expected = " or ".join(repr(name) for name in LIBRARY_NAMES)
        raise CheckpointError(f"{card}: library_name is {meta['library_name']!r}, expected {expected}")
    if conflict := dataset_claim_conflict(read_config(folder), meta.get("datasets")):
        raise CheckpointError(f"{card}: {conflict}; `cl-zoo card-update {folder}` re-renders the card from it")
    return FolderReport(
        folder=folder,
        model_name=str(getattr(model, "model_name", "")),
        architecture=str(model.arch_name),
        num_params=sum(p.numel() for p in model.parameters()),
        weight_files=files,
        front_matter=meta,
    )


def card_for_repo(
    folder: str | os.PathLike[str],
    repo_id: str,
    *,
    run_card_code: bool = False,
    echo: Callable[[str], None] | None = None,
) -> str:
    """The folder's card with its load calls naming ``hf-hub:<repo_id>``, checked without running it.

    Its "How to load" section must be the one cl-zoo generates from config.json for what is
    uploaded (the repo itself, or the registered name pinning these weights), and cl-zoo's own
    generated snippet must load the folder. The card's text is never executed unless
    ``run_card_code``: then ``echo`` shows its code first and it runs with no credentials, offline.
    One CheckpointError line for any failure.
    """
    folder = Path(folder)
    card = folder / CARD_NAME
    headings = [t for t in heading_titles(card.read_text(encoding="utf-8")) if t.casefold() == USAGE_SECTION.casefold()]
    if len(headings) > 1:
        # The Hub renders every one of them; cl-zoo checks (and a reader copies from) only one.
        raise CheckpointError(
            f"{card} has {len(headings)} '{USAGE_SECTION}' headings (a '#' line or a line underlined with ---/===); "
            f"a card has one, cl-zoo's own: re-render it with `cl-zoo card-update {folder}`"
        )
    text = retarget(card.read_text(encoding="utf-8"), folder, f"hf-hub:{repo_id}")
    config = read_config(folder)
    recorded = merged_pretrained_cfg(config).get("hf_hub_id")
    if isinstance(recorded, str) and recorded and recorded != repo_id:
        # The Hub id recorded at save time (timm's call names it): published elsewhere (--namespace,
        # a fork), the uploaded card names the repo it is uploaded to.
        text = re.sub(r"hf-hub:" + re.escape(recorded) + r"(?=[@'\"\s`]|$)", lambda _: f"hf-hub:{repo_id}", text)
    names = [n for n in [registered_name_of(config)] if n] + [f"hf-hub:{repo_id}"]
    if run_card_code:
        blocks = usage_blocks(text)
        if echo is not None:
            echo(f"running the card's own code ({card}, '## {USAGE_SECTION}'), offline and without credentials:")
            for block in blocks:
                echo("    " + block.replace("\n", "\n    "))
        if blocks and not any(name in block for block in blocks for name in names):
            raise CheckpointError(
                f"{card}: the usage snippet under '## {USAGE_SECTION}' does not load {' or '.join(names)}; "
                "write the call that loads this checkpoint there"
            )
        check_usage(text, folder, repo_id=repo_id)
        return text
    section = section_text(card.read_text(encoding="utf-8"))
    if section is None:
        raise CheckpointError(f"{card} has no '## {USAGE_SECTION}' section; a card must say how to load it")
    # What save_pretrained wrote (the folder's path), or a card already naming the repo or the registered name.
    local = [str(folder.resolve()), os.path.abspath(folder)]
    matching = [name for name in dict.fromkeys(local + names) if how_to_load(config, name, folder).strip() == section]
    if not matching:
        raise CheckpointError(
            f"{card}: its '## {USAGE_SECTION}' section is not the one cl-zoo generates from config.json "
            f"(loading {' or '.join(names)}); cl-zoo does not run a card's own code: re-render it with "
            f"`cl-zoo card-update {folder}`, or review it and pass --run-card-code"
        )
    # cl-zoo's own snippet, built from config.json, not the folder's text.
    check_usage(f"## {USAGE_SECTION}\n\n{how_to_load(config, names[0], folder)}\n", folder, repo_id=repo_id,
                card_name=f"{CARD_NAME} (cl-zoo's generated snippet)")
    return text


def _refuse_unless_regular(path: Path, folder: Path) -> None:
    """A symbolic link (or a FIFO, a device...) in a folder to publish is refused in one line.

    Uploading follows a link: ``notes.txt -> ~/.cache/huggingface/token`` would publish the token
    under the link's name. Only regular files go, so what is uploaded is what the folder holds.
    """
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise CheckpointError(
            f"{path} is a symbolic link (to {os.readlink(path)}); publish uploads regular files only, since a link "
            f"would upload whatever it points to: replace it with a copy of the file, or remove it from {folder}"
        )
    if not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
        raise CheckpointError(f"{path} is not a regular file; publish uploads regular files only: remove it from {folder}")


_ATX_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))??(?:[ \t]+#+)?[ \t]*$")
_SETEXT_UNDERLINE = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")


def heading_titles(text: str) -> list[str]:
    """The titles of every Markdown heading in ``text`` as a renderer sees them: ``#`` lines of any
    level and setext headings (text underlined with ``---``/``===``), outside code fences and the
    YAML front matter."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":  # front matter: up to the closing ---
        end = next((n for n in range(1, len(lines)) if lines[n].strip() == "---"), 0)
        lines = lines[end + 1:]
    titles: list[str] = []
    paragraph: list[str] = []
    fences = FenceTracker()
    for line in lines:
        if fences.feed(line) != "outside":
            paragraph = []
            continue
        atx = _ATX_HEADING.match(line)
        if atx:
            titles.append((atx.group(1) or "").strip())
            paragraph = []
        elif paragraph and _SETEXT_UNDERLINE.match(line):
            titles.append(" ".join(p.strip() for p in paragraph))
            paragraph = []
        else:
            paragraph = paragraph + [line] if line.strip() else []
    return titles


def _folder_files(folder: Path) -> Iterator[tuple[str, Path]]:
    """(path in the repo, local file) of everything uploaded from ``folder`` except its card, which
    is replaced by the retargeted one; hidden files, staging folders and temporaries never go. Every
    other entry must be a regular file or folder (:func:`_refuse_unless_regular`), the card included."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in dirnames:  # os.walk lists a linked folder here without entering it
            _refuse_unless_regular(Path(dirpath) / name, folder)
        rel = Path(dirpath).relative_to(folder)
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith(".tmp"):
                continue
            _refuse_unless_regular(Path(dirpath) / name, folder)
            if rel == Path(".") and name == CARD_NAME:
                continue
            yield (rel / name).as_posix(), Path(dirpath) / name


def _staged(folder: Path, card: str) -> Path:
    """A folder to upload: hard links to ``folder``'s files (copies across filesystems) plus ``card``."""
    try:
        staging = Path(tempfile.mkdtemp(prefix=".publish-", dir=folder))
    except OSError:  # a read-only checkpoint folder
        staging = Path(tempfile.mkdtemp(prefix="cl-zoo-publish-"))
    for rel, path in _folder_files(folder):
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target, follow_symlinks=False)
        except OSError:
            shutil.copy2(path, target, follow_symlinks=False)
    (staging / CARD_NAME).write_bytes(card.encode("utf-8"))
    return staging


def publish_folder(
    folder: str | os.PathLike[str],
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    token: str | None = None,
    commit_message: str | None = None,
    delete_stale: bool = False,
    run_card_code: bool = False,
    echo: Callable[[str], None] | None = None,
) -> PublishResult:
    """Validate ``folder`` and upload it to ``repo_id`` (created if needed).

    ``revision`` pushes to that branch (created from main if missing); ``create_pr`` opens a pull
    request against main instead of committing to it. The two are exclusive, as on the Hub.
    ``delete_stale`` also deletes the repo's files that the folder does not have (a shard count
    that changed), so the repo equals the folder.
    """
    check_repo_id(repo_id)
    if create_pr and revision not in (None, "main"):
        raise HubError("--create-pr opens a pull request against main; do not combine it with --revision")
    report = validate_folder(folder)
    settings = hub_settings()
    token = _write_token(settings, token)
    card = card_for_repo(report.folder, repo_id, run_card_code=run_card_code, echo=echo)
    message = commit_message or f"Upload {report.model_name or report.architecture} with cl-zoo"
    return _push(_api(settings, token), report.folder, repo_id, card, private=private, revision=revision,
                 create_pr=create_pr, message=message, delete_stale=delete_stale)


def check_repo_id(repo_id: str) -> None:
    """One line of :class:`HubError` unless ``repo_id`` is ``owner/name``, before any token or network is needed."""
    if not is_repo_id(repo_id):
        raise HubError(f"bad repo id {repo_id!r}: expected owner/name")
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # the Hub's own rules for a name

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubError(f"bad repo id {repo_id!r}: {one_line(str(exc).split(': ')[0], 200)}") from None


def _write_token(settings: dict[str, Any], token: str | None) -> str:
    """The token to write with; one-line errors for offline mode and for no token at all."""
    from huggingface_hub import get_token

    if settings["local_files_only"]:
        raise HubError("HF_HUB_OFFLINE=1 is set; unset it to publish")
    token = token or get_token()
    if not token:
        raise HubError("no Hub token: set HF_TOKEN or run `hf auth login`")
    return token


def _api(settings: dict[str, Any], token: str | None) -> Any:
    from huggingface_hub import HfApi

    return HfApi(endpoint=settings["endpoint"], token=token or None)


def _push(
    api: Any, folder: Path, repo_id: str, card: str, *, private: bool = False, revision: str | None = None,
    create_pr: bool = False, message: str, delete_stale: bool = False,
) -> PublishResult:
    """Upload ``folder`` (with ``card`` as its README.md) in one commit; errors are one line."""
    from huggingface_hub.errors import HfHubHTTPError

    staging = _staged(folder, card)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(staging),
            repo_type="model",
            revision=revision,
            create_pr=create_pr,
            commit_message=message,
            ignore_patterns=list(IGNORE_PATTERNS),
            # .gitattributes is never deleted by huggingface_hub, whatever the pattern.
            delete_patterns=["*"] if delete_stale else None,
        )
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        hint = " (check that the token has write access)" if status in (401, 403) else ""
        raise HubError(f"could not publish to {repo_id}: {one_line(exc, 300)}{hint}") from exc
    except ValueError as exc:
        raise HubError(f"could not publish to {repo_id}: {one_line(exc, 300)}") from exc
    except Exception as exc:  # noqa: BLE001 - transport errors of the client's HTTP stack
        if not is_transport_error(exc):
            raise
        raise HubError(f"could not publish to {repo_id}: {api.endpoint} cannot be reached ({type(exc).__name__})") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PublishResult(repo_id=repo_id, commit=info.oid, commit_url=info.commit_url, pr_url=info.pr_url)


# --------------------------------------------------------------------------------------------------
# Many folders, idempotently: compare with the Hub, upload what differs, record what was pushed
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalFile:
    """What the Hub would report for a file: its git blob sha1 (regular files) and sha256 (LFS)."""

    sha256: str
    git_sha1: str
    size: int = 0


def _digest(data: bytes | Path) -> LocalFile:
    if isinstance(data, bytes):
        return LocalFile(hashlib.sha256(data).hexdigest(),
                         hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), len(data))
    # O_NOFOLLOW: a file swapped for a link after the folder was checked is an error, not its target's bytes
    try:
        fd = os.open(data, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise CheckpointError(f"cannot read {data} ({exc.strerror or exc}); publish uploads regular files only") from None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        sha256 = hashlib.sha256()
        sha1 = hashlib.sha1(b"blob %d\0" % size)
        while chunk := fh.read(1 << 20):
            sha256.update(chunk)
            sha1.update(chunk)
    return LocalFile(sha256.hexdigest(), sha1.hexdigest(), size)


def file_lines(files: dict[str, LocalFile]) -> list[str]:
    """One line per file to upload, with its size and sha256: what ``--dry-run`` shows, so a reviewer
    sees every file that would leave the machine, not just how many."""
    width = max((len(path) for path in files), default=0)
    return [f"  {path:<{width}}  {f.size:>12,} bytes  sha256 {f.sha256}" for path, f in files.items()]


def local_files(folder: str | os.PathLike[str], card: str) -> dict[str, LocalFile]:
    """Digests of exactly what :func:`publish_folder` would upload from ``folder`` with ``card``."""
    files = {rel: _digest(path) for rel, path in _folder_files(Path(folder))}
    files[CARD_NAME] = _digest(card.encode("utf-8"))
    return dict(sorted(files.items()))


# Files the Hub itself puts in every repo (create_repo's first commit): not part of what we compare.
HUB_OWN_FILES = frozenset({".gitattributes"})


def remote_files(api: Any, repo_id: str) -> tuple[str | None, dict[str, Any]]:
    """(main's commit sha, path -> RepoFile) of ``repo_id``; (None, {}) when the repo or main does not
    exist. Network failures propagate (the caller decides whether that is an error)."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        commit = api.model_info(repo_id, revision="main").sha
        tree = api.list_repo_tree(repo_id, revision=commit, recursive=True, repo_type="model")
        files = {entry.path: entry for entry in tree if hasattr(entry, "blob_id")}  # RepoFolder has none
    except (RepositoryNotFoundError, RevisionNotFoundError):  # a new repo (or one without main)
        return None, {}
    return commit, {path: entry for path, entry in files.items() if path not in HUB_OWN_FILES}


def differences(local: dict[str, LocalFile], remote: dict[str, Any]) -> list[str]:
    """Repo paths whose content differs, is new, or would be deleted; [] when the repo already matches."""
    changed = []
    for path in sorted(set(local) | set(remote)):
        mine, theirs = local.get(path), remote.get(path)
        if mine is None or theirs is None:
            changed.append(path)
            continue
        lfs = getattr(theirs, "lfs", None)
        same = (lfs.sha256 == mine.sha256) if lfs is not None else (theirs.blob_id == mine.git_sha1)
        if not same:
            changed.append(path)
    return changed


@dataclass
class Plan:
    """What publishing one folder to one repo would do."""

    folder: Path
    repo_id: str
    report: FolderReport
    card: str
    files: dict[str, LocalFile]
    remote_commit: str | None = None  # main's commit now (None: new repo, or could not tell)
    changes: list[str] | None = None  # paths that differ; None: could not tell (offline, unreachable)
    unknown_reason: str = ""
    new_repo: bool = False

    @property
    def unchanged(self) -> bool:
        return self.changes == []


@dataclass(frozen=True)
class SyncResult:
    repo_id: str
    folder: Path
    action: str  # uploaded | unchanged | would-upload | unknown (dry run, Hub not reachable)
    commit: str | None
    files: dict[str, str] = field(default_factory=dict)  # path in the repo -> sha256


def _naming(exc: ClZooError, folder: Path, repo_id: str) -> ClZooError:
    """The same error, its one line naming the folder and the repo (so a run of many says which)."""
    message = " ".join(str(exc).split())
    missing = [name for name in (repo_id, str(folder)) if name not in message]
    if missing:
        message = (f"{missing[0]} ({missing[1]})" if len(missing) == 2 else missing[0]) + f": {message}"
    try:
        return type(exc)(message)
    except Exception:  # noqa: BLE001 - an error class with another constructor
        return ClZooError(message)


def plan_folder(folder: Path, repo_id: str, api: Any | None, *, dry_run: bool, run_card_code: bool = False,
                echo: Callable[[str], None] | None = None) -> Plan:
    """Validate ``folder`` for ``repo_id`` and compare it with the repo (``api`` None: offline).

    The card's usage snippet (a subprocess, seconds) runs when the folder will be uploaded, or
    always in a dry run; a repo that already holds these exact bytes got that check when they
    were uploaded.
    """
    from huggingface_hub.errors import HfHubHTTPError

    report = validate_folder(folder)
    card = retarget((report.folder / CARD_NAME).read_text(encoding="utf-8"), report.folder, f"hf-hub:{repo_id}")
    plan = Plan(report.folder, repo_id, report, card, local_files(report.folder, card))
    if api is None:
        plan.unknown_reason = "offline (HF_HUB_OFFLINE=1)"
    else:
        try:
            commit, remote = remote_files(api, repo_id)
        except (HfHubHTTPError, OSError, ValueError) as exc:
            if not dry_run:
                raise HubError(f"cannot read {repo_id} on the Hub to compare: {one_line(exc, 300)}") from exc
            plan.unknown_reason = f"the Hub answered {one_line(exc, 300)[:120]}"
        except Exception as exc:  # noqa: BLE001 - transport errors of the client's HTTP stack
            if not is_transport_error(exc):
                raise
            if not dry_run:
                raise HubError(f"cannot read {repo_id}: {api.endpoint} cannot be reached ({type(exc).__name__})") from exc
            plan.unknown_reason = f"{api.endpoint} cannot be reached"
        else:
            plan.remote_commit, plan.new_repo = commit, commit is None
            plan.changes = differences(plan.files, remote)
    if dry_run or not plan.unchanged:
        checked = card_for_repo(report.folder, repo_id, run_card_code=run_card_code, echo=echo)
        if checked != plan.card:  # never expected; keep the digests true to what is uploaded
            plan.card, plan.files = checked, local_files(report.folder, checked)
    return plan


def _record(path: Path, result: SyncResult) -> None:
    """Append one JSON line: what is on the repo now, and whether this run pushed it."""
    line = {
        "repo_id": result.repo_id,
        "action": result.action,
        "commit": result.commit,
        "files": result.files,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")


def _summary(plan: Plan) -> str:
    if plan.new_repo:
        return f"new repo, {len(plan.files)} files"
    changes = plan.changes or []
    return f"{len(changes)} file(s) differ: {listed(changes, 6)}"


def sync_folders(
    items: Sequence[tuple[Path, str]],
    *,
    dry_run: bool = False,
    record: str | os.PathLike[str] | None = None,
    private: bool = False,
    commit_message: str | None = None,
    token: str | None = None,
    echo: Callable[[str], None] = print,
    run_card_code: bool = False,
) -> list[SyncResult]:
    """Publish each (folder, repo id), skipping repos that already hold exactly those files.

    Every folder is validated (and compared with its repo) before anything is uploaded, so a
    broken folder stops the run with nothing uploaded. ``record`` gets one JSON line per repo
    (not in a dry run: nothing was pushed). Errors are one line naming the folder and repo.
    """
    for _, repo_id in items:
        check_repo_id(repo_id)
    settings = hub_settings()
    if not dry_run:
        token = _write_token(settings, token)
    else:
        from huggingface_hub import get_token

        token = token or get_token()
    api = None if settings["local_files_only"] else _api(settings, token)
    plans: list[Plan] = []
    for folder, repo_id in items:
        try:
            plans.append(plan_folder(Path(folder), repo_id, api, dry_run=dry_run, run_card_code=run_card_code, echo=echo))
        except ClZooError as exc:
            raise _naming(exc, Path(folder), repo_id) from exc
    results: list[SyncResult] = []
    for plan in plans:
        digests = {path: f.sha256 for path, f in plan.files.items()}
        if dry_run:
            if plan.changes is None:
                action, text = "unknown", (f"would upload: {plan.repo_id} unless the Hub already has these "
                                           f"{len(plan.files)} files (cannot tell: {plan.unknown_reason})")
            elif plan.unchanged:
                action, text = "unchanged", f"unchanged: {plan.repo_id} (nothing to upload)"
            else:
                action, text = "would-upload", f"would upload: {plan.repo_id} ({_summary(plan)})"
            echo(f"{text}; validated {plan.folder}")
            result = SyncResult(plan.repo_id, plan.folder, action, plan.remote_commit, digests)
        elif plan.unchanged:
            echo(f"unchanged: {plan.repo_id}")
            result = SyncResult(plan.repo_id, plan.folder, "unchanged", plan.remote_commit, digests)
        else:
            message = commit_message or f"Upload {plan.report.model_name or plan.report.architecture} with cl-zoo"
            try:
                pushed = _push(api, plan.folder, plan.repo_id, plan.card, private=private, message=message,
                               delete_stale=True)
            except ClZooError as exc:
                raise _naming(exc, plan.folder, plan.repo_id) from exc
            echo(f"uploaded: {plan.repo_id} @ {pushed.commit} ({_summary(plan)}) {pushed.commit_url}")
            result = SyncResult(plan.repo_id, plan.folder, "uploaded", pushed.commit, digests)
        if record is not None and not dry_run:
            _record(Path(record), result)
        results.append(result)
    if dry_run:  # after the verdicts: every file each repo would get, so nothing leaves unseen
        for plan in plans:
            echo(f"files for {plan.repo_id} ({len(plan.files)}, from {plan.folder}):")
            for line in file_lines(plan.files):
                echo(line)
    return results


def zoo_folders(model_cards: str | os.PathLike[str]) -> list[Path]:
    """The checkpoint folders (a ``config.json`` inside) directly under ``model_cards``, by name."""
    root = Path(model_cards)
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a folder")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / CONFIG_NAME).is_file())
    if not folders:
        raise CheckpointError(f"{root} holds no checkpoint folders (sub-folders with a {CONFIG_NAME})")
    return folders


def default_model_cards() -> Path:
    """The first of :func:`cl_zoo.checkpoint.hub.model_card_dirs` that exists."""
    dirs = model_card_dirs()
    for folder in dirs:
        if folder.is_dir():
            return folder
    raise CheckpointError(f"no model_cards folder found (looked in {', '.join(map(str, dirs))}); pass --model-cards DIR")


def check_namespace(namespace: str) -> str:
    """A Hub user or organisation name (the same rule as CL_ZOO_HUB_NAMESPACE)."""
    if not is_namespace(namespace):
        raise HubError(f"--namespace {namespace!r} is not a Hub user or organisation name")
    return namespace


def publish_all(
    model_cards: str | os.PathLike[str] | None = None,
    namespace: str | None = None,
    **kwargs: Any,
) -> list[SyncResult]:
    """Publish every checkpoint folder under ``model_cards`` to ``<namespace>/<folder name>``
    (defaults: the bundled model_cards, :func:`cl_zoo.checkpoint.hub.zoo_namespace`)."""
    namespace = check_namespace(namespace) if namespace is not None else zoo_namespace()
    folders = zoo_folders(model_cards if model_cards is not None else default_model_cards())
    return sync_folders([(folder, f"{namespace}/{folder.name}") for folder in folders], **kwargs)
