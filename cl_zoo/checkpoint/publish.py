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
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cl_zoo.checkpoint.folder import CARD_NAME, CONFIG_NAME, load_folder, weight_files
from cl_zoo.errors import CheckpointError, HubError

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
    from cl_zoo.checkpoint.card import parse_front_matter

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder")
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
    if meta.get("library_name") not in (None, "cl-zoo"):
        raise CheckpointError(f"{card}: library_name is {meta['library_name']!r}, expected 'cl-zoo'")
    return FolderReport(
        folder=folder,
        model_name=str(getattr(model, "model_name", "")),
        architecture=str(model.arch_name),
        num_params=sum(p.numel() for p in model.parameters()),
        weight_files=files,
        front_matter=meta,
    )


def card_for_repo(folder: str | os.PathLike[str], repo_id: str) -> str:
    """The folder's card with its load calls naming ``hf-hub:<repo_id>``, after checking that its
    usage snippet runs against the folder (CheckpointError, one line, when it does not)."""
    from cl_zoo.checkpoint.card import registered_name_of
    from cl_zoo.checkpoint.usage import check_usage, retarget, usage_blocks
    from cl_zoo.checkpoint.folder import read_config

    folder = Path(folder)
    card = folder / CARD_NAME
    text = retarget(card.read_text(encoding="utf-8"), folder, f"hf-hub:{repo_id}")
    # The snippet must load what is uploaded: the repo itself, or the registered name pinning these weights.
    names = [f"hf-hub:{repo_id}"] + [n for n in [registered_name_of(read_config(folder))] if n]
    blocks = usage_blocks(text)  # none: check_usage says so
    if blocks and not any(name in block for block in blocks for name in names):
        raise CheckpointError(
            f"{card}: the usage snippet under '## How to load' does not load {' or '.join(names)}; "
            "write the call that loads this checkpoint there"
        )
    check_usage(text, folder, repo_id=repo_id)
    return text


def _staged(folder: Path, card: str) -> Path:
    """A folder to upload: hard links to ``folder``'s files (copies across filesystems) plus ``card``."""
    try:
        staging = Path(tempfile.mkdtemp(prefix=".publish-", dir=folder))
    except OSError:  # a read-only checkpoint folder
        staging = Path(tempfile.mkdtemp(prefix="cl-zoo-publish-"))
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
        rel = Path(dirpath).relative_to(folder)
        for name in filenames:
            if name.startswith(".") or name.endswith(".tmp") or (rel == Path(".") and name == CARD_NAME):
                continue
            target = staging / rel / name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(Path(dirpath) / name, target)
            except OSError:
                shutil.copy2(Path(dirpath) / name, target)
    (staging / CARD_NAME).write_text(card, encoding="utf-8")
    return staging


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def publish_folder(
    folder: str | os.PathLike[str],
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    token: str | None = None,
    commit_message: str | None = None,
) -> PublishResult:
    """Validate ``folder`` and upload it to ``repo_id`` (created if needed).

    ``revision`` pushes to that branch (created from main if missing); ``create_pr`` opens a pull
    request against main instead of committing to it. The two are exclusive, as on the Hub.
    """
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    from cl_zoo.checkpoint.hub import hub_settings

    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise HubError(f"bad repo id {repo_id!r}: expected owner/name")
    if create_pr and revision not in (None, "main"):
        raise HubError("--create-pr opens a pull request against main; do not combine it with --revision")
    report = validate_folder(folder)
    settings = hub_settings()
    if settings["local_files_only"]:
        raise HubError("HF_HUB_OFFLINE=1 is set; unset it to publish")
    token = token or get_token()
    if not token:
        raise HubError("no Hub token: set HF_TOKEN or run `hf auth login`")
    card = card_for_repo(report.folder, repo_id)
    api = HfApi(endpoint=settings["endpoint"], token=token)
    message = commit_message or f"Upload {report.model_name or report.architecture} with cl-zoo"
    staging = _staged(report.folder, card)
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
        )
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        hint = " (check that the token has write access)" if status in (401, 403) else ""
        raise HubError(f"could not publish to {repo_id}: {_one_line(exc)}{hint}") from exc
    except ValueError as exc:
        raise HubError(f"could not publish to {repo_id}: {_one_line(exc)}") from exc
    except Exception as exc:  # noqa: BLE001 - transport errors of the client's HTTP stack
        if type(exc).__module__.split(".")[0] not in {"httpx", "httpx2", "httpcore"}:
            raise
        endpoint = settings["endpoint"] or api.endpoint
        raise HubError(f"could not publish to {repo_id}: {endpoint} cannot be reached ({type(exc).__name__})") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PublishResult(repo_id=repo_id, commit=info.oid, commit_url=info.commit_url, pr_url=info.pr_url)
