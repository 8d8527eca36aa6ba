"""The ``torchrun`` environment variables, read and checked in one place.

``torchrun`` tells each process where it sits through ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
the rendezvous address ``MASTER_ADDR``/``MASTER_PORT``. The same names are easily left behind in a
shell or a job script, and read where each is used, every inconsistent set ends differently:
``RANK=1`` alone makes ``cl-zoo embed --out DIR/`` exit 0 having written nothing (rank 1 of a job of
one leaves the writing to a rank 0 that does not exist), ``RANK=abc`` is a ``ValueError`` traceback,
``WORLD_SIZE=0`` a division by zero, ``RANK=3 WORLD_SIZE=2`` torch's rendezvous traceback. Every reader (embedding's
``dist_info``, training's ``init_distributed``) goes through :func:`torchrun_env`, so a set that
cannot describe a real job is one ``error:`` line naming the variables, before any work.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cl_zoo.errors import ClZooError

RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")
# Digits only (a sign is read so that "-1" is named as negative, not as "not an integer"), and few
# of them: int() of thousands of digits is slow, and no job has a billion processes.
_INTEGER = re.compile(r"^[+-]?[0-9]{1,9}$")
_ADVICE = "unset the torchrun variables for a single process, or launch with torchrun"


class TorchrunError(ClZooError):
    """Inconsistent ``torchrun`` environment variables (usually left over from another job)."""


@dataclass(frozen=True)
class TorchrunEnv:
    """Where this process sits in the job (a single process when no variable is set)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _show(name: str, text: str) -> str:
    return f"{name}={text[:40]!r}" if not _INTEGER.match(text.strip()) else f"{name}={text.strip()}"


def _integer(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if text is None or not text.strip():  # exported but empty: as unset
        return default
    if not _INTEGER.match(text.strip()):
        raise TorchrunError(f"{_show(name, text)} is not an integer; {_ADVICE}")
    return int(text.strip())


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv:
    """The checked variables of ``environ`` (default: this process's environment).

    Checked: integers; ``WORLD_SIZE >= 1``; ``0 <= RANK < WORLD_SIZE``; ``0 <= LOCAL_RANK`` (and
    ``< LOCAL_WORLD_SIZE`` when that is set); and, when ``WORLD_SIZE > 1``, the rendezvous
    variables present with a port in 1-65535. Anything else is one :class:`TorchrunError` line.
    """
    env = os.environ if environ is None else environ
    world = _integer(env, "WORLD_SIZE", 1)
    rank = _integer(env, "RANK", 0)
    local = _integer(env, "LOCAL_RANK", 0)
    local_world = _integer(env, "LOCAL_WORLD_SIZE", 0)
    if world < 1:
        raise TorchrunError(f"WORLD_SIZE={world}: a job has at least one process; {_ADVICE}")
    if not 0 <= rank < world:
        world_text = f"WORLD_SIZE={world}" if (env.get("WORLD_SIZE") or "").strip() else "WORLD_SIZE unset (one process)"
        raise TorchrunError(f"RANK={rank} with {world_text}: a rank runs from 0 to WORLD_SIZE-1; {_ADVICE}")
    if local < 0 or (local_world and local >= local_world):
        bound = f" with LOCAL_WORLD_SIZE={local_world}" if local_world else ""
        raise TorchrunError(f"LOCAL_RANK={local}{bound}: a local rank runs from 0 to LOCAL_WORLD_SIZE-1; {_ADVICE}")
    if world > 1:
        missing = [name for name in RENDEZVOUS if not (env.get(name) or "").strip()]
        if missing:
            raise TorchrunError(f"WORLD_SIZE={world} but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                                f"not set, so the processes cannot find each other; {_ADVICE}")
        port = _integer(env, "MASTER_PORT", 0)
        if not 1 <= port <= 65535:
            raise TorchrunError(f"MASTER_PORT={port} is not a TCP port (1-65535); {_ADVICE}")
    return TorchrunEnv(rank=rank, world_size=world, local_rank=local)


__all__ = ["RENDEZVOUS", "TorchrunEnv", "TorchrunError", "torchrun_env"]
