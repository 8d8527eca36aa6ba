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


# The HTTP stacks huggingface_hub has shipped on: requests/urllib3 (0.x), httpx/httpcore (1.x), httpx2.
_TRANSPORT_MODULES = frozenset({"httpx", "httpx2", "httpcore", "requests", "urllib3"})


def is_transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the Hub client's HTTP stack failing to connect, time out or speak HTTP.

    huggingface_hub lets those through untyped (``httpx2.ConnectError`` ...), and which stack it uses
    changes between its versions, so the check goes by the exception's module rather than by a class
    that may not exist in the installed version. Every Hub call of cl-zoo (download, publish,
    release sources) turns them into one "cannot be reached" line with this; it lives here, below
    all of them, so that none imports another's module for it.
    """
    return type(exc).__module__.split(".")[0] in _TRANSPORT_MODULES
