"""A model card's usage snippet, checked against the folder the card describes.

A card whose "How to load" call fails is worse than no card: it is the first thing a user copies.
But a card is text from whoever wrote the folder, and running it would run their code with the
publisher's environment (tokens included). So ``cl-zoo publish`` never executes a card's text by
default: it rebuilds the "How to load" section cl-zoo generates from config.json, requires the
card's section to be exactly that (:func:`section_text`), and runs cl-zoo's *own* generated snippet
against the folder (same bytes as the upload), offline, in a fresh interpreter with a time limit
(the sample photo a snippet opens by URL is served from a local file for that run).
Running the card's own code is an opt-in (``--run-card-code``) that shows the code first and runs
it with a scrubbed environment (:func:`scrubbed_env`: no tokens, no saved Hub login, offline).
Only blocks that import cl_zoo run: a card also shows how timm loads the folder, and timm is an
optional extra that publishing must not need.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from cl_zoo.errors import CheckpointError

# The photo a card's "How to load" snippet opens (the card renders it; running a snippet swaps it
# for a local file). Here rather than in the card module, which imports this one.
SAMPLE_IMAGE_URL = "https://huggingface.co/datasets/huggingface/documentation-images/resolve/main/beignets-task-guide.png"

USAGE_SECTION = "How to load"
SNIPPET_TIMEOUT_S = 300.0  # importing torch and loading a ResNet-50 on a busy 2-core machine


_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


class FenceTracker:
    """CommonMark's code fences, line by line: a fence opens with 3+ backticks (whose info string
    holds no backtick) or tildes, and closes with at least as many of the same character and
    nothing else. A line that merely starts with a code span (```` ``x`` ````) opens nothing."""

    def __init__(self) -> None:
        self.fence: str | None = None
        self.info = ""

    def feed(self, line: str) -> str:
        """``"open"``, ``"close"``, ``"inside"`` or ``"outside"`` for this line."""
        match = _FENCE_LINE.match(line)
        if self.fence is None:
            if match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
                self.fence, self.info = match.group(1), match.group(2).strip()
                return "open"
            return "outside"
        if match and match.group(1)[0] == self.fence[0] and len(match.group(1)) >= len(self.fence) and not match.group(2).strip():
            self.fence = None
            return "close"
        return "inside"


def _sections(text: str) -> list[tuple[str | None, list[str]]]:
    """``(title, lines)`` per ``## `` section (``None`` for what precedes the first); fences respected."""
    out: list[tuple[str | None, list[str]]] = [(None, [])]
    fences = FenceTracker()
    for line in text.splitlines():
        if fences.feed(line) == "outside" and line.startswith("## "):
            out.append((line[3:].strip(), [line]))
            continue
        out[-1][1].append(line)
    return out


# "import cl_zoo", "import torch, cl_zoo as cz", "from cl_zoo.checkpoint import load_folder"...
_CL_ZOO_IMPORT = re.compile(
    r"^\s*(?:import\s+(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)*cl_zoo\b|from\s+cl_zoo(?:\.\w+)*\s+import\b)", re.MULTILINE
)
LOCAL_DIR = "local-dir:"  # timm's prefix for a folder, as a card's timm block names it


def uses_cl_zoo(block: str) -> bool:
    """Whether a usage block imports cl_zoo: the blocks ``check_usage`` runs (a timm block does not)."""
    return _CL_ZOO_IMPORT.search(block) is not None


def section_text(text: str, title: str = USAGE_SECTION) -> str | None:
    """The body of the card's first ``## title`` section (fences respected), or None without one."""
    for name, lines in _sections(text):
        if name == title:
            return "\n".join(lines[1:]).strip()
    return None


# Environment variables a card's code must not see: credentials of the Hub and of anything else.
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY", "AUTH")


def scrubbed_env(home: str | os.PathLike[str]) -> dict[str, str]:
    """The environment for code cl-zoo runs on a user's behalf: no credentials, offline, and a Hub
    token path that does not exist (``huggingface_hub`` would otherwise read the saved login)."""
    env = {k: v for k, v in os.environ.items() if not any(word in k.upper() for word in _SECRET_WORDS)}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", HF_TOKEN_PATH=str(Path(home) / "no-token"),
               HF_HUB_DISABLE_IMPLICIT_TOKEN="1")
    return env


def usage_blocks(text: str, *, every: bool = False) -> list[str]:
    """The ```python blocks of the card's "How to load" section that import cl_zoo, in order.

    Those are the card's usage snippet: what ``check_usage`` runs and what ``cl-zoo publish``
    requires to load the uploaded repo. ``every=True`` adds the other Python blocks (timm's).
    """
    blocks: list[str] = []
    for title, lines in _sections(text):
        if title != USAGE_SECTION:
            continue
        current: list[str] | None = None
        fences = FenceTracker()
        for line in lines:
            state = fences.feed(line)
            if state == "open" and fences.info.lower() in ("python", "py"):
                current = []
            elif state == "close" and current is not None:
                blocks.append("\n".join(current))
                current = None
            elif state == "inside" and current is not None:
                current.append(line)
    return blocks if every else [b for b in blocks if uses_cl_zoo(b)]


def _path_pattern(paths: set[str]) -> re.Pattern[str]:
    # A whole path, not the prefix of a longer one (".../ckpt" must not match ".../ckpt-sharded"),
    # with timm's "local-dir:" prefix when present, so that it is replaced too.
    alternatives = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
    return re.compile(r"(?<![\w/.~-])(?P<prefix>" + re.escape(LOCAL_DIR) + r")?(?:" + alternatives + r")(?![\w/.-])")


def retarget(text: str, folder: str | os.PathLike[str], source: str) -> str:
    """The card with the folder's local path (as ``save_pretrained`` wrote it) replaced by ``source``.

    timm's ``local-dir:<folder>`` becomes ``source`` itself when that is an ``hf-hub:`` id (timm's
    name for the same repo), else ``local-dir:<source>``.
    """
    folder = Path(folder)
    paths = {str(folder.resolve()), os.path.abspath(folder)}

    def replace(match: re.Match[str]) -> str:
        if match["prefix"] and not source.startswith("hf-hub:"):
            return LOCAL_DIR + source
        return source

    return _path_pattern(paths).sub(replace, text)


def _local_code(block: str, folder: Path, repo_id: str | None) -> str:
    if repo_id is None:
        return block
    pattern = re.compile(r"hf-hub:" + re.escape(repo_id) + r"(?:@[^'\"\s]*)?")
    return pattern.sub(lambda _: str(folder.resolve()), block)


def local_sample_image(code: str, cwd: Path) -> str:
    """``code`` with the card's sample photo URL pointing at a local photo of the same kind (an RGB
    PNG, written into ``cwd``): the snippet runs offline, and cl-zoo never fetches a URL for it."""
    from PIL import Image  # pillow, only when a card's snippet is run

    if SAMPLE_IMAGE_URL not in code:
        return code
    path = cwd / "sample.png"
    ramp = Image.linear_gradient("L").resize((320, 240))
    Image.merge("RGB", (ramp, ramp.rotate(90), ramp.transpose(Image.Transpose.FLIP_LEFT_RIGHT))).save(path)
    return code.replace(SAMPLE_IMAGE_URL, path.as_uri())


def check_usage(text: str, folder: str | os.PathLike[str], *, repo_id: str | None = None,
                card_name: str = "README.md", timeout: float = SNIPPET_TIMEOUT_S) -> None:
    """Run the card's cl-zoo Python usage block(s) against ``folder``; a one-line CheckpointError if they fail.

    ``hf-hub:<repo_id>[@rev]`` in the snippet is replaced by the folder's absolute path, so a card
    written for the Hub is tried on the very bytes about to be uploaded, offline. Blocks that do not
    import cl_zoo (the timm one) are not run: they need packages cl-zoo does not require.
    """
    folder = Path(folder)
    label = f"{folder / card_name}"
    if not usage_blocks(text, every=True):
        raise CheckpointError(f"{label} has no Python usage block under '## {USAGE_SECTION}'; a card must say how to load it")
    blocks = usage_blocks(text)
    if not blocks:
        raise CheckpointError(
            f"{label} has no Python usage block that imports cl_zoo under '## {USAGE_SECTION}'; "
            "a card must say how cl-zoo loads it"
        )
    code = "\n\n".join(_local_code(b, folder, repo_id) for b in blocks)
    with tempfile.TemporaryDirectory(prefix="cl-zoo-card-") as cwd:
        code = local_sample_image(code, Path(cwd))
        env = scrubbed_env(cwd)
        package_parent = str(Path(__file__).resolve().parents[1])  # the cl_zoo being used, installed or not
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        try:
            done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CheckpointError(f"{label}: the usage snippet did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit code {done.returncode}"
        raise CheckpointError(f"{label}: the usage snippet fails when run against {folder}: {last[:300]}")
