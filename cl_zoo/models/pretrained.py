"""The zoo's pretrained checkpoints: one :func:`register_pretrained` call per published model.

Entries whose folder is bundled under ``model_cards/`` load offline; the others resolve through
the Hugging Face Hub (or, for author-released files, their original URL) via :mod:`cl_zoo.hub`.
"""

from __future__ import annotations

# Entries are added here as checkpoints are trained and published (see model_cards/).
