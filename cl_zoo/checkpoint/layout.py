"""The file names of a checkpoint folder (the same names a Hugging Face Hub repo uses).

A torch-free leaf so that Hub resolution and ``cl-zoo models`` / ``info`` can find folders and
cached repos without importing torch; :mod:`cl_zoo.checkpoint.folder` re-exports them.
"""

from __future__ import annotations

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CARD_NAME = "README.md"
