"""The ``cl-zoo`` command.

Subcommands live one per module in this package and are imported only when invoked, so
``cl-zoo --help`` stays fast and a broken optional dependency of one command cannot break the
others. The CLI only parses arguments and calls the Python API.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

import click

from cl_zoo.errors import ClZooError

# name -> "module:attribute"; each module owns one command (or group).
_COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("cl_zoo.cli.models", "Registered models and their metrics."),
    "info": ("cl_zoo.cli.models", "Show one model's pretrained config."),
    "publish": ("cl_zoo.cli.publish", "Validate a checkpoint folder and upload it to the Hugging Face Hub."),
    "embed": ("cl_zoo.cli.embed", "Embed images (files, folders, lists) with any model."),
    "search": ("cl_zoo.cli.search", "Nearest-neighbour search over saved embeddings (faiss)."),
    "dedup": ("cl_zoo.cli.search", "List near-duplicate groups in saved embeddings."),
    "index": ("cl_zoo.cli.index", "Build a faiss index over saved embeddings to a memory budget, for search and dedup."),
    "pretrain": ("cl_zoo.cli.pretrain", "Self-supervised pretraining with one of the zoo's methods."),
    "knn": ("cl_zoo.cli.evaluate", "Weighted kNN classification of a model's features."),
    "linear-eval": ("cl_zoo.cli.evaluate", "Linear probe of a frozen model (fast, paper or small-scale protocol)."),
    "card-update": ("cl_zoo.cli.evaluate", "Write an evaluation report's metrics into a checkpoint folder, or re-render its card."),
    "export": ("cl_zoo.cli.export", "Export a backbone for detectron2, torchvision or timm."),
    "detect": ("cl_zoo.cli.detect", "Detection transfer: fine-tune a backbone with Faster R-CNN."),
    "import": ("cl_zoo.cli.import_official", "Convert an author-released checkpoint into the zoo format."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        module_name, _ = _COMMANDS[name]
        module = importlib.import_module(module_name)
        return getattr(module, name.replace("-", "_") + "_command")

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table above, without importing every command module.
        rows = [(name, _COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cl-zoo")
def cli() -> None:
    """cl-zoo: contrastive self-supervised vision models, from pretraining to detection transfer."""


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
    """A warning as the CLI shows it: one ``warning:`` line, like errors (no file, line or source)."""
    return f"warning: {' '.join(str(message).split())}\n"


# click 8.2+ raises this for a bare group (`cl-zoo`, `cl-zoo export`); 8.1 prints the help and exits 0.
_NO_ARGS_IS_HELP: type[click.ClickException] | tuple[()] = getattr(click.exceptions, "NoArgsIsHelpError", ())


def click_message(exc: click.ClickException) -> str:
    """click's own refusal (a usage error, a bad option value) as the one line our errors are.

    click would print a usage block and ``Error: ...``; every cl-zoo error is ``error: ...``, so
    scripts and readers see one form. A usage error names where the options are listed.
    """
    message = " ".join(exc.format_message().split()).rstrip(".")
    context = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and context is not None:
        message += f" (see {context.command_path} --help)"
    return message


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning user errors into one line and a non-zero exit."""
    shown_as = warnings.formatwarning
    warnings.formatwarning = format_warning  # type: ignore[assignment]
    try:
        return _run(argv)
    finally:
        warnings.formatwarning = shown_as


def _run(argv: list[str] | None) -> int:
    try:
        result = cli.main(args=argv, prog_name="cl-zoo", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except _NO_ARGS_IS_HELP as exc:
        exc.show()  # its help is the answer
        return exc.exit_code
    except click.ClickException as exc:
        click.echo(f"error: {click_message(exc)}", err=True)
        return exc.exit_code
    except ClZooError as exc:
        message = " ".join(str(exc).split())  # always one line
        click.echo(f"error: {message}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:
        # `cl-zoo models | head`: stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    # Commands signal a non-zero status (e.g. "nothing embedded") with ctx.exit(code) or by
    # returning an int; standalone_mode=False hands either back here.
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
