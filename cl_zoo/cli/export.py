"""``cl-zoo export {detectron2,torchvision,timm} MODEL OUT``: hand a backbone to another library."""

from __future__ import annotations

import click

_MODEL_HELP = (
    "MODEL is a zoo name, a checkpoint folder or file, an hf-hub: id, or a raw training checkpoint "
    "(.pth/.pth.tar/.safetensors; prefixes such as module.encoder_q. are found automatically)."
)
_PREFIX = click.option(
    "--prefix",
    default=None,
    help="Take the ResNet under this key prefix (e.g. 'module.encoder_q.') instead of guessing.",
)


@click.group("export", help=f"Export a ResNet backbone for detectron2, torchvision or timm. {_MODEL_HELP}")
def export_command() -> None:
    pass


def _run(target: str, model: str, out: str, prefix: str | None) -> None:
    from cl_zoo.convert.export import EXPORTERS

    summary = EXPORTERS[target](model, out, prefix=prefix)
    click.echo(summary.text())


@export_command.command("detectron2")
@click.argument("model")
@click.argument("out", type=click.Path(dir_okay=False))
@_PREFIX
def detectron2_cmd(model: str, out: str, prefix: str | None) -> None:
    """Write OUT.pkl for detectron2 (names stem.conv1, res2..res5; numpy arrays).

    Use it with transfer/detectron2/train_net.py ... MODEL.WEIGHTS OUT.pkl.
    """
    _run("detectron2", model, out, prefix)


@export_command.command("torchvision")
@click.argument("model")
@click.argument("out", type=click.Path(dir_okay=False))
@_PREFIX
def torchvision_cmd(model: str, out: str, prefix: str | None) -> None:
    """Write OUT.pth: a torchvision ResNet state dict (load with strict=False; only fc is missing)."""
    _run("torchvision", model, out, prefix)


@export_command.command("timm")
@click.argument("model")
@click.argument("out", type=click.Path(dir_okay=False))
@_PREFIX
def timm_cmd(model: str, out: str, prefix: str | None) -> None:
    """Write OUT.safetensors for timm.create_model('resnetNN', num_classes=0)."""
    _run("timm", model, out, prefix)
