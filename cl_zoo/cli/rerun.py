"""The command line that repeats the running command, for messages such as "to continue, run: ...".

It is rebuilt from what click parsed (the options typed, not their defaults), so it is the same
whether cl-zoo was started as ``cl-zoo``, ``python -m cl_zoo.cli`` or in process. Values that name
existing files or folders are made absolute, so the command works from any folder.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Container, Iterable

import click

_TYPED = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)


def _word(value: object) -> str:
    text = str(value)
    return os.path.abspath(text) if text and os.path.exists(text) else text


def typed_option_words(ctx: click.Context, *, skip: Container[str] = (), always: Container[str] = (),
                       word: Callable[[str, object], str] = lambda _name, value: _word(value)) -> list[str]:
    """The options of ``ctx`` as typed (``always``: also when left at their default), each value
    through ``word(name, value)``; flags as typed (``--no-progress`` too), repeated options repeated."""
    words: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if not isinstance(param, click.Option) or name is None or name in skip:
            continue
        if ctx.get_parameter_source(name) not in _TYPED and name not in always:
            continue
        value = ctx.params.get(name)
        flag = max(param.opts, key=len)
        if param.is_flag:
            if value:
                words.append(flag)
            elif param.secondary_opts:  # a typed --no-progress
                words.append(max(param.secondary_opts, key=len))
            continue
        for item in value if param.multiple else [value]:
            words.extend([flag, word(name, item)])
    return words


def rerun_command(ctx: click.Context, *, add: Iterable[str] = ()) -> str:
    """``cl-zoo COMMAND`` with every option typed for ``ctx``, then ``add`` (flags not already there)."""
    words = ["cl-zoo", ctx.info_name or ctx.command.name or "", *typed_option_words(ctx)]
    trailing: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if isinstance(param, click.Argument) and name is not None and ctx.get_parameter_source(name) in _TYPED:
            value = ctx.params.get(name)
            trailing.extend(_word(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    words.extend(flag for flag in add if flag not in words)
    if trailing:
        words.extend(["--", *trailing])
    return shlex.join(words)
