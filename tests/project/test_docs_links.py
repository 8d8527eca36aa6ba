"""The README is a front door that links into docs/ (issue 42): a renamed page or heading must not leave
a dead link behind, and every environment variable the code reads is documented in the one place the
README promises ("Environment variables")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.helpers import REPO_ROOT

REPO = REPO_ROOT
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def without_code(text: str) -> str:
    """Fenced blocks hold shell comments (``# ...``) that are not headings."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(page: Path) -> set[str]:
    return {github_slug(h) for h in re.findall(r"^#{1,6} (.+)$", without_code(page.read_text(encoding="utf-8")), re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", without_code(page.read_text(encoding="utf-8")))
    assert page.name != "README.md" or any(link.startswith("docs/") for link in links)
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link} points to a missing file"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target), f"{page.name}: {link} has no such heading in {target.name}"


def test_every_variable_the_code_reads_is_in_the_readme_table() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.partition("### Environment variables")[2].partition("\n#")[0]
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "cl_zoo").rglob("*.py"))
    names = set(re.findall(r'"((?:CL_ZOO|HF)_[A-Z_]+)"', sources))
    assert {"CL_ZOO_CACHE", "CL_ZOO_OFFLINE", "HF_HUB_OFFLINE"} <= names
    missing = sorted(name for name in names if f"`{name}`" not in table)
    assert not missing, f"README's environment variables table lacks {missing}"
