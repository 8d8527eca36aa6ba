"""``cl-zoo publish``: validate checkpoint folders and upload them to the Hugging Face Hub.

Three forms, exactly one per call: ``FOLDER --repo-id owner/name`` (one folder), ``--all`` (every
checkpoint folder under model_cards/ to ``<namespace>/<folder name>``, skipping repos that already
hold the same files) and ``--release NAME --repo-id owner/name`` (a mirror of a third-party release
whose licence allows it).
"""

from __future__ import annotations

from pathlib import Path

import click

from cl_zoo.errors import ClZooError


def _pins_line(name: str, repo_id: str, pins: dict[str, str]) -> str:
    return f"MIRRORS[{name!r}] = Mirror(repo_id={repo_id!r}, sha256={pins!r})"


@click.command("publish")
@click.argument("folder", required=False, type=click.Path(path_type=Path))
@click.option("--all", "all_", is_flag=True, help="Publish every checkpoint folder under --model-cards to <namespace>/<folder name>.")
@click.option("--release", default=None, metavar="NAME", help="Mirror a third-party release (fetched and converted) to --repo-id.")
@click.option("--repo-id", default=None, help="Target Hub repo, owner/name (created if missing); with FOLDER or --release.")
@click.option("--model-cards", type=click.Path(path_type=Path), default=None,
              help="With --all: the folder of checkpoint folders (default: the zoo's model_cards).")
@click.option("--namespace", default=None, help="With --all: the Hub user or organisation (default: CL_ZOO_HUB_NAMESPACE or cl-zoo).")
@click.option("--record", type=click.Path(path_type=Path), default=None,
              help="With --all or --release: append one JSON line per repo (action, commit, sha256 of each file).")
@click.option("--private", is_flag=True, help="Create the repo(s) as private.")
@click.option("--revision", default=None, help="Branch to push to (created from main if missing); FOLDER only.")
@click.option("--create-pr", is_flag=True, help="Open a pull request against main instead of committing to it; FOLDER only.")
@click.option("--message", "commit_message", default=None, help="Commit message.")
@click.option("--dry-run", is_flag=True, help="Only validate (and compare with the Hub when reachable) and list every file with its size and sha256; upload nothing.")
@click.option("--run-card-code", is_flag=True,
              help="Run the card's own 'How to load' code (shown first; offline, without credentials) instead of "
                   "requiring the section cl-zoo generates from config.json.")
def publish_command(
    folder: Path | None,
    all_: bool,
    release: str | None,
    repo_id: str | None,
    model_cards: Path | None,
    namespace: str | None,
    record: Path | None,
    private: bool,
    revision: str | None,
    create_pr: bool,
    commit_message: str | None,
    dry_run: bool,
    run_card_code: bool,
) -> None:
    """Validate FOLDER (config, weights, card) and upload it to the Hub; or every zoo folder
    (--all); or a mirror of a third-party release (--release NAME).

    The token comes from HF_TOKEN or `hf auth login`; HF_ENDPOINT selects another Hub. The
    printed hf-hub:owner/name@<commit> id pins exactly what was uploaded. --all and --release
    upload nothing to a repo that already holds the same files ("unchanged").
    """
    forms = [name for name, given in (("FOLDER", folder is not None), ("--all", all_), ("--release", release)) if given]
    if len(forms) != 1:
        raise ClZooError("give exactly one of FOLDER, --all or --release NAME" + (f" (got {' and '.join(forms)})" if forms else ""))
    if all_:
        if repo_id:
            raise ClZooError("--all publishes each folder to <namespace>/<folder name>; use --namespace, not --repo-id")
    else:
        if not repo_id:
            raise ClZooError(f"{forms[0]} needs --repo-id owner/name")
        for flag, given in (("--model-cards", model_cards), ("--namespace", namespace)):
            if given is not None:
                raise ClZooError(f"{flag} applies to --all only")
    if (all_ or release) and (revision or create_pr):
        raise ClZooError(f"{forms[0]} publishes to main; --revision and --create-pr apply to FOLDER only")
    if folder is not None and record is not None:
        raise ClZooError("--record applies to --all and --release")

    from cl_zoo.checkpoint import publish as pub

    if repo_id is not None:  # before any folder is read or release fetched, dry run or not
        pub.check_repo_id(repo_id)
    options = dict(dry_run=dry_run, record=record, private=private, commit_message=commit_message, echo=click.echo,
                   run_card_code=run_card_code)
    if all_:
        results = pub.publish_all(model_cards, namespace, **options)
        counts = {action: sum(r.action == action for r in results) for action in ("uploaded", "unchanged", "would-upload", "unknown")}
        if dry_run:
            click.echo(f"dry run: {len(results)} folder(s) validated, {counts['would-upload']} would be uploaded, "
                       f"{counts['unchanged']} unchanged, {counts['unknown']} cannot tell; nothing uploaded")
        else:
            click.echo(f"{counts['uploaded']} uploaded, {counts['unchanged']} unchanged")
        return
    if release:
        assert repo_id is not None
        from cl_zoo.convert.mirror import publish_release

        result, pins = publish_release(release, repo_id, **options)
        if dry_run:
            click.echo("dry run: nothing uploaded")
            return
        click.echo(f"load with: cl_zoo.load_pretrained('hf-hub:{repo_id}@{result.commit}')")
        click.echo("to use it as the release's last source, record it in cl_zoo/models/releases.py:")
        click.echo(f"    {_pins_line(release, repo_id, pins)}")
        return

    assert folder is not None and repo_id is not None
    if dry_run:
        report = pub.validate_folder(folder)
        card = pub.card_for_repo(report.folder, repo_id, run_card_code=run_card_code, echo=click.echo)
        checked = ("its card's own usage code ran" if run_card_code else
                   "its card's How to load is cl-zoo's own, and that snippet ran")
        click.echo(
            f"ok: {report.folder} ({report.model_name or report.architecture}, {report.architecture}, "
            f"{report.num_params / 1e6:.2f}M params, {len(report.weight_files)} weight file(s); {checked}, "
            f"loading hf-hub:{repo_id} from this folder); nothing uploaded"
        )
        files = pub.local_files(report.folder, card)
        click.echo(f"files it would upload ({len(files)}):")
        for line in pub.file_lines(files):
            click.echo(line)
        return
    result = pub.publish_folder(
        folder, repo_id, private=private, revision=revision, create_pr=create_pr, commit_message=commit_message,
        run_card_code=run_card_code, echo=click.echo,
    )
    click.echo(f"uploaded {folder} -> {result.commit_url}")
    if result.pr_url:
        click.echo(f"pull request: {result.pr_url}")
    click.echo(f"load with: cl_zoo.load_pretrained({result.load_spec!r})")
