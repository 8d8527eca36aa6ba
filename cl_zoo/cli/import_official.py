"""``cl-zoo import {jcl,cmc,cacr,moco,lightly} CHECKPOINT --out FOLDER``: bring a published checkpoint into the zoo."""

from __future__ import annotations

import json

import click

from cl_zoo.fileio import check_output_path
from cl_zoo.validation import check_text

from cl_zoo.models.releases import FORMATS


@click.command("import")
@click.argument("format", type=click.Choice(FORMATS))
@click.argument("checkpoint", type=click.Path(dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(), help="Zoo checkpoint folder to write (checked before the checkpoint is read).")
@click.option(
    "--arch",
    default=None,
    help="Zoo architecture to load into (default: resnet50; for cmc, read from the file's width).",
)
@click.option("--origin", default=None, help="Where the file came from (URL), recorded in the model card.")
@click.option("--json", "as_json", is_flag=True, help="Print the conversion report and the folder written as JSON.")
def import_command(format: str, checkpoint: str, out: str, arch: str | None, origin: str | None, as_json: bool = False) -> None:
    """Convert CHECKPOINT, in the layout its publisher FORMAT uses, into a zoo folder.

    \b
    jcl   checkpoint_0199.pth.tar (state_dict, module.encoder_q.*)
    cmc   CMC_resnet50v{1,2,3}.pth (model, encoder.module.l_to_ab.* / ab_to_l.*)
    cacr  MoCo v3-style checkpoint (state_dict, module.base_encoder.*)
    moco  moco_v{1,2}_*_pretrain.pth.tar (state_dict, module.encoder_q.*)
    lightly  PyTorch Lightning .ckpt of lightly's benchmarks (state_dict, backbone.*)

    The file is read with torch.load(weights_only=True) (lightly's Lightning files with their
    AttributeDict read as a plain dict), after its archive is checked; nothing in it is imported
    or called. Every backbone tensor must be used, otherwise nothing is written.
    """
    if origin is not None:
        check_text("--origin", origin)  # before torch is imported
    from cl_zoo.convert.readers import import_checkpoint  # torch

    check_output_path(out, folder=True, create_parents=True)  # before the checkpoint is read and converted
    folder, report = import_checkpoint(format, checkpoint, out, arch=arch, origin=origin)
    if as_json:
        click.echo(json.dumps({"folder": str(folder), **report.to_dict()}, indent=1))
        return
    click.echo(report.text())
    if report.matches_release:
        click.echo(f"checksum matches the published release {report.matches_release}")
    click.echo(f"wrote {folder}")
