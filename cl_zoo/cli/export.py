"""``cl-zoo export {detectron2,torchvision,timm} MODEL OUT``: hand a backbone to another library."""

from __future__ import annotations

import dataclasses
import json

import click

from cl_zoo.errors import ClZooError
from cl_zoo.fileio import check_output_path, input_files, refuse_inputs_as_outputs

_MODEL_HELP = (
    "MODEL is a zoo name, a checkpoint folder or file, an hf-hub: id, or a raw training checkpoint "
    "(.pth/.pth.tar/.safetensors; prefixes such as module.encoder_q. are found automatically)."
)
_PREFIX = click.option(
    "--prefix",
    default=None,
    help="Take the ResNet under this key prefix (e.g. 'module.encoder_q.') instead of guessing.",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print what was written, renamed and dropped as JSON.")


@click.group("export", help=f"Export a ResNet backbone for detectron2, torchvision or timm. {_MODEL_HELP}")
def export_command() -> None:
    pass


def _run(target: str, model: str, out: str, prefix: str | None, as_json: bool = False) -> None:
    from cl_zoo.export import check_export_path, EXPORTERS  # torch, numpy

    check_output_path(out, option="OUT")  # before the checkpoint is read and converted
    # `export timm ck/ ck/model.safetensors` used to replace the checkpoint it read, and exit 0
    refuse_inputs_as_outputs([out], input_files(model), error=ClZooError)
    check_export_path(target, out)
    summary = EXPORTERS[target](model, out, prefix=prefix)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(summary), indent=1))
    else:
        click.echo(summary.text())


@export_command.command("detectron2")
@click.argument("model")
@click.argument("out", type=click.Path())
@_PREFIX
@_JSON
def detectron2_cmd(model: str, out: str, prefix: str | None, as_json: bool) -> None:
    """Write OUT, a .pkl for detectron2 (names stem.conv1, res2..res5; numpy arrays).

    OUT must end in .pkl: detectron2 reads only such a file as this format. Use it with transfer/detectron2/train_net.py ... MODEL.WEIGHTS OUT.pkl.
    """
    _run("detectron2", model, out, prefix, as_json)


@export_command.command("torchvision")
@click.argument("model")
@click.argument("out", type=click.Path())
@_PREFIX
@_JSON
def torchvision_cmd(model: str, out: str, prefix: str | None, as_json: bool) -> None:
    """Write OUT (e.g. resnet50.pth): a torchvision ResNet state dict (load with strict=False; only fc is missing)."""
    _run("torchvision", model, out, prefix, as_json)


@export_command.command("timm")
@click.argument("model")
@click.argument("out", type=click.Path())
@_PREFIX
@_JSON
def timm_cmd(model: str, out: str, prefix: str | None, as_json: bool) -> None:
    """Write OUT, a .safetensors for timm.create_model('resnetNN', num_classes=0).

    OUT must end in .safetensors: timm reads any other name as a pickle.
    """
    _run("timm", model, out, prefix, as_json)
