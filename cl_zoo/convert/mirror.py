"""Mirrors of third-party releases: ``cl-zoo publish --release NAME``.

A release whose licence allows redistribution (:data:`cl_zoo.models.releases.REDISTRIBUTION`;
refused otherwise, before any download) is fetched and converted as
:func:`cl_zoo.convert.sources.load_release` does, then published as a zoo repo whose ``config.json``
carries a ``mirror`` object (release, the publisher's Hub repo as ``base_model``, pages, licence) and
whose card has a "Provenance" section.

This lives in ``convert/`` rather than ``checkpoint/`` because a mirror starts from a converted
release (:func:`cl_zoo.convert.sources.release_folder`) and ends as an ordinary publish
(:func:`cl_zoo.checkpoint.publish.sync_folders`): ``convert`` already sits above ``checkpoint``
(its readers write checkpoint folders), so every import here points down, where the same code in
``checkpoint/`` would import ``convert`` back up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cl_zoo.checkpoint.card import extra_sections, render_card
from cl_zoo.checkpoint.folder import CARD_NAME, CONFIG_NAME, INDEX_NAME, read_config, sha256_file, weight_files
from cl_zoo.checkpoint.publish import SyncResult, check_repo_id, sync_folders
from cl_zoo.convert.sources import release_folder
from cl_zoo.errors import ClZooError, HubError
from cl_zoo.fileio import atomic_write_json, atomic_write_text
from cl_zoo.models.releases import RELEASES, HubSource, Redistribution, Release
from cl_zoo.registry import get_pretrained

__all__ = [
    "RedistributionError",
    "check_redistribution",
    "mirror_info",
    "mirror_pins",
    "provenance_section",
    "publish_release",
    "stage_mirror",
]


class RedistributionError(ClZooError):
    """A release whose licence does not allow publishing a copy."""


def check_redistribution(release: Release) -> Redistribution:
    """The release's :class:`~cl_zoo.models.releases.Redistribution`; a one-line refusal naming the
    licence and its page when copies may not be published."""
    terms = release.redistribution
    if not terms.allowed:
        quote = " ".join(release.licence_quote.split())
        raise RedistributionError(
            f"refusing to mirror {release.name}: its licence ({release.licence or 'none'}; {release.licence_page} "
            f"says \"{quote}\") does not allow redistribution: {terms.terms}"
        )
    return terms


def mirror_info(release: Release) -> dict[str, Any]:
    """The ``mirror`` object of a mirror's config.json: where the weights came from and on what terms."""
    hub = next((s for s in release.sources if isinstance(s, HubSource)), None)
    pages = list(dict.fromkeys(s.page for s in release.sources))
    return {
        "release": release.name,
        "base_model": hub.repo_id if hub is not None else None,
        "pages": pages,
        "licence_page": release.licence_page,
        "licence_quote": release.licence_quote,
        "licence": release.licence,
        "redistribution": release.redistribution.terms,
    }


def provenance_section(release: Release, info: dict[str, Any], origin: str | None) -> str:
    """The card's "Provenance" section: who published the weights, where they came from, on what terms."""
    quote = " / ".join(line.strip() for line in release.licence_quote.splitlines())
    lines = [
        f"This repository is a copy of the release `{release.name}`, published by {release.trained_by}. "
        f"cl-zoo downloaded it from {origin or 'its first working source'} (checked against the publisher's "
        "checksum where one is published) and converted it losslessly to safetensors (backbone only); "
        "it is mirrored so the weights stay available if the original links go away.",
        "",
        "Original pages:",
        *(f"- {page}" for page in info["pages"]),
    ]
    if info["base_model"]:
        lines += ["", f"Original Hub repo (base model): [{info['base_model']}](https://huggingface.co/{info['base_model']})."]
    lines += [
        "",
        f"Licence: **{release.licence}**, as stated at {release.licence_page}: \"{quote}\". "
        f"Redistribution: {release.redistribution.terms}.",
    ]
    if "nc" in release.licence.split("-"):
        lines += ["", "**Non-commercial use only.** These weights are under a NonCommercial licence; "
                      "using them, from this mirror or the original, is bound by its terms."]
    return "\n".join(lines)


def stage_mirror(name: str, dest: str | os.PathLike[str]) -> Path:
    """Write the mirror folder of release ``name`` into ``dest``: the cached conversion's weights
    (hard links), its config.json plus ``mirror``, and a card with a "Provenance" section.

    The licence is checked first, so a refused release is never downloaded. config.json and the card
    are written atomically (fileio): a ``dest`` left by an earlier run may hold them as hard links
    into the conversion cache, which writing in place would change too.
    """
    release = RELEASES.get(name)
    if release is None:
        get_pretrained(name)  # an unknown name: the "did you mean" error
        raise HubError(f"{name} is not a third-party release (those are listed by `cl-zoo models --pretrained '*.in1k*'`)")
    check_redistribution(release)
    source = release_folder(name, get_pretrained(name).arch, mirror=False)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    config = read_config(source)
    info = mirror_info(release)
    config["mirror"] = info
    for member in [*weight_files(source), INDEX_NAME]:
        if (source / member).is_file():
            try:
                os.link(source / member, dest / member)
            except OSError:
                shutil.copy2(source / member, dest / member)
    atomic_write_json(dest / CONFIG_NAME, config, indent=2)
    sections = {"Provenance": provenance_section(release, info, config.get("origin"))}
    if (source / CARD_NAME).is_file():  # the conversion's sections: who trained it, reported results, origin
        kept = extra_sections((source / CARD_NAME).read_text(encoding="utf-8"))
        sections.update({title: text for title, text in kept.items() if title != "Provenance"})
    if release.citation:
        sections["Citation"] = f"```bibtex\n{release.citation}\n```"
    atomic_write_text(dest / CARD_NAME, render_card(config, sections=sections, folder=dest))
    return dest


def mirror_pins(folder: str | os.PathLike[str]) -> dict[str, str]:
    """The sha256 of each weights file of a mirror folder: what MIRRORS records."""
    folder = Path(folder)
    return {name: sha256_file(folder / name) for name in weight_files(folder)}


def publish_release(name: str, repo_id: str, **kwargs: Any) -> tuple[SyncResult, dict[str, str]]:
    """Mirror release ``name`` to ``repo_id`` (idempotent, like :func:`~cl_zoo.checkpoint.publish.sync_folders`);
    returns the result and the pins to record in ``cl_zoo.models.releases.MIRRORS``."""
    check_repo_id(repo_id)
    staging = Path(tempfile.mkdtemp(prefix="cl-zoo-mirror-"))
    try:
        folder = stage_mirror(name, staging / name)
        pins = mirror_pins(folder)
        (result,) = sync_folders([(folder, repo_id)], **kwargs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result, pins
