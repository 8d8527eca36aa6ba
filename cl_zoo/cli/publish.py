"""``cl-zoo publish``: validate a checkpoint folder and upload it to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("publish")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--repo-id", required=True, help="Target Hub repo, owner/name (created if missing).")
@click.option("--private", is_flag=True, help="Create the repo as private.")
@click.option("--revision", default=None, help="Branch to push to (created from main if missing).")
@click.option("--create-pr", is_flag=True, help="Open a pull request against main instead of committing to it.")
@click.option("--message", "commit_message", default=None, help="Commit message.")
@click.option("--dry-run", is_flag=True, help="Only validate the folder; upload nothing.")
def publish_command(
    folder: Path,
    repo_id: str,
    private: bool,
    revision: str | None,
    create_pr: bool,
    commit_message: str | None,
    dry_run: bool,
) -> None:
    """Validate FOLDER (config, weights, card) and upload it to the Hub.

    The token comes from HF_TOKEN or `hf auth login`; HF_ENDPOINT selects another Hub. The
    printed hf-hub:owner/name@<commit> id pins exactly what was uploaded.
    """
    from cl_zoo.checkpoint.publish import card_for_repo, publish_folder, validate_folder

    if dry_run:
        report = validate_folder(folder)
        card_for_repo(report.folder, repo_id)
        click.echo(
            f"ok: {report.folder} ({report.model_name or report.architecture}, {report.architecture}, "
            f"{report.num_params / 1e6:.2f}M params, {len(report.weight_files)} weight file(s); its card's usage "
            f"snippet runs, loading hf-hub:{repo_id} from this folder); nothing uploaded"
        )
        return
    result = publish_folder(
        folder, repo_id, private=private, revision=revision, create_pr=create_pr, commit_message=commit_message
    )
    click.echo(f"uploaded {folder} -> {result.commit_url}")
    if result.pr_url:
        click.echo(f"pull request: {result.pr_url}")
    click.echo(f"load with: cl_zoo.load_pretrained({result.load_spec!r})")
