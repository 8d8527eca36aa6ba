"""User-facing errors.

Everything a user can cause (a wrong name, a bad file, an unreachable Hub) raises a subclass of
:class:`ClZooError`. The CLI turns these into one line on stderr and a non-zero exit; anything else
is a bug in cl-zoo and keeps its traceback.
"""

from __future__ import annotations


class ClZooError(Exception):
    """An error the user can fix; its message is one self-contained line."""

    exit_code: int = 2


class ModelNotFoundError(ClZooError, KeyError):
    """An unknown model name or architecture."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ModelArgumentError(ClZooError, TypeError):
    """A keyword argument a model cannot take (``create_model(name, num_classes=10)``); a TypeError too, as Python's own."""


class CheckpointError(ClZooError):
    """A checkpoint folder or file that is malformed, incomplete or does not match its model."""


class HubError(ClZooError):
    """The Hugging Face Hub could not provide (or accept) a checkpoint."""


class DataError(ClZooError):
    """Input data that cannot be used: missing, empty, unreadable or inconsistent."""
