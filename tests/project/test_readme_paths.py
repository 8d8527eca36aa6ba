"""The README's quick start leaves nothing untracked in the checkout, and the environment variables
it documents (caches, datasets for tests) are the ones the code reads."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path
from tests.helpers import REPO_ROOT

REPO = REPO_ROOT
README = (REPO / "README.md").read_text(encoding="utf-8")


def ci_block(tag: str) -> str:
    """The fenced block after ``<!-- ci: tag -->`` (what .ci/run executes verbatim)."""
    found = re.search(rf"<!-- ci: {tag} -->\n```bash\n(.*?)```", README, re.S)
    assert found, f"README has no ci:{tag} block"
    return found.group(1)


def ignored(path: str) -> bool:
    patterns = [p.strip() for p in (REPO / ".gitignore").read_text().splitlines() if p.strip() and not p.startswith("#")]
    parts = Path(path).parts
    for pattern in patterns:
        anchored, bare = pattern.startswith("/"), pattern.strip("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, bare) for p in (prefixes if anchored else prefixes + list(parts))):
            return True
    return False


def test_quick_start_writes_into_an_ignored_folder() -> None:
    words = shlex.split(ci_block("quickstart").replace("&&", " && "))
    out = Path(words[words.index("--out") + 1])
    assert out.parent != Path("."), "the quick start must not write embeddings.* into the repository root"
    assert ignored(out.as_posix()) and ignored(out.with_suffix(".paths.jsonl").as_posix())
    assert f"mkdir -p {out.parent.as_posix()}" in ci_block("quickstart")


def test_documented_variables_are_read_by_the_code() -> None:
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "cl_zoo").rglob("*.py"))
    conftest = (REPO / "tests" / "conftest.py").read_text(encoding="utf-8")
    for name in ("CL_ZOO_CACHE", "CL_ZOO_DATA", "CL_ZOO_MODEL_CARDS"):
        assert name in README and f'"{name}"' in sources, name
    for name in ("CL_ZOO_SHARED_DATASETS", "CL_ZOO_TEST_DATA"):
        assert name in README and f'"{name}"' in conftest, name
    assert "~/.cache/cl-zoo" in README and '"~/.cache/cl-zoo"' in sources
